"""JSON lines: veRL's file logger (`{"step": N, "data": {key: value}}` a line, under
VERL_FILE_LOGGER_PATH or VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl), or flat rows
with a step column (W&B and MLflow exports)."""

from __future__ import annotations

from pathlib import Path

from collapsecheck.inputs.prompts import jsonl_rows
from collapsecheck.inputs.training_logs.base import TrainingLog, lines, step_of

FORMAT = "jsonl"


def matches(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in (".jsonl", ".json", ".ndjson")


def read(path: Path) -> TrainingLog:
    log = TrainingLog(str(path), "veRL file logger")
    for where, row, _ in jsonl_rows(path, lines(path)):
        step = step_of(row, where)
        data = row.get("data") if isinstance(row.get("data"), dict) else None
        if data is None:
            log.format = "flat JSONL"
        for key, value in (data if data is not None else row).items():
            log.add(step, key, value)
    return log
