"""The regime verdict of SPEC "The verdict": two axes read from estimates and their intervals.

Pure: takes the metric mapping of `collapsecheck.metrics.compute_metrics`, returns a Verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from collapsecheck.metrics import MetricValue, interval_bounds, point_value

GROUNDED = "grounded"
TEMPLATE_COLLAPSE = "template_collapse"
LOW_ENTROPY_COLLAPSE = "low_entropy_collapse"
INCONCLUSIVE = "inconclusive"
REGIMES = (GROUNDED, TEMPLATE_COLLAPSE, LOW_ENTROPY_COLLAPSE, INCONCLUSIVE)
COLLAPSES = (TEMPLATE_COLLAPSE, LOW_ENTROPY_COLLAPSE)

DEPENDENCE_KEYS = ("retrieval_skill", "normalized_mi")
ENTROPY_KEY = "conditional_entropy_seq_est"


@dataclass(frozen=True)
class Thresholds:
    """Verdict thresholds (SPEC defaults; every one is a CLI option and a config value)."""

    dependence_high: float = 0.7
    dependence_collapsed: float = 0.3
    entropy_low: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.dependence_collapsed <= self.dependence_high <= 1.0:
            raise ValueError(
                "thresholds need 0 <= dependence_collapsed <= dependence_high <= 1, got "
                f"{self.dependence_collapsed} and {self.dependence_high}"
            )


@dataclass(frozen=True)
class Verdict:
    regime: str
    style: str | None
    partial: bool
    reason: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def is_collapse(self) -> bool:
        return self.regime in COLLAPSES


def _dependence_level(values: list[float], t: Thresholds) -> str:
    if all(v >= t.dependence_high for v in values):
        return "high"
    if all(v <= t.dependence_collapsed for v in values):
        return "collapsed"
    return "partial"


def _dependence_phrase(metrics: Mapping[str, MetricValue], level: str) -> str:
    meaning = {
        "high": "reasoning depends on the input",
        "partial": "reasoning depends on the input only in part",
        "collapsed": "reasoning does not depend on the input",
    }[level]
    return (
        f"retrieval {point_value(metrics['retrieval_accuracy']):.2f} vs chance "
        f"{point_value(metrics['retrieval_chance_level']):.2f}, normalized MI "
        f"{point_value(metrics['normalized_mi']):.2f}: {meaning}"
    )


def _diversity_phrase(metrics: Mapping[str, MetricValue], low: bool, grounded: bool) -> str:
    entropy = point_value(metrics[ENTROPY_KEY])
    effective = point_value(metrics["effective_traces_per_prompt"])
    if low:
        meaning = "compressed, near-deterministic reasoning" if grounded else "it barely varies"
    else:
        meaning = "diverse reasoning" if grounded else "it still looks varied"
    count = f"{effective:,.0f}" if effective >= 100 else f"{effective:.1f}"
    return f"entropy {entropy:.1f} nats/trace ({count} effective traces per prompt): {meaning}"


def _straddle_phrase(name: str, metric: MetricValue, threshold: float) -> str:
    low, high = interval_bounds(metric)
    return f"{name} interval [{low:.2f}, {high:.2f}] straddles {threshold:g}"


def decide(metrics: Mapping[str, MetricValue], thresholds: Thresholds | None = None) -> Verdict:
    """Regime from input dependence (retrieval skill, normalized MI) and diversity (H(Z|X))."""
    t = thresholds or Thresholds()
    dependence = [point_value(metrics[k]) for k in DEPENDENCE_KEYS]
    level = _dependence_level(dependence, t)
    entropy = metrics[ENTROPY_KEY]
    low_entropy = point_value(entropy) < t.entropy_low

    pessimistic = [interval_bounds(metrics[k])[0] for k in DEPENDENCE_KEYS]
    optimistic = [interval_bounds(metrics[k])[1] for k in DEPENDENCE_KEYS]
    high_is_sure = _dependence_level(pessimistic, t) == "high"
    high_is_possible = _dependence_level(optimistic, t) == "high"
    entropy_low_bound, entropy_high_bound = interval_bounds(entropy)
    entropy_is_ambiguous = entropy_low_bound < t.entropy_low <= entropy_high_bound

    straddles = []
    if high_is_possible and not high_is_sure:
        straddles += [
            _straddle_phrase(k, metrics[k], t.dependence_high)
            for k in DEPENDENCE_KEYS
            if interval_bounds(metrics[k])[0] < t.dependence_high <= interval_bounds(metrics[k])[1]
        ]
    if not high_is_possible and entropy_is_ambiguous:
        straddles.append(_straddle_phrase("conditional entropy", entropy, t.entropy_low))
    if straddles:
        return Verdict(
            regime=INCONCLUSIVE,
            style=None,
            partial=False,
            reason=f"{_dependence_phrase(metrics, level)}; "
            f"{_diversity_phrase(metrics, low_entropy, level == 'high')}; but the "
            + " and the ".join(straddles)
            + ", so the regime could flip: raise the number of prompts (N) or samples (K)",
        )

    grounded = level == "high"
    regime = GROUNDED if grounded else LOW_ENTROPY_COLLAPSE if low_entropy else TEMPLATE_COLLAPSE
    return Verdict(
        regime=regime,
        style=("compressed" if low_entropy else "diverse") if grounded else None,
        partial=level == "partial",
        reason=f"{_dependence_phrase(metrics, level)}; "
        f"{_diversity_phrase(metrics, low_entropy, grounded)}",
    )
