"""JSON lines: veRL's file logger (`{"step": N, "data": {key: value}}` a line, under
VERL_FILE_LOGGER_PATH or VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl), or flat rows
with a step column (W&B and MLflow exports)."""

from __future__ import annotations

import json
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.training_logs.base import TrainingLog, lines, step_of

FORMAT = "jsonl"


def matches(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in (".jsonl", ".json", ".ndjson")


def read(path: Path) -> TrainingLog:
    log = TrainingLog(str(path), "veRL file logger")
    for number, text in enumerate(lines(path), start=1):
        if not text.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise CollapsecheckError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise CollapsecheckError(f"{where}: expected a JSON object")
        step = step_of(row, where)
        data = row.get("data") if isinstance(row.get("data"), dict) else None
        if data is None:
            log.format = "flat JSONL"
        for key, value in (data if data is not None else row).items():
            log.add(step, key, value)
    return log
