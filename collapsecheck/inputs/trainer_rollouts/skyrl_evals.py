"""SkyRL's evaluation dumps, on by default (`trainer.dump_eval_results`, every
`trainer.eval_interval` steps): `{export_path}/dumped_evals/global_step_{N}_evals/
{data_source}.jsonl` beside `aggregated_results.jsonl` (the metrics), written by
`dump_per_dataset_eval_results` (skyrl/train/utils/trainer_utils.py, read at NovaSky-AI/SkyRL
a956457; the same in skyrl-train 0.3.1).

Each line: `input_prompt` (the prompt's ids decoded with special tokens kept: the chat-templated
context, tokenized again here as it stands), `output_response` (the response's ids decoded the
same way, stop token included: dropped again here), `score` (a number, or a per-token list from
the agent loop: its sum), `stop_reason`, `env_class`, `env_extras`, `data_source`. A prompt's
samples are consecutive lines; the file has no group id, so they are grouped by their prompt.

The evaluation at step N runs after the weights of N updates are synced to the sampler, so it
is the weights of `global_step_N` (step 0: the base model, `eval_before_train`). `score` takes
one data source's file or a step's folder (all its data sources)."""

from __future__ import annotations

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
    folder_holding,
    number,
    require,
    text,
)

TRAINER = "skyrl"
FOLDER_NAME = re.compile(r"global_step_(\d+)_evals")
FOLDER = "dumped_evals"
FIELDS = ("input_prompt", "output_response", "score", "stop_reason")
AGGREGATE = "aggregated_results.jsonl"
# skyrl-train's Hydra entry point saved its config; SkyRL after it saves only a pickle
SAVED_CONFIG = SavedConfig(
    TRAINER,
    training=TemperatureKeys(
        ("generator.sampling_params.temperature",),
        "SkyRL samples at generator.sampling_params.temperature, 1.0 by default", 1.0,
    ),
    evaluation=TemperatureKeys(
        ("generator.eval_sampling_params.temperature",),
        "SkyRL evaluates at generator.eval_sampling_params.temperature, greedily where unset",
        0.0,
    ),
    files=(HYDRA_CONFIG,),
    evaluates=always,
)  # fmt: skip


def data_files(path: Path) -> list[Path]:
    """A step folder's data-source files (a file: itself)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.glob("*.jsonl") if p.name != AGGREGATE)


def matches(path: Path) -> bool:
    folder = path if path.is_dir() else path.parent
    if FOLDER_NAME.fullmatch(folder.name) is None:
        return False
    return path.is_dir() or (path.suffix == ".jsonl" and path.name != AGGREGATE)


def step_of(path: Path) -> int:
    folder = path if path.is_dir() else path.parent
    return int(FOLDER_NAME.fullmatch(folder.name).group(1))


def policy_step(path: Path) -> int:
    """Evaluated with the weights of `global_step_N` (module docstring)."""
    return step_of(path)


def beside(run_dir: Path) -> Path | None:
    """`dumped_evals/` of the export path, when the run directory is that path."""
    return folder_holding(run_dir, FOLDER, matches)


def reward(value: Any, where: str) -> float:
    """A number, or the agent loop's per-token list (the reward at each turn's end): its sum."""
    if isinstance(value, list):
        return sum(number(v, where, "score") for v in value)
    return number(value, where, "score")


def rows_of(path: Path) -> list[tuple[str, dict[str, Any], int]]:
    rows = []
    for where, row, line in jsonl_rows(path, path.read_text(encoding="utf-8").splitlines()):
        require(row, FIELDS, where)
        rows.append((where, {
            "prompt": text(row["input_prompt"], where, "input_prompt"),
            "rendered": True,
            "response": text(row["output_response"], where, "output_response"),
            "reward": reward(row["score"], where),
            "truncated": row["stop_reason"] == "length",
        }, line))  # fmt: skip
    return rows


def read(path: Path) -> TrainerRollouts:
    files = data_files(path)
    rows = [row for file in files for row in rows_of(file)]
    if not rows:
        raise CollapsecheckError(f"{path}: no evaluation samples (no data-source lines)")
    step = step_of(path)
    sources = ", ".join(f.stem for f in files)
    notes = [
        f"SkyRL evaluation of step {step} ({sources}): {len(rows)} samples, each prompt "
        f"scored as the context SkyRL decoded (special tokens kept), by the weights of "
        f"global_step_{step}"
    ]
    return TrainerRollouts(TRAINER, step, rows, notes)
