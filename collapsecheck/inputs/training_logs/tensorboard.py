"""TensorBoard event files (veRL's default `tensorboard_log/<project>/<experiment>`), read
with the `tensorboard` package's event reader: an optional extra,
`pip install 'collapsecheck[logs]'`."""

from __future__ import annotations

from pathlib import Path

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.training_logs.base import TrainingLog

FORMAT = "TensorBoard"
EVENTS = "events.out.tfevents"


def matches(path: Path) -> bool:
    if path.is_file():
        return EVENTS in path.name
    return path.is_dir() and any(path.rglob(f"{EVENTS}*"))


def read(path: Path) -> TrainingLog:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise CollapsecheckError(
            f"{path}: reading TensorBoard logs needs the tensorboard package "
            "(pip install 'collapsecheck[logs]')"
        ) from None
    files = [path] if path.is_file() else sorted(path.rglob(f"{EVENTS}*"))
    log = TrainingLog(str(path), FORMAT)
    for file in files:  # in name order: a resumed run's later file wins for a repeated step
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        try:
            events.Reload()
        except Exception as err:  # a corrupt event file fails in several ways
            raise CollapsecheckError(f"{file}: not a readable event file ({err})") from None
        for tag in events.Tags().get("scalars", []):
            for event in events.Scalars(tag):
                log.add(event.step, tag, event.value)
    return log
