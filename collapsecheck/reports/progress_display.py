"""Progress of the work, for a person at a terminal or a log: rich bars, or plain lines.
Imports no array library, so a command shows its progress before any is loaded."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from collapsecheck.progress import ProgressHook, stoppable

LOG_STEPS = 4  # a progress line at every quarter of a stage, in a log


@contextmanager
def progress_bars(console: Console) -> Iterator[ProgressHook]:
    """Progress of each pipeline stage: rich bars (with ETA) on a terminal, plain lines as the
    work goes in a log (CI, a file), where a bar would only show at the end."""
    if not console.is_terminal:
        yield stoppable(progress_lines(console))
        return
    columns = (
        TextColumn("[bold]{task.description:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bars:
        tasks: dict[str, TaskID] = {}

        def start(stage: str, total: int) -> Callable[[int], None]:
            if stage in tasks:
                bars.reset(tasks[stage], total=total)
            else:
                tasks[stage] = bars.add_task(stage, total=total)
            task = tasks[stage]
            return lambda n: bars.advance(task, n)

        yield stoppable(start)


def progress_lines(console: Console) -> ProgressHook:
    """A ProgressHook printing "stage: done/total" lines at the start, each quarter, the end."""

    def start(stage: str, total: int) -> Callable[[int], None]:
        console.print(f"{stage}: 0/{total}", highlight=False)
        done = [0]
        marks = {round(total * i / LOG_STEPS) for i in range(1, LOG_STEPS + 1)}

        def advance(n: int) -> None:
            before, done[0] = done[0], done[0] + n
            if any(before < mark <= done[0] for mark in marks):
                console.print(f"{stage}: {done[0]}/{total}", highlight=False)

        return advance

    return start
