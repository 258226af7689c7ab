"""Sampled negatives and swaps (SPEC "Sampled negatives and swaps"): which entries are chosen,
that the estimators are unbiased inside the log, that a sampled scan computes exactly the
full matrices' entries, and what the report and the plan say."""

import dataclasses
import math

import numpy as np
import pytest

from collapsecheck import scan
from collapsecheck.engines.cross_scoring import chosen_swaps, negative_groups
from collapsecheck.measures.flow import FlowLogProbs, flow_rows
from collapsecheck.measures.metrics import matched_and_marginal
from collapsecheck.reports.dump import read_dump, read_flow
from collapsecheck.runs.cost import unit_cost
from collapsecheck.settings import DEFAULT_NEGATIVES, Settings
from tests.conftest import HEALTHY, PROMPTS


def test_each_prompt_is_a_negative_exactly_m_times_and_keeps_its_own():
    groups = np.arange(10)
    under = negative_groups(groups, 3, seed=4)
    assert all(g in chosen and len(chosen) == 4 for g, chosen in under.items())
    served = np.concatenate([chosen[chosen != g] for g, chosen in under.items()])
    assert np.bincount(served, minlength=10).tolist() == [3] * 10
    assert negative_groups(groups, 3, seed=4).keys() == under.keys()
    assert all((negative_groups(groups, 3, 4)[g] == under[g]).all() for g in under)


def test_duplicate_prompts_count_once_and_a_large_m_is_the_full_matrix():
    groups = np.array([0, 1, 1, 3])  # prompt 2 renders like prompt 1
    under = negative_groups(groups, 2, seed=0)
    assert set(under) == {0, 1, 3} and all(len(c) == 3 for c in under.values())


def test_every_swap_branches_off_a_pass_the_reasoning_scores_already_ran():
    own = np.repeat(np.arange(12), 4)
    under = negative_groups(np.arange(12), 3, seed=1)
    swaps = chosen_swaps(own, under, 5, seed=1)
    # a prompt's rows share one draw (one swapped pass serves them all); prompts differ
    assert all((swaps[row] == swaps[row - row % 4]).all() for row in range(len(own)))
    assert len({tuple(chosen) for chosen in swaps}) == 12
    for row, chosen in enumerate(swaps):
        assert (chosen[own[chosen] == own[row]] == np.flatnonzero(own == own[row])).all()
        assert (own[chosen] != own[row]).sum() == 5
        # prompt j(r) with trace s's reasoning is one of trace s's X->Z requests
        assert all(own[row] in under[int(own[s])] for s in chosen)


def horvitz_thompson(values, scored, complete):
    """Per row, the plain estimate of log mean_j exp(values): the complete columns once, the
    sampled others standing for all others (no bias correction)."""
    others = scored & ~complete
    weight = (~complete).sum(axis=1) / others.sum(axis=1)
    total = np.where(complete, np.exp(values), 0).sum(axis=1)
    total += weight * np.where(others, np.exp(values), 0).sum(axis=1)
    return np.log(total) - np.log(values.shape[1])


def draws_of(values, complete, choose, seeds=3000):
    """Over many draws: the mean of exp(plain estimate), the mean plain estimate, and the mean
    of the estimate `choose(seed)` returns with the mask it sampled."""
    plain, corrected = [], []
    for seed in range(seeds):
        scored, marginal = choose(seed)
        plain.append(horvitz_thompson(values, scored, complete))
        corrected.append(marginal)
    return np.exp(plain).mean(axis=0), np.mean(plain, axis=0), np.mean(corrected, axis=0)


def test_the_sampled_marginal_is_unbiased_inside_the_log_and_nearly_so_outside():
    """Averaged over the draws of negatives, the mixture estimate inside the log equals the
    full matrix's; the log of it is biased low, and the correction removes most of that."""
    rng = np.random.default_rng(0)
    n, k, m = 13, 2, 4
    rows, groups = np.repeat(np.arange(n), k), np.arange(n)
    sums = rng.normal(-6, 1.5, size=(n * k, n))
    full = matched_and_marginal(sums, rows, groups, np.ones_like(sums, bool))[1]

    def choose(seed):
        under = negative_groups(groups, m, seed)
        scored = np.array([np.isin(groups, under[p]) for p in rows])
        return scored, matched_and_marginal(sums, rows, groups, scored)[1]

    inside, plain, corrected = draws_of(sums, groups[None, :] == rows[:, None], choose)
    assert inside == pytest.approx(np.exp(full), rel=0.05)  # Monte Carlo error: about 1%
    assert np.abs(corrected - full).mean() < 0.6 * np.abs(plain - full).mean()


def test_the_sampled_swaps_are_unbiased_even_with_repeated_reasoning():
    """The reasoning matrix's marginal over swapped traces: identical reasoning elsewhere in
    the batch is a sampled column like any other, not one that is always there."""
    rng = np.random.default_rng(1)
    n, k = 8, 3
    rows = np.repeat(np.arange(n), k)
    m = len(rows)
    reasoning_group = np.array([r % 2 for r in range(m)])  # two distinct reasonings
    matrix = rng.normal(-3, 1.5, size=(m, m))
    flow = FlowLogProbs(
        input=np.zeros((m, n)), reasoning=matrix, natural=matrix, row_prompt=rows,
        reasoning_group=reasoning_group, actions=["a"] * m,
        responses_per_prompt=np.full(n, float(k)),
    )  # fmt: skip
    full = np.diag(matrix) - flow_rows(flow)["reasoning"]

    def choose(seed):
        under = negative_groups(np.arange(n), n - 1, seed)
        swapped = np.zeros((m, m), bool)
        for row, chosen in enumerate(chosen_swaps(rows, under, 4, seed)):
            swapped[row, chosen] = True
        sampled = dataclasses.replace(flow, reasoning=np.where(swapped, matrix, np.nan))
        return swapped, np.diag(matrix) - flow_rows(sampled)["reasoning"]

    same_prompt = rows[:, None] == rows[None, :]
    inside, plain, corrected = draws_of(matrix, same_prompt, choose)
    assert inside == pytest.approx(np.exp(full), rel=0.05)  # Monte Carlo error: about 1%
    assert np.abs(corrected - full).mean() < 0.6 * np.abs(plain - full).mean()


def test_the_default_is_full_up_to_sixteen_prompts_and_bounded_beyond():
    assert Settings.build().scoring.negatives_bound == DEFAULT_NEGATIVES == 15
    assert Settings.build(negatives="all").scoring.negatives_bound is None
    assert unit_cost(16, 8, 64, 15, flow=False).negatives is None
    small, large = unit_cost(16, 8, 64, 15, True), unit_cost(256, 8, 64, 15, True)
    assert small.xz_pairs == 16 * 8 * 16 and large.xz_pairs == 256 * 8 * 16
    # per trace: 16 inputs, its own prompt's 8 traces and 30 others, twice
    assert large.flow_pairs == 256 * 8 * (16 + 2 * 38)
    full = unit_cost(256, 8, 64, None, True)
    assert full.xz_pairs == 256 * 8 * 256 and full.flow_pairs == 2048 * 256 + 2 * 2048**2


@pytest.mark.parametrize("value", ["0", "some", "-3"])
def test_a_bad_negatives_value_is_refused(value):
    from collapsecheck.errors import CollapsecheckError

    with pytest.raises(CollapsecheckError, match="--negatives must be"):
        Settings.build(negatives=value)


FAST = {"k": 3, "num_prompts": 6, "max_new_tokens": 48, "device": "cpu", "bootstrap": 50,
        "dtype": "float32"}  # fmt: skip


def test_a_sampled_scan_computes_the_full_matrices_entries(tmp_path):
    full_dir, sampled_dir = tmp_path / "full", tmp_path / "sampled"
    full = scan(HEALTHY, PROMPTS, dump=full_dir, negatives="all", **FAST)
    sampled = scan(HEALTHY, PROMPTS, dump=sampled_dir, negatives=2, **FAST)
    assert full.settings["cross_scoring"] == {
        "negatives": "all", "estimator": "full matrix", "flow_estimator": "full matrices",
        "early_answer_fractions": [0.0, 0.25, 0.5, 0.75, 1.0],
    }  # fmt: skip
    assert sampled.settings["cross_scoring"]["flow_estimator"] == (
        "sampled swaps: own prompt's traces + 4 others per action"
    )
    f, s = read_dump(full_dir)[0], read_dump(sampled_dir)[0]
    assert (s.scored.sum(axis=1) == 3).all() and f.is_full
    assert np.allclose(s.sum[s.scored], f.sum[s.scored], atol=1e-4)
    ff, sf = read_flow(full_dir), read_flow(sampled_dir)
    for name in ("input", "reasoning", "natural"):
        chosen = np.isfinite(getattr(sf, name))
        assert 0 < chosen.sum() < chosen.size
        assert np.allclose(getattr(sf, name)[chosen], getattr(ff, name)[chosen], atol=1e-4)
    assert math.isfinite(sampled.metrics["action_state_mi"].value)
