"""AReaL before its JSONL dumps (v0.3.0-lite to v0.5.1): the RLVR, vision and multi-turn
workflows' `dump_dir`, which AReaL's examples set to the trial's log folder's `generated/`
(`generated-eval/` for evaluation): `generated/{version}/{qid}.txt`, appended a record per
sample (areal/workflow/rlvr.py `arun_episode`, read at inclusionAI/AReaL v0.5.1):

    idx: {i} / {n}, seqlen: {seqlen}, reward is {reward}.
    prompt is
    ESC[33mESC[2m{prompt}ESC[0m
    sequence is:
    ESC[33mESC[2m{completion}ESC[0m

`prompt` and `completion` are decoded with special tokens kept (the context as text,
tokenized again as it stands; the completion's stop token dropped). `version` is the policy
version when the episode started (RLVR; multi-turn: when it was written): version V, the
weights after V updates, is the checkpoint of step V - 1, as for AReaL's JSONL dumps."""

from __future__ import annotations

import re
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.trainer_rollouts.areal_trajectories import VersionFolders
from collapsecheck.inputs.trainer_rollouts.base import Row, TrainerRollouts, number

TRAINER = "areal"
COLOR, RESET = "\x1b[33m\x1b[2m", "\x1b[0m"
RECORD = re.compile(
    r"idx: (\d+) / (\d+), seqlen: (\d+), reward is (.*?)\.\n"
    rf"prompt is \n{re.escape(COLOR)}(.*?){re.escape(RESET)}\n"
    rf"sequence is: \n{re.escape(COLOR)}(.*?){re.escape(RESET)}\n",
    re.DOTALL,
)
LAYOUT = VersionFolders("generated", "generated-eval", ".txt")
SAVED_CONFIG = LAYOUT.saved_config()
matches, step_of, policy_step, beside = (
    LAYOUT.matches, LAYOUT.step_of, LAYOUT.policy_step, LAYOUT.beside
)  # fmt: skip


def records(file: Path) -> list[Row]:
    """Every record of one question's file, each checked to follow the one before it."""
    content = file.read_text(encoding="utf-8")
    rows, at = [], 0
    for found in RECORD.finditer(content):
        line = content.count("\n", 0, found.start()) + 1
        where = f"{file}:{line}"
        if found.start() != at:
            raise not_a_record(file, content, at)
        at = found.end()
        reward = number(_float(found.group(4), where), where, "reward")
        prompt, completion = found.group(5), found.group(6)
        rows.append((where, {"prompt": prompt, "rendered": True, "response": completion,
                             "reward": reward}, line))  # fmt: skip
    if at != len(content):
        raise not_a_record(file, content, at)
    return rows


def not_a_record(file: Path, content: str, at: int) -> CollapsecheckError:
    line = content.count("\n", 0, at) + 1
    return CollapsecheckError(f"{file}:{line}: not an AReaL record ('idx: i / n, seqlen: ...')")


def _float(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CollapsecheckError(f"{where}: the reward {text!r} is not a number") from None


def read(path: Path) -> TrainerRollouts:
    files = LAYOUT.files(path)
    rows = [row for file in files for row in records(file)]
    if not rows:
        raise CollapsecheckError(f"{path}: no samples")
    kind, version = LAYOUT.kind(path), LAYOUT.version(path)
    notes = [
        f"AReaL {kind} of version {version} (text dumps, before v0.5.2): {len(rows)} "
        f"samples of {len({r['prompt'] for _, r, _ in rows})} prompts, each prompt scored as the "
        f"context AReaL decoded (special tokens kept), paired with the checkpoint of step "
        f"{policy_step(path)}"
    ]
    return TrainerRollouts(TRAINER, step_of(path), rows, notes)
