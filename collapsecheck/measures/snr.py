"""Why it collapsed: reward variance and the SNR report (SPEC "Why: reward variance and the
SNR report"). Pure: numpy and scipy on per-prompt rewards and per-row statistics.

On prompts whose K rewards barely differ the task gradient vanishes; RAGEN-2 keeps the prompts
of highest within-prompt reward variance. Zero variance has three causes with three fixes:
too easy (every response at the batch's best reward), too hard (every one at the worst), and
an uninformative reward (all equal, in between, while the behaviours differ).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapsecheck.measures.metrics import (
    Estimate,
    bootstrap_prompt_weights,
    finite_interval,
    per_prompt_mean,
)

QUARTILES = 4
KEEP_SLACK = 0.01  # RAGEN's linear top-p rule: reach rho x total - 0.01


@dataclass(frozen=True)
class PromptRewards:
    """Per prompt: the mean and sample std (ddof 1; 0 for one response) of its rewards."""

    mean: np.ndarray
    std: np.ndarray
    first: np.ndarray  # one reward of each prompt (all equal where std is 0)

    @classmethod
    def of(cls, rewards: Sequence[Sequence[float]]) -> PromptRewards:
        arrays = [np.asarray(r, dtype=float) for r in rewards]
        if any(a.size == 0 for a in arrays):
            raise ValueError("every prompt needs at least one reward")
        if any(not np.isfinite(a).all() for a in arrays):
            raise ValueError("rewards must be finite numbers")
        return cls(
            mean=np.array([a.mean() for a in arrays]),
            std=np.array([a.std(ddof=1) if a.size > 1 else 0.0 for a in arrays]),
            first=np.array([a[0] for a in arrays]),
        )


def zero_variance_split(rewards: PromptRewards) -> dict[str, np.ndarray]:
    """Masks of the prompts whose rewards all tie, split by cause: at the batch's highest
    reward (too easy), at its lowest (too hard), or in between (uninformative). When every
    reward of the batch is the same there is no highest or lowest: uninformative."""
    tie = rewards.std == 0
    high, low = rewards.first.max(), rewards.first.min()
    spread = rewards.mean.max() > rewards.mean.min() or high > low
    easy = tie & spread & (rewards.first == high)
    hard = tie & spread & (rewards.first == low)
    return {"zero": tie, "too_easy": easy, "too_hard": hard, "uninformative": tie & ~easy & ~hard}


def snr_keep(std: np.ndarray, top_p: float) -> np.ndarray:
    """RAGEN's SNR-aware filter, linear top-p: prompts by reward std, descending; keep the
    shortest prefix whose summed std reaches top_p x total - 0.01; a std of 0 is never kept."""
    order = np.argsort(-std, kind="stable")
    total = std.sum()
    keep = np.zeros(len(std), dtype=bool)
    if total <= 0:
        return keep
    reached = np.cumsum(std[order]) >= top_p * total - KEEP_SLACK
    count = int(np.argmax(reached)) + 1 if reached.any() else len(std)
    keep[order[:count]] = True
    return keep & (std > 0)


def quartile_groups(std: np.ndarray) -> np.ndarray:
    """Each prompt's reward-variance group, 0 (lowest std) to 3, as equal in size as ties
    allow: prompts with the same std share a group."""
    n = len(std)
    values, counts = np.unique(std, return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)[:-1]])
    group_of_value = np.minimum(((before + counts / 2) * QUARTILES / n).astype(int), QUARTILES - 1)
    return group_of_value[np.searchsorted(values, std)]


def _weighted(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ values) / weights.sum(axis=1)


@dataclass(frozen=True)
class RowStatistics:
    """Per valid trace (row): its prompt, its own MI (matched - marginal, nats) and whether
    its own prompt retrieved it (SPEC's tie rule), from the X->Z matrix of all N prompts."""

    row_prompt: np.ndarray
    mi: np.ndarray
    hit: np.ndarray


def own_mi_per_prompt(rows: RowStatistics, num_prompts: int) -> np.ndarray:
    """Per prompt, the mean of matched - marginal over its rows, / log N (NaN without rows)."""
    return per_prompt_mean(rows.row_prompt, rows.mi, num_prompts) / math.log(num_prompts)


def quartile_table(
    rewards: PromptRewards, rows: RowStatistics, resamples: int, seed: int
) -> list[dict[str, object]]:
    """RAGEN-2's table: per reward-variance group, its prompts, mean reward and std, and the
    normalized MI and retrieval accuracy of its rows, each with a bootstrap interval over the
    group's prompts."""
    n = len(rewards.std)
    groups = quartile_groups(rewards.std)
    boot = bootstrap_prompt_weights(n, resamples, seed)
    table = []
    for group in range(QUARTILES):
        members = groups == group
        if not members.any():
            continue
        prompt_weights = np.vstack([members.astype(float), boot * members])
        row_weights = prompt_weights[:, rows.row_prompt]
        columns = {
            "reward_mean": _weighted(rewards.mean, prompt_weights),
            "reward_std": _weighted(rewards.std, prompt_weights),
            "normalized_mi": np.clip(_weighted(rows.mi, row_weights) / math.log(n), 0, 1),
            "retrieval_accuracy": _weighted(rows.hit, row_weights),
        }
        row: dict[str, object] = {"quartile": group + 1, "prompts": int(members.sum())}
        for key, draws in columns.items():
            row[key] = Estimate(float(draws[0]), *finite_interval(draws[1:]))
        table.append(row)
    return table


def rv_mi_spearman(std: np.ndarray, own_mi: np.ndarray, resamples: int, seed: int) -> Estimate:
    """Spearman correlation of a prompt's reward std and its own normalized MI, with a
    bootstrap interval over prompts (NaN where either is constant)."""
    usable = np.isfinite(own_mi)

    def rho(index: np.ndarray) -> float:
        from scipy.stats import spearmanr

        x, y = std[index], own_mi[index]
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            return math.nan
        return float(spearmanr(x, y).statistic)

    prompts = np.flatnonzero(usable)
    rng = np.random.default_rng(seed)
    draws = np.array(
        [rho(rng.choice(prompts, size=len(prompts))) for _ in range(resamples)]
    ) if len(prompts) > 2 else np.array([])  # fmt: skip
    return Estimate(rho(prompts), *finite_interval(draws))


def snr_section(
    rewards: PromptRewards,
    rows: RowStatistics,
    distinct_behaviour: np.ndarray,
    *,
    top_p: float = 0.9,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, object]:
    """Every key of SPEC's SNR report. `distinct_behaviour`: per prompt, distinct actions (or
    responses) / responses, for the zero-variance prompts' behaviour rate."""
    n = len(rewards.std)
    split = zero_variance_split(rewards)
    zero = split["zero"]
    keep = snr_keep(rewards.std, top_p)
    own_mi = own_mi_per_prompt(rows, n)
    return {
        "rollout/in_group_reward_mean": float(rewards.mean.mean()),
        "rollout/in_group_reward_std": float(rewards.std.mean()),
        "frac_reward_zero_std": float(zero.mean()),
        "zero_std_too_easy": float(split["too_easy"].mean()),
        "zero_std_too_hard": float(split["too_hard"].mean()),
        "zero_std_uninformative": float(split["uninformative"].mean()),
        "distinct_action_rate_at_zero_std": (
            float(distinct_behaviour[zero].mean()) if zero.any() else None
        ),
        "rv_mi_spearman": rv_mi_spearman(rewards.std, own_mi, resamples, seed),
        "quartiles": quartile_table(rewards, rows, resamples, seed),
        "snr_top_p": top_p,
        "rollout/filter_kept_ratio": float(keep.mean()),
        "kept_prompts": np.flatnonzero(keep).tolist(),
    }
