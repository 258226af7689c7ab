"""Input dependence by turn (SPEC "Agents across turns"): for each turn index t, the turn-t
pairs cross-scored among the distinct turn-t contexts, read with the metrics of SPEC
"Metrics"; and the finding where an early turn is grounded and a later one collapsed beyond
their intervals. Pure: the matrices come in, entries go out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collapsecheck.measures.metrics import (
    Estimate,
    MetricValue,
    interval_bounds,
    interval_text,
)
from collapsecheck.measures.verdict import DEPENDENCE_KEYS, Thresholds

BY_TURN_KEYS = ("normalized_mi", "retrieval_skill", "conditional_entropy_est")
TOO_FEW = "fewer than 2 distinct contexts at this turn"


@dataclass(frozen=True)
class TurnDependence:
    """One turn index: N_t (`contexts`), the pairs scored, and the metrics with their
    intervals (empty where not measured, `reason` saying why)."""

    turn: int
    contexts: int
    pairs: int
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    reason: str | None = None

    @property
    def measured(self) -> bool:
        return bool(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        from_metrics: dict[str, Any] = {}
        for key in BY_TURN_KEYS:
            metric = self.metrics.get(key, math.nan)
            if isinstance(metric, Estimate):
                from_metrics[key] = metric.to_json()
            else:
                from_metrics[key] = None if math.isnan(metric) else float(metric)
        return {
            "turn": self.turn, "contexts": self.contexts, "pairs": self.pairs, **from_metrics,
            **({"reason": self.reason} if self.reason else {}),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnDependence:
        metrics = {
            key: Estimate.from_json(data[key]) if isinstance(data[key], dict) else math.nan
            for key in BY_TURN_KEYS
            if data.get(key) is not None
        }
        return cls(int(data["turn"]), int(data["contexts"]), int(data["pairs"]), metrics,
                   data.get("reason"))  # fmt: skip


def turn_entry(
    turn: int, contexts: int, pairs: int, metrics: Mapping[str, MetricValue] | None
) -> TurnDependence:
    """A turn's entry: its by-turn metrics out of a full metric set, or not measured where
    it has fewer than 2 contexts (`metrics` None)."""
    if contexts < 2 or metrics is None:
        return TurnDependence(turn, contexts, pairs, reason=TOO_FEW)
    return TurnDependence(turn, contexts, pairs, {k: metrics[k] for k in BY_TURN_KEYS})


def _level(entry: TurnDependence, thresholds: Thresholds) -> str | None:
    """ "grounded" where every dependence metric is at or above dependence_high beyond its
    interval, "collapsed" where every one is at or below dependence_collapsed beyond it."""
    if not entry.measured or not all(k in entry.metrics for k in DEPENDENCE_KEYS):
        return None
    bounds = [interval_bounds(entry.metrics[k]) for k in DEPENDENCE_KEYS]
    if all(low >= thresholds.dependence_high for low, _ in bounds):
        return "grounded"
    if all(high <= thresholds.dependence_collapsed for _, high in bounds):
        return "collapsed"
    return None


def stops_reading(turns: Sequence[TurnDependence], thresholds: Thresholds) -> str | None:
    """The finding "the agent reads its first state, then stops reading": the first turn
    grounded beyond its intervals followed by a later one collapsed beyond its intervals;
    None where there is none."""
    levels = [(entry, _level(entry, thresholds)) for entry in turns]
    grounded = next((e for e, level in levels if level == "grounded"), None)
    if grounded is None:
        return None
    later = next(
        (e for e, level in levels if level == "collapsed" and e.turn > grounded.turn), None
    )
    if later is None:
        return None
    read, unread = (interval_text(e.metrics["normalized_mi"]) for e in (grounded, later))
    return (
        f"the agent reads its state at turn {grounded.turn} (normalized MI {read}), then stops "
        f"reading: at turn {later.turn} its reasoning no longer depends on the input "
        f"(normalized MI {unread}), beyond both intervals"
    )
