"""`collapsecheck watch URL --every DURATION`: the policy a live RL job serves, diagnosed
through its server each interval, and each time the weight version the server states changes
(SPEC "The policy where it is served"). Each diagnosis is a row of the run as `watch RUN_DIR`
writes a checkpoint's: the console line, the run table, --html, the dashboards (at step 1,
2, ... in diagnosis order) and the gate (`watch.gated`). It ends where --until's file exists
(after a diagnosis), at --stop-on-fail's failure, or when stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from collapsecheck.config import GateConfig
from collapsecheck.engines.backends.served_api import PolicyServer
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import RunReport, RunStep
from collapsecheck.runs.join import run_of, with_narrowing
from collapsecheck.runs.served import ServedScan, scan_served
from collapsecheck.runs.units import for_step
from collapsecheck.runs.watch import gated, step_words
from collapsecheck.settings import WatchSettings

Say = Callable[[str], None]
UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(duration: str) -> float:
    """--every: seconds, or a number with s, m or h (30s, 10m, 1h)."""
    text = duration.strip().lower()
    scale = UNITS.get(text[-1:])
    number = text[:-1] if scale else text
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        value = -1
    if value < 0:
        raise CollapsecheckError(
            f"--every {duration!r}: a duration such as 30s, 10m or 1h (seconds where no unit)"
        )
    return value


@dataclass
class ServedWatch:
    """One watch of a served policy: what is scanned, how often, the gate, and what is written
    after each diagnosis (`after_step`: the page, the dashboards)."""

    request: ServedScan
    every: float
    watch: WatchSettings
    gate: GateConfig
    say: Say
    progress: ProgressHook = silent
    after_step: Callable[[RunReport, RunCheckpoint, Report], None] = lambda run, row, rep: None
    done: list[RunStep] = field(default_factory=list)
    fired: bool = False

    def follow(self) -> int:
        """A diagnosis each interval (from one's start to the next's), and each time the
        weight version the server states changes, until the watch ends; the exit code."""
        server = PolicyServer(self.request.url)
        try:
            server.discover()
            return self.follow_with(server)
        finally:
            server.close()

    def follow_with(self, server: PolicyServer) -> int:
        until = self.watch.until
        while True:
            started = time.monotonic()
            code = self.diagnose()
            if code is not None:
                return code
            if until is not None and until.exists():
                self.say(f"the run ended ({until} exists)")
                return 0
            self.wait(server, started, server.weight_version())

    def wait(self, server: PolicyServer, started: float, version: str | None) -> None:
        """Until the interval since `started` has passed or, where the server states a weight
        version, it states another than `version` (looked at each --poll seconds)."""
        while (left := self.every - (time.monotonic() - started)) > 0:
            time.sleep(min(left, self.watch.poll) if version is not None else left)
            now = server.weight_version() if version is not None else None
            if now != version:
                self.say(f"{self.request.url}: weights now version {now} (were {version})")
                return

    def diagnose(self) -> int | None:
        """One diagnosis of the policy served now, written and gated."""
        row = served_row(self.request.url, len(self.done) + 1)
        report = scan_served(self.request, self.say, for_step(self.progress, row.label))
        self.done.append(RunStep(row, report))
        self.say(f"{row.name}: {step_words(report)}")
        self.after_step(self.run_report(), row, report)
        code, self.fired = gated(report, row, self.gate, self.watch, self.say, self.fired)
        return code

    def run_report(self) -> RunReport:
        return with_narrowing(run_of(self.request.url, list(self.done), []))


def served_row(url: str, number: int) -> RunCheckpoint:
    """The run's row of the `number`-th diagnosis: its step is its number."""
    at = datetime.now().strftime("%H:%M:%S")
    served = Checkpoint("served", Path(url.split("://", 1)[-1]), Path("."), url=url)
    return RunCheckpoint(f"diagnosis {number} at {at}", number, served)
