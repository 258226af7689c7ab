"""Metric math against hand-computed matrices (SPEC "Metrics")."""

import itertools
import math

import numpy as np
import pytest

from collapsecheck.measures.metrics import (
    CrossLogProbs,
    Estimate,
    PromptCounts,
    apply_run_ema,
    compute_metrics,
    count_per_prompt,
    hit_probability,
    retrieval_scores,
)


def matrix(sums, row_prompt, lengths=None):
    sums = np.asarray(sums, dtype=float)
    lengths = np.ones(len(sums)) if lengths is None else np.asarray(lengths, float)
    return CrossLogProbs(sum=sums, mean=sums / lengths[:, None], row_prompt=np.asarray(row_prompt))


def counts_for(scores, k):
    n = scores.num_prompts
    responses = np.full(n, float(k))
    valid = np.bincount(scores.row_prompt, minlength=n).astype(float)
    return PromptCounts(responses, valid, np.zeros(n), valid)


def value(metric):
    return metric.value if isinstance(metric, Estimate) else metric


def test_two_by_two_by_hand():
    scores = matrix([[-1.0, -3.0], [-4.0, -2.0]], [0, 1], lengths=[2, 4])
    m = compute_metrics(scores, counts_for(scores, 1), resamples=50)
    marginal0 = math.log(math.exp(-1) + math.exp(-3)) - math.log(2)
    marginal1 = math.log(math.exp(-4) + math.exp(-2)) - math.log(2)
    expected_mi_seq = ((-1 - marginal0) + (-2 - marginal1)) / 2
    assert value(m["mi_seq_estimate"]) == pytest.approx(expected_mi_seq)
    assert value(m["conditional_entropy_seq_est"]) == pytest.approx(1.5)
    assert value(m["reasoning_entropy_seq_est"]) == pytest.approx(-(marginal0 + marginal1) / 2)
    # per-token: rows divided by their lengths 2 and 4
    pm0 = math.log(math.exp(-0.5) + math.exp(-1.5)) - math.log(2)
    pm1 = math.log(math.exp(-1.0) + math.exp(-0.5)) - math.log(2)
    assert value(m["mi_estimate"]) == pytest.approx(((-0.5 - pm0) + (-0.5 - pm1)) / 2)
    assert value(m["matched_log_prob_mean"]) == pytest.approx(-0.5)
    assert m["mi_upper_bound"] == pytest.approx(math.log(2))
    assert value(m["retrieval_accuracy"]) == 1.0
    assert m["retrieval_chance_level"] == 0.5
    assert value(m["retrieval_skill"]) == 1.0
    assert value(m["normalized_mi"]) == pytest.approx(expected_mi_seq / math.log(2))
    assert value(m["effective_traces_per_prompt"]) == pytest.approx(math.exp(1.5))
    std = np.std([marginal0, marginal1])
    assert value(m["marginal_std_seq"]) == pytest.approx(std)
    assert value(m["mi_zscore_seq"]) == pytest.approx(expected_mi_seq / (std + 1e-3))
    # a run of one checkpoint: the EMA is the checkpoint's own std
    assert m["marginal_std_ema_seq"] == pytest.approx(std)


def test_identical_rows_score_chance_not_perfect_or_zero():
    scores = matrix(np.full((4, 4), -2.0), [0, 1, 2, 3])
    m = compute_metrics(scores, counts_for(scores, 1), resamples=20)
    assert value(m["retrieval_accuracy"]) == pytest.approx(0.25)
    assert m["retrieval_chance_level"] == pytest.approx(0.25)
    assert value(m["retrieval_skill"]) == pytest.approx(0.0)
    assert value(m["mi_seq_estimate"]) == pytest.approx(0.0)
    assert value(m["retrieval_accuracy@2"]) == pytest.approx(0.5)


def test_tie_rule_on_one_row():
    # own prompt 0 ties with column 2 at the top: 1/2 at k=1; column 1 is below both
    row = np.array([[-1.0, -3.0, -1.0, -5.0]])
    assert retrieval_scores(row, np.array([0]), np.arange(4), 1)[0] == pytest.approx(0.5)
    assert retrieval_scores(row, np.array([0]), np.arange(4), 2)[0] == pytest.approx(1.0)
    # own prompt 1 is third: no hit at k=1 or 2, a hit at k=3
    assert retrieval_scores(row, np.array([1]), np.arange(4), 2)[0] == 0.0
    assert retrieval_scores(row, np.array([1]), np.arange(4), 3)[0] == 1.0


def test_retrieval_at_k_is_capped_at_n():
    scores = matrix([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]], [0, 1, 2])
    m = compute_metrics(scores, counts_for(scores, 1), resamples=20)
    assert value(m["retrieval_accuracy"]) == pytest.approx(1 / 3)
    assert value(m["retrieval_accuracy@2"]) == pytest.approx(2 / 3)
    assert value(m["retrieval_accuracy@4"]) == 1.0
    assert value(m["retrieval_accuracy@8"]) == 1.0
    assert m["retrieval_chance_level@8"] == 1.0


def test_hit_probability_matches_enumeration():
    for tied, correct, slots in itertools.product(range(1, 6), range(0, 4), range(0, 7)):
        if correct > tied:
            continue
        draws = list(itertools.combinations(range(tied), min(slots, tied)))
        hits = sum(any(c < correct for c in draw) for draw in draws) / len(draws)
        assert hit_probability(tied, correct, slots) == pytest.approx(hits), (tied, correct, slots)


def test_n_equals_two_and_n_below_two():
    scores = matrix([[-1.0, -2.0], [-1.5, -1.0], [-2.0, -2.5]], [0, 1, 1])
    m = compute_metrics(scores, counts_for(scores, 2), resamples=50)
    assert value(m["retrieval_accuracy"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        compute_metrics(matrix([[-1.0]], [0]), counts_for(matrix([[-1.0]], [0]), 1))


def test_bootstrap_is_reproducible_with_a_seed():
    rng = np.random.default_rng(3)
    sums = rng.normal(-20, 5, size=(40, 8))
    scores = matrix(sums, np.repeat(np.arange(8), 5), lengths=rng.integers(5, 30, size=40))
    counts = counts_for(scores, 5)
    first = compute_metrics(scores, counts, resamples=200, seed=7)
    again = compute_metrics(scores, counts, resamples=200, seed=7)
    other = compute_metrics(scores, counts, resamples=200, seed=8)
    assert first == again
    assert first["mi_seq_estimate"] != other["mi_seq_estimate"]
    interval = first["mi_seq_estimate"]
    assert interval.low <= interval.value <= interval.high
    assert interval.low < interval.high


def test_non_finite_matrix_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        matrix([[np.nan, -1.0], [-1.0, -2.0]], [0, 1])


def test_count_per_prompt():
    counts = count_per_prompt(
        3,
        [0, 0, 0, 1, 1, 1, 2, 2, 2],
        [True, True, False, True, True, True, False, False, False],
        [False, False, True, False, False, False, False, True, False],
        ["a", "a", "", "x", "y", "z", "", "", ""],
    )
    assert counts.responses.tolist() == [3, 3, 3]
    assert counts.valid.tolist() == [2, 3, 0]
    assert counts.truncated.tolist() == [1, 0, 1]
    assert counts.distinct_reasoning.tolist() == [1, 3, 0]


def test_model_free_rates():
    scores = matrix([[-1.0, -2.0], [-1.0, -2.0], [-2.0, -1.0]], [0, 0, 1])
    counts = PromptCounts(
        responses=np.array([2.0, 2.0]),
        valid=np.array([2.0, 1.0]),
        truncated=np.array([0.0, 1.0]),
        distinct_reasoning=np.array([1.0, 1.0]),
    )
    m = compute_metrics(scores, counts, resamples=10)
    assert value(m["valid_reasoning_rate"]) == pytest.approx(0.75)
    assert value(m["truncated_rate"]) == pytest.approx(0.25)
    assert value(m["distinct_reasoning_rate"]) == pytest.approx(0.5)


def test_run_ema_follows_the_steps():
    run = [
        {"marginal_std": 1.0, "marginal_std_seq": 2.0, "mi_estimate": 0.5, "mi_seq_estimate": 1.0},
        {"marginal_std": 3.0, "marginal_std_seq": 4.0, "mi_estimate": 0.5, "mi_seq_estimate": 1.0},
    ]
    apply_run_ema(run)
    assert run[1]["marginal_std_ema"] == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)
    assert run[1]["mi_zscore_ema_seq"] == pytest.approx(1.0 / (0.9 * 2.0 + 0.1 * 4.0 + 1e-3))


def test_sampled_negatives_estimator_by_hand():
    sums = np.array([[-1.0, -9.0, -3.0, -9.0], [-9.0, -2.0, -9.0, -1.5]])
    scored = np.array([[True, False, True, False], [False, True, False, True]])
    scores = CrossLogProbs(sums, sums, np.array([0, 1]), scored)
    m = compute_metrics(scores, counts_for(scores, 1), resamples=20)
    # row 0: own p0 plus the 3 other prompts estimated from the one sampled (weight 3 / 1)
    marginal0 = math.log(math.exp(-1) + 3 * math.exp(-3)) - math.log(4)
    marginal1 = math.log(math.exp(-2) + 3 * math.exp(-1.5)) - math.log(4)
    assert value(m["mi_seq_estimate"]) == pytest.approx(((-1 - marginal0) + (-2 - marginal1)) / 2)
    # retrieval among own + 1 sampled: row 0 wins, row 1 loses; chance 1/2
    assert value(m["retrieval_accuracy"]) == pytest.approx(0.5)
    assert m["retrieval_chance_level"] == pytest.approx(0.5)
    assert value(m["retrieval_accuracy@2"]) == 1.0


def test_full_mask_equals_no_mask():
    rng = np.random.default_rng(5)
    sums = rng.normal(-10, 3, size=(12, 4))
    plain = matrix(sums, np.repeat(np.arange(4), 3))
    masked = CrossLogProbs(plain.sum, plain.mean, plain.row_prompt, np.ones((12, 4), dtype=bool))
    assert compute_metrics(plain, counts_for(plain, 3), resamples=50) == compute_metrics(
        masked, counts_for(masked, 3), resamples=50
    )


def test_own_prompt_must_be_scored():
    with pytest.raises(ValueError, match="own prompt"):
        CrossLogProbs(np.zeros((1, 2)), np.zeros((1, 2)), np.array([0]), np.array([[False, True]]))


def test_traces_of_one_prompt_get_no_interval_but_every_responses_rates_keep_theirs():
    """SPEC "Enough to carry a verdict": with every scored trace from one prompt, each
    resample is that prompt again, so the matrix's metrics have no interval (NaN) rather than
    a zero-width one; the rates over all responses (of every prompt) keep theirs."""
    scores = matrix([[-1.0, -3.0, -2.0], [-1.5, -2.5, -3.0]], [0, 0])
    counts = PromptCounts(np.array([4.0, 4, 4]), np.array([2.0, 0, 0]), np.array([0.0, 3, 1]),
                          np.array([2.0, 0, 0]))  # fmt: skip
    m = compute_metrics(scores, counts, resamples=200)
    for key in ("normalized_mi", "retrieval_skill", "conditional_entropy_est", "mi_estimate"):
        assert math.isnan(m[key].low) and math.isnan(m[key].high), key
        assert math.isfinite(m[key].value)
    rate = m["truncated_rate"]
    assert rate.value == pytest.approx(4 / 12) and rate.low < rate.high
    two = compute_metrics(matrix([[-1.0, -3.0], [-3.0, -1.5]], [0, 1]), counts_for(
        matrix([[-1.0, -3.0], [-3.0, -1.5]], [0, 1]), 1), resamples=200)  # fmt: skip
    assert math.isfinite(two["normalized_mi"].low)
