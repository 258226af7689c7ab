"""RAGEN's trajectory files (mll-lab-nu/RAGEN 20daedc, `ragen/llm_agent/agent_proxy.py`
`_save_as_jsonl`, run as `python -m ragen.llm_agent.agent_proxy` with `output.format=jsonl`,
or its pickle converted by `scripts/convert_to_jsonl.py`): one line per trajectory,
`{"custom_id", "messages", "metadata"}`. The messages alternate the environment's state (a
user message, "(reward: r)" appended after the first) and the policy's response (an assistant
message, `<think>...</think><answer>...</answer>`); `metadata` holds `env_id`, `group_id`,
`num_turns` and `total_reward` (the environment's rewards and format penalties summed).

Read as multi-turn rollouts (SPEC "Multi-turn"): each assistant message is one turn, its
context every message before it, rendered with the checkpoint's chat template; its reward the
trajectory's total. RAGEN's own training context is built differently (a system instruction
and each state as "Turn k: State: ..."), and the file keeps only the states: a note says the
context is the conversation as saved, not the exact prompt the policy saw. RAGEN's writer at
20daedc writes `total_reward` 0 for every trajectory (its `np.sum` of a torch tensor raises,
and it falls back to 0): a file whose rewards are all 0 is read without rewards, and the note
says why.
The default `val_rollouts.pkl` is a pickled veRL DataProto: refused, naming the converter."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.trainer_configs import (
    HYDRA_CONFIG,
    SavedConfig,
    TemperatureKeys,
    always,
)
from collapsecheck.inputs.trainer_rollouts.base import (
    TrainerRollouts,
    assistant_turns,
    number,
    require,
)

TRAINER = "ragen"
FIELDS = ("messages", "metadata")
PICKLE_PREFIX = "val_rollouts"
# the export is an evaluation (agent_proxy, a Hydra entry point): sampled at val_kwargs, which
# RAGEN falls back from to the rollout's own temperature (`_get_rollout_val_kwarg`)
VALIDATION = TemperatureKeys(
    ("actor_rollout_ref.rollout.val_kwargs.temperature", "actor_rollout_ref.rollout.temperature"),
    "RAGEN validates at val_kwargs.temperature, 0.5 by default",
    0.5,
)
SAVED_CONFIG = SavedConfig(TRAINER, VALIDATION, VALIDATION, (HYDRA_CONFIG,), always)
REWARD_SUFFIX = re.compile(r"\s*\(reward: [^()]*\)\s*$")
ALL_ZERO = (
    "every trajectory's total_reward is 0, so none is read as a reward: RAGEN's writer "
    "(20daedc) sums the scores with np.sum on a torch tensor, which raises, and writes 0 "
    "(unless every trajectory truly earned 0)"
)


def first_row(path: Path) -> Any:
    with path.open(encoding="utf-8") as stream:
        try:
            return json.loads(stream.readline())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None


def is_pickled_dataproto(path: Path) -> bool:
    return path.suffix == ".pkl" and path.name.startswith(PICKLE_PREFIX)


def matches(path: Path) -> bool:
    if not path.is_file():
        return False
    if is_pickled_dataproto(path):
        return True
    row = first_row(path) if path.suffix == ".jsonl" else None
    return (
        isinstance(row, dict)
        and all(f in row for f in FIELDS)
        and isinstance(row["metadata"], dict)
        and "total_reward" in row["metadata"]
    )


def step_of(path: Path) -> None:
    """None: RAGEN writes these at evaluation, named by time, not by a training step."""
    return None


def policy_step(path: Path) -> None:
    return None


def beside(run_dir: Path) -> None:
    """None: RAGEN writes evaluation trajectories where `output.dir` says."""
    return None


def observation(message: dict[str, Any]) -> str | None:
    """A state message's observation, less the " (reward: r)" RAGEN appends after the first
    (SPEC "Agents across turns": the state of a turn)."""
    content = message.get("content")
    return REWARD_SUFFIX.sub("", content) if isinstance(content, str) else None


def with_states(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each turn with its state: its context's last user message, less the reward."""
    for turn in turns:
        users = [m for m in turn["messages"] if m.get("role") == "user"]
        state = observation(users[-1]) if users else None
        if state is not None:
            turn["state"] = state
    return turns


def final_state(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The observation after the last turn: RAGEN's export ends with it (a user message)."""
    last = messages[-1] if messages else {}
    state = observation(last) if last.get("role") == "user" else None
    return {"final_state": state} if state is not None else {}


def read(path: Path) -> TrainerRollouts:
    if is_pickled_dataproto(path):
        raise CollapsecheckError(
            f"{path}: RAGEN's pickled DataProto is not read (it is veRL's class, and a pickle "
            "can run code); write JSONL with output.format=jsonl, or convert it with RAGEN's "
            "scripts/convert_to_jsonl.py --input FILE.pkl"
        )
    rows = []
    for where, row, line in jsonl_rows(path, path.read_text(encoding="utf-8").splitlines()):
        require(row, FIELDS, where)
        metadata = row["metadata"]
        require(metadata, ("total_reward",), f"{where} (metadata)")
        rows.append((where, {
            "turns": with_states(assistant_turns(row["messages"], where)),
            "reward": number(metadata["total_reward"], where, "metadata.total_reward"),
            "group": metadata.get("group_id"),
            **final_state(row["messages"]),
            **({"success": metadata["success"]} if isinstance(metadata.get("success"), bool)
               else {}),
        }, line))  # fmt: skip
    if not rows:
        raise CollapsecheckError(f"{path}: no trajectories (the file is empty)")
    count = sum(len(r["turns"]) for _, r, _ in rows)
    notes = [
        f"RAGEN trajectories: {len(rows)} trajectories, {count} turns, each turn's context the "
        "conversation before it as saved (the states, rendered by the chat template), not "
        "RAGEN's own 'Turn k: State:' prompt; reward: the trajectory's total_reward"
    ]
    if all(row["reward"] == 0 for _, row, _ in rows):
        rows = [(w, {k: v for k, v in r.items() if k != "reward"}, n) for w, r, n in rows]
        notes.append(ALL_ZERO)
    return TrainerRollouts(TRAINER, None, rows, notes)
