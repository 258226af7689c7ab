"""The plan: what a scan or a run will cost, worked out before any work and before any
weights load (SPEC "Sampled negatives and swaps" gives the pair counts). Pure arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from collapsecheck.formatting import format_number
from collapsecheck.settings import swap_count


def count(n: int) -> str:
    """A count as a person reads it: 2,048; 1.18e+07 past a million."""
    return f"{n:,}" if n < 1_000_000 else format_number(n)


@dataclass(frozen=True)
class Plan:
    """Per checkpoint: N prompts x K samples, the scored pairs of X->Z and of the flow, and an
    upper bound on the tokens sampled and scored (every response at its length limit)."""

    checkpoints: int
    cached: int
    prompts: int
    samples: int
    negatives: int | None  # None: every prompt (the full matrices)
    xz_pairs: int
    flow_pairs: int
    max_tokens: int

    @property
    def to_scan(self) -> int:
        return self.checkpoints - self.cached

    def line(self) -> str:
        cached = f" ({self.cached} cached)" if self.cached else ""
        negatives = "all prompts" if self.negatives is None else f"{self.negatives} negatives"
        flow = f", {count(self.flow_pairs)} flow pairs" if self.flow_pairs else ""
        return (
            f"plan: {self.checkpoints} checkpoint{'s' * (self.checkpoints != 1)}{cached}, "
            f"{self.prompts} prompts x {self.samples} samples, "
            f"{count(self.xz_pairs)} X->Z pairs ({negatives}){flow} per checkpoint; "
            f"at most {count(self.max_tokens * self.to_scan)} tokens to sample and score"
        )


def plan_work(
    prompts: int, samples: int, max_new_tokens: int, negatives: int | None, flow: bool,
    checkpoints: int = 1, cached: int = 0,
) -> Plan:  # fmt: skip
    """SPEC "Sampled negatives and swaps": each of the N x K traces is scored under its own
    prompt and M others (all N when M >= N - 1 or with no bound); with the flow, its action
    under those M + 1 inputs (`action_input`), and with the reasoning of its own prompt's K
    traces and 2M others swapped in (all N x K traces when that is fewer), once under its own
    input (`action_reasoning`) and once under theirs (`action_natural`)."""
    traces = prompts * samples
    full = negatives is None or negatives >= prompts - 1
    columns = prompts if full else negatives + 1
    swaps = traces if negatives is None else min(traces, samples + swap_count(negatives))
    xz = traces * columns
    flow_pairs = traces * columns + 2 * traces * swaps if flow else 0
    return Plan(
        checkpoints, cached, prompts, samples, None if full else negatives, xz, flow_pairs,
        (traces + xz + flow_pairs) * max_new_tokens,
    )  # fmt: skip
