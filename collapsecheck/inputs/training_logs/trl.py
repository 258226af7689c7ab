"""TRL and HF Trainer: `trainer_state.json`, whose `log_history` holds one dict a log step."""

from __future__ import annotations

import json
from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.training_logs.base import TrainingLog, lines

FORMAT = "trl trainer_state.json"


def matches(path: Path) -> bool:
    return path.is_file() and path.name == "trainer_state.json"


def read(path: Path) -> TrainingLog:
    try:
        history = json.loads("\n".join(lines(path)))["log_history"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CollapsecheckError(
            f"{path}: not a trainer_state.json with a log_history ({err})"
        ) from None
    log = TrainingLog(str(path), FORMAT)
    for number, entry in enumerate(history, start=1):
        if not isinstance(entry, dict) or "step" not in entry:
            raise CollapsecheckError(f"{path}: log_history entry {number} has no step")
        for key, value in entry.items():
            if key != "step":
                log.add(entry["step"], key, value)
    return log
