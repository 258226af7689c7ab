"""`collapsecheck watch RUN_DIR`: the sidecar of a run that is still going. Look after look it
re-plans the run (`runs.plan`, one unit per checkpoint folder its writer has finished:
`inputs.completeness`) and hands the units still to do to this process's executor
(`runs.executors.run_here`), the newest first; each step's diagnosis goes to the console, the
results cache, the run's page and the team's dashboard.

Killed at any moment (SIGKILL included) and started again with the same command, it
diagnoses no step twice (a finished step's report is in the results cache) and loses none (a
step killed while sampling keeps the prompts already drawn: `runs.sampling`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from collapsecheck.config import GateConfig
from collapsecheck.engines.backends.base import Backend
from collapsecheck.errors import CollapsecheckError, DirectoryBusy
from collapsecheck.formatting import format_number
from collapsecheck.inputs.baseline import check_tokenizers
from collapsecheck.inputs.checkpoint import Checkpoint, detect_checkpoint
from collapsecheck.inputs.completeness import Completeness, weights_present, written_at
from collapsecheck.inputs.discovery import RunCheckpoint, step_number
from collapsecheck.inputs.sampled_temperature import temperature_line
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.gate import RuleResult, check_report, failures
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import RunReport
from collapsecheck.runs.executors import run_here
from collapsecheck.runs.explanation import reward_function
from collapsecheck.runs.join import join, pairing_of, read_against_start
from collapsecheck.runs.loading import open_backend
from collapsecheck.runs.pairing import RunRollouts, find_run_rollouts
from collapsecheck.runs.plan import ScanPlan, plan_played, plan_run_rollouts, plan_sampled
from collapsecheck.runs.preparation import read_prompt_set
from collapsecheck.runs.run import run_context
from collapsecheck.runs.units import (
    PlayedTraces,
    RolloutTraces,
    VerdictThresholds,
    WorkUnit,
    for_step,
    run_unit,
)
from collapsecheck.settings import Settings, WatchSettings

Say = Callable[[str], None]
EXIT_FAIL = 1


@dataclass
class Followed:
    """What the watch has seen of the run: the steps diagnosed (their units and reports, in
    this process or before it, from the results cache), the folders the trainer deleted, and
    whether --on-fail has run."""

    done: dict[str, tuple[WorkUnit, Report]] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    queued: dict[str, RunCheckpoint] = field(default_factory=dict)  # ready, not yet diagnosed
    busy: set[str] = field(default_factory=set)  # being diagnosed by another process
    said: set[str] = field(default_factory=set)  # where rollouts' temperatures came from
    fired: bool = False

    def names(self) -> set[str]:
        """The checkpoint folders diagnosed (a run's rollouts: those that scored a step)."""
        return {unit.row.name for unit, _ in self.done.values()}

    def notice_deleted(self, rows: list[RunCheckpoint], say: Say) -> None:
        """Steps that were waiting at the last look and are gone now: named, and skipped."""
        present, diagnosed = {row.name for row in rows}, self.names()
        for name, row in list(self.queued.items()):
            if name not in present and name not in diagnosed and not row.checkpoint.path.exists():
                deleted(row, self, say)
        self.queued = {row.name: row for row in rows if row.name not in diagnosed}

    def run_report(
        self, run_dir: Path, settings: Settings, training_log: Path | bool = True,
        train_keys: Mapping[str, str] | None = None,
    ) -> RunReport:  # fmt: skip
        """The run report of every step diagnosed so far, in step order (a step the trainer
        deleted since keeps its row), beside the trainer's log as `scan RUN` reads it
        (`training_log`: found by itself, a file, or False for none; `train_keys`)."""
        pairs = sorted(self.done.values(), key=lambda pair: order(pair[0].row))
        units = tuple(unit for unit, _ in pairs)
        rows = [unit.row for unit in units]
        try:
            _, context = run_context(run_dir, settings, rows, [], training_log, train_keys, None)
        except CollapsecheckError:  # the trainer's log, mid-write or unreadable: left out
            _, context = run_context(run_dir, settings, rows, [], False, None, None)
        plan = ScanPlan(units, (None,) * len(units), settings)
        return join(plan, [report for _, report in pairs], context)


def order(row: RunCheckpoint) -> tuple[bool, int, str]:
    return (row.step is None, row.step or 0, row.name)


def unit_key(unit: WorkUnit) -> str:
    """A unit's identity across looks: its folder and its results-cache entry (two folders
    with the same weights share an entry: the second is answered from the cache)."""
    return f"{unit.row.name}\0{unit.dump}"


@dataclass(frozen=True)
class PlayedIn:
    """Each checkpoint played in an environment (`--env`, SPEC "Agents across turns"), the
    environment loaded and checked before the run has a checkpoint."""

    played: PlayedTraces

    def check(self, settings: Settings) -> None:
        """Nothing more: the environment was loaded (and one made) when the watch began."""

    def units(self, watch: Watch, rows: list[RunCheckpoint], rules: Completeness) -> list[WorkUnit]:
        return list(plan_played(rows, self.played, watch.settings, cache=watch.cache).units)

    def left_out(self, watch: Watch) -> list[str]:
        return never_complete(watch)


@dataclass(frozen=True)
class SampledFrom:
    """Each checkpoint sampled afresh from a prompt set (`-p`)."""

    prompts: Path

    def check(self, settings: Settings) -> None:
        """The prompt set and the reward function read now, before the run has a checkpoint:
        a mistake in them is said at once, not when the first checkpoint lands."""
        read_prompt_set(self.prompts, settings)
        reward_function(settings)

    def units(self, watch: Watch, rows: list[RunCheckpoint], rules: Completeness) -> list[WorkUnit]:
        return plan_units(rows, self.prompts, watch.settings, watch.cache, watch.baseline)

    def left_out(self, watch: Watch) -> list[str]:
        return never_complete(watch)


def never_complete(watch: Watch) -> list[str]:
    """Folders with weights that their writer's rule never called complete (still settling,
    say)."""
    diagnosed, gone = watch.followed.names(), watch.followed.gone
    return [
        f"not diagnosed: {folder} was not complete by its writer's rule when the run ended"
        for folder in step_folders(watch.run_dir)
        if folder.name not in diagnosed | gone and weights_present(folder)
    ]


@dataclass(frozen=True)
class TrainerRollouts:
    """The run's own rollouts (in `folder`, else where the trainer keeps them beside the
    run), each step's scored under the checkpoint that sampled it (`runs.pairing`) once its
    file is complete; `training_prompts`: veRL's prompt file its decoded inputs match."""

    folder: Path | None = None
    training_prompts: Path | None = None

    def check(self, settings: Settings) -> None:
        """Rollouts are read as they land; a named training prompt file must exist now."""
        if self.training_prompts is not None and not self.training_prompts.is_file():
            raise CollapsecheckError(f"prompt file not found: {self.training_prompts}")

    def units(self, watch: Watch, rows: list[RunCheckpoint], rules: Completeness) -> list[WorkUnit]:
        try:
            found = find_run_rollouts(watch.run_dir, self.folder)
        except CollapsecheckError:  # --rollouts DIR, empty so far
            return []
        if found is None:
            return []
        scored = {u.traces.path for u, _ in watch.followed.done.values()}
        files = [
            f for at, f in enumerate(found.files)
            if f.path not in scored and rules.rollout_complete(f.path, at + 1 < len(found.files))
        ]  # fmt: skip
        if not files or not rows:
            return []
        try:
            plan = plan_run_rollouts(
                RunRollouts(found.folder, files), rows, watch.settings, cache=watch.cache,
                training_prompts=self.training_prompts,
            )  # fmt: skip
        except CollapsecheckError as err:
            if "cannot score" in str(err):  # no step pairs with a checkpoint yet
                return []
            raise
        return list(plan.units)

    def left_out(self, watch: Watch) -> list[str]:
        """Rollout files not scored: not complete yet, or sampled before any checkpoint."""
        try:
            found = find_run_rollouts(watch.run_dir, self.folder)
        except CollapsecheckError:
            return []
        scored = {u.traces.path for u, _ in watch.followed.done.values()}
        return [
            f"not scored: {f.path} (not complete when the run ended, or no checkpoint at or "
            "before the step before it)"
            for f in (found.files if found is not None else [])
            if f.path not in scored
        ]


def ready_rows(run_dir: Path, completeness: Completeness, gone: set[str]) -> list[RunCheckpoint]:
    """The checkpoint folders under the run directory that their writer has finished."""
    rows = []
    for folder in step_folders(run_dir):
        try:
            if folder.name in gone or not completeness.complete(folder, run_dir):
                continue
            checkpoint = detect_checkpoint(folder)
        except OSError:  # removed while looked at: the next look says so
            continue
        if checkpoint is not None:
            rows.append(RunCheckpoint(folder.name, step_number(folder.name), checkpoint))
    return sorted(rows, key=order)


def step_folders(run_dir: Path) -> list[Path]:
    try:
        return sorted(p for p in run_dir.iterdir() if p.is_dir())
    except OSError:  # not there yet
        return []


def plan_units(
    rows: list[RunCheckpoint], prompts: Path, settings: Settings, cache: Path | None,
    baseline: Checkpoint | None = None,
) -> list[WorkUnit]:  # fmt: skip
    """One unit per ready row through the results cache, planned together (the prompt file
    read once a look), each row's reasoning also scored under `baseline` (its tokenizer
    checked against each row's); none this look where a folder vanished while planned: the
    next look names it (`Followed.notice_deleted`) and plans the others."""
    if not rows:
        return []
    try:
        if baseline is not None:
            checkpoints = [row.checkpoint for row in rows]
            check_tokenizers(baseline, checkpoints, settings.load.trust_remote_code)
        return list(plan_sampled(rows, prompts, settings, cache=cache, prior=baseline).units)
    except Exception:  # whatever reading a vanished folder raises
        if all(row.checkpoint.path.exists() for row in rows):
            raise
        return []


def deleted(row: RunCheckpoint, followed: Followed, say: Say) -> None:
    followed.gone.add(row.name)
    followed.queued.pop(row.name, None)
    say(f"step {row.label}: {row.checkpoint.path} was deleted by the trainer before its "
        "diagnosis; skipped")  # fmt: skip


def step_line(report: Report, unit: WorkUnit, written: float) -> str:
    """One line per diagnosed step: its verdict and the lag from written to diagnosed."""
    lag = time.time() - written
    at = datetime.fromtimestamp(written).strftime("%H:%M:%S")
    pairing = pairing_of(unit.traces)
    scored = f"rollouts scored by {pairing.describe()}, " if pairing is not None else ""
    when = f"{scored}written {at}, diagnosed {lag:.0f} s later"
    return f"step {unit.label}: {step_words(report)} ({when})"


def step_words(report: Report) -> str:
    """A diagnosis in a line: the verdict, normalized MI, retrieval skill, where the input
    shows, the flow, early answering, and the reading from the start where there is one."""
    return (
        f"{report.verdict.label}, normalized MI {format_number(report.value('normalized_mi'))}, "
        f"retrieval skill {format_number(report.value('retrieval_skill'))}, input shows "
        f"{report.token_information.short(report.metrics)}, flow "
        f"{report.flow.regime.replace('_', ' ')}, early answer "
        f"{report.early_answer.short(report.metrics)}{start_words(report)}"
    )


def start_words(report: Report) -> str:
    """ ", from the start: start mode" where the step was read under the start."""
    regime = report.prior.regime
    return "" if regime == "not_measured" else f", from the start: {regime.replace('_', ' ')}"


def run_on_fail(command: str, row: RunCheckpoint, failed: list[RuleResult], say: Say) -> None:
    """--on-fail: the command, once, with the failing step and rules in its environment."""
    env = {
        **os.environ,
        "COLLAPSECHECK_STEP": row.label,
        "COLLAPSECHECK_CHECKPOINT": row.checkpoint.where,
        "COLLAPSECHECK_RULE": ",".join(r.name for r in failed),
        "COLLAPSECHECK_MESSAGE": "; ".join(r.message for r in failed),
    }
    done = subprocess.run(command, shell=True, env=env, check=False)
    say(f"--on-fail ran ({command!r}), exit {done.returncode}")


@dataclass
class Watch:
    """One watch of one run: its inputs, how it follows the run, what it writes after each
    step (`after_step`: the page, the dashboards), and the gate."""

    run_dir: Path
    traces: SampledFrom | TrainerRollouts | PlayedIn
    settings: Settings
    watch: WatchSettings
    gate: GateConfig
    verdicts: VerdictThresholds
    cache: Path | None = None
    say: Say = print
    progress: ProgressHook = silent
    after_step: Callable[[RunReport, RunCheckpoint, Report], None] = lambda run, row, rep: None
    followed: Followed = field(default_factory=Followed)
    # the trainer's log as `scan RUN` takes it: found by itself, a file, or False for none
    training_log: Path | bool = True
    train_keys: Mapping[str, str] = field(default_factory=dict)
    # the policy the run started from (SPEC "Scored under the start"): scanned first as step
    # 0, each step's reasoning also scored under it; its own report once scanned
    baseline: Checkpoint | None = None
    start: Report | None = None
    start_model: Backend | None = None  # the baseline, loaded once for the whole watch

    def follow(self) -> int:
        """Diagnose each step as it lands until the run ends; the exit code. With a
        baseline, it is loaded once, scanned as step 0, and held for every step."""
        self.traces.check(self.settings)
        if self.baseline is None:
            return self.follow_steps()
        with open_backend(self.baseline, None, self.settings) as start:
            self.start_model = start
            self.scan_start()
            return self.follow_steps()

    def follow_steps(self) -> int:
        completeness = Completeness(self.watch.settle)
        last_news = time.monotonic()
        if not self.run_dir.is_dir():
            self.say(f"waiting for {self.run_dir} to appear")
        while True:
            rows = ready_rows(self.run_dir, completeness, self.followed.gone)
            self.followed.notice_deleted(rows, self.say)
            units = self.traces.units(self, rows, completeness)
            self.read_finished(units)
            todo = [u for u in units if unit_key(u) not in self.followed.done]
            if not todo:
                if self.watch.until is not None and self.watch.until.exists():
                    self.say(f"the run ended ({self.watch.until} exists)")
                    self.say_left_out()
                    return 0
                if time.monotonic() - last_news >= self.watch.idle:
                    self.say(f"nothing new for {self.watch.idle:g} s: the watch ends")
                    self.say_left_out()
                    return 0
                time.sleep(self.watch.poll)
                continue
            unit = self.next_unit(todo)
            code = self.diagnose(unit)
            if code is not None:
                return code
            last_news = time.monotonic()  # --idle counts from the end of the last diagnosis

    def scan_start(self) -> None:
        """The baseline's own scan of the watch's prompts (through the results cache), step 0
        of the run: what each step's reasoning under it is read against."""
        if not isinstance(self.traces, SampledFrom):
            raise CollapsecheckError(
                "--baseline goes with -p when watching: the trainer's rollouts are not scored "
                "under the start"
            )
        row = RunCheckpoint("baseline", 0, self.baseline)
        (unit,) = plan_units([row], self.traces.prompts, self.settings, self.cache)
        progress = for_step(self.progress, unit.label)
        report = run_unit(unit, self.settings, self.verdicts, progress=progress,
                          backend=self.start_model)  # fmt: skip
        self.start = report
        self.followed.done[unit_key(unit)] = (unit, report)
        self.say(f"step 0 (the start, {self.baseline.path}): {report.verdict.label}; each "
                 "step's reasoning is also scored under it")  # fmt: skip

    def read_against_start(self, report: Report) -> None:
        if self.start is not None:
            read_against_start([report], self.start)

    def say_temperature(self, report: Report) -> None:
        """Where the rollouts' temperature came from (a saved config, or nothing), once."""
        said = temperature_line(report.settings, report.warnings)
        if said is not None and said[0] not in self.followed.said:
            self.followed.said.add(said[0])
            self.say(said[1])

    def say_left_out(self) -> None:
        """At the end, what was not diagnosed is named, not silently left out."""
        for line in self.traces.left_out(self):
            self.say(line)

    def next_unit(self, todo: list[WorkUnit]) -> WorkUnit:
        """The newest waiting step (--every-step: the oldest), saying so when several wait:
        diagnosing takes longer than the trainer takes to write the next step."""
        todo = sorted(todo, key=lambda u: order(u.row))
        unit = todo[0] if self.watch.every_step else todo[-1]
        if len(todo) > 1:
            waiting = ", ".join(u.label for u in todo)
            how = "in order (--every-step)" if self.watch.every_step else "the newest first"
            self.say(f"falling behind the trainer: steps {waiting} are waiting; diagnosing {how}"
                     f" (step {unit.label})")  # fmt: skip
        return unit

    def read_finished(self, units: list[WorkUnit]) -> None:
        """Steps the results cache already holds (diagnosed before a restart): read, said
        once, and written to the dashboards (which keep each step once)."""
        for unit in units:
            if unit_key(unit) not in self.followed.done and unit.finished():
                (report,) = run_here(ScanPlan((unit,), (None,), self.settings), self.verdicts,
                                     labelled=False, start=self.start_model)  # fmt: skip
                self.read_against_start(report)
                self.followed.done[unit_key(unit)] = (unit, report)
                self.say(f"step {unit.label}: {report.verdict.label}, from the results cache")
                self.after_step(self.run_report(), unit.row, report)

    def run_report(self) -> RunReport:
        return self.followed.run_report(
            self.run_dir, self.settings, self.training_log, self.train_keys
        )

    def diagnose(self, unit: WorkUnit) -> int | None:
        """Diagnose one step, write what follows it, and apply the gate; an exit code where
        the watch ends."""
        traces = unit.traces
        written = written_at(
            traces.path if isinstance(traces, RolloutTraces) else unit.checkpoint.path
        )
        plan = ScanPlan((unit,), (None,), self.settings)
        try:
            (report,) = run_here(
                plan, self.verdicts, self.progress, labelled=True, start=self.start_model
            )
        except DirectoryBusy:  # a second watcher on the same results cache has this step
            if unit.row.name not in self.followed.busy:
                self.followed.busy.add(unit.row.name)
                self.say(f"step {unit.label}: another process is diagnosing it; its report "
                         "will be read from the results cache")  # fmt: skip
            time.sleep(self.watch.poll)
            return None
        except Exception:  # whatever loading a vanished folder raises
            if unit.checkpoint.path.exists():
                raise
            deleted(unit.row, self.followed, self.say)
            return None
        self.read_against_start(report)
        self.followed.done[unit_key(unit)] = (unit, report)
        self.say(step_line(report, unit, written))
        self.say_temperature(report)
        self.after_step(self.run_report(), unit.row, report)
        code, self.followed.fired = gated(
            report, unit.row, self.gate, self.watch, self.say, self.followed.fired
        )
        return code


def gated(
    report: Report, row: RunCheckpoint, gate: GateConfig, watch: WatchSettings, say: Say,
    fired: bool,
) -> tuple[int | None, bool]:  # fmt: skip
    """A step's report through the gate: each failed rule said, --on-fail run at the first
    failure of the watch (`fired`: it has run), and the exit code where --stop-on-fail ends
    the watch; with whether --on-fail has run now."""
    failed = failures(check_report(report, gate))
    if not failed:
        return None, fired
    for rule in failed:
        say(f"gate failed at step {row.label} (rule: {rule.name}): {rule.message}")
    if watch.on_fail and not fired:
        fired = True
        run_on_fail(watch.on_fail, row, failed, say)
    return (EXIT_FAIL if watch.stop_on_fail else None), fired
