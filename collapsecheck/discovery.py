"""Finding checkpoints: one checkpoint directory, or the checkpoints of a training run.

A run directory is any directory whose sub-directories hold checkpoints (in any format of
`collapsecheck.checkpoint`): `global_step_N/` (veRL), `checkpoint-N/` (HF Trainer, TRL),
`step_N/`, or any other name. They are ordered by the step number in their name, unnumbered
ones last by name; sub-directories that hold no checkpoint are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collapsecheck.checkpoint import Checkpoint, describe_directory, detect_checkpoint
from collapsecheck.errors import CollapsecheckError

STEP_NUMBER = re.compile(r"(\d+)(?!.*\d)")


@dataclass(frozen=True)
class RunCheckpoint:
    """One checkpoint of a run: its folder name, step number (None if unnumbered), and what
    it holds."""

    name: str
    step: int | None
    checkpoint: Checkpoint

    @property
    def label(self) -> str:
        return str(self.step) if self.step is not None else self.name


def step_number(name: str) -> int | None:
    """The last number in a folder name: global_step_300 -> 300, checkpoint-500 -> 500."""
    match = STEP_NUMBER.search(name)
    return int(match.group(1)) if match else None


def discover_run(run_dir: Path, base_model: Path | None = None) -> list[RunCheckpoint]:
    """The checkpoints directly under a run directory, in step order."""
    found = []
    for child in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        checkpoint = detect_checkpoint(child, base_model)
        if checkpoint is not None:
            found.append(RunCheckpoint(child.name, step_number(child.name), checkpoint))
    return sorted(found, key=lambda c: (c.step is None, c.step or 0, c.name))


def find_checkpoints(
    path: str | Path, base_model: Path | None = None
) -> tuple[Checkpoint | None, list[RunCheckpoint]]:
    """(the checkpoint, []) for one checkpoint, (None, its checkpoints) for a run directory."""
    path = Path(path)
    if not path.exists():
        raise CollapsecheckError(f"checkpoint not found: {path}")
    if path.is_dir():
        single = detect_checkpoint(path, base_model)
        if single is not None:
            return single, []
        run = discover_run(path, base_model)
        if run:
            return None, run
    raise CollapsecheckError(
        f"{path}: neither a checkpoint nor a run directory of checkpoints: "
        + describe_directory(path)
    )


def require_run(path: Path, base_model: Path | None = None) -> list[RunCheckpoint]:
    """The checkpoints of a run directory, or an error when `path` is not one."""
    single, run = find_checkpoints(path, base_model)
    if single is not None:
        raise CollapsecheckError(f"{path}: a single checkpoint, not a run directory")
    return run
