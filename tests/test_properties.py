"""Property-based tests of the metric code (hypothesis): invariances, bounds, the tie rule."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from collapsecheck.measures.metrics import CrossLogProbs, PromptCounts, compute_metrics, point_value

KEYS = ("mi_estimate", "mi_seq_estimate", "retrieval_accuracy", "retrieval_accuracy@2",
        "retrieval_accuracy@4", "normalized_mi", "retrieval_skill",
        "conditional_entropy_seq_est", "marginal_std_seq")  # fmt: skip


@st.composite
def matrices(draw):
    """A cross log-probability matrix with ties (values from a small grid) and lengths."""
    n = draw(st.integers(2, 6))
    k = draw(st.integers(1, 4))
    levels = draw(st.integers(2, 12))
    grid = np.linspace(-40.0, -1.0, levels)
    picks = draw(st.lists(st.integers(0, levels - 1), min_size=n * k * n, max_size=n * k * n))
    sums = grid[np.array(picks)].reshape(n * k, n)
    lengths = np.array(draw(st.lists(st.integers(1, 30), min_size=n * k, max_size=n * k)))
    return sums, lengths, np.repeat(np.arange(n), k), n, k


def build(sums, lengths, rows, n, k):
    scores = CrossLogProbs(sums, sums / lengths[:, None], rows)
    full = np.full(n, float(k))
    counts = PromptCounts(full, full, np.zeros(n), full)
    return scores, counts


def points(scores, counts):
    metrics = compute_metrics(scores, counts, resamples=0)
    return {key: point_value(metrics[key]) for key in KEYS}, metrics


def close(a, b):
    return all(math.isclose(a[key], b[key], rel_tol=1e-9, abs_tol=1e-9) for key in a)


@settings(max_examples=60, deadline=None)
@given(matrices(), st.randoms(use_true_random=False))
def test_permuting_prompts_and_rows_changes_nothing(matrix, rng):
    sums, lengths, rows, n, k = matrix
    base, _ = points(*build(sums, lengths, rows, n, k))
    columns = list(range(n))
    rng.shuffle(columns)
    order = list(range(len(rows)))
    rng.shuffle(order)
    inverse = np.argsort(columns)  # old prompt j is now column inverse[j]
    permuted = sums[order][:, columns]
    new_rows = inverse[rows[order]]
    moved, _ = points(*build(permuted, lengths[order], new_rows, n, k))
    assert close(base, moved)


@settings(max_examples=60, deadline=None)
@given(matrices(), st.floats(-20, 20))
def test_a_constant_added_to_a_row_leaves_mi_and_retrieval(matrix, shift):
    sums, lengths, rows, n, k = matrix
    base, _ = points(*build(sums, lengths, rows, n, k))
    shifted = sums.copy()
    shifted[0] += shift
    moved, _ = points(*build(shifted, lengths, rows, n, k))
    for key in ("mi_seq_estimate", "retrieval_accuracy", "retrieval_accuracy@2", "normalized_mi"):
        assert math.isclose(base[key], moved[key], rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=80, deadline=None)
@given(matrices())
def test_bounds_and_monotonicity(matrix):
    sums, lengths, rows, n, k = matrix
    values, metrics = points(*build(sums, lengths, rows, n, k))
    assert 0.0 <= values["normalized_mi"] <= 1.0
    assert values["mi_seq_estimate"] <= math.log(n) + 1e-9
    accuracies = [values["retrieval_accuracy"], values["retrieval_accuracy@2"],
                  values["retrieval_accuracy@4"]]  # fmt: skip
    chances = [metrics[f"retrieval_chance_level{s}"] for s in ("", "@2", "@4")]
    assert all(0.0 <= a <= 1.0 + 1e-12 for a in accuracies)
    assert accuracies == sorted(accuracies) and chances == sorted(chances)
    assert all(0.0 < c <= 1.0 for c in chances)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(1, 4), st.floats(-30, -1))
def test_identical_rows_score_exactly_chance(n, k, value):
    sums = np.full((n * k, n), value)
    values, metrics = points(*build(sums, np.ones(n * k, int), np.repeat(np.arange(n), k), n, k))
    assert math.isclose(values["retrieval_accuracy"], metrics["retrieval_chance_level"])
    assert math.isclose(values["retrieval_skill"], 0.0, abs_tol=1e-12)
    assert math.isclose(values["mi_seq_estimate"], 0.0, abs_tol=1e-12)
