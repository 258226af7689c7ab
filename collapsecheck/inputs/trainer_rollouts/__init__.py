"""Rollouts the trainer already sampled, in the trainer's own files: one small module per
trainer format, tried in this order. Each says whether a file or step folder is its trainer's
(`matches`), which training step it holds (`step_of`; None for an evaluation dump), which
checkpoint step's weights sampled it (`policy_step`, as the trainer's loop defines it), where
the trainer keeps them inside a run (`beside`, None when the user chose the folder), and turns
it into rollout rows of the generic form `rollouts.py` reads (`read`: prompt or exact ids,
response, reward, group, or turns), so everything above is trainer-free. Adding a trainer is
one module and one entry in READERS (docs/formats.md, one section per trainer). Each also says
where its trainer saves its configuration and which keys name the rollouts' temperature
(`SAVED_CONFIG`, `inputs.trainer_configs`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from collapsecheck.inputs.trainer_configs import SavedConfig
from collapsecheck.inputs.trainer_rollouts import (
    areal_generated_text,
    areal_trajectories,
    prime_rl_traces,
    ragen_trajectories,
    roll_dumps,
    skyrl_evals,
    skyrl_training_batch,
    slime_debug_rollouts,
    trl_completions,
    verl_generations,
)
from collapsecheck.inputs.trainer_rollouts.base import TrainerRollouts

READERS = (
    trl_completions,
    verl_generations,
    slime_debug_rollouts,
    skyrl_evals,
    skyrl_training_batch,
    ragen_trajectories,
    prime_rl_traces,
    roll_dumps,
    areal_trajectories,
    areal_generated_text,
)

__all__ = [
    "READERS",
    "RolloutFile",
    "rollout_files",
    "rollouts_beside",
    "saved_config",
    "trainer_reader",
    "trainer_rollouts",
]


def trainer_reader(path: Path) -> ModuleType | None:
    """The reader of the trainer that wrote this file or step folder, if one did."""
    return next((r for r in READERS if r.matches(path)), None)


def trainer_rollouts(path: Path) -> TrainerRollouts | None:
    """The file's (or step folder's) rows when a trainer wrote it, else None (a generic
    rollout file)."""
    reader = trainer_reader(path)
    return None if reader is None else reader.read(path)


def saved_config(path: Path) -> SavedConfig | None:
    """Where the trainer that wrote these rollouts saves its configuration, and the keys
    naming their temperature there (None: no trainer's own file)."""
    reader = trainer_reader(path)
    return None if reader is None else reader.SAVED_CONFIG


@dataclass(frozen=True)
class RolloutFile:
    """One step's rollouts as the trainer wrote them (a file, or a step's folder), and the
    step of the checkpoint whose weights sampled them (`policy_step`: the step before, for a
    trainer that dumps step s's rollouts after update s)."""

    step: int
    path: Path
    trainer: str
    policy_step: int


def rollout_files(folder: Path) -> list[RolloutFile]:
    """The trainer's training rollouts directly in `folder` (files, or a step's folder), in
    step order; other files, and evaluation dumps (no training step), ignored."""
    found = []
    for path in sorted(folder.iterdir()):
        reader = trainer_reader(path)
        step = reader.step_of(path) if reader is not None else None
        if step is not None:
            found.append(RolloutFile(step, path, reader.TRAINER, reader.policy_step(path)))
    return sorted(found, key=lambda f: f.step)


def rollouts_beside(run_dir: Path) -> list[Path]:
    """The folders where trainers keep their rollouts inside this run directory (SkyRL: its
    evaluations and its training batches), in the order of READERS."""
    return [folder for reader in READERS if (folder := reader.beside(run_dir)) is not None]
