"""Finding checkpoints: one checkpoint directory, or the checkpoints of a training run.

A run directory is any directory whose sub-directories hold checkpoints (in any format of
`collapsecheck.inputs.checkpoint`): `global_step_N/` (veRL), `checkpoint-N/` (HF Trainer, TRL),
`step_N/`, or any other name. They are ordered by the step number in their name, unnumbered
ones last by name; sub-directories that hold no checkpoint are ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import Checkpoint, describe_directory, detect_checkpoint

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


STEP_FOLDER = re.compile(r"(global_step|checkpoint|step|iter)[_-]?\d+")
TRAINER_STATE = "trainer_state.json"


def discover_run(
    run_dir: Path, base_model: Path | None = None, notes: list[str] | None = None
) -> list[RunCheckpoint]:
    """The checkpoints directly under a run directory, in step order. A folder named like a
    step checkpoint that holds none is left out with a note saying why (into `notes`)."""
    found = []
    for child in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        checkpoint = detect_checkpoint(child, base_model)
        if checkpoint is not None:
            found.append(RunCheckpoint(child.name, step_number(child.name), checkpoint))
        elif STEP_FOLDER.fullmatch(child.name) and notes is not None:
            notes.append(f"left out {child}: {describe_directory(child)}")
    return sorted(found, key=_order)


def _order(checkpoint: RunCheckpoint) -> tuple[bool, int, str]:
    """Step order; unnumbered checkpoints last, by name."""
    return (checkpoint.step is None, checkpoint.step or 0, checkpoint.name)


def final_step(path: Path) -> int | None:
    """The step a saved model was trained to, from its trainer_state.json (TRL, HF Trainer)."""
    try:
        return int(json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_checkpoints(
    path: str | Path, base_model: Path | None = None, notes: list[str] | None = None
) -> tuple[Checkpoint | None, list[RunCheckpoint]]:
    """(the checkpoint, []) for one checkpoint, (None, its checkpoints) for a run directory.

    A checkpoint folder that also holds step checkpoints (TRL's output_dir after
    `trainer.save_model`) is a run: its steps, then the folder's own model as the final row.
    Everything read other than what one might expect is said in `notes`."""
    path = Path(path)
    notes = notes if notes is not None else []
    if not path.exists():
        raise CollapsecheckError(f"checkpoint not found: {path}")
    if path.is_dir():
        single = detect_checkpoint(path, base_model)
        run = discover_run(path, base_model, notes)
        steps = [c for c in run if STEP_FOLDER.fullmatch(c.name)]
        if single is not None and steps:
            step = final_step(path)
            notes.append(
                f"{path} is a checkpoint and holds {len(steps)} step checkpoints: scanned as a "
                "run, the folder's own model as the last row"
                + (f" (step {step}, from its {TRAINER_STATE})" if step is not None else "")
            )
            final = RunCheckpoint("final model", step, single)
            return None, sorted([*steps, final], key=_order)
        if single is not None:
            return single, []
        if run:
            return None, run
    raise CollapsecheckError(
        f"{path}: neither a checkpoint nor a run directory of checkpoints: "
        + describe_directory(path)
    )


def require_run(
    path: Path, base_model: Path | None = None, notes: list[str] | None = None
) -> list[RunCheckpoint]:
    """The checkpoints of a run directory, or an error when `path` is not one."""
    single, run = find_checkpoints(path, base_model, notes)
    if single is not None:
        raise CollapsecheckError(f"{path}: a single checkpoint, not a run directory")
    return run
