"""SkyRL with `trainer.dump_data_batch=true`: `{export_path}/dumped_data/
global_step_{N}_training_input.pkl`, the step's training batch as `TrainingInputBatch.save`
pickles it (`RayPPOTrainer.dump_data`, skyrl/train/trainer.py; read at NovaSky-AI/SkyRL
a956457, and as skyrl-train 0.3.1 and skyrl 0.4.0 write it), after the advantages and before
the update.

The pickle names SkyRL's classes; they are never imported: the file is read as data
(`inputs.safe_load`), each class a plain record. Two encodings: skyrl-train up to 0.3.1
pickles the batch as a dict of tensors; later versions rebuild it from
`{"batch_dict": {name: {"format": "numpy", "data": bytes, "shape", "dtype"}}, ...}`. Read from
it: `sequences` (prompt and response ids, left-padded), `attention_mask`, `response_mask` (the
response's tokens: right-aligned since SkyRL #1285, left-aligned after the padded prompt
before), and `pad_size` (padding rows at the end, dropped). Multi-turn responses hold the
environment's tokens too (`loss_mask` 0): scored as they are.

What the file does not hold: the rewards and the group ids (SkyRL pops both before dumping),
so there is no "why" section, and responses are grouped by their prompt's ids; nor whether a
response was cut by the length limit. SkyRL's synchronous trainer sampled the batch of step N
with the weights after N - 1 updates (`global_step_{N-1}`); its fully asynchronous trainer
may have used older ones (`max_staleness_steps`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.safe_load import Record, load_pickle
from collapsecheck.inputs.trainer_configs import never
from collapsecheck.inputs.trainer_rollouts.base import NamedSteps, TrainerRollouts
from collapsecheck.inputs.trainer_rollouts.skyrl_evals import SAVED_CONFIG as EVALS_CONFIG

TRAINER = "skyrl"
NAME = re.compile(r"global_step_(\d+)_training_input\.pkl")
FOLDER = "dumped_data"
NEW = "skyrl.backends.skyrl_train.training_batch"
RECORDS = (
    "skyrl_train.training_batch.TrainingInputBatch",
    f"{NEW}.TrainingInputBatch",
    f"{NEW}._rebuild_tensor_batch",
    f"{NEW}.TensorFormat",
)
READ = ("sequences", "attention_mask", "response_mask")


# the synchronous trainer's step N was sampled by the weights of step N - 1
LAYOUT = NamedSteps(NAME, FOLDER)
SAVED_CONFIG = dataclasses.replace(EVALS_CONFIG, evaluates=never)  # training batches
matches, step_of, policy_step, beside = (
    LAYOUT.named, LAYOUT.step_of, LAYOUT.policy_step, LAYOUT.beside
)  # fmt: skip


def decoded(entry: Any, path: Path, name: str) -> np.ndarray:
    """One tensor of the newer encoding, from its bytes (integer tensors are numpy bytes)."""
    if not isinstance(entry, dict):
        raise CollapsecheckError(f"{path}: tensor {name!r} is missing")
    form = entry["format"].value if isinstance(entry["format"], Record) else entry["format"]
    if form != "numpy":
        raise CollapsecheckError(f"{path}: tensor {name!r} is stored as {form!r}, not numpy bytes")
    return np.frombuffer(entry["data"], dtype=entry["dtype"]).reshape(entry["shape"])


def tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors read and the batch's metadata, from either encoding."""
    data = load_pickle(path, RECORDS)
    if isinstance(data, Record) and data.kind.endswith("_rebuild_tensor_batch"):
        _, state = data["args"]
        batch = state["batch_dict"]
        return {n: decoded(batch.get(n), path, n) for n in READ}, state.get("metadata") or {}
    if isinstance(data, Record) and data.kind.endswith("TrainingInputBatch"):
        missing = [n for n in READ if data.get(n) is None]
        if missing:
            raise CollapsecheckError(f"{path}: tensor {missing[0]!r} is missing")
        return {n: data[n].numpy() for n in READ}, data.get("metadata") or {}
    raise CollapsecheckError(f"{path}: not a SkyRL TrainingInputBatch")


def split(row: int, arrays: dict[str, np.ndarray]) -> tuple[list[int], list[int]]:
    """A row's prompt ids and response ids, in either padding layout (module docstring)."""
    sequence, attended = arrays["sequences"][row], arrays["attention_mask"][row] == 1
    mask = arrays["response_mask"][row]
    length, width = int(mask.sum()), mask.shape[0]
    if mask[-1] == 1 or length == width:  # right-aligned: the row's last tokens
        prompt, response = sequence[attended][:-length], sequence[-length:]
    else:  # after the prompt, which is left-padded to the batch's longest
        start = sequence.shape[0] - width
        prompt = sequence[:start][attended[:start]]
        response = sequence[start : start + length]
    return [int(i) for i in prompt], [int(i) for i in response]


def read(path: Path) -> TrainerRollouts:
    arrays, metadata = tensors(path)
    rows = arrays["sequences"].shape[0] - int(metadata.get("pad_size") or 0)
    read_rows = []
    for row in range(rows):
        prompt, response = split(row, arrays)
        if not prompt or not response:
            raise CollapsecheckError(f"{path}, row {row + 1}: no prompt or no response tokens")
        read_rows.append((f"{path}, row {row + 1}", {
            "prompt_ids": prompt, "response_ids": response,
        }, row + 1))  # fmt: skip
    if not read_rows:
        raise CollapsecheckError(f"{path}: no rows")
    step = step_of(path)
    notes = [
        f"SkyRL training batch of step {step}: {rows} responses (its padding rows left out), "
        "scored as the ids SkyRL trained on, grouped by their prompt's ids (SkyRL drops the "
        "group ids before dumping); no rewards (dropped too)"
    ]
    return TrainerRollouts(TRAINER, step, read_rows, notes)
