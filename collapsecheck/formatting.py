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


def format_count(x: float) -> str:
    """A count that may be fractional (effective traces): one decimal below 100."""
    return format_number(x) if abs(x) >= 100 else f"{x:.1f}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
