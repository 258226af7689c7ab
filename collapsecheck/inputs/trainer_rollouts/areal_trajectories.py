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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.trainer_configs import SavedConfig, TemperatureKeys
from collapsecheck.inputs.trainer_rollouts.base import (
    TrainerRollouts,
    folder_holding,
    number,
    require,
    text,
)

TRAINER = "areal"
FIELDS = ("prompt", "completion", "reward", "head_version", "tail_version")
VERSION = re.compile(r"\d+")


@dataclass(frozen=True)
class VersionFolders:
    """AReaL's dump layout: `{kind}/{version}/` folders of `*{suffix}` files, one kind for
    training and one for evaluation (no training step)."""

    training: str
    evaluation: str
    suffix: str

    def folder(self, path: Path) -> Path | None:
        """The version folder a path is, or holds a file of."""
        folder = path if path.is_dir() else path.parent
        kinds = (self.training, self.evaluation)
        return folder if VERSION.fullmatch(folder.name) and folder.parent.name in kinds else None

    def matches(self, path: Path) -> bool:
        folder = self.folder(path)
        if folder is None:
            return False
        return path.suffix == self.suffix if path.is_file() else any(folder.glob(f"*{self.suffix}"))

    def files(self, path: Path) -> list[Path]:
        return [path] if path.is_file() else sorted(path.glob(f"*{self.suffix}"))

    def version(self, path: Path) -> int:
        return int(self.folder(path).name)

    def kind(self, path: Path) -> str:
        return self.folder(path).parent.name

    def is_evaluation(self, path: Path) -> bool:
        return self.kind(path) == self.evaluation

    def step_of(self, path: Path) -> int | None:
        """The version of a training folder; None for an evaluation one."""
        return None if self.is_evaluation(path) else self.version(path)

    def saved_config(self) -> SavedConfig:
        """AReaL saves its resolved config as `config.yaml` in the trial's log folder, two
        above a version folder (`save_config`, areal/api/cli_args.py)."""
        return SavedConfig(
            TRAINER,
            training=TemperatureKeys(
                ("gconfig.temperature",), "AReaL samples at gconfig.temperature, 1.0 by default",
                1.0,
            ),
            evaluation=TemperatureKeys(
                ("eval_gconfig.temperature", "gconfig.temperature"),
                "AReaL evaluates at eval_gconfig.temperature (gconfig's where unset; its example "
                "workflows may set their own in code)",
            ),
            files=("config.yaml",),
            evaluates=self.is_evaluation,
        )  # fmt: skip

    def policy_step(self, path: Path) -> int:
        """Version V was saved as the checkpoint of global step V - 1 (module docstring)."""
        return self.version(path) - 1

    def beside(self, run_dir: Path) -> Path | None:
        """The training kind's folder inside the trial's log folder, when the run directory
        is that folder."""
        return folder_holding(run_dir, self.training, self.matches)


LAYOUT = VersionFolders("rollout", "eval-rollout", ".jsonl")
SAVED_CONFIG = LAYOUT.saved_config()
matches, step_of, policy_step, beside = (
    LAYOUT.matches, LAYOUT.step_of, LAYOUT.policy_step, LAYOUT.beside
)  # fmt: skip


def sample_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    require(row, FIELDS, where)
    prompt = text(row["prompt"], where, "prompt")
    return {
        "prompt": prompt,
        "rendered": True,
        "response": text(row["completion"], where, "completion"),
        "reward": number(row["reward"], where, "reward"),
    }


def spanned(row: dict[str, Any]) -> bool:
    """The sample records tokens of an older version than its newest (AReaL's own workflows
    write -1, the prompt's, as the oldest: never counted)."""
    head, tail = row.get("head_version"), row.get("tail_version")
    return isinstance(head, int) and isinstance(tail, int) and 0 <= head < tail


def read(path: Path) -> TrainerRollouts:
    files = LAYOUT.files(path)
    raw = [
        numbered
        for file in files
        for numbered in jsonl_rows(file, file.read_text(encoding="utf-8").splitlines())
    ]
    rows = [(where, sample_row(row, where), line) for where, row, line in raw]
    if not rows:
        raise CollapsecheckError(f"{path}: no samples")
    older = sum(spanned(row) for _, row, _ in raw)
    version, kind = LAYOUT.version(path), LAYOUT.kind(path)
    notes = [
        f"AReaL {kind} of version {version}: {len(rows)} samples of "
        f"{len({r['prompt'] for _, r, _ in rows})} prompts, each prompt scored as the context "
        "AReaL decoded (special tokens kept), paired with the checkpoint of step "
        f"{policy_step(path)}",
        f"{older} sample(s) record tokens of an older version than {version} "
        "(head_version); AReaL writes -1 there for in-tree workflows, so a sample whose "
        "generation a weight update interrupted cannot be told apart: the share of samples no "
        "single checkpoint sampled is unknown",
    ]
    return TrainerRollouts(TRAINER, step_of(path), rows, notes)
