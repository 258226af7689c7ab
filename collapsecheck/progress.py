"""Progress reporting, shared by every layer: a stage announces its work, then advances."""

from __future__ import annotations

from collections.abc import Callable

# Advances a stage by a number of work units.
Progress = Callable[[int], None]
# Called once per stage with a description and the number of work units; returns the
# callback that advances the stage. The CLI turns it into rich progress bars.
ProgressHook = Callable[[str, int], Progress]


def no_progress(_: int) -> None:
    """Progress callback that reports nothing."""


def silent(_: str, __: int) -> Progress:
    """ProgressHook that reports nothing."""
    return no_progress
