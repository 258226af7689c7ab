"""Where the input shows in the reasoning (SPEC "Where the input shows"): each scored row's
matched - marginal split over its reasoning tokens, exactly, by the chain rule, and how sure a
reader of the first t tokens is of the trace's own prompt. No new sampling: the per-token
log-probabilities of the cross-scoring pairs are all it needs. Pure: numpy/scipy on arrays,
no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from collapsecheck.measures.metrics import (
    Estimate,
    MetricValue,
    bootstrap_prompt_weights,
    finite_interval,
    paired_bootstrap,
    point_value,
)

POSITIONS = 10  # information_by_position: the reasoning in tenths
NAMED = 0.5  # a trace names its prompt once its own prompt's posterior passes one half
WHERE_KEYS = ("input_named_rate", "input_named_at")
EARLY_CENTRE, LATE_CENTRE = 1 / 3, 2 / 3  # where the information's centre reads early, late
NOWHERE_SHARE = 0.01  # a tenth carries information when its interval is above 1% of log N
BULK = 0.75  # the reason names the shortest span of tenths holding this share of it
SPREAD, EARLY, LATE, NOWHERE = "spread", "early", "late", "nowhere"
NOT_MEASURED = "not_measured"


@dataclass(frozen=True)
class ReasoningTokenLogProbs:
    """l_j(t) of SPEC "Where the input shows", per scored row r (the rows of the cross
    log-probability matrix): `logprobs[r]` (len(columns[r]), T_r), row r's reasoning tokens
    under each column its marginal uses, `columns[r]` (increasing). `column_group`: per
    column, its group of identical contexts (each column its own by default)."""

    logprobs: list[np.ndarray]
    columns: list[np.ndarray]
    row_prompt: np.ndarray
    num_prompts: int
    column_group: np.ndarray | None = None


@dataclass(frozen=True)
class TokenInformation:
    """Per token of every scored row, rows one after another (row r's tokens are
    `offsets[r]:offsets[r + 1]`): its `information` in nats and the own prompt's posterior
    after it (`own_posterior`)."""

    information: np.ndarray
    own_posterior: np.ndarray
    offsets: np.ndarray

    def of_row(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        span = slice(self.offsets[row], self.offsets[row + 1])
        return self.information[span], self.own_posterior[span]

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1


def column_weights(own: np.ndarray, num_prompts: int) -> np.ndarray:
    """w_j of the marginal a row's columns make (`own`: which of them are its own prompt's
    group): 1 for each own column; with sampled negatives each of the m other scored columns
    stands for P / m of the P others, so the weights sum to N (SPEC "Sampled negatives")."""
    others = int((~own).sum())
    population = num_prompts - int(own.sum())
    return np.where(own, 1.0, population / max(others, 1))


def row_information(
    logprobs: np.ndarray, weights: np.ndarray, own_column: int, own: np.ndarray, num_prompts: int
) -> tuple[np.ndarray, np.ndarray]:
    """One row's per-token information and own-prompt posterior (SPEC "Where the input
    shows"): C_j(t) the running sums of l_j, M(t) = log sum_j w_j exp C_j(t) - log N with
    M(0) = 0, information(t) = l_o(t) - (M(t) - M(t-1)), posterior(t) = the own group's share
    of sum_j w_j exp C_j(t). The information sums to the row's matched - marginal."""
    weighted = np.log(weights)[:, None] + np.cumsum(logprobs, axis=1)
    mixture = column_logsumexp(weighted)  # M(t) + log N
    steps = np.diff(mixture, prepend=math.log(num_prompts))
    information = logprobs[own_column] - steps
    posterior = np.exp(column_logsumexp(weighted[own]) - mixture)
    return information, posterior


def column_logsumexp(values: np.ndarray) -> np.ndarray:
    """log sum_j exp values[j, t] per column t (finite values): scipy's logsumexp without
    its checks, which cost more than the sums on one row's small array."""
    top = values.max(axis=0)
    return top + np.log(np.exp(values - top).sum(axis=0))


def token_information(tokens: ReasoningTokenLogProbs) -> TokenInformation:
    """Every scored row's per-token information and posterior, rows in the matrix's order."""
    groups = np.arange(tokens.num_prompts) if tokens.column_group is None else tokens.column_group
    information, posterior = [], []
    for r, (values, columns) in enumerate(zip(tokens.logprobs, tokens.columns, strict=True)):
        prompt = int(tokens.row_prompt[r])
        own = groups[columns] == groups[prompt]
        weights = column_weights(own, tokens.num_prompts)
        own_column = int(np.flatnonzero(columns == prompt)[0])
        row = row_information(values, weights, own_column, own, tokens.num_prompts)
        information.append(row[0])
        posterior.append(row[1])
    lengths = np.fromiter((len(i) for i in information), dtype=np.int64, count=len(information))
    return TokenInformation(
        np.concatenate(information or [np.empty(0)]),
        np.concatenate(posterior or [np.empty(0)]),
        np.concatenate([[0], np.cumsum(lengths)]),
    )


def position_of_tokens(length: int) -> np.ndarray:
    """The tenth each token t = 1..T falls in: floor(10 (t - 0.5) / T), in integers."""
    t = np.arange(1, length + 1)
    return (POSITIONS * (2 * t - 1)) // (2 * length)


@dataclass(frozen=True)
class RowSummaries:
    """Per scored row: its information summed by tenth of its reasoning (M, 10), whether
    its own prompt's posterior ever passes one half (`named`), and at what share of its
    reasoning it first does (`named_at`, NaN where never)."""

    by_position: np.ndarray
    named: np.ndarray
    named_at: np.ndarray
    row_prompt: np.ndarray
    num_prompts: int


def row_summaries(
    tokens: TokenInformation, row_prompt: np.ndarray, num_prompts: int
) -> RowSummaries:
    """The per-row quantities whose weighted means are the section's numbers."""
    m = tokens.rows
    by_position = np.zeros((m, POSITIONS))
    named = np.zeros(m, dtype=bool)
    named_at = np.full(m, np.nan)
    for r in range(m):
        information, posterior = tokens.of_row(r)
        by_position[r] = np.bincount(
            position_of_tokens(len(information)), weights=information, minlength=POSITIONS
        )
        passed = np.flatnonzero(posterior > NAMED)
        if passed.size:
            named[r], named_at[r] = True, (passed[0] + 1) / len(information)
    return RowSummaries(by_position, named, named_at, np.asarray(row_prompt), num_prompts)


def _means(rows: RowSummaries, prompt_weights: np.ndarray) -> dict[str, np.ndarray]:
    """For each weighting of the prompts (a row of `prompt_weights`): the profile and the
    summaries, as weighted means over the rows."""
    weights = prompt_weights[:, rows.row_prompt]
    named = weights @ rows.named.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = weights.sum(axis=1)
        return {
            "by_position": (weights @ rows.by_position) / total[:, None],
            "input_named_rate": named / total,
            "input_named_at": (weights @ np.nan_to_num(rows.named_at)) / named,
        }


@dataclass(frozen=True)
class WhereInputShows:
    """The section of report.json: the reading (`regime`, `reason`) and the information by
    tenth of the reasoning, each with its interval (SPEC "Where the input shows")."""

    regime: str
    reason: str
    by_position: list[Estimate] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "regime": self.regime,
            "reason": self.reason,
            "information_by_position": [v.to_json() for v in self.by_position],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> WhereInputShows:
        """A `token_information` section of report.json read back."""
        values = data.get("information_by_position", ())
        return cls(data["regime"], data["reason"], [Estimate.from_json(v) for v in values])

    def short(self, metrics: Mapping[str, MetricValue]) -> str:
        """The regime and how many traces name their prompt, for a table cell or a line."""
        if self.regime in (NOT_MEASURED, NOWHERE):
            return self.regime.replace("_", " ")
        return f"{self.regime} ({_percent(point_value(metrics['input_named_rate']))} named)"


def not_measured(reason: str) -> tuple[WhereInputShows, dict[str, MetricValue]]:
    """The section and the summaries (NaN) of a scan where it was not measured."""
    return WhereInputShows(NOT_MEASURED, reason), {key: math.nan for key in WHERE_KEYS}


def compute_where(
    rows: RowSummaries, *, resamples: int = 1000, seed: int = 0
) -> tuple[WhereInputShows, dict[str, MetricValue]]:
    """The profile and the summaries (WHERE_KEYS), each with its 95% bootstrap interval over
    prompts (the resamples every metric of the scan draws), and the reading."""
    point = _means(rows, np.ones((1, rows.num_prompts)))
    boot = _means(rows, bootstrap_prompt_weights(rows.num_prompts, resamples, seed))
    metrics: dict[str, MetricValue] = {
        key: Estimate(float(point[key][0]), *finite_interval(boot[key])) for key in WHERE_KEYS
    }
    profile = [
        Estimate(float(point["by_position"][0, d]), *finite_interval(boot["by_position"][:, d]))
        for d in range(POSITIONS)
    ]
    regime, reason = read_where(profile, metrics, rows.num_prompts)
    return WhereInputShows(regime, reason, profile), metrics


def information_centre(profile: Sequence[float]) -> float:
    """Where the information sits, 0 the start of the reasoning and 1 its end: the mean
    position of the tenths' midpoints weighted by their positive information."""
    positive = np.maximum(np.asarray(profile, dtype=float), 0.0)
    midpoints = (np.arange(POSITIONS) + 0.5) / POSITIONS
    return float((positive * midpoints).sum() / positive.sum())


def bulk_span(profile: Sequence[float]) -> tuple[int, int, float]:
    """The shortest run of consecutive tenths [start, end) that holds at least BULK of the
    positive information (the fullest of the shortest), and the share it holds."""
    positive = np.maximum(np.asarray(profile, dtype=float), 0.0)
    total = positive.sum()
    for width in range(1, POSITIONS + 1):
        sums = np.convolve(positive, np.ones(width), mode="valid")
        start = int(sums.argmax())
        if sums[start] >= BULK * total:
            return start, start + width, float(sums[start] / total)
    return 0, POSITIONS, 1.0


def read_where(
    profile: Sequence[Estimate], metrics: Mapping[str, MetricValue], num_prompts: int
) -> tuple[str, str]:
    """SPEC "Where the input shows": `nowhere` when no tenth's interval lies above
    NOWHERE_SHARE x log N; else `early`, `spread` or `late` by where the information's
    centre falls (before 1/3, after 2/3, between); the reason in words and numbers."""
    values = [p.value for p in profile]
    total = float(sum(values))
    rate = point_value(metrics["input_named_rate"])
    named = f"{_percent(rate)} of traces name their prompt"
    if not any(p.low > NOWHERE_SHARE * math.log(num_prompts) for p in profile):
        return NOWHERE, (
            f"no tenth of the reasoning carries information about the input beyond noise "
            f"({total:.2f} nats a trace in all); {named}"
        )
    centre = information_centre(values)
    regime = EARLY if centre < EARLY_CENTRE else LATE if centre > LATE_CENTRE else SPREAD
    words = {EARLY: "early in the reasoning", LATE: "late in the reasoning",
             SPREAD: "spread over the reasoning"}[regime]  # fmt: skip
    start, end, share = bulk_span(values)
    reason = (
        f"{words}: {_percent(share)} of its {total:.1f} nats a trace within "
        f"{10 * start}-{10 * end}% of the reasoning; {named}"
    )
    if rate > 0:
        reason += f", after {_percent(point_value(metrics['input_named_at']))} of it on average"
    if rate < 1:
        reason += f"; the other {_percent(1 - rate)} never do"
    return regime, reason


def _percent(value: float) -> str:
    return f"{100 * value:.0f}%"


POSITION_PREFIX = "information_by_position/"


def position_key(position: int) -> str:
    """The name of one tenth of the profile where numbers are flat (scalars, compare)."""
    return f"{POSITION_PREFIX}{position}"


def _flat(rows: RowSummaries, prompt_weights: np.ndarray) -> dict[str, np.ndarray]:
    """The summaries and each tenth, by key, for each weighting of the prompts."""
    means = _means(rows, prompt_weights)
    flat = {key: means[key] for key in WHERE_KEYS}
    flat.update((position_key(d), means["by_position"][:, d]) for d in range(POSITIONS))
    return flat


def paired_where_differences(
    first: RowSummaries, second: RowSummaries, *, resamples: int = 1000, seed: int = 0
) -> dict[str, Estimate]:
    """second minus first of the summaries and of each tenth of the profile, each resample
    drawing the same prompts for both (as `metrics.paired_differences`)."""
    if second.num_prompts != first.num_prompts:
        raise ValueError("the scans cover other prompts")
    return paired_bootstrap(_flat, first, second, first.num_prompts, resamples=resamples, seed=seed)
