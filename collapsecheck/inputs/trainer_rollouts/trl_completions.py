"""TRL's GRPOTrainer with `log_completions=True`: `output_dir/completions/
completions_{step:05d}.parquet`, written by `GRPOTrainer.log()` after the optimizer step of
`step`, with columns step, prompt, completion, one column per reward function (named after
it), any extra logged columns, and advantage.

What the file holds (TRL 1.16, read from its `log()`): the completions TRL keeps in a buffer
of one generation batch, so with `logging_steps` > 1 only the last generation batch before
the logging step, not every step's. `prompt` is the chat messages (conversational datasets)
or the text; `completion` the assistant message(s) or the text. The file has no group id (a
prompt's `num_generations` completions share its prompt) and no token ids (completions are
tokenized again, which may differ from the sampled ids at a few boundaries). The reward is
TRL's weighted sum of the reward columns; the weights (`GRPOConfig.reward_weights`) are not in
the file, so the columns are summed with equal weights, TRL's default, and a note says so
(`--reward-field` picks one column instead)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import read_parquet_rows
from collapsecheck.inputs.trainer_configs import SavedConfig, TemperatureKeys
from collapsecheck.inputs.trainer_rollouts.base import (
    NamedSteps,
    TrainerRollouts,
    number,
    require,
)

TRAINER = "trl"
NAME = re.compile(r"completions_(\d+)\.parquet")
COLUMNS = ("step", "prompt", "completion", "advantage")
NOT_REWARDS = {"step", "prompt", "completion", "advantage", "image"}
FOLDER = "completions"  # beside the checkpoints, in the output_dir
# TRL saves its arguments only as training_args.bin, a pickle: never read
TEMPERATURE = TemperatureKeys(
    (), "TRL samples at GRPOConfig.temperature, 1.0 by default (its training_args.bin is a "
    "pickle, left unread)", 1.0,
)  # fmt: skip
SAVED_CONFIG = SavedConfig(TRAINER, TEMPERATURE, TEMPERATURE)


# the file of step s, written after update s from what the policy before it generated
LAYOUT = NamedSteps(NAME, FOLDER)
matches, step_of, policy_step, beside = (
    LAYOUT.named, LAYOUT.step_of, LAYOUT.policy_step, LAYOUT.beside
)  # fmt: skip


def completion_text(value: Any, where: str) -> str:
    """The completion as text: the assistant messages' contents joined, or the text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        parts = [m["content"] for m in value if m.get("role", "assistant") == "assistant"]
        if all(isinstance(p, str) for p in parts) and parts:
            return "".join(parts)
    raise CollapsecheckError(f"{where}: field 'completion' is neither text nor assistant messages")


def reward_columns(row: dict[str, Any]) -> list[str]:
    """The reward functions' columns: numeric columns that are not TRL's own."""
    return [k for k, v in row.items() if k not in NOT_REWARDS and isinstance(v, int | float)]


def completion_row(
    prompt: Any, completion: Any, rewards: Mapping[str, float], weights: Mapping[str, float],
    where: str,
) -> dict[str, Any]:  # fmt: skip
    """One completion as a rollout row. Its reward is TRL's: the weighted sum of the reward
    functions that scored it; NaN marks a function that did not apply to it, skipped as TRL's
    nansum skips it."""
    applied = {name: value for name, value in rewards.items() if not math.isnan(value)}
    if rewards and not applied:
        raise CollapsecheckError(f"{where}: no reward function scored this completion (all NaN)")
    reward = sum(weights[name] * value for name, value in applied.items())
    return {
        "prompt": prompt,
        "response": completion_text(completion, where),
        **({"reward": reward} if rewards else {}),
        **rewards,
        "group": json.dumps(prompt, sort_keys=True, default=str),
    }


def read(path: Path) -> TrainerRollouts:
    raw = read_parquet_rows(path)
    if not raw:
        raise CollapsecheckError(f"{path}: no completions (the file is empty)")
    columns = reward_columns(raw[0])
    equal = dict.fromkeys(columns, 1.0)
    rows, steps = [], set()
    for index, row in enumerate(raw, start=1):
        where = f"{path}, row {index}"
        require(row, COLUMNS, where)
        steps.add(int(number(row["step"], where, "step")))
        rewards = {c: number(row[c], where, c, missing_ok=True) for c in columns}
        completion = completion_row(row["prompt"], row["completion"], rewards, equal, where)
        rows.append((where, completion, index))
    if len(steps) != 1:
        raise CollapsecheckError(f"{path}: rows of several steps ({sorted(steps)})")
    (step,) = steps
    notes = [f"TRL completions of step {step}: {len(rows)} completions"]
    if columns:
        notes.append(
            f"reward = {' + '.join(columns)} (equal weights, TRL's default: the file does not "
            "record GRPOConfig.reward_weights; --reward-field NAME reads one column)"
        )
    return TrainerRollouts(TRAINER, step, rows, notes)
