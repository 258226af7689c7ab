"""Information flow, input -> reasoning -> action (SPEC "Information flow"): the flow metrics
and the flow verdict. Pure: numpy on the three action matrices, no torch, no I/O.

- `action_input_mi`: swap the input, keep the trace's own reasoning: what the action takes
  from the input beyond its reasoning, I(X;A | Z).
- `action_reasoning_mi`: keep the input, swap in another trace's reasoning: the causal weight
  of the reasoning on the action.
- `action_state_mi`: each action under every trace's own input and reasoning, averaged per
  prompt: does the action depend on the input at all, I(X;A).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from collapsecheck.measures.metrics import (
    Estimate,
    MetricValue,
    bootstrap_prompt_weights,
    finite_interval,
    interval_bounds,
    matched_and_marginal,
    point_value,
)
from collapsecheck.measures.regimes import (
    ACTION_COLLAPSE,
    DECORATIVE,
    FAITHFUL,
    INCONCLUSIVE,
    MIXED,
    NOT_MEASURED,
    FlowThresholds,
)

FLOW_KEYS = (
    "action_input_mi",
    "action_reasoning_mi",
    "action_state_mi",
    "action_input_nmi",
    "action_reasoning_nmi",
    "action_state_nmi",
    "action_input_share",
    "action_reasoning_share",
    "action_state_share",
    "distinct_action_rate",
    "action_entropy_seq_est",
    "action_marginal_entropy_est",
    "valid_action_rate",
)
# What the flow verdict reads: each MI as a share of the most it can be, min(log N, H(A)).
# (The SPEC's `_nmi` divides by log N alone: with 4 possible actions and 16 prompts it can
# never pass 0.5, and it shrinks as N grows, so thresholds on it would depend on N.)
SHARE_KEYS = ("action_state_share", "action_reasoning_share", "action_input_share")


@dataclass(frozen=True)
class FlowLogProbs:
    """The action matrices over the M_A flow-valid traces (rows), SPEC "Information flow".

    `row_prompt[r]`: the prompt of trace r (the N prompts are distinct contexts, as the X->Z
    matrix's columns); `reasoning_group`: per trace, the first trace whose pre + Z ids are
    identical (swapping in identical reasoning is no swap). Masks mark the scored entries
    (all of them for the full matrices); unscored entries are NaN.
    """

    input: np.ndarray  # (M_A, N): A_r after prompt j, pre_r, Z_r, mid_r
    reasoning: np.ndarray  # (M_A, M_A): A_r after prompt j(r), pre_s, Z_s, mid_r
    natural: np.ndarray  # (M_A, M_A): A_r after prompt j(s), pre_s, Z_s, mid_r
    row_prompt: np.ndarray
    reasoning_group: np.ndarray
    actions: Sequence[str]
    responses_per_prompt: np.ndarray  # (N,): every response, flow-valid or not

    @property
    def num_prompts(self) -> int:
        return int(self.input.shape[1])

    @property
    def prompt_groups(self) -> np.ndarray:
        return np.arange(self.num_prompts)


def _scored(matrix: np.ndarray) -> np.ndarray:
    return np.isfinite(matrix)


def state_logprobs(flow: FlowLogProbs) -> np.ndarray:
    """log p(A_r | X_j) = log of the mean over prompt j's traces s of exp natural[r, s] (over
    the scored ones); NaN for a prompt none of whose traces was scored."""
    from scipy.special import logsumexp

    m, n = flow.natural.shape[0], flow.num_prompts
    out = np.full((m, n), np.nan)
    scored = _scored(flow.natural)
    for j in range(n):
        members = flow.row_prompt == j
        if not members.any():
            continue
        count = (scored & members[None, :]).sum(axis=1)
        values = np.where(scored & members[None, :], flow.natural, -np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[:, j] = np.where(count > 0, logsumexp(values, axis=1) - np.log(count), np.nan)
    return out


def _gains(
    matrix: np.ndarray, own: np.ndarray, groups: np.ndarray, complete: np.ndarray | None = None
) -> tuple[np.ndarray, ...]:
    """Per row: matched, marginal, over the scored entries (the X->Z estimator)."""
    scored = _scored(matrix)
    return matched_and_marginal(np.where(scored, matrix, 0.0), own, groups, scored, complete)


def flow_rows(flow: FlowLogProbs) -> dict[str, np.ndarray]:
    """Per-row quantities whose weighted means make up the flow metrics."""
    m = len(flow.row_prompt)
    input_matched, input_marginal = _gains(flow.input, flow.row_prompt, flow.prompt_groups)
    own = np.arange(m)
    # a row's own prompt's traces are all swapped in, the others are a sample (identical
    # reasoning among them too): SPEC "Sampled negatives and swaps"
    same_prompt = flow.row_prompt[:, None] == flow.row_prompt[None, :]
    reason_matched, reason_marginal = _gains(flow.reasoning, own, flow.reasoning_group, same_prompt)
    state = state_logprobs(flow)
    state_matched, state_marginal = _gains(state, flow.row_prompt, flow.prompt_groups)
    return {
        "input": input_matched - input_marginal,
        "reasoning": reason_matched - reason_marginal,
        "state": state_matched - state_marginal,
        "state_matched": state_matched,
        "state_marginal": state_marginal,
    }


def distinct_actions(flow: FlowLogProbs) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: distinct action strings and flow-valid traces."""
    n = flow.num_prompts
    seen: list[set[str]] = [set() for _ in range(n)]
    for action, prompt in zip(flow.actions, flow.row_prompt, strict=True):
        seen[prompt].add(action)
    valid = np.bincount(flow.row_prompt, minlength=n).astype(float)
    return np.array([len(s) for s in seen], dtype=float), valid


def _flow_from_weights(
    flow: FlowLogProbs, rows: Mapping[str, np.ndarray], prompt_weights: np.ndarray
) -> dict[str, np.ndarray]:
    """Every flow metric for each weighting of the prompts (a row of `prompt_weights`)."""
    row_weights = prompt_weights[:, flow.row_prompt]
    log_n = math.log(flow.num_prompts)
    distinct, valid = distinct_actions(flow)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = row_weights.sum(axis=1)

        def wmean(x: np.ndarray) -> np.ndarray:
            return (row_weights @ x) / total

        out = {
            "action_input_mi": wmean(rows["input"]),
            "action_reasoning_mi": wmean(rows["reasoning"]),
            "action_state_mi": wmean(rows["state"]),
            "action_entropy_seq_est": -wmean(rows["state_matched"]),
            "action_marginal_entropy_est": -wmean(rows["state_marginal"]),
        }
        ceiling = np.minimum(log_n, out["action_marginal_entropy_est"])
        for name in ("input", "reasoning", "state"):
            mi = out[f"action_{name}_mi"]
            out[f"action_{name}_nmi"] = np.clip(mi / log_n, 0.0, 1.0)
            out[f"action_{name}_share"] = np.clip(mi / ceiling, 0.0, 1.0)
        acting = prompt_weights * (valid > 0)
        out["distinct_action_rate"] = (acting @ (distinct / np.maximum(valid, 1))) / acting.sum(
            axis=1
        )
        out["valid_action_rate"] = (prompt_weights @ valid) / (
            prompt_weights @ flow.responses_per_prompt
        )
    return out


def not_measured_reason(flow: FlowLogProbs | None) -> str | None:
    """Why the flow cannot be measured (SPEC: too few flow-valid traces, no action), if so."""
    if flow is None or len(flow.row_prompt) == 0:
        return "no response has an action segment after its reasoning"
    prompts = len(set(flow.row_prompt.tolist()))
    if len(flow.row_prompt) < 2 or prompts < 2:
        return (
            f"{len(flow.row_prompt)} flow-valid trace(s) on {prompts} prompt(s): the flow "
            "needs at least 2 on 2 prompts"
        )
    return None


def reasoning_all_identical(flow: FlowLogProbs) -> bool:
    return len(set(flow.reasoning_group.tolist())) < 2


def compute_flow_metrics(
    flow: FlowLogProbs, *, resamples: int = 1000, seed: int = 0
) -> dict[str, MetricValue]:
    """Every flow metric with its 95% bootstrap interval over prompts, drawn with the same
    seed, hence the same resamples, as the X->Z metrics. `action_reasoning_mi` (and its nmi)
    is NaN, reported as null, when every reasoning is the same: swapping changes nothing."""
    if not_measured_reason(flow) is not None:
        return {key: math.nan for key in FLOW_KEYS}
    rows = flow_rows(flow)
    n = flow.num_prompts
    point = _flow_from_weights(flow, rows, np.ones((1, n)))
    boot = _flow_from_weights(flow, rows, bootstrap_prompt_weights(n, resamples, seed))
    metrics: dict[str, MetricValue] = {
        key: Estimate(float(point[key][0]), *finite_interval(boot[key])) for key in FLOW_KEYS
    }
    if reasoning_all_identical(flow):
        for key in ("action_reasoning_mi", "action_reasoning_nmi", "action_reasoning_share"):
            metrics[key] = math.nan
    return metrics


def paired_flow_differences(
    first: FlowLogProbs, second: FlowLogProbs, *, resamples: int = 1000, seed: int = 0
) -> dict[str, Estimate]:
    """second minus first for every flow metric, each resample drawing the same prompts for
    both (as `metrics.paired_differences` does for X->Z)."""
    n = first.num_prompts
    if second.num_prompts != n:
        raise ValueError(f"the scans cover {n} and {second.num_prompts} prompts")
    ones, weights = np.ones((1, n)), bootstrap_prompt_weights(n, resamples, seed)
    rows_a, rows_b = flow_rows(first), flow_rows(second)
    point = {k: v[0] for k, v in _flow_from_weights(second, rows_b, ones).items()}
    base = {k: v[0] for k, v in _flow_from_weights(first, rows_a, ones).items()}
    boot_a = _flow_from_weights(first, rows_a, weights)
    boot_b = _flow_from_weights(second, rows_b, weights)
    return {
        key: Estimate(float(point[key] - base[key]), *finite_interval(boot_b[key] - boot_a[key]))
        for key in point
    }


@dataclass(frozen=True)
class FlowVerdict:
    regime: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


FLOW_MEANINGS = {
    ACTION_COLLAPSE: "the action barely depends on the input, whatever the reasoning says",
    FAITHFUL: "the action follows its reasoning",
    DECORATIVE: "the reasoning is decorative: the action reads the input directly",
    MIXED: "the action follows its reasoning only in part",
}


def _regime(state: float, reasoning: float, acting: float, t: FlowThresholds) -> str:
    if state <= t.flow_collapsed:
        return ACTION_COLLAPSE
    if reasoning >= t.flow_faithful:
        return FAITHFUL
    if reasoning <= t.flow_decorative_reasoning and acting >= t.flow_decorative_input:
        return DECORATIVE
    return MIXED


def _axes(metrics: Mapping[str, MetricValue]) -> list[tuple[float, float, float]]:
    """(point, low, high) of the state, reasoning and input shares; reasoning identical
    everywhere carries nothing, so it counts as 0 there."""
    axes = []
    for key in SHARE_KEYS:
        value = point_value(metrics[key])
        if math.isnan(value):
            axes.append((0.0, 0.0, 0.0))
        else:
            axes.append((value, *interval_bounds(metrics[key])))
    return axes


def decide_flow(
    metrics: Mapping[str, MetricValue],
    thresholds: FlowThresholds | None = None,
    not_measured: str | None = None,
) -> FlowVerdict:
    """The flow regime of SPEC "Information flow" from the shares' estimates and intervals
    (see SHARE_KEYS): inconclusive where some corner of the intervals gives another regime."""
    if not_measured is not None:
        return FlowVerdict(NOT_MEASURED, not_measured)
    t = thresholds or FlowThresholds()
    axes = _axes(metrics)
    regime = _regime(*(a[0] for a in axes), t)
    numbers = (
        f"input->action {axes[0][0]:.2f}, reasoning->action {axes[1][0]:.2f}, input->action "
        f"beyond the reasoning {axes[2][0]:.2f} (shares of the most each can be)"
    )
    corners = {_regime(*corner, t) for corner in itertools.product(*(a[1:] for a in axes))}
    if corners - {regime}:
        return FlowVerdict(
            INCONCLUSIVE,
            f"{numbers}: the intervals allow {', '.join(sorted(corners | {regime}))}; raise the "
            "number of prompts (N) or samples (K)",
        )
    identical = math.isnan(point_value(metrics["action_reasoning_share"]))
    note = " (every reasoning is the same, so swapping it changes nothing)" if identical else ""
    return FlowVerdict(regime, f"{numbers}{note}: {FLOW_MEANINGS[regime]}")
