"""What every training-log reader gives: the series it holds, as (step, value) points."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainingLog:
    """Every numeric key of a log with its (step, value) points; a repeated step (a resumed
        run) keeps its later value. Non-finite values (and nulls, as which veRL's file logger writes
    NaN) are skipped and counted."""

    source: str
    format: str
    points: dict[str, dict[int, float]] = field(default_factory=dict)
    skipped_nonfinite: int = 0

    def add(self, step: int, key: str, value: Any) -> None:
        if value is None:  # veRL's file logger (orjson) writes NaN as null
            self.skipped_nonfinite += 1
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return  # text, lists, nested objects: not a series
        if not math.isfinite(float(value)):
            self.skipped_nonfinite += 1
            return
        self.points.setdefault(key, {})[int(step)] = float(value)

    def series(self, key: str) -> list[tuple[int, float]]:
        return sorted(self.points.get(key, {}).items())


STEP_COLUMNS = ("step", "global_step", "_step", "train/global_step")


def step_of(row: dict[str, Any], where: str) -> int:
    """A row's step, from the first step column it has."""
    from collapsecheck.errors import CollapsecheckError

    name = next((c for c in STEP_COLUMNS if c in row), None)
    if name is None:
        raise CollapsecheckError(f"{where}: no step column ({', '.join(STEP_COLUMNS)})")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise CollapsecheckError(f"{where}: the step {value!r} is not a whole number")
    return int(value)


def lines(path: Path) -> list[str]:
    from collapsecheck.errors import CollapsecheckError

    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise CollapsecheckError(f"{path}: cannot read the training log ({err})") from None
