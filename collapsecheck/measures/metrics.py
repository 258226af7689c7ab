"""Metrics of the cross log-probability matrix (SPEC, "The cross log-probability matrix" and
"Metrics"). Pure numpy/scipy: no torch, no I/O, usable on hand-made matrices or inside a
training loop.

Every mean-type metric is written as a function of *weighted* row means. The point estimate
weights each row by 1; the bootstrap weights each row by how often its prompt was drawn.
One code path therefore gives the estimate and its interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RETRIEVAL_KS = (2, 4, 8)
ZSCORE_EPS = 1e-3
EMA_DECAY = 0.9
DEFAULT_RESAMPLES = 1000


@dataclass(frozen=True, eq=False)
class Estimate:
    """A metric's point value with its 95% percentile-bootstrap interval. Two estimates are
    equal when their numbers are, an undefined one (NaN) equal to another undefined one."""

    value: float
    low: float
    high: float

    def _numbers(self) -> tuple[float | None, ...]:
        return tuple(None if math.isnan(x) else x for x in (self.value, self.low, self.high))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Estimate):
            return NotImplemented
        return self._numbers() == other._numbers()

    def __hash__(self) -> int:
        return hash(self._numbers())

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}

    def to_json(self) -> dict[str, float | None]:
        """As `to_dict`, NaN written as null (a curve's point that is not defined)."""
        return {key: None if math.isnan(x) else float(x) for key, x in self.to_dict().items()}

    @classmethod
    def from_json(cls, data: Mapping[str, float | None]) -> Estimate:
        """`to_json` read back."""
        return cls(*(math.nan if data.get(k) is None else float(data[k]) for k in KEYS))


KEYS = ("value", "low", "high")
MetricValue = Estimate | float


@dataclass(frozen=True)
class CrossLogProbs:
    """The M x N matrices of SPEC "The cross log-probability matrix".

    Each column is one distinct context: identical contexts are one prompt, merged before
    anything is sampled or scored (SPEC "Identical contexts are one prompt"), so N is the
    number of columns everywhere. `row_prompt[r]` is the prompt (column) that produced trace
    r. `scored` marks the entries that were computed: all of them for the full matrix; with
    sampled negatives, each row's own prompt and the sampled others.
    """

    sum: np.ndarray
    mean: np.ndarray
    row_prompt: np.ndarray
    scored: np.ndarray | None = None

    def __post_init__(self) -> None:
        m, n = self.sum.shape
        if self.mean.shape != (m, n):
            raise ValueError(f"sum is {self.sum.shape} but mean is {self.mean.shape}")
        if self.row_prompt.shape != (m,):
            raise ValueError("row_prompt must have one entry per row")
        if n and (self.row_prompt.min(initial=0) < 0 or self.row_prompt.max(initial=0) >= n):
            raise ValueError("row_prompt holds an index outside the columns")
        if self.scored is None:
            object.__setattr__(self, "scored", np.ones((m, n), dtype=bool))
        if self.scored.shape != (m, n):
            raise ValueError(f"scored is {self.scored.shape}, the matrix {(m, n)}")
        if (self.own_columns & ~self.scored).any():
            raise ValueError("every row must be scored under its own prompt")
        if not (
            np.isfinite(self.sum[self.scored]).all() and np.isfinite(self.mean[self.scored]).all()
        ):
            raise ValueError("the cross log-probability matrix holds NaN or infinite values")

    @property
    def num_prompts(self) -> int:
        return self.sum.shape[1]

    @property
    def prompt_groups(self) -> np.ndarray:
        """Each column its own group: the columns are distinct contexts."""
        return np.arange(self.num_prompts)

    @property
    def own_columns(self) -> np.ndarray:
        """(M, N) mask of each row's own prompt."""
        return correct_columns(self.row_prompt, self.prompt_groups)

    @property
    def is_full(self) -> bool:
        return bool(self.scored.all())


@dataclass(frozen=True)
class PromptCounts:
    """Per-prompt counts behind the model-free rates (each array has one entry per prompt)."""

    responses: np.ndarray
    valid: np.ndarray
    truncated: np.ndarray
    distinct_reasoning: np.ndarray


def count_per_prompt(
    num_prompts: int,
    prompt_index: Sequence[int],
    valid: Sequence[bool],
    truncated: Sequence[bool],
    reasoning: Sequence[str],
) -> PromptCounts:
    """Per-prompt response, valid, truncated and distinct-reasoning counts, from one entry
    per response (all N x K of them, valid or not)."""
    index = np.asarray(prompt_index, dtype=np.int64)
    distinct: list[set[str]] = [set() for _ in range(num_prompts)]
    for p, ok, text in zip(index, valid, reasoning, strict=True):
        if ok:
            distinct[p].add(text)
    return PromptCounts(
        responses=np.bincount(index, minlength=num_prompts).astype(float),
        valid=np.bincount(index, weights=np.asarray(valid, float), minlength=num_prompts),
        truncated=np.bincount(index, weights=np.asarray(truncated, float), minlength=num_prompts),
        distinct_reasoning=np.array([len(d) for d in distinct], dtype=float),
    )


def matched_and_marginal(
    logprobs: np.ndarray,
    row_prompt: np.ndarray,
    column_group: np.ndarray,
    scored: np.ndarray,
    complete: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """matched[r] = L[r, own prompt]; marginal[r] = logsumexp_j L[r, j] - log N.
    `column_group`: per column, its group; the columns of a row's own group are always scored
    (the prompt columns are distinct, each its own group; the flow's swapped reasoning groups
    identical reasoning).

    With sampled negatives (SPEC "Sampled negatives and swaps") the sum S inside the log is
    estimated by stratum: the `complete` columns (always scored; by default the row's own
    prompt and its duplicates) count once each, and the m scored others stand for all P
    other columns, each weighted by P / m. That estimate is unbiased; its log is biased low
    by about Var/(2 S^2), which is added back, with Var estimated from the sampled terms
    (drawn without replacement). For the full matrix every weight is 1, Var is 0 and this
    is the plain logsumexp.
    """
    m, n = logprobs.shape
    matched = logprobs[np.arange(m), row_prompt]
    if complete is None:
        complete = correct_columns(row_prompt, column_group)
    others = scored & ~complete
    sampled = others.sum(axis=1)
    population = n - complete.sum(axis=1)
    shift = np.where(scored, logprobs, -np.inf).max(axis=1)
    terms = np.where(scored, np.exp(logprobs - shift[:, None]), 0.0)
    weight = population / np.maximum(sampled, 1)
    total = np.where(complete, terms, 0.0).sum(axis=1) + weight * np.where(others, terms, 0.0).sum(
        axis=1
    )
    marginal = np.log(total) + shift - np.log(n)
    return matched, marginal + sampling_correction(terms, others, population, total)


def sampling_correction(
    terms: np.ndarray, others: np.ndarray, population: np.ndarray, total: np.ndarray
) -> np.ndarray:
    """Var(S_hat) / (2 S_hat^2) per row: the second-order bias of log S_hat when m of the P
    other terms were sampled without replacement (0 when all or at most one were)."""
    sampled = others.sum(axis=1)
    mean = np.where(others, terms, 0.0).sum(axis=1) / np.maximum(sampled, 1)
    spread = np.where(others, (terms - mean[:, None]) ** 2, 0.0).sum(axis=1)
    variance = spread / np.maximum(sampled - 1, 1)
    drawn = (sampled > 1) & (sampled < population)
    fraction = np.where(drawn, sampled / np.maximum(population, 1), 1.0)
    total_variance = population**2 * (1 - fraction) * variance / np.maximum(sampled, 1)
    return np.where(drawn, total_variance / (2 * total**2), 0.0)


def hit_probability(tied: np.ndarray, correct: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Chance that `slots` columns drawn at random from `tied` include one of `correct` of them.

    1 - C(tied - correct, slots) / C(tied, slots); slots <= 0 gives 0, slots >= tied gives 1
    (when any is correct).
    This is SPEC's tie rule: for k = 1 it is correct / tied.
    """
    from scipy.special import gammaln

    tied, correct, slots = np.broadcast_arrays(
        np.asarray(tied, float), np.asarray(correct, float), np.asarray(slots, float)
    )
    safe_slots = np.clip(slots, 0, tied)
    misses = tied - correct
    possible = misses >= safe_slots
    log_ratio = (
        gammaln(misses + 1)
        - gammaln(np.where(possible, misses - safe_slots, 0) + 1)
        - gammaln(tied + 1)
        + gammaln(tied - safe_slots + 1)
    )
    miss_all = np.where(possible, np.exp(np.where(possible, log_ratio, 0.0)), 0.0)
    hit = 1.0 - miss_all
    return np.where(slots <= 0, 0.0, np.where(slots >= tied, (correct > 0) * 1.0, hit))


def correct_columns(row_prompt: np.ndarray, column_group: np.ndarray) -> np.ndarray:
    """(M, N) mask of the columns that count as a correct retrieval for each row."""
    return column_group[None, :] == column_group[row_prompt][:, None]


def retrieval_scores(
    logprobs: np.ndarray,
    row_prompt: np.ndarray,
    column_group: np.ndarray,
    k: int,
    scored: np.ndarray | None = None,
) -> np.ndarray:
    """Per-row retrieval@k among the scored columns, under SPEC's tie rule (expected hit
    under random tie-breaking)."""
    if scored is not None:
        logprobs = np.where(scored, logprobs, -np.inf)
    correct = correct_columns(row_prompt, column_group)
    best_correct = np.where(correct, logprobs, -np.inf).max(axis=1, keepdims=True)
    strictly_better = (logprobs > best_correct).sum(axis=1)
    tied = logprobs == best_correct
    candidates = logprobs.shape[1] if scored is None else scored.sum(axis=1)
    return hit_probability(
        tied.sum(axis=1),
        (tied & correct).sum(axis=1),
        np.minimum(k, candidates) - strictly_better,
    )


def retrieval_chance(
    row_prompt: np.ndarray, column_group: np.ndarray, k: int, scored: np.ndarray | None = None
) -> np.ndarray:
    """Per-row retrieval@k of a guesser that ranks the candidate columns at random."""
    correct = correct_columns(row_prompt, column_group).sum(axis=1)
    n = column_group.shape[0]
    candidates = np.full(correct.shape, n) if scored is None else scored.sum(axis=1)
    return hit_probability(candidates, correct, np.minimum(k, candidates))


def row_statistics(scores: CrossLogProbs) -> dict[str, np.ndarray]:
    """Per-row quantities whose weighted means make up every row-level metric."""
    where = (scores.row_prompt, scores.prompt_groups, scores.scored)
    matched_mean, marginal_mean = matched_and_marginal(scores.mean, *where)
    matched_seq, marginal_seq = matched_and_marginal(scores.sum, *where)
    rows = {
        "matched_mean": matched_mean,
        "marginal_mean": marginal_mean,
        "matched_seq": matched_seq,
        "marginal_seq": marginal_seq,
    }
    for k in (1, *RETRIEVAL_KS):
        rows[f"hit@{k}"] = retrieval_scores(
            scores.sum, scores.row_prompt, scores.prompt_groups, k, scores.scored
        )
        rows[f"chance@{k}"] = retrieval_chance(
            scores.row_prompt, scores.prompt_groups, k, scores.scored
        )
    return rows


def _suffix(k: int) -> str:
    return "" if k == 1 else f"@{k}"


# the mean-type metrics counted over every response, scored or not (their units: every prompt)
RESPONSE_RATES = ("valid_reasoning_rate", "truncated_rate", "distinct_reasoning_rate")


def _metrics_from_weights(
    rows: Mapping[str, np.ndarray],
    counts: PromptCounts,
    row_weights: np.ndarray,
    prompt_weights: np.ndarray,
    num_prompts: int,
) -> dict[str, np.ndarray]:
    """All mean-type metrics for each weighting (a row of `row_weights`/`prompt_weights`)."""
    total = row_weights.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):

        def wmean(x: np.ndarray) -> np.ndarray:
            return (row_weights @ x) / total

        def wstd(x: np.ndarray) -> np.ndarray:
            # two passes: E[x^2] - E[x]^2 cancels catastrophically when the rows are alike
            deviations = x[None, :] - wmean(x)[:, None]
            return np.sqrt((row_weights * deviations**2).sum(axis=1) / total)

        out: dict[str, np.ndarray] = {}
        for unit, tag in (("mean", ""), ("seq", "_seq")):
            matched, marginal = rows[f"matched_{unit}"], rows[f"marginal_{unit}"]
            mi = wmean(matched - marginal)
            std = wstd(marginal)
            out[f"mi{tag}_estimate"] = mi
            out[f"conditional_entropy{tag}_est"] = -wmean(matched)
            out[f"reasoning_entropy{tag}_est"] = -wmean(marginal)
            out[f"marginal_std{tag}"] = std
            out[f"mi_zscore{tag}"] = mi / (std + ZSCORE_EPS)
        out["matched_log_prob_mean"] = wmean(rows["matched_mean"])
        out["marginal_log_prob_mean"] = wmean(rows["marginal_mean"])
        for k in (1, *RETRIEVAL_KS):
            accuracy, chance = wmean(rows[f"hit@{k}"]), wmean(rows[f"chance@{k}"])
            out[f"retrieval_accuracy{_suffix(k)}"] = accuracy
            out[f"retrieval_above_chance{_suffix(k)}"] = accuracy - chance
        chance = wmean(rows["chance@1"])
        out["retrieval_skill"] = (out["retrieval_accuracy"] - chance) / (1.0 - chance)
        out["normalized_mi"] = np.clip(out["mi_seq_estimate"] / np.log(num_prompts), 0.0, 1.0)
        out["effective_traces_per_prompt"] = np.exp(out["conditional_entropy_seq_est"])

        responses = prompt_weights @ counts.responses
        out["valid_reasoning_rate"] = (prompt_weights @ counts.valid) / responses
        out["truncated_rate"] = (prompt_weights @ counts.truncated) / responses
        out["distinct_reasoning_rate"] = (prompt_weights @ counts.distinct_reasoning) / responses
    return out


def bootstrap_prompt_weights(num_prompts: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, N) draw counts of each prompt: resampling prompts with replacement."""
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(num_prompts, np.full(num_prompts, 1.0 / num_prompts), size=resamples)
    return draws.astype(float)


def _draws(
    rows: Mapping[str, np.ndarray],
    scores: CrossLogProbs,
    counts: PromptCounts,
    prompt_weights: np.ndarray,
) -> dict[str, np.ndarray]:
    """Every mean-type metric under each row of prompt weights."""
    row_weights = prompt_weights[:, scores.row_prompt]
    return _metrics_from_weights(rows, counts, row_weights, prompt_weights, scores.num_prompts)


def per_prompt_mean(row_prompt: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per prompt, the mean of `values` over its rows (NaN for a prompt without rows)."""
    counts = np.bincount(row_prompt, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(row_prompt, weights=values, minlength=n) / counts


def finite_interval(draws: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of the finite bootstrap draws (NaN with none): for statistics
    that some resamples leave undefined (a correlation of constants, an empty group)."""
    finite = draws[np.isfinite(draws)]
    if finite.size == 0:
        return math.nan, math.nan
    low, high = np.percentile(finite, [2.5, 97.5])
    return float(low), float(high)


def _interval(draws: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of bootstrap draws (NaN with no defined draws)."""
    if np.isnan(draws).all():
        return math.nan, math.nan
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return float(low), float(high)


def _check_prompts(scores: CrossLogProbs) -> int:
    n = scores.num_prompts
    if n < 2:
        raise ValueError(f"cross-scoring needs at least 2 prompts, got {n}")
    return n


def compute_metrics(
    scores: CrossLogProbs,
    counts: PromptCounts,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    input_rows: int | None = None,
) -> dict[str, MetricValue]:
    """Every metric of SPEC "Metrics", mean-type ones with a 95% bootstrap interval.

    The bootstrap resamples prompts with all their traces while the columns stay fixed
    (SPEC "95% intervals"); it is seeded, so the same inputs give the same intervals. Where
    every scored trace comes from one prompt, each resample is that prompt again: the
    matrix's metrics get no interval (NaN), not a zero-width one (SPEC "Enough to carry a
    verdict"); the rates over every response (`RESPONSE_RATES`) keep theirs.
    `input_rows`: the rows the distinct prompts came from (RAGEN's columns, one per row:
    `mi_upper_bound`); the columns themselves by default.
    """
    n = _check_prompts(scores)
    rows = row_statistics(scores)
    point = _draws(rows, scores, counts, np.ones((1, n)))
    boot = _draws(rows, scores, counts, bootstrap_prompt_weights(n, resamples, seed))
    metrics: dict[str, MetricValue] = {
        "mi_upper_bound": float(np.log(input_rows or n)),
        "mi_upper_bound_distinct": float(np.log(n)),
    }
    one_unit = len(np.unique(scores.row_prompt)) < 2  # every resample the same: no interval
    for key, value in point.items():
        undefined = one_unit and key not in RESPONSE_RATES
        bounds = (math.nan, math.nan) if undefined else _interval(boot[key])
        metrics[key] = Estimate(float(value[0]), *bounds)
    for k in (1, *RETRIEVAL_KS):
        metrics[f"retrieval_chance_level{_suffix(k)}"] = float(rows[f"chance@{k}"].mean())
    apply_run_ema([metrics])
    return metrics


def paired_differences(
    first: tuple[CrossLogProbs, PromptCounts],
    second: tuple[CrossLogProbs, PromptCounts],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, Estimate]:
    """second minus first for every mean-type metric, with a paired bootstrap interval.

    Both scans must cover the same prompts in the same order: each resample draws the same
    prompts for both, so what the prompts have in common cancels out of the difference.
    """
    (scores_a, counts_a), (scores_b, counts_b) = first, second
    n = _check_prompts(scores_a)
    if scores_b.num_prompts != n:
        raise ValueError(f"the scans cover {n} and {scores_b.num_prompts} prompts")
    rows_a, rows_b = row_statistics(scores_a), row_statistics(scores_b)
    ones, weights = np.ones((1, n)), bootstrap_prompt_weights(n, resamples, seed)
    point_a = _draws(rows_a, scores_a, counts_a, ones)
    point_b = _draws(rows_b, scores_b, counts_b, ones)
    boot_a = _draws(rows_a, scores_a, counts_a, weights)
    boot_b = _draws(rows_b, scores_b, counts_b, weights)
    return {
        key: Estimate(
            float(point_b[key][0] - point_a[key][0]), *_interval(boot_b[key] - boot_a[key])
        )
        for key in point_a
    }


def paired_bootstrap(
    measure: Callable[[Any, np.ndarray], Mapping[str, np.ndarray]],
    first: Any,
    second: Any,
    num_prompts: int,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, Estimate]:
    """second minus first of every quantity `measure(scan, prompt_weights)` gives (one value
    per row of the (B, N) prompt weights, by key), each resample drawing the same prompts for
    both scans; the interval over the finite resampled differences."""
    ones, weights = (
        np.ones((1, num_prompts)),
        bootstrap_prompt_weights(num_prompts, resamples, seed),
    )
    point = [measure(scan, ones) for scan in (first, second)]
    boot = [measure(scan, weights) for scan in (first, second)]
    return {
        key: Estimate(
            float(point[1][key][0] - point[0][key][0]),
            *finite_interval(boot[1][key] - boot[0][key]),
        )
        for key in point[0]
    }


def apply_run_ema(run: list[dict[str, MetricValue]], decay: float = EMA_DECAY) -> None:
    """SPEC `mi_zscore_ema`, `marginal_std_ema` (+ `_seq`): the std smoothed along a run.

    The EMA starts at the first checkpoint's std and is updated in step order; a single
    checkpoint is a run of one, whose EMA equals its own std.
    """
    for tag in ("", "_seq"):
        ema = None
        for metrics in run:
            std = point_value(metrics[f"marginal_std{tag}"])
            ema = std if ema is None else decay * ema + (1.0 - decay) * std
            metrics[f"marginal_std_ema{tag}"] = ema
            metrics[f"mi_zscore_ema{tag}"] = point_value(metrics[f"mi{tag}_estimate"]) / (
                ema + ZSCORE_EPS
            )


def point_value(metric: MetricValue) -> float:
    """The point value of a metric, with or without an interval."""
    return metric.value if isinstance(metric, Estimate) else float(metric)


def interval_bounds(metric: MetricValue) -> tuple[float, float]:
    """The 95% interval of a metric, or its point value twice where it has none."""
    value = point_value(metric)
    if isinstance(metric, Estimate) and not (np.isnan(metric.low) or np.isnan(metric.high)):
        return metric.low, metric.high
    return value, value


def interval_text(metric: MetricValue) -> str:
    """`value [low, high]` to two decimals, as a reading's reason shows a metric."""
    low, high = interval_bounds(metric)
    return f"{point_value(metric):.2f} [{low:.2f}, {high:.2f}]"
