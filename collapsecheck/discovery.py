"""Finding checkpoints: one checkpoint directory, or the checkpoints of a training run.

Recognised layouts of one checkpoint (the first that holds config.json and weights wins):
`DIR/` itself (Hugging Face), `DIR/actor/huggingface/` and `DIR/huggingface/` (veRL's
`global_step_N/` with a merged Hugging Face folder). A run directory is any directory whose
sub-directories are checkpoints: `global_step_N/` (veRL), `checkpoint-N/` (HF Trainer, TRL),
`step_N/`, or any other name; they are ordered by the step number in their name, unnumbered
ones last by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collapsecheck.checkpoint import check_checkpoint_dir, weight_files
from collapsecheck.errors import CollapsecheckError

LAYOUTS = ((), ("actor", "huggingface"), ("huggingface",))
STEP_NUMBER = re.compile(r"(\d+)(?!.*\d)")


@dataclass(frozen=True)
class RunCheckpoint:
    """One checkpoint of a run: its folder name, step number (None if unnumbered), model dir."""

    name: str
    step: int | None
    path: Path

    @property
    def label(self) -> str:
        return str(self.step) if self.step is not None else self.name


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and bool(weight_files(path))


def resolve_checkpoint(path: Path) -> Path | None:
    """The model directory inside a checkpoint folder of any recognised layout, or None."""
    for parts in LAYOUTS:
        candidate = path.joinpath(*parts)
        if candidate.is_dir() and is_checkpoint(candidate):
            return candidate
    return None


def step_number(name: str) -> int | None:
    """The last number in a folder name: global_step_300 -> 300, checkpoint-500 -> 500."""
    match = STEP_NUMBER.search(name)
    return int(match.group(1)) if match else None


def discover_run(run_dir: Path) -> list[RunCheckpoint]:
    """The checkpoints directly under a run directory, in step order."""
    found = []
    for child in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        model_dir = resolve_checkpoint(child)
        if model_dir is not None:
            found.append(RunCheckpoint(child.name, step_number(child.name), model_dir))
    return sorted(found, key=lambda c: (c.step is None, c.step or 0, c.name))


def find_checkpoints(path: str | Path) -> tuple[Path | None, list[RunCheckpoint]]:
    """(model dir, []) for one checkpoint, (None, checkpoints) for a run directory."""
    path = Path(path)
    if path.is_dir():
        single = resolve_checkpoint(path)
        if single is not None:
            return single, []
        run = discover_run(path)
        if run:
            return None, run
        if not (path / "config.json").is_file():
            raise CollapsecheckError(
                f"{path}: neither a checkpoint nor a run directory (no config.json with weights "
                "in it, in actor/huggingface/ or huggingface/, or in any sub-directory)"
            )
    check_checkpoint_dir(path)  # raises the error that fits: missing, not a directory, no weights
    raise AssertionError(f"{path} is a checkpoint but was not resolved")
