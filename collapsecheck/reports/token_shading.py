"""SPEC "Where the input shows" on the page: each reasoning token shaded by its information
(blue where it tells the trace's own prompt apart from the batch's others, red where it fits
the others better), its value and the own prompt's posterior after it on hover; the
information by tenth of the reasoning for a scan, and per step along a run."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

import numpy as np

from collapsecheck.measures.token_information import NOT_MEASURED, WhereInputShows
from collapsecheck.reports.evidence import Evidence
from collapsecheck.reports.figures import information_by_step_picture, information_picture

LEVELS = 5  # shades of each sign
MIN_SCALE = 0.05  # nats: the darkest shade is at least this much information
SHADED_PROMPTS = 4  # the section shows the first trace of this many prompts
TOKEN_BUDGET = 20_000  # tokens a page shades in its traces by prompt (the rest: plain text)
TOKEN_CAPTION = (
    "Each reasoning token shaded by its information about the trace's own prompt (SPEC "
    '"Where the input shows"): blue, the token is likelier under its own prompt than under '
    "the batch's mixture of prompts given the tokens before it; red, likelier under the others; "
    "unshaded, a token any prompt would write (a template's). Hover a token for its value and "
    "how sure a reader of the reasoning up to it is of the own prompt. A trace's tokens sum to "
    "its matched - marginal. The traces by prompt below are shaded up to 20,000 tokens, each "
    "prompt's first trace first; the dump's token_information.npz holds every token's values."
)


def shading_scale(evidence: Evidence) -> float:
    """The information the darkest shade stands for: the 99th percentile of |information|
    over the scan's tokens, at least MIN_SCALE."""
    if evidence.tokens is None or not len(evidence.tokens.information):
        return MIN_SCALE
    return max(float(np.percentile(np.abs(evidence.tokens.information), 99)), MIN_SCALE)


def token_span(text: str, information: float, posterior: float, scale: float) -> str:
    """One token: its shade's class by sign and level (p1-p5 for, n1-n5 against its own
    prompt; none below half a level), its information and the own prompt's posterior after
    it as its title."""
    level = min(LEVELS, int(LEVELS * abs(information) / scale + 0.5))
    shade = f' class="{"p" if information > 0 else "n"}{level}"' if level else ""
    return (
        f'<span{shade} title="{information:+.3f} nats, own {100 * posterior:.0f}%">'
        f"{escape(text)}</span>"
    )


def shaded_trace(evidence: Evidence, row: int, scale: float, chars: int) -> str | None:
    """Row `row`'s reasoning, token by token, cut after about `chars` characters; None
    where the scan has no per-token values."""
    tokens = evidence.token_row(row)
    if tokens is None:
        return None
    spans, length = [], 0
    for text, information, posterior in tokens:
        if length >= chars:
            spans.append(" …")
            break
        spans.append(token_span(text, information, posterior, scale))
        length += len(text)
    return "".join(spans)


def where_section(where: WhereInputShows, evidence: Evidence, chars: int) -> str:
    """A scan's section: its reading, the information by tenth, and the first trace of a
    few prompts shaded token by token ("" where not measured)."""
    if where.regime == NOT_MEASURED or evidence.tokens is None:
        return ""
    scale = shading_scale(evidence)
    rows = first_rows(evidence.matrix.row_prompt, SHADED_PROMPTS)
    traces = "".join(
        f'<div class="trace"><b>prompt {int(evidence.matrix.row_prompt[r])}:</b> '
        f"{shaded_trace(evidence, r, scale, chars)}</div>"
        for r in rows
    )
    return (
        f'<section class="where"><h2>Where the input shows: {escape(where.regime)}</h2>'
        + f'<div class="note">{escape(where.reason)}</div>'
        + f'<img class="profile" src="{information_picture(where)}" alt="information by tenth">'
        + f'<div class="note">{escape(TOKEN_CAPTION)}</div>{traces}</section>'
    )


def shaded_rows(evidence: Evidence, budget: int = TOKEN_BUDGET) -> set[int]:
    """The rows a page's traces by prompt shade: each prompt's first trace, then each one's
    second, and so on, while their tokens fit `budget` (a page's size stays bounded)."""
    if evidence.tokens is None:
        return set()
    row_prompt = evidence.matrix.row_prompt
    order = np.argsort(row_prompt, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    starts = np.searchsorted(row_prompt[order], row_prompt[order])
    rank[order] = np.arange(len(order)) - starts
    rows = np.lexsort((row_prompt, rank))
    within = np.cumsum(np.diff(evidence.tokens.offsets)[rows]) <= budget
    return {int(r) for r in rows[within]}


def first_rows(row_prompt: np.ndarray, prompts: int) -> list[int]:
    """The first row of each of the first `prompts` prompts that have rows."""
    _, first = np.unique(row_prompt, return_index=True)
    return sorted(int(r) for r in first)[:prompts]


RUN_CAPTION = (
    "Each step's information about the input in each tenth of the reasoning (nats a trace, "
    "summed over the tokens that fall in it; the ten sum to the step's mi_seq_estimate on the "
    "full matrix). Blue spread over the row: the whole reasoning reads the input; blue only "
    "at the right: only its last words do; a pale row: the reasoning no longer carries it."
)


def where_along_run(steps: Sequence[tuple[str, WhereInputShows]]) -> str:
    """The run page's one picture of where the information sits at each step ("" where no
    step measured it)."""
    measured = [(label, where) for label, where in steps if where.regime != NOT_MEASURED]
    if not measured:
        return ""
    return (
        "<h2>Where the input shows along the run</h2>"
        + f'<div class="note">{escape(RUN_CAPTION)}</div>'
        + f'<img class="profile" src="{information_by_step_picture(measured)}" '
        + 'alt="information by tenth, per step">'
    )
