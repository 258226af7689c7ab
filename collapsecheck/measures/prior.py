"""Where the template came from (SPEC "Scored under the start"): each scored row's reasoning
read under the baseline B, the policy the run started from. How probable the policy's
reasoning is under B, what a KL penalty to B charges for it, and whether it is B's own
high-probability text amplified or text B would not write. Pure: numpy on per-row arrays,
no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from collapsecheck.measures.metrics import (
    Estimate,
    MetricValue,
    bootstrap_prompt_weights,
    finite_interval,
    point_value,
)

PRIOR_KEYS = ("prior_logprob", "prior_logprob_seq", "prior_kl", "prior_kl_seq")
TYPICALITY = "prior_typicality"
PRIOR_METRICS = (*PRIOR_KEYS, TYPICALITY)
BASELINE_ENTROPY = "conditional_entropy_seq_est"  # the baseline's own, from its scan
START_MODE, LEARNED, START_TYPICAL = "start_mode", "learned_template", "start_typical"
NOT_MEASURED = "not_measured"
PRIOR_FOREIGN = 1.0  # typicality below -1 x the baseline's entropy: text it would not write


@dataclass(frozen=True)
class PriorLogProbs:
    """Per scored row r (the rows of the cross log-probability matrix): `prior` = log
    p_B(Z_r | c_r), `own` = log p_policy(Z_r | c_r) (the matrix's entry under r's own
    prompt), each summed over Z_r's `tokens`."""

    prior: np.ndarray
    own: np.ndarray
    tokens: np.ndarray
    row_prompt: np.ndarray
    num_prompts: int


def prior_row_values(logprobs: PriorLogProbs) -> dict[str, np.ndarray]:
    """Per row, the value each PRIOR_KEY averages: per token (no suffix) and per trace."""
    prior, kl = logprobs.prior, logprobs.own - logprobs.prior
    tokens = np.maximum(logprobs.tokens, 1)
    return {
        "prior_logprob": prior / tokens,
        "prior_logprob_seq": prior,
        "prior_kl": kl / tokens,
        "prior_kl_seq": kl,
    }


def compute_prior(logprobs: PriorLogProbs, *, resamples: int, seed: int) -> dict[str, MetricValue]:
    """PRIOR_KEYS: means over the scored rows, each with its 95% bootstrap interval over
    prompts (the resamples every metric of the scan draws)."""
    rows = prior_row_values(logprobs)
    draws = bootstrap_prompt_weights(logprobs.num_prompts, resamples, seed)
    weights = draws[:, logprobs.row_prompt]
    total = weights.sum(axis=1)
    out: dict[str, MetricValue] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for key, values in rows.items():
            boot = (weights @ values) / total
            out[key] = Estimate(float(values.mean()), *finite_interval(boot))
    return out


def typicality(prior_seq: Estimate, baseline_entropy: Estimate) -> Estimate:
    """`prior_typicality` = prior_logprob_seq - (-H_B), H_B the baseline's own
    conditional_entropy_seq_est on the same prompts. The two come from independent samples
    (the policy's traces, the baseline's own): each side's half-widths add in quadrature."""
    p, h = prior_seq, baseline_entropy
    value = p.value + h.value
    below, above = (
        math.hypot(p.value - p.low, h.value - h.low),
        math.hypot(p.high - p.value, h.high - h.value),
    )
    return Estimate(value, value - below, value + above)


@dataclass(frozen=True)
class PriorReading:
    """Which of SPEC's cases the reasoning is, and why, in words."""

    regime: str
    reason: str
    baseline: str | None = None

    def to_dict(self) -> dict:
        return {"regime": self.regime, "reason": self.reason, "baseline": self.baseline}

    @classmethod
    def from_dict(cls, data: Mapping) -> PriorReading:
        return cls(data["regime"], data["reason"], data.get("baseline"))


NO_PRIOR = {"regime": NOT_MEASURED, "reason": "no --baseline", "baseline": None}
AWAITING_START = "prior_typicality needs the baseline's own scan of the same prompts"


def read_prior(
    metrics: Mapping[str, MetricValue], baseline_entropy: Estimate, baseline: str,
    foreign: float = PRIOR_FOREIGN,
) -> PriorReading:  # fmt: skip
    """SPEC "Scored under the start": the start's own mode (typicality above 0 beyond its
    interval), a learned template (below -foreign x H_B beyond it), else about as probable
    as the start's own text."""
    typical = metrics[TYPICALITY]
    kl, prior = metrics["prior_kl_seq"], metrics["prior_logprob_seq"]
    if not isinstance(typical, Estimate) or math.isnan(typical.value):
        return PriorReading(NOT_MEASURED, "no reasoning was scored under the baseline", baseline)
    numbers = (
        f"under the start its reasoning scores {prior.value:.1f} nats a trace, its own traces "
        f"{-baseline_entropy.value:.1f} (typicality {_signed(typical)}); a KL penalty to the "
        f"start charges it {point_value(kl):.1f} nats a trace"
    )
    if typical.low > 0:
        regime, what = START_MODE, "the start's own high-probability text, amplified"
    elif typical.high < -foreign * baseline_entropy.value:
        regime, what = LEARNED, "text the start would not write, taught by the reward"
    else:
        regime, what = START_TYPICAL, "about as probable under the start as its own text"
    return PriorReading(regime, f"{what}: {numbers}", baseline)


def _signed(estimate: Estimate) -> str:
    return f"{estimate.value:+.1f} [{estimate.low:+.1f}, {estimate.high:+.1f}]"
