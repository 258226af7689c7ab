"""CSV with a step column (W&B and MLflow exports)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.training_logs.base import STEP_COLUMNS, TrainingLog, lines, step_of

FORMAT = "CSV"


def matches(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".csv"


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def read(path: Path) -> TrainingLog:
    rows = list(csv.DictReader(io.StringIO("\n".join(lines(path)))))
    if rows and not any(c in rows[0] for c in STEP_COLUMNS):
        raise CollapsecheckError(f"{path}: no step column ({', '.join(STEP_COLUMNS)})")
    log = TrainingLog(str(path), FORMAT)
    for number, row in enumerate(rows, start=2):
        values = {k: _number(v) for k, v in row.items() if k is not None and v not in ("", None)}
        step = step_of(values, f"{path}:{number}")
        for key, value in values.items():
            if key not in STEP_COLUMNS:
                log.add(step, key, value)
    return log
