"""SPEC "Agents across turns", the pure part: stall, revisit and undo counted on hand-made
episodes, the pooled rates and their intervals over start states, the reading, and the
finding where the agent stops reading its state."""

import math

import numpy as np
import pytest

from collapsecheck.measures.by_turn import TurnDependence, stops_reading, turn_entry
from collapsecheck.measures.episodes import (
    EpisodeIds,
    compute_episode_metrics,
    read_episodes,
    state_text,
    step_counts,
)
from collapsecheck.measures.metrics import Estimate
from collapsecheck.measures.verdict import Thresholds

A, B, C, D = range(4)


@pytest.mark.parametrize(
    ("states", "final", "counts"),
    [
        ((A, B, A), C, (3, 0, 1, 1)),  # B -> A undoes A -> B; A -> C is new
        ((A, A), B, (2, 1, 0, 0)),  # A -> A changed nothing
        ((A, B, C), A, (3, 0, 1, 0)),  # C -> A revisits the start, but undoes no move
        ((A, B, C, B), None, (3, 0, 1, 1)),  # the last turn's next state is unknown
        ((A,), None, (0, 0, 0, 0)),  # one turn, no final state: no step
        # B -> B stalls; B -> A revisits (s_{t-1} is B: no undo); A -> B revisits and undoes
        ((A, B, B, A), B, (4, 1, 2, 1)),
    ],
)
def test_steps_are_counted_as_the_spec_defines_them(states, final, counts):
    episode = EpisodeIds(0, states, tuple(range(len(states))), final)
    assert step_counts(episode) == counts


def test_a_manager_that_executes_several_actions_a_turn_counts_each_as_a_step():
    """SPEC "RAGEN's own environments": an `Up || Down` turn is a step and its undo inside one
    turn; a turn that executed none is one step that changed nothing; turns stay turns."""
    from collapsecheck.inputs.episodes import Episode, EpisodeTurn
    from collapsecheck.measures.episodes import episode_ids

    turns = (
        EpisodeTurn("A", "r1", "Up || Down", -0.2, {}, ("Up", "Down"), (1, 2), ("B", "A"), 0.0),
        EpisodeTurn("A", "r2", "", 0.0, {}, (), (), (), -0.1),  # nothing valid: a stall
        EpisodeTurn("A", "r3", "Right", -0.1, {}, ("Right",), (4,), ("C",), 0.0),
    )
    (ids,), starts = episode_ids([Episode(0, 7, turns, "C", False, False)])
    assert (starts, ids.turns) == (1, 3)
    assert step_counts(ids) == (4, 1, 1, 1)  # A->B, B->A (undo), A->A (stall), A->C
    metrics = compute_episode_metrics([ids], starts, resamples=20)
    assert metrics["undo_rate"].value == metrics["stall_rate"].value == 0.25
    assert metrics["turns_per_episode"].value == 3


def test_an_undo_needs_a_move_before_it():
    # t = 1: s_2 = s_1 is a stall, never an undo (there is no s_0)
    assert step_counts(EpisodeIds(0, (A,), (0,), A)) == (1, 1, 0, 0)


def test_states_compare_with_whitespace_runs_collapsed():
    assert state_text("  agent 1,2\n goal\t3,4 ") == "agent 1,2 goal 3,4"


def episodes_of_two_starts():
    return [
        # start 0: two episodes that undo every second move, the same actions
        EpisodeIds(0, (A, B, A, B), (0, 1, 0, 1), A, False),
        EpisodeIds(0, (A, B, A, B), (0, 1, 0, 1), A, False),
        # start 1: two episodes that walk to the goal, different routes
        EpisodeIds(1, (C, D), (2, 3), B, True),
        EpisodeIds(1, (C, A), (3, 2), B, True),
    ]


def test_rates_pool_the_steps_of_every_episode():
    metrics = compute_episode_metrics(episodes_of_two_starts(), 2, resamples=200, seed=0)
    # start 0: 8 steps, 6 revisits (t >= 2: A, B, A each time), all 6 undos; start 1: 4 steps
    assert metrics["revisit_rate"].value == pytest.approx(6 / 12)
    assert metrics["undo_rate"].value == pytest.approx(6 / 12)
    assert metrics["stall_rate"].value == 0
    assert metrics["success_rate"].value == pytest.approx(0.5)
    assert metrics["turns_per_episode"].value == pytest.approx(3.0)
    # start 0: one sequence of two episodes (0.5); start 1: two of two (1.0)
    assert metrics["distinct_action_sequences"].value == pytest.approx(0.75)
    for metric in metrics.values():
        assert metric.low <= metric.value <= metric.high


def test_the_interval_resamples_start_states():
    metrics = compute_episode_metrics(episodes_of_two_starts(), 2, resamples=500, seed=1)
    # a resample of start 0 twice revisits at 6/8, of start 1 twice at 0
    assert metrics["revisit_rate"].low == pytest.approx(0.0)
    assert metrics["revisit_rate"].high == pytest.approx(0.75)
    one_start = compute_episode_metrics(episodes_of_two_starts()[:2], 1, resamples=100)
    assert one_start["revisit_rate"] == Estimate(0.75, 0.75, 0.75)


def test_success_unknown_is_not_counted_as_failure():
    episodes = [EpisodeIds(0, (A,), (0,), B, None), EpisodeIds(1, (C,), (0,), D, True)]
    assert compute_episode_metrics(episodes, 2, resamples=50)["success_rate"].value == 1.0
    unknown = [EpisodeIds(0, (A,), (0,), B, None)]
    assert math.isnan(compute_episode_metrics(unknown, 1, resamples=50)["success_rate"].value)


def rates(revisit, stall):
    return {"revisit_rate": Estimate(*revisit), "stall_rate": Estimate(*stall)}


@pytest.mark.parametrize(
    ("revisit", "stall", "regime"),
    [
        ((0.5, 0.3, 0.7), (0.0, 0.0, 0.0), "looping"),
        ((0.05, 0.0, 0.1), (0.5, 0.35, 0.6), "stalling"),
        ((0.5, 0.3, 0.7), (0.5, 0.35, 0.6), "looping"),  # looping is named first
        ((0.05, 0.0, 0.1), (0.1, 0.0, 0.2), "progressing"),
        ((0.15, 0.05, 0.3), (0.1, 0.0, 0.2), "inconclusive"),  # straddles 0.2
        ((math.nan,) * 3, (math.nan,) * 3, "not_measured"),
    ],
)
def test_the_reading(revisit, stall, regime):
    reading = read_episodes(rates(revisit, stall), 0.2, 0.3, 4, 2)
    assert reading.regime == regime
    assert "revisit_rate" in reading.reason


def test_the_lines_move_the_reading():
    measured = rates((0.25, 0.21, 0.3), (0.0, 0.0, 0.0))
    assert read_episodes(measured, 0.2, 0.3, 4, 2).regime == "looping"
    assert read_episodes(measured, 0.5, 0.3, 4, 2).regime == "progressing"


def entry(turn, nmi, skill):
    metrics = {"normalized_mi": Estimate(*nmi), "retrieval_skill": Estimate(*skill),
               "conditional_entropy_est": Estimate(0.5, 0.4, 0.6)}  # fmt: skip
    return TurnDependence(turn, 8, 8, metrics)


def test_the_agent_that_stops_reading_is_found():
    grounded = entry(1, (0.9, 0.8, 0.95), (0.9, 0.75, 1.0))
    collapsed = entry(3, (0.1, 0.0, 0.2), (0.05, 0.0, 0.25))
    middle = entry(2, (0.5, 0.3, 0.7), (0.5, 0.2, 0.8))
    finding = stops_reading([grounded, middle, collapsed], Thresholds())
    assert finding is not None and "turn 1" in finding and "turn 3" in finding
    # beyond the intervals only: a later turn whose interval reaches the line is no finding
    unsure = entry(3, (0.1, 0.0, 0.35), (0.05, 0.0, 0.25))
    assert stops_reading([grounded, unsure], Thresholds()) is None
    # a collapse before the grounded turn is not the agent that stops reading
    assert stops_reading([collapsed, entry(4, (0.9, 0.8, 0.95), (0.9, 0.75, 1.0))],
                         Thresholds()) is None  # fmt: skip


def test_a_turn_with_one_context_is_not_measured():
    single = turn_entry(4, 1, 3, None)
    assert not single.measured and single.reason
    assert single.to_dict()["normalized_mi"] is None
    back = TurnDependence.from_dict(entry(2, (0.5, 0.4, 0.6), (0.5, 0.4, 0.6)).to_dict())
    assert back.metrics["normalized_mi"] == Estimate(0.5, 0.4, 0.6)
    assert np.isfinite(back.metrics["retrieval_skill"].value)


def test_info_shares_count_only_the_turns_that_gave_a_key():
    from collapsecheck.measures.episodes import info_shares

    shares = info_shares({"action_is_valid": [True, False, True, True], "action_is_effective": []})
    assert shares == {"action_is_valid": 0.75}


def step(entropy, distinct):
    return {"conditional_entropy_est": Estimate(*entropy),
            "distinct_action_sequences": Estimate(*distinct)}  # fmt: skip


def test_a_strategy_that_narrows_while_the_text_still_varies_is_found():
    from collapsecheck.measures.findings import strategy_narrowing

    labels = ["100", "200", "300"]
    narrowing = [step((0.50, 0.4, 0.6), (0.9, 0.8, 1.0)), step((0.5, 0.4, 0.6), (0.6, 0.5, 0.7)),
                 step((0.55, 0.45, 0.65), (0.3, 0.2, 0.4))]  # fmt: skip
    found = strategy_narrowing(labels, narrowing)
    assert found is not None and found.kind == "strategy_narrowing"
    assert "steps 100 -> 300" in found.text and "0.90 -> 0.30" in found.text
    # the entropy fell as well: the dashboard would have seen it, no finding
    fell = [*narrowing[:2], step((0.2, 0.1, 0.3), (0.3, 0.2, 0.4))]
    assert strategy_narrowing(labels, fell) is None
    # intervals that overlap: no finding
    overlap = [*narrowing[:2], step((0.5, 0.4, 0.6), (0.7, 0.5, 0.85))]
    assert strategy_narrowing(labels, overlap) is None
    # steps without episodes are not read
    assert strategy_narrowing(labels[:1], narrowing[:1]) is None


def test_trajectories_from_one_first_state_share_a_start():
    from collapsecheck.measures.episodes import start_numbers

    assert start_numbers(["agent 1,1", "agent 2,2", "agent  1,1 ", "agent 3,3"]) == [0, 1, 0, 2]


def test_paired_changes_resample_the_same_start_states_for_both():
    """SPEC "Comparing two checkpoints on the same start states": B equal to A changes nothing
    in any resample (an unpaired interval would not be 0 wide); B revisiting more on every
    start state is worse beyond noise, and only that."""
    from collapsecheck.measures.episodes import paired_episode_deltas, worse_beyond_noise

    a = [EpisodeIds(s, (A, B, C), (0, 1, 2), D, s % 2 == 0) for s in range(6)]
    same = paired_episode_deltas(a, a, 6, resamples=200)
    assert all((d.value, d.low, d.high) == (0, 0, 0) for d in same.values())
    b = [EpisodeIds(s, (A, B, A), (0, 1, 0), B, s % 2 == 0) for s in range(6)]
    deltas = paired_episode_deltas(a, b, 6, resamples=200)
    assert deltas["revisit_rate"].value == pytest.approx(2 / 3)
    assert deltas["revisit_rate"].low > 0
    assert worse_beyond_noise(deltas) == ["revisit_rate", "undo_rate"]
