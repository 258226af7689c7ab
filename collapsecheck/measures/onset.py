"""Where in a training run the reasoning stopped depending on the input. Pure: regimes and
metric estimates in step order in, the onset out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from collapsecheck.measures.metrics import MetricValue, interval_bounds, point_value
from collapsecheck.measures.verdict import COLLAPSES

ONSET_METRIC = "normalized_mi"
# How each rule reads in a table or a plot: a significant drop can still be grounded.
KINDS = {"collapse": "collapsed", "mi_drop": "decline begins"}


@dataclass(frozen=True)
class Onset:
    index: int  # position in the run's step order
    rule: str  # "collapse" or "mi_drop"
    reason: str

    @property
    def kind(self) -> str:
        return KINDS[self.rule]

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "kind": self.kind}


def collapse_onset(regimes: Sequence[str]) -> int | None:
    """First index from which every regime is a collapse (inconclusive breaks the streak)."""
    onset = None
    for index, regime in enumerate(regimes):
        if regime not in COLLAPSES:
            onset = None
        elif onset is None:
            onset = index
    return onset


def mi_drop_onset(values: Sequence[MetricValue]) -> tuple[int, int] | None:
    """First index whose interval lies wholly below the interval of the best earlier step,
    with the index of that best step."""
    best = None
    for index, metric in enumerate(values):
        if best is not None and interval_bounds(metric)[1] < interval_bounds(values[best])[0]:
            return index, best
        if best is None or point_value(metric) > point_value(values[best]):
            best = index
    return None


def detect_onset(
    labels: Sequence[str], regimes: Sequence[str], mi: Sequence[MetricValue]
) -> Onset | None:
    """The earlier of: the step from which the run stays collapsed, and the first step whose
    normalized MI falls significantly (non-overlapping 95% intervals) below its best earlier
    value."""
    candidates = []
    collapsed = collapse_onset(regimes)
    if collapsed is not None:
        candidates.append(
            Onset(
                collapsed,
                "collapse",
                f"from step {labels[collapsed]} on every verdict is a collapse",
            )
        )
    dropped = mi_drop_onset(mi)
    if dropped is not None:
        index, best = dropped
        low, high = interval_bounds(mi[index])
        best_low, best_high = interval_bounds(mi[best])
        candidates.append(
            Onset(
                index,
                "mi_drop",
                f"normalized MI at step {labels[index]} [{low:.2f}, {high:.2f}] is significantly "
                f"below its best earlier value at step {labels[best]} [{best_low:.2f}, "
                f"{best_high:.2f}]",
            )
        )
    return min(candidates, key=lambda o: o.index, default=None)
