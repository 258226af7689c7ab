"""What one unit of work costs, worked out before any work and before any weights load
(SPEC "Sampled negatives and swaps" gives the pair counts). Pure arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from collapsecheck.formatting import format_number
from collapsecheck.settings import swap_count


def count(n: int) -> str:
    """A count as a person reads it: 2,048; 1.18e+07 past a million."""
    return f"{n:,}" if n < 1_000_000 else format_number(n)


@dataclass(frozen=True)
class Cost:
    """One checkpoint's work: N prompts x K samples (`responses` traces in all), the scored
    pairs of X->Z and of the flow, and an upper bound on the tokens sampled and scored (every
    response at its length limit; 0 when nothing is sampled)."""

    prompts: int
    samples: int
    responses: int
    negatives: int | None  # None: every prompt (the full matrices)
    xz_pairs: int
    flow_pairs: int
    max_tokens: int
    rows: int  # the rows the prompts came from (identical ones count as one prompt)


def unit_cost(
    prompts: int, samples: int, max_new_tokens: int, negatives: int | None, flow: bool,
    responses: int | None = None, rows: int | None = None,
) -> Cost:  # fmt: skip
    """SPEC "Sampled negatives and swaps": each of the N x K traces is scored under its own
    prompt and M others (all N when M >= N - 1 or with no bound); with the flow, its action
    under those M + 1 inputs (`action_input`), and with the reasoning of its own prompt's K
    traces and 2M others swapped in (all N x K traces when that is fewer), once under its own
    input (`action_reasoning`) and once under theirs (`action_natural`). `responses`: the
    traces there are, when fewer than N x K (rollouts with groups of unequal size)."""
    traces = prompts * samples
    full = negatives is None or negatives >= prompts - 1
    columns = prompts if full else negatives + 1
    swaps = traces if negatives is None else min(traces, samples + swap_count(negatives))
    xz = traces * columns
    flow_pairs = traces * columns + 2 * traces * swaps if flow else 0
    return Cost(
        prompts, samples, traces if responses is None else responses,
        None if full else negatives, xz, flow_pairs, (traces + xz + flow_pairs) * max_new_tokens,
        prompts if rows is None else rows,
    )  # fmt: skip
