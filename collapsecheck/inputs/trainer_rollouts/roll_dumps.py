"""ROLL's RLVR pipeline with `rollout_dump_dir: /ABSOLUTE/PATH`:
`rollout_dump_data.step_{N}.jsonl`, one JSON line holding the step's batch as columns (column ->
list, a value per response), written by `dump_rollout_to_specific_path` and
`write_to_json_process` (roll/pipeline/rlvr/utils.py of alibaba/ROLL). Only the columns of its
`COLUMNS_CONFIG` the batch has are kept: `global_step`, `id`, `source`, `difficulty`,
`prompt`, `messages`, `ground_truth`, `tag`, `domain`, `responses` (decoded with special
tokens skipped), `scores` and `sampling_params`.

Its agentic pipeline writes the same file name (`dump_rollout_trajectories`,
roll/pipeline/agentic/utils.py) only with an environment manager that sets `COLUMMNS_CONFIG`
(`AgentNativeStepEnvManager`, `ProxyEnvManager`; the default `TrajEnvManager` writes nothing):
a value per trajectory of `trajectory_data` (JSON: `reward_info.episode_reward`,
`env_info.group_id`, ...), `messages` (JSON: the trajectory's conversations) and `tools`. Read as
multi-turn rollouts: each assistant message a turn, its context the messages before it.

ROLL writes only when the path starts with "/" (its `json_checker`): a relative
`rollout_dump_dir` writes nothing, silently. A response's context: `messages` (the chat,
JSON text or a list), rendered with the checkpoint's chat template, else `prompt` as text;
responses are grouped by `id`, else by that context. In the synchronous pipeline step N's
batch is generated before its update, by the weights saved as `checkpoint-{N-1}` (step 0: the
base model); asynchronous generation can be up to `ceil(async_generation_ratio)` steps older."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.trainer_configs import SavedConfig, TemperatureKeys
from collapsecheck.inputs.trainer_rollouts.base import (
    NamedSteps,
    Row,
    TrainerRollouts,
    assistant_turns,
    number,
    text,
)

TRAINER = "roll"
NAME = re.compile(r"rollout_dump_data\.step_(\d+)\.jsonl")
CONTEXTS = ("messages", "prompt")
AGENTIC = ("trajectory_data", "messages")


LAYOUT = NamedSteps(NAME)  # no folder: ROLL writes where `rollout_dump_dir` says
# ROLL composes its config with Hydra's compose API, which saves none; its rows' sampling_params
# name the temperature where the dump keeps that column
TEMPERATURE = TemperatureKeys(
    (), "ROLL samples at actor_infer.generating_args.temperature, 0.95 by default", 0.95
)
SAVED_CONFIG = SavedConfig(TRAINER, TEMPERATURE, TEMPERATURE)
matches, step_of, policy_step, beside = (
    LAYOUT.named, LAYOUT.step_of, LAYOUT.policy_step, LAYOUT.beside
)  # fmt: skip


def columns(path: Path) -> dict[str, list[Any]]:
    """The file's one line of columns, every column a list of the same length."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        data = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError as err:
        raise CollapsecheckError(f"{path}:1: malformed JSON ({err.msg})") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise CollapsecheckError(f"{path}:1: not ROLL's dump (a line of column -> list)")
    wanted = AGENTIC if "trajectory_data" in data else ("responses", "scores")
    for name in wanted:
        if name not in data:
            raise CollapsecheckError(f"{path}:1: no {name!r} column")
    if len({len(v) for v in data.values()}) > 1:
        raise CollapsecheckError(f"{path}:1: the columns have different lengths")
    return data


def context(data: dict[str, list[Any]], index: int, where: str) -> tuple[str, Any]:
    """The response's context: its messages (parsed when JSON text), else its prompt."""
    name = next((c for c in CONTEXTS if c in data and data[c][index] not in (None, "")), None)
    if name is None:
        raise CollapsecheckError(f"{where}: no 'messages' or 'prompt' value")
    value = data[name][index]
    if name == "messages" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise CollapsecheckError(f"{where}: 'messages' is not JSON chat messages") from None
    return name, value


def parsed(value: Any, where: str, name: str) -> Any:
    """A column's JSON text, parsed."""
    try:
        return json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        raise CollapsecheckError(f"{where}: {name!r} is not JSON") from None


def trajectory_rows(path: Path, data: dict[str, list[Any]]) -> list[Row]:
    """The agentic pipeline's trajectories, each conversation of one a multi-turn row."""
    rows = []
    for index in range(len(data["trajectory_data"])):
        where = f"{path}:1, trajectory {index + 1}"
        trajectory = parsed(data["trajectory_data"][index], where, "trajectory_data")
        reward = ((trajectory or {}).get("reward_info") or {}).get("episode_reward")
        group = ((trajectory or {}).get("env_info") or {}).get("group_id")
        for conversation in parsed(data["messages"][index], where, "messages"):
            row = {"turns": assistant_turns(conversation, where), "group": group}
            row |= {} if reward is None else {"reward": number(reward, where, "episode_reward")}
            rows.append((where, row, index + 1))
    return rows


def sampled_at(data: dict[str, list[Any]], index: int, where: str) -> dict[str, float]:
    """The temperature a response was generated at, from its `sampling_params` (JSON text of
    `{"generation_config": {"temperature": T, ...}}`), where it names one."""
    if "sampling_params" not in data:
        return {}
    params = parsed(data["sampling_params"][index], where, "sampling_params")
    config = params.get("generation_config") if isinstance(params, dict) else None
    if not isinstance(config, dict) or "temperature" not in config:
        return {}
    return {"temperature": number(config["temperature"], where, "sampling_params temperature")}


def read(path: Path) -> TrainerRollouts:
    data = columns(path)
    if "trajectory_data" in data:
        rows = trajectory_rows(path, data)
        if not rows:
            raise CollapsecheckError(f"{path}: no trajectories (the columns are empty)")
        turns = sum(len(row["turns"]) for _, row, _ in rows)
        notes = [
            f"ROLL agentic trajectories of step {step_of(path)}: {len(rows)} trajectories, "
            f"{turns} turns, each in the conversation before it (rendered as the chat template "
            "renders it); reward: the episode's (reward_info.episode_reward)"
        ]
        return TrainerRollouts(TRAINER, step_of(path), rows, notes)
    rows, used = [], set()
    for index in range(len(data["responses"])):
        where = f"{path}:1, response {index + 1}"
        name, prompt = context(data, index, where)
        used.add(name)
        rows.append((where, {
            "prompt": prompt,
            "response": text(data["responses"][index], where, "responses"),
            "reward": number(data["scores"][index], where, "scores"),
            **({"group": data["id"][index]} if "id" in data else {}),  # else by the prompt
            **sampled_at(data, index, where),
        }, index + 1))  # fmt: skip
    if not rows:
        raise CollapsecheckError(f"{path}: no responses (the columns are empty)")
    step = step_of(path)
    notes = [
        f"ROLL rollouts of step {step}: {len(rows)} responses, each in its "
        f"{' or '.join(sorted(used))} (rendered as the chat template renders it), the "
        "responses as ROLL decoded them (special tokens skipped), tokenized again"
    ]
    return TrainerRollouts(TRAINER, step, rows, notes)
