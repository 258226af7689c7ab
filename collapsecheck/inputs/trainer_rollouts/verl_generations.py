"""veRL with `trainer.rollout_data_dir=DIR`: `DIR/{step}.jsonl`, one row per response with
input, output, score and step, gts (the ground truth; absent in older versions) and one field
per extra reward value.

What the file holds: `input` and `output` are the prompt and response ids decoded with
special tokens skipped, so `input` is the chat-templated prompt without its special tokens,
not the exact context the policy saw, and `output` is re-tokenized (its sampled ids are not in
the file). There is no group id: responses are grouped by their input text. `score` is the
sequence reward (the token-level scores summed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.trainer_rollouts.base import TrainerRollouts, number, require, text

TRAINER = "verl"
NAME = re.compile(r"(\d+)\.jsonl")
FIELDS = ("input", "output", "score")


def matches(path: Path) -> bool:
    if not (path.is_file() and NAME.fullmatch(path.name)):
        return False
    with path.open(encoding="utf-8") as stream:
        first = stream.readline()
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and all(f in row for f in FIELDS)


def step_of(path: Path) -> int:
    """The global step in the file's name (the step whose update the rollouts fed)."""
    return int(NAME.fullmatch(path.name).group(1))


def policy_step(path: Path) -> int:
    """The checkpoint step that sampled the file's rollouts: the step before its update."""
    return step_of(path) - 1


def beside(run_dir: Path) -> Path | None:
    """None: veRL keeps `rollout_data_dir` wherever the user set it (--rollouts DIR)."""
    return None


def read(path: Path) -> TrainerRollouts:
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for where, row, line in jsonl_rows(path, lines):
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
    notes = [
        f"veRL rollouts of step {step}: {len(rows)} responses to "
        f"{len({r['group'] for _, r, _ in rows})} inputs; each input is veRL's decoded prompt "
        "(special tokens skipped), not the context the policy saw: --prompts TRAIN_FILE "
        "matches each to its training row"
    ]
    return TrainerRollouts(TRAINER, step, rows, notes)
