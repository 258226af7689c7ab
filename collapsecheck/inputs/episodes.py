"""Episodes as records (SPEC "Agents across turns"): the states an agent saw, what it said and
did at each turn, and how the episode ended. A scan that plays an environment makes them
(`runs.episodes`); every trainer's multi-turn file gives them (`from_trajectories`, from the
rows `inputs.rollouts` reads). `episodes.jsonl` of the dump holds one per line.

The state of a turn is the observation the policy saw at it: the environment's observation;
in a file, the turn's own `state` where its reader knows it (RAGEN's export: the user
message less its " (reward: r)"), else the turn's last user message (or its prompt text).
`--state-regex` picks the state out of that text (its first group, else the whole match)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collapsecheck.errors import CollapsecheckError

EPISODES_FILE = "episodes.jsonl"


@dataclass(frozen=True)
class EpisodeTurn:
    """One turn: the state seen, the response, the action taken ("" where the response has
    none; None where it is still to be located), the reward and the environment's info.
    Where a manager executes several actions a turn (RAGEN's, SPEC "RAGEN's own
    environments"): the action names as it parsed them, the ids it executed, the render after
    each and the format penalty it charged (None elsewhere). Where a framework's environment
    gets the whole reply: the reply as it was given (`given`) and the messages it returned."""

    state: str
    response: str
    action: str | None = None
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    parsed_actions: tuple[str, ...] | None = None
    action_ids: tuple[int | str, ...] | None = None
    renders: tuple[str, ...] | None = None
    penalty: float | None = None
    given: str | None = None
    returned: tuple[dict[str, Any], ...] | None = None

    def exchanged(self) -> dict[str, Any]:
        """What a chat-playing framework's environment was given and returned (SPEC "Every
        framework's environment"), as episodes.jsonl keeps them (none elsewhere)."""
        if self.given is None:
            return {}
        return {"given": self.given, "returned": list(self.returned or ())}

    def executed(self) -> dict[str, Any]:
        """The manager's fields as episodes.jsonl keeps them (none where there is no manager)."""
        if self.action_ids is None:
            return {}
        return {
            "actions_parsed": list(self.parsed_actions or ()), "action_ids": list(self.action_ids),
            "renders": list(self.renders or ()), "penalty": self.penalty,
        }  # fmt: skip


@dataclass(frozen=True)
class Episode:
    """One episode: `start` numbers its start state among the scan's (a played episode's
    seed; None for a file's trajectory until its first state is compared with the others',
    `runs.measuring.with_actions`), `seed` the environment's seed (None in a file), its
    turns, the observation
    after the last turn (None where unknown), whether it ended (`done`) and succeeded (None
    where nothing says)."""

    start: int | None
    seed: int | None
    turns: tuple[EpisodeTurn, ...]
    final_state: str | None = None
    done: bool | None = None
    success: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """Its line in episodes.jsonl (SPEC "Dump format")."""
        return {
            "start": self.start,
            "seed": self.seed,
            "turns": [
                {
                    "state": t.state,
                    "response": t.response,
                    "action": t.action or "",
                    "reward": t.reward,
                    "info": t.info,
                    **t.executed(),
                    **t.exchanged(),
                }
                for t in self.turns
            ],
            "final_state": self.final_state,
            "done": self.done,
            "success": self.success,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Episode:
        turns = tuple(
            EpisodeTurn(t["state"], t["response"], t.get("action"), t.get("reward"),
                        t.get("info") or {}, *_executed(t), t.get("given"),
                        None if "returned" not in t else tuple(t["returned"]))
            for t in row["turns"]
        )  # fmt: skip
        return cls(row.get("start"), row.get("seed"), turns, row.get("final_state"),
                   row.get("done"), row.get("success"))  # fmt: skip


def _executed(turn: dict[str, Any]) -> tuple[Any, ...]:
    """A turn's manager fields read back from episodes.jsonl (Nones where it has none)."""
    if "action_ids" not in turn:
        return None, None, None, None
    return (tuple(turn.get("actions_parsed") or ()), tuple(turn["action_ids"]),
            tuple(turn.get("renders") or ()), turn.get("penalty"))  # fmt: skip


def picked_state(text: str, regex: str | None, where: str) -> str:
    """The state in an observation's text: `regex`'s first group (else its match) where one
    is given, the whole text otherwise; an observation it does not match is an error."""
    if regex is None:
        return text
    match = re.search(regex, text, flags=re.DOTALL)
    if match is None:
        raise CollapsecheckError(f"{where}: --state-regex {regex!r} does not match {text!r:.80}")
    return match.group(1) if match.re.groups else match.group(0)


def last_user_text(turn: dict[str, Any]) -> str:
    """A file's turn's observation: its `state`, else its context's last user message, else
    its prompt as text."""
    if isinstance(turn.get("state"), str):
        return turn["state"]
    context = turn.get("messages", turn.get("prompt"))
    if isinstance(context, list):
        users = [
            m.get("content") for m in context if isinstance(m, dict) and m.get("role") == "user"
        ]
        texts = [u for u in users if isinstance(u, str)]
        return texts[-1] if texts else ""
    return context if isinstance(context, str) else ""


def from_trajectories(
    rows: Sequence[tuple[str, dict[str, Any], int]], state_regex: str | None
) -> list[Episode]:
    """A multi-turn file's trajectories as episodes: each turn's state and response, the
    row's `final_state` and `success` where it has them (their start states are numbered
    later: trajectories whose first states are equal share one)."""
    episodes = []
    for where, row, _ in rows:
        turns = []
        for number, turn in enumerate(row["turns"], start=1):
            state = picked_state(last_user_text(turn), state_regex, f"{where} turn {number}")
            response = turn.get("response")
            turns.append(EpisodeTurn(state, response if isinstance(response, str) else ""))
        final = row.get("final_state")
        if isinstance(final, str):
            final = picked_state(final, state_regex, f"{where} (final_state)")
        success = row.get("success")
        episodes.append(Episode(None, None, tuple(turns),
                                final if isinstance(final, str) else None, None,
                                bool(success) if isinstance(success, bool) else None))  # fmt: skip
    return episodes
