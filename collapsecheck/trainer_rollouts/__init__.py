"""Rollouts the trainer already sampled, in the trainer's own files: one small module per
trainer (matches, read), tried in this order. Each turns its file into rollout rows of the
generic form `rollouts.py` reads (prompt, response, reward, group), so everything above is
trainer-free. Adding a trainer (OpenRLHF, say) is one module and one entry in READERS."""

from __future__ import annotations

from pathlib import Path

from collapsecheck.trainer_rollouts import trl_completions, verl_generations
from collapsecheck.trainer_rollouts.base import TrainerRollouts

READERS = (trl_completions, verl_generations)

__all__ = ["READERS", "TrainerRollouts", "trainer_rollouts"]


def trainer_rollouts(path: Path) -> TrainerRollouts | None:
    """The file's rows when a trainer wrote it, else None (a generic rollout file)."""
    reader = next((r for r in READERS if r.matches(path)), None)
    return None if reader is None else reader.read(path)
