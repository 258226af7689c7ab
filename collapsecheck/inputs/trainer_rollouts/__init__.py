"""Rollouts the trainer already sampled, in the trainer's own files: one small module per
trainer, tried in this order. Each says whether a file is its trainer's (`matches`), which
step a file holds (`step_of`), where the trainer keeps them beside a run (`beside`, None when
the user chose the folder), and turns a file into rollout rows of the generic form
`rollouts.py` reads (`read`: prompt, response, reward, group), so everything above is
trainer-free. Adding a trainer (OpenRLHF, say) is one module and one entry in READERS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collapsecheck.inputs.trainer_rollouts import trl_completions, verl_generations
from collapsecheck.inputs.trainer_rollouts.base import TrainerRollouts

READERS = (trl_completions, verl_generations)

__all__ = ["READERS", "RolloutFile", "rollout_files", "rollouts_beside", "trainer_rollouts"]


def trainer_rollouts(path: Path) -> TrainerRollouts | None:
    """The file's rows when a trainer wrote it, else None (a generic rollout file)."""
    reader = next((r for r in READERS if r.matches(path)), None)
    return None if reader is None else reader.read(path)


@dataclass(frozen=True)
class RolloutFile:
    """One step's rollouts as the trainer wrote them."""

    step: int
    path: Path
    trainer: str


def rollout_files(folder: Path) -> list[RolloutFile]:
    """The trainer rollout files directly in `folder`, in step order (other files ignored)."""
    found = []
    for path in sorted(folder.iterdir()):
        reader = next((r for r in READERS if r.matches(path)), None)
        if reader is not None:
            found.append(RolloutFile(reader.step_of(path), path, reader.TRAINER))
    return sorted(found, key=lambda f: f.step)


def rollouts_beside(run_dir: Path) -> Path | None:
    """The folder where a trainer keeps its rollouts inside its run directory, if any."""
    return next((f for r in READERS if (f := r.beside(run_dir)) is not None), None)
