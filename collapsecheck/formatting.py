"""Numbers for people: every number a console, Markdown summary or verdict reason shows."""

from __future__ import annotations

import math

SCIENTIFIC_FROM = 1e6  # above a million, a count of digits says nothing: 5.73e+37


def format_number(x: float, decimals: int = 3) -> str:
    """3 decimals; thousands separators from 1,000; scientific notation from a million."""
    if math.isnan(x):
        return "-"
    if math.isinf(x) or abs(x) >= SCIENTIFIC_FROM:
        return f"{x:.3g}"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{decimals}f}"


WHOLE_FROM = 10  # an effective count shows one decimal below this (1.2 traces), whole above


def format_count(x: float) -> str:
    """An effective count (traces): one decimal below 10, where 1.2 and 1.9 differ to a reader;
    a whole number from 10 on (284, 2,537), never a count with decimals beside it."""
    if abs(x) >= SCIENTIFIC_FROM:
        return format_number(x)
    return f"{x:,.0f}" if abs(x) >= WHOLE_FROM else f"{x:.1f}"


# SPEC "Metrics": effective_traces_per_prompt is shown as a count up to here. exp of a
# sequence's entropy grows with its length; past this, it says only that no two of the K
# sampled traces of a prompt are alike, and its digits mean nothing to a reader.
READABLE_TRACES = 10_000
TRACES_KEY = "effective_traces_per_prompt"


def format_traces(x: float) -> str:
    """An effective number of traces for a person: a count up to READABLE_TRACES, else
    `> 10,000`."""
    if math.isnan(x):
        return "-"
    return format_count(x) if x <= READABLE_TRACES else f"> {READABLE_TRACES:,}"


def format_metric(key: str, x: float) -> str:
    """A metric's value as a console, Markdown summary or page shows it."""
    return format_traces(x) if key == TRACES_KEY else format_number(x)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def prompts_phrase(prompts: int, rows: int) -> str:
    """`8 prompts`, or `8 prompts (from 16 rows: identical contexts count once)` (SPEC
    "Identical contexts are one prompt")."""
    said = plural(prompts, "prompt")
    return said if rows == prompts else f"{said} (from {rows} rows: identical contexts count once)"


def samples_phrase(fewest: int, most: int) -> str:
    """`8 samples`, or `1 to 8 samples (each trace weighs the same)` where prompts differ."""
    if fewest == most:
        return plural(most, "sample")
    return f"{fewest} to {most} samples (each trace weighs the same)"
