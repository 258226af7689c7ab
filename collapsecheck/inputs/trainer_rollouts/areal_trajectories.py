"""AReaL with `rollout.dump_to_file: true` (and `rollout.tokenizer_path`):
`{fileroot}/logs/{user}/{experiment}/{trial}/rollout/{version}/{task_id}.jsonl` (evaluation:
`eval-rollout/`), appended by `WorkflowExecutor._dump_trajectory`
(areal/infra/workflow_executor.py, read at inclusionAI/AReaL 4aef98d, areal 1.0.4), the one
writer of every workflow (RLVR, multi-turn, vision, agent), before the accept filter (rejected
groups are dumped too).

A line per sample: `task_id`, `sample_idx`, `seqlen`, `prompt_len`, `head_version`,
`tail_version`, `reward`, `prompt` and `completion` (both decoded with special tokens kept:
the context as text, tokenized again as it stands; the completion's stop token dropped).
`task_id` restarts per rollout worker and after a restart, so a file can hold several prompts:
responses are grouped by their prompt. A multi-turn sample's `prompt_len` counts only the
masked tokens, so its split puts early turns' output in the prompt: it is read as AReaL split it.

Versions: AReaL is asynchronous: a sample's tokens carry the policy version that generated
them, and a generation a weight update interrupted goes on under the next version. The
folder is the newest version of any token of the group (`tail_version`); `head_version` is the
oldest, but prompt tokens carry -1, so in-tree workflows always write -1 and the file cannot
say whether a sample spanned versions: the note says so, and counts the samples whose
`head_version` (where set) differs from `tail_version`. Version V is the weights after V
updates, saved as `epoch{E}epochstep{S}globalstep{V-1}/`: a version folder pairs with the
checkpoint of step V - 1."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.trainer_rollouts.base import (
    TrainerRollouts,
    folder_holding,
    number,
    require,
    text,
)

TRAINER = "areal"
KINDS = ("rollout", "eval-rollout")
FIELDS = ("prompt", "completion", "reward", "head_version", "tail_version")
VERSION = re.compile(r"\d+")


def version_folder(path: Path) -> Path | None:
    folder = path if path.is_dir() else path.parent
    if VERSION.fullmatch(folder.name) and folder.parent.name in KINDS:
        return folder
    return None


def matches(path: Path) -> bool:
    folder = version_folder(path)
    if folder is None:
        return False
    return path.suffix == ".jsonl" if path.is_file() else any(folder.glob("*.jsonl"))


def version(path: Path) -> int:
    return int(version_folder(path).name)


def step_of(path: Path) -> int | None:
    """The version of a training rollout folder; None for an evaluation one."""
    return None if version_folder(path).parent.name == "eval-rollout" else version(path)


def policy_step(path: Path) -> int:
    """Version V was saved as the checkpoint of global step V - 1 (module docstring)."""
    return version(path) - 1


def beside(run_dir: Path) -> Path | None:
    """`rollout/` of the trial's log folder, when the run directory is that folder."""
    return folder_holding(run_dir, "rollout", matches)


def sample_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    require(row, FIELDS, where)
    prompt = text(row["prompt"], where, "prompt")
    return {
        "prompt": prompt,
        "rendered": True,
        "response": text(row["completion"], where, "completion"),
        "reward": number(row["reward"], where, "reward"),
        "group": prompt,
    }


def spanned(row: dict[str, Any]) -> bool:
    """The sample records tokens of an older version than its newest (AReaL's own workflows
    write -1, the prompt's, as the oldest: never counted)."""
    head, tail = row.get("head_version"), row.get("tail_version")
    return isinstance(head, int) and isinstance(tail, int) and 0 <= head < tail


def read(path: Path) -> TrainerRollouts:
    files = [path] if path.is_file() else sorted(path.glob("*.jsonl"))
    raw = [
        numbered
        for file in files
        for numbered in jsonl_rows(file, file.read_text(encoding="utf-8").splitlines())
    ]
    rows = [(where, sample_row(row, where), line) for where, row, line in raw]
    if not rows:
        raise CollapsecheckError(f"{path}: no samples")
    older = sum(spanned(row) for _, row, _ in raw)
    kind = version_folder(path).parent.name
    notes = [
        f"AReaL {kind} of version {version(path)}: {len(rows)} samples of "
        f"{len({r['group'] for _, r, _ in rows})} prompts, each prompt scored as the context "
        "AReaL decoded (special tokens kept), paired with the checkpoint of step "
        f"{policy_step(path)}",
        f"{older} sample(s) record tokens of an older version than {version(path)} "
        "(head_version); AReaL writes -1 there for in-tree workflows, so a sample whose "
        "generation a weight update interrupted cannot be told apart: the share of samples no "
        "single checkpoint sampled is unknown",
    ]
    return TrainerRollouts(TRAINER, step_of(path), rows, notes)
