"""What episodes show across their turns (SPEC "Agents across turns"): the agent that stalls,
revisits and undoes its own moves, how often it succeeds, and how varied its strategy is.
Pure numpy: states and actions come in as integer ids (equal text, equal id), so the same
functions read played episodes and every trainer's multi-turn file.

Every rate is pooled over the steps of all episodes; its 95% interval resamples the start
states with all their episodes (the prompts' resamples, as every metric: SPEC "95%
intervals")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapsecheck.measures.metrics import (
    DEFAULT_RESAMPLES,
    Estimate,
    MetricValue,
    bootstrap_prompt_weights,
    finite_interval,
    interval_bounds,
    interval_text,
)
from collapsecheck.measures.regimes import (
    INCONCLUSIVE,
    LOOPING,
    NOT_MEASURED,
    PROGRESSING,
    STALLING,
)

EPISODE_KEYS = (
    "stall_rate",
    "revisit_rate",
    "undo_rate",
    "success_rate",
    "turns_per_episode",
    "distinct_action_sequences",
)


def state_text(text: str) -> str:
    """A state as it is compared: whitespace runs collapsed to one space, ends stripped."""
    return " ".join(text.split())


@dataclass(frozen=True)
class EpisodeIds:
    """One episode as ids: `states` s_1 .. s_T (the state at each turn), `final` s_{T+1}
    where known (None: the file does not say it), `actions` one id per turn, `success`
    1/0 (None: unknown). `path`: where a turn executes several actions (RAGEN's manager),
    the states one step at a time (s_1, the state after each executed action; a turn that
    executed none, its state again), which the steps are counted over instead of turns."""

    start: int
    states: tuple[int, ...]
    actions: tuple[int, ...]
    final: int | None = None
    success: bool | None = None
    path: tuple[int, ...] | None = None

    @property
    def turns(self) -> int:
        return len(self.states)

    def visited(self) -> tuple[int, ...]:
        """The states step by step: the path where there is one, else s_1 .. s_T and s_{T+1}
        where known."""
        if self.path is not None:
            return self.path
        return self.states + (() if self.final is None else (self.final,))


STEP, STALL, REVISIT, UNDO = "step", "stall", "revisit", "undo"


def step_kinds(episode: EpisodeIds) -> list[str]:
    """What each step v_t -> v_{t+1} of one episode's visited states was (SPEC "Agents
    across turns"): a stall, an undo (also a revisit), a revisit, or a plain step."""
    kinds = []
    visited = episode.visited()
    for t in range(len(visited) - 1):  # 0-based t: the step from visited[t]
        after = visited[t + 1]
        if after == visited[t]:
            kinds.append(STALL)
        elif after in visited[:t]:
            kinds.append(UNDO if t >= 1 and after == visited[t - 1] else REVISIT)
        else:
            kinds.append(STEP)
    return kinds


def start_numbers(first_states: Sequence[str]) -> list[int]:
    """Each episode's start state numbered by its first state (equal text, one number, in
    order of first appearance): a file's trajectories from one start share a start."""
    numbers: dict[str, int] = {}
    return [numbers.setdefault(state_text(state), len(numbers)) for state in first_states]


def episode_ids(episodes: Sequence[Any]) -> tuple[list[EpisodeIds], int]:
    """Episodes (`inputs.episodes.Episode`: a start number, turns with a `state` and an
    `action`, a `final_state`, a `success`) as ids for the measures, equal text after
    `state_text` one id; and the number of start states."""
    states: dict[str, int] = {}
    actions: dict[str, int] = {}

    def state_id(text: str) -> int:
        return states.setdefault(state_text(text), len(states))

    def path_of(episode: Any) -> tuple[int, ...] | None:
        """The states action by action, where every turn says what its actions rendered."""
        turns = episode.turns
        if not turns or any(t.renders is None for t in turns):
            return None
        path = [state_id(turns[0].state)]
        for turn in turns:
            path += [state_id(r) for r in turn.renders] or [path[-1]]
        return tuple(path)

    found = [
        EpisodeIds(
            episode.start,
            tuple(state_id(t.state) for t in episode.turns),
            tuple(actions.setdefault(t.action or "", len(actions)) for t in episode.turns),
            None if episode.final_state is None else state_id(episode.final_state),
            episode.success,
            path_of(episode),
        )
        for episode in episodes
    ]
    return found, 1 + max((e.start for e in found), default=-1)


def step_counts(episode: EpisodeIds) -> tuple[int, int, int, int]:
    """(steps, stalls, revisits, undos) of one episode; an undo counts as a revisit too."""
    kinds = step_kinds(episode)
    undos = kinds.count(UNDO)
    return len(kinds), kinds.count(STALL), kinds.count(REVISIT) + undos, undos


@dataclass(frozen=True)
class StartTotals:
    """Per start state (one entry each): the sums the pooled rates are ratios of."""

    steps: np.ndarray
    stalls: np.ndarray
    revisits: np.ndarray
    undos: np.ndarray
    successes: np.ndarray
    known_success: np.ndarray
    turns: np.ndarray
    episodes: np.ndarray
    distinct_share: np.ndarray  # distinct action sequences / episodes


def start_totals(episodes: Sequence[EpisodeIds], starts: int) -> StartTotals:
    sums = np.zeros((8, starts))
    sequences: list[set[tuple[int, ...]]] = [set() for _ in range(starts)]
    for episode in episodes:
        s = episode.start
        sums[:4, s] += step_counts(episode)
        sums[4, s] += bool(episode.success)
        sums[5, s] += episode.success is not None
        sums[6, s] += episode.turns
        sums[7, s] += 1
        sequences[s].add(episode.actions)
    with np.errstate(invalid="ignore", divide="ignore"):
        distinct = np.array([len(q) for q in sequences]) / sums[7]
    return StartTotals(*sums, distinct_share=distinct)


def _ratio(weights: np.ndarray, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ top) / (weights @ bottom)


def rates(totals: StartTotals, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Every episode metric under each row of (B, starts) start weights; NaN where a
    resample holds no step (or no episode whose success is known)."""
    has = totals.episodes > 0
    return {
        "stall_rate": _ratio(weights, totals.stalls, totals.steps),
        "revisit_rate": _ratio(weights, totals.revisits, totals.steps),
        "undo_rate": _ratio(weights, totals.undos, totals.steps),
        "success_rate": _ratio(weights, totals.successes, totals.known_success),
        "turns_per_episode": _ratio(weights, totals.turns, totals.episodes),
        "distinct_action_sequences": _ratio(
            weights[:, has], totals.distinct_share[has], np.ones(int(has.sum()))
        ),
    }


# the episode metrics a paired compare reads as worse when they move this way (+1 up, -1 down)
WORSE_WHEN = {"success_rate": -1, "stall_rate": 1, "revisit_rate": 1, "undo_rate": 1}


def paired_episode_deltas(
    a: Sequence[EpisodeIds], b: Sequence[EpisodeIds], starts: int, *,
    resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
) -> dict[str, Estimate]:  # fmt: skip
    """B - A of each episode metric where both played the same start states (numbered alike
    in both): each resample draws the start states once, with all of A's and B's episodes
    from each, and recomputes both pooled rates (SPEC "Comparing two checkpoints on the same
    start states")."""
    totals = start_totals(a, starts), start_totals(b, starts)
    ones = np.ones((1, starts))
    weights = bootstrap_prompt_weights(starts, resamples, seed)
    point = [rates(t, ones) for t in totals]
    boot = [rates(t, weights) for t in totals]
    deltas = {}
    for key in EPISODE_KEYS:
        change = float(point[1][key][0] - point[0][key][0])
        deltas[key] = Estimate(change, *finite_interval(boot[1][key] - boot[0][key]))
    return deltas


def worse_beyond_noise(deltas: Mapping[str, Estimate]) -> list[str]:
    """The episode metrics whose whole 95% interval of B - A lies on their worse side of 0."""
    return [
        key
        for key, sign in WORSE_WHEN.items()
        if key in deltas and (deltas[key].low > 0 if sign > 0 else deltas[key].high < 0)
    ]


def compute_episode_metrics(
    episodes: Sequence[EpisodeIds], starts: int, *, resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, MetricValue]:  # fmt: skip
    """SPEC "Agents across turns": each metric with its 95% interval over start states."""
    if starts < 1 or not episodes:
        return {key: math.nan for key in EPISODE_KEYS}
    totals = start_totals(episodes, starts)
    point = rates(totals, np.ones((1, starts)))
    boot = rates(totals, bootstrap_prompt_weights(starts, resamples, seed))
    return {
        key: Estimate(float(point[key][0]), *finite_interval(boot[key])) for key in EPISODE_KEYS
    }


@dataclass(frozen=True)
class EpisodeReading:
    """The reading of a scan's episodes (SPEC "Agents across turns"): `looping`, `stalling`,
    `progressing`, `inconclusive`, or `not_measured` (no episode, or no step)."""

    regime: str
    reason: str
    episodes: int = 0
    starts: int = 0
    metrics: dict[str, MetricValue] = field(default_factory=dict)
    # the share of turns whose info said true, per RAGEN key the environment gave
    info: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"regime": self.regime, "reason": self.reason, "episodes": self.episodes,
                "starts": self.starts, "info": self.info}  # fmt: skip


NO_EPISODES = EpisodeReading(NOT_MEASURED, "no episodes: single-turn prompts")


def read_episodes(
    metrics: Mapping[str, MetricValue], looping_line: float, stalling_line: float,
    episodes: int, starts: int,
) -> EpisodeReading:  # fmt: skip
    """Looping where revisit_rate is at or above `looping_line` beyond its interval, else
    stalling where stall_rate is at or above `stalling_line`; progressing where both are below
    their lines beyond their intervals; else inconclusive (the lines: `FlowThresholds`)."""
    revisit, stall = metrics["revisit_rate"], metrics["stall_rate"]
    revisit_low, revisit_high = interval_bounds(revisit)
    stall_low, stall_high = interval_bounds(stall)
    said = (
        f"revisit_rate {interval_text(revisit)} (line {looping_line:g}), stall_rate "
        f"{interval_text(stall)} (line {stalling_line:g})"
    )
    if any(math.isnan(x) for x in (revisit_low, revisit_high, stall_low, stall_high)):
        regime, meaning = NOT_MEASURED, "no step whose next state is known"
    elif revisit_low >= looping_line:
        regime, meaning = LOOPING, "the agent goes back to states it has left"
    elif stall_low >= stalling_line:
        regime, meaning = STALLING, "the agent's actions often change nothing"
    elif revisit_high < looping_line and stall_high < stalling_line:
        regime, meaning = PROGRESSING, "the agent keeps reaching new states"
    else:
        regime, meaning = INCONCLUSIVE, "an interval straddles its line: play more episodes"
    return EpisodeReading(regime, f"{said}: {meaning}", episodes, starts, dict(metrics))


def info_shares(flags: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    """Per info key (RAGEN's `action_is_valid`, `action_is_effective`), the share of the
    turns that gave it whose value was true; keys no turn gave are left out."""
    return {key: float(np.mean(values)) for key, values in flags.items() if len(values)}
