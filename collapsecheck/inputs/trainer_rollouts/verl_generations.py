"""veRL with `trainer.rollout_data_dir=DIR`: `DIR/{step}.jsonl`, one row per response with
input, output, score and step, gts (the ground truth; absent in older versions) and one field
per extra reward value.

What the file holds: `input` and `output` are the prompt and response ids decoded with
special tokens skipped, so `input` is the chat-templated prompt without its special tokens,
not the exact context the policy saw, and `output` is re-tokenized (its sampled ids are not in
the file). There is no group id: responses are grouped by their input text. `score` is the
sequence reward (the token-level scores summed).

verl-agent writes the same file with veRL's older writer (no `gts`): a row per environment
step, its input that step's context (the observation with the environment's summary of the
last steps), its score the episode's return; read alike, each row a turn in its own context
(docs/formats.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.trainer_configs import HYDRA_CONFIG, SavedConfig, TemperatureKeys
from collapsecheck.inputs.trainer_rollouts.base import (
    NamedSteps,
    Row,
    TrainerRollouts,
    number,
    require,
    text,
)

TRAINER = "verl"
NAME = re.compile(r"(\d+)\.jsonl")
FIELDS = ("input", "output", "score")


LAYOUT = NamedSteps(NAME)  # no folder: veRL writes where `rollout_data_dir` says
ROLLOUT = "actor_rollout_ref.rollout"
# main_ppo is a Hydra entry point; `validation_data_dir` dumps are named alike, at val_kwargs
SAVED_CONFIG = SavedConfig(
    TRAINER,
    training=TemperatureKeys(
        (f"{ROLLOUT}.temperature",), f"veRL samples at {ROLLOUT}.temperature, 1.0 by default",
        1.0, f"{ROLLOUT}.do_sample",
    ),
    evaluation=TemperatureKeys(
        (f"{ROLLOUT}.val_kwargs.temperature",),
        f"veRL validates at {ROLLOUT}.val_kwargs.temperature, greedily by default",
        0.0, f"{ROLLOUT}.val_kwargs.do_sample",
    ),
    files=(HYDRA_CONFIG,),
    evaluation_dir="trainer.validation_data_dir",
)  # fmt: skip
step_of, policy_step, beside = LAYOUT.step_of, LAYOUT.policy_step, LAYOUT.beside


def matches(path: Path) -> bool:
    """A `{step}.jsonl` whose first row has veRL's fields."""
    if not LAYOUT.named(path):
        return False
    with path.open(encoding="utf-8") as stream:
        first = stream.readline()
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and all(f in row for f in FIELDS)


def copies_note(rows: list[Row], has_gts: bool) -> list[str]:
    """verl-agent (veRL's older writer: no `gts`) pads a batch with copies of random rows
    (`adjust_batch`); copies cannot be told from two samples that agree, so they are counted,
    and said."""
    seen: set[tuple[str, str, float]] = set()
    copies = 0
    for _, row, _ in rows:
        key = (row["prompt"], row["response"], row["reward"])
        copies += key in seen
        seen.add(key)
    if has_gts or not copies:
        return []
    return [
        f"{copies} row(s) repeat an earlier row exactly (input, output and score): verl-agent "
        "pads its batches with copies of rows (adjust_batch), which count here as samples"
    ]


def read(path: Path) -> TrainerRollouts:
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    raw = jsonl_rows(path, lines)
    for where, row, line in raw:
        require(row, FIELDS, where)
        prompt = text(row["input"], where, "input")
        if not prompt.strip():
            raise CollapsecheckError(f"{where}: field 'input' is empty")
        rows.append((where, {
            "prompt": prompt,
            "response": text(row["output"], where, "output"),
            "reward": number(row["score"], where, "score"),
            "group": prompt,
        }, line))  # fmt: skip
    if not rows:
        raise CollapsecheckError(f"{path}: no rollouts (the file is empty)")
    step = step_of(path)
    notes = copies_note(rows, any("gts" in row for _, row, _ in raw))
    notes += [
        f"veRL rollouts of step {step}: {len(rows)} responses to "
        f"{len({r['group'] for _, r, _ in rows})} inputs; each input is veRL's decoded prompt "
        "(special tokens skipped), not the context the policy saw: --prompts TRAIN_FILE "
        "matches each to its training row (verl-agent's prompts come from its environment, "
        "not a file)"
    ]
    return TrainerRollouts(TRAINER, step, rows, notes)
