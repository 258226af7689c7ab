"""The regime verdict of SPEC "The verdict": two axes read from estimates and their intervals.

Pure: takes the metric mapping of `collapsecheck.measures.metrics.compute_metrics`,
returns a Verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from collapsecheck.formatting import format_traces, plural
from collapsecheck.measures.metrics import (
    CrossLogProbs,
    MetricValue,
    PromptCounts,
    interval_bounds,
    point_value,
)
from collapsecheck.measures.regimes import (
    COLLAPSES,
    GROUNDED,
    INCONCLUSIVE,
    LOW_ENTROPY_COLLAPSE,
    TEMPLATE_COLLAPSE,
    Thresholds,
)

DEPENDENCE_KEYS = ("retrieval_skill", "normalized_mi")
ENTROPY_KEY = "conditional_entropy_est"  # H(Z|X) per token (SPEC "The verdict")
# Matched below the marginal by more than this share of log N, beyond noise: the traces are
# unlikely under this checkpoint and these contexts, which says nothing about collapse.
MISMATCH_NMI = 0.05
# Prompts with a scored trace a verdict needs (SPEC "Enough to carry a verdict"): below 4, more
# than the intervals' 2.5% tails are resamples of one prompt alone (a share u^(1 - u)).
MIN_SCORED_PROMPTS = 4


@dataclass(frozen=True)
class Support:
    """What the metrics rest on (a report's `counts`): every response, the traces scored (those
    with a reasoning segment) and the prompts they came from (the bootstrap's units)."""

    responses: int
    scored_traces: int
    scored_prompts: int
    truncated_responses: int = 0

    @classmethod
    def of(cls, counts: Mapping[str, Any]) -> Support:
        """From a report's `counts`."""
        names = ("responses", "scored_traces", "scored_prompts", "truncated_responses")
        return cls(*(int(counts[name]) for name in names))

    @classmethod
    def measured(cls, scores: CrossLogProbs, counts: PromptCounts) -> Support:
        """From the matrix and the per-prompt counts `compute_metrics` read (a training
        loop's own)."""
        rows = scores.row_prompt.tolist()
        return cls(int(counts.responses.sum()), len(rows), len(set(rows)),
                   int(counts.truncated.sum()))  # fmt: skip

    def shortfall(self) -> str | None:
        """Why these traces cannot carry a verdict (SPEC "Enough to carry a verdict"), or
        None where they can."""
        if self.scored_prompts >= MIN_SCORED_PROMPTS:
            return None
        unscored = self.responses - self.scored_traces
        verb = "has" if unscored == 1 else "have"
        why = f": {unscored} {verb} no reasoning segment" if unscored else ""
        cut = (
            f" ({self.truncated_responses} of the responses cut by the length limit)"
            if self.truncated_responses else ""
        )  # fmt: skip
        scored, prompts = plural(self.scored_traces, "trace"), plural(self.scored_prompts, "prompt")
        return (
            f"{scored} scored of {self.responses}{why}{cut}; they come from {prompts}, and a "
            f"verdict needs scored traces from at least {MIN_SCORED_PROMPTS}: raise the number "
            "of prompts (N) or samples (K), or name the reasoning segment the responses write"
        )


@dataclass(frozen=True)
class Verdict:
    """SPEC "The verdict". `kind_uncertain`: a collapse beyond its interval whose kind the
    entropy's interval leaves open; `regime` then names the point estimate's kind."""

    regime: str
    style: str | None
    partial: bool
    reason: str
    kind_uncertain: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def is_collapse(self) -> bool:
        return self.regime in COLLAPSES

    @property
    def label(self) -> str:
        """The regime with what qualifies it, as a person reads it:
        `template_collapse (partial, kind uncertain)`."""
        qualifiers = [q for q in (self.style, "partial" if self.partial else None) if q]
        if self.kind_uncertain:
            qualifiers.append("kind uncertain")
        return self.regime + (f" ({', '.join(qualifiers)})" if qualifiers else "")


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
    return (
        f"entropy {entropy:.3f} nats/token ({format_traces(effective)} effective traces per "
        f"prompt): {meaning}"
    )


def _straddle_phrase(name: str, metric: MetricValue, threshold: float) -> str:
    low, high = interval_bounds(metric)
    return f"{name} interval [{low:.2f}, {high:.2f}] straddles {threshold:g}"


def mismatch_reason(metrics: Mapping[str, MetricValue]) -> str | None:
    """Why the traces do not fit this checkpoint and these contexts, if they do not.

    Traces sampled by the policy under their own prompts have matched >= marginal in
    expectation (MI >= 0). Matched far below marginal, beyond noise, means they were not:
    rollouts from another checkpoint, or contexts other than the ones they were sampled under.
    """
    log_n = point_value(metrics.get("mi_upper_bound_distinct", metrics["mi_upper_bound"]))
    mi = metrics["mi_seq_estimate"]
    high = interval_bounds(mi)[1]
    if log_n <= 0 or high / log_n >= -MISMATCH_NMI:
        return None
    return (
        f"the reasoning is less likely under its own prompt than under the others "
        f"(MI {point_value(mi):.2f} nats/trace, interval up to {high:.2f}): the traces are "
        "unlikely under this checkpoint and these contexts (rollouts from another checkpoint, "
        "or contexts that differ from the ones they were sampled under), so this is no verdict "
        "on collapse; score them under the checkpoint and contexts that produced them"
    )


def decide(
    metrics: Mapping[str, MetricValue], support: Support, thresholds: Thresholds | None = None
) -> Verdict:
    """Regime from input dependence (retrieval skill, normalized MI) and diversity (H(Z|X)
    per token); inconclusive where too few prompts have a scored trace (`Support`), where the
    dependence's intervals leave both grounded and a collapse open, or where the traces do not
    fit the checkpoint (`mismatch_reason`). A collapse beyond its intervals whose kind the
    entropy's interval leaves open is a collapse, `kind_uncertain`."""
    t = thresholds or Thresholds()
    cannot = support.shortfall() or mismatch_reason(metrics)
    if cannot is not None:
        return Verdict(regime=INCONCLUSIVE, style=None, partial=False, reason=cannot)
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
    if straddles:
        return Verdict(
            regime=INCONCLUSIVE,
            style=None,
            partial=False,
            reason=f"{_dependence_phrase(metrics, level)}; "
            f"{_diversity_phrase(metrics, low_entropy, level == 'high')}; but the "
            + " and the ".join(straddles)
            + ", so it could be grounded or a collapse: raise the number of prompts (N) or "
            "samples (K)",
        )

    grounded = level == "high"
    regime = GROUNDED if grounded else LOW_ENTROPY_COLLAPSE if low_entropy else TEMPLATE_COLLAPSE
    kind_uncertain = not grounded and entropy_is_ambiguous
    kind = (
        f"; the {_straddle_phrase('conditional entropy', entropy, t.entropy_low)}, so it is a "
        "collapse of either kind (template or low-entropy), named here by the point estimate"
        if kind_uncertain
        else ""
    )
    return Verdict(
        regime=regime,
        style=("compressed" if low_entropy else "diverse") if grounded else None,
        partial=level == "partial",
        reason=f"{_dependence_phrase(metrics, level)}; "
        f"{_diversity_phrase(metrics, low_entropy, grounded)}{kind}",
        kind_uncertain=kind_uncertain,
    )
