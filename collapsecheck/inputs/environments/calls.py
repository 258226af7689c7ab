"""Every call into an environment's code (a reset, a step, a tool), made so that whatever it
does wrong is one line naming the environment, the seed and the turn: an exception it raises,
an answer of the wrong shape (`EnvironmentFault`, raised by an adapter that checks it), or no
answer within --env-timeout seconds."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from collapsecheck.errors import CollapsecheckError

T = TypeVar("T")


class EnvironmentFault(Exception):
    """An environment's answer an adapter cannot play (the wrong shape, a missing field): said
    as it is, after where it happened."""


def call_within(seconds: float, where: str, call: Callable[[], T]) -> T:
    """`call()`'s answer, or one line naming `where`. With a limit the call runs in a daemon
    thread waited on for `seconds`: a hung environment cannot be stopped, but it cannot hold
    the scan or its exit either. `seconds` 0: no limit, in this thread."""
    if not seconds:
        return _answered(where, call)
    answer: dict[str, Any] = {}

    def run() -> None:
        try:
            answer["value"] = _answered(where, call)
        except BaseException as err:  # carried to the caller's thread and raised there
            answer["error"] = err

    worker = threading.Thread(target=run, name=f"collapsecheck-env {where}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise CollapsecheckError(
            f"{where}: the environment gave no answer within {seconds:g} s (--env-timeout)"
        )
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


def _answered(where: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except CollapsecheckError:
        raise
    except EnvironmentFault as fault:
        raise CollapsecheckError(f"{where}: {fault}") from None
    except Exception as err:  # the environment's code can fail in any way
        raise CollapsecheckError(
            f"{where}: the environment raised {type(err).__name__}: {said(err)}"
        ) from None


ANSI = re.compile(r"\x1b\[[0-9;]*m")
SAID = 300  # characters of an environment's error message kept on the one line


def said(err: Exception) -> str:
    """An exception's message on one line: colours and runs of decoration dropped, cut short."""
    words = [w for w in ANSI.sub("", str(err)).split() if w.strip("*=-")]
    text = " ".join(words)
    return text if len(text) <= SAID else text[: SAID - 3] + "..."
