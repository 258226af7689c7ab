"""Training logs in: one small module per format (matches, read), tried in this order.
Adding a format is one module and one entry in READERS."""

from __future__ import annotations

from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.training_logs import csv_file, jsonl, tensorboard, trl
from collapsecheck.inputs.training_logs.base import TrainingLog

READERS = (trl, tensorboard, jsonl, csv_file)
TRAINER_STATE = "trainer_state.json"

__all__ = ["TrainingLog", "find_log", "read_log"]


def read_log(path: str | Path) -> TrainingLog:
    """The log a user named; anything that is not one is an error naming it."""
    path = Path(path)
    if not path.exists():
        raise CollapsecheckError(f"--train-log {path}: not found")
    reader = next((r for r in READERS if r.matches(path)), None)
    if reader is None:
        raise CollapsecheckError(
            f"--train-log {path}: not a training log (trainer_state.json, TensorBoard events, "
            "JSONL or CSV with a step column)"
        )
    return reader.read(path)


def find_log(run_dir: Path, latest: Path | None) -> tuple[TrainingLog | None, str]:
    """The run's own log when one is where its trainer leaves it: TRL's trainer_state.json in
    the latest checkpoint (or the run's root), veRL's tensorboard_log/<project>/<experiment>
    beside checkpoints/<project>/<experiment>. (None, why) when there is none."""
    for folder in (latest, run_dir):
        if folder is not None and (folder / TRAINER_STATE).is_file():
            return trl.read(folder / TRAINER_STATE), ""
    parts = run_dir.resolve().parts
    if len(parts) >= 3 and parts[-3] == "checkpoints":
        board = Path(*parts[:-3], "tensorboard_log", *parts[-2:])
        if tensorboard.matches(board):
            return tensorboard.read(board), ""
    return None, (
        f"no training log found beside {run_dir} (a trainer_state.json, or veRL's "
        "tensorboard_log/<project>/<experiment>); name one with --train-log"
    )
