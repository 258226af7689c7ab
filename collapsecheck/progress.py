"""Progress reporting, shared by every layer: a stage announces its work, then advances."""

from __future__ import annotations

import threading
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


# A stop asked for from outside the work (SIGTERM), raised as KeyboardInterrupt where the work
# next reports progress too: the signal handler's own raise is lost where it lands inside a
# `__del__` (Python prints and ignores exceptions raised there).
_stop = threading.Event()


def request_stop() -> None:
    _stop.set()


def stoppable(hook: ProgressHook) -> ProgressHook:
    """`hook`, whose callbacks raise KeyboardInterrupt once a stop has been requested."""

    def start(stage: str, total: int) -> Progress:
        advance = hook(stage, total)

        def checked(n: int) -> None:
            if _stop.is_set():
                raise KeyboardInterrupt
            advance(n)

        return checked

    return start
