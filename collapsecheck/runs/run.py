"""Training runs: scan every checkpoint of a run directory through the results cache, smooth
the z-score along the steps, and find the onset of collapse."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collapsecheck.inputs.checkpoint import Checkpoint, require_checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint, require_run
from collapsecheck.inputs.training_logs import TrainingLog, find_log, read_log
from collapsecheck.measures.findings import find, series_keys, step_windows
from collapsecheck.measures.flow import NOT_MEASURED, FlowThresholds, decide_flow
from collapsecheck.measures.metrics import apply_run_ema
from collapsecheck.measures.onset import ONSET_METRIC, Onset, detect_onset
from collapsecheck.measures.verdict import Thresholds, decide
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.dump import REPORT_FILE
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import RunReport, RunStep
from collapsecheck.runs.cache import cache_entry, default_cache_root
from collapsecheck.runs.diagnose import scan
from collapsecheck.settings import Settings, resolve_settings


def cached_scan(
    checkpoint: str | Path | Checkpoint,
    prompts: str | Path,
    settings: Settings | None = None,
    *,
    cache_root: str | Path | None = None,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    progress: ProgressHook = silent,
    **flags: Any,
) -> Report:
    """`scan` through the results cache (`cache_root`, else the default cache): a finished
    scan with the same key is loaded, not redone. The key holds only the settings that change
    the numbers (thresholds excluded: the verdict is decided again from cached metrics)."""
    settings = resolve_settings(settings, flags)
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = require_checkpoint(checkpoint, settings.load.base_model)
    prompts = Path(prompts)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    entry = cache_entry(root, checkpoint, prompts, settings.numbers())
    if (entry / REPORT_FILE).is_file() and not rescan:
        return load_cached(entry, checkpoint, thresholds, flow_thresholds)
    return scan(
        checkpoint,
        prompts,
        settings,
        dump=entry,
        resume=True,
        thresholds=thresholds,
        flow_thresholds=flow_thresholds,
        progress=progress,
    )


def load_cached(
    entry: Path, checkpoint: Checkpoint, thresholds: Thresholds | None,
    flow_thresholds: FlowThresholds | None,
) -> Report:  # fmt: skip
    """A finished cache entry's report, its verdicts decided again with these thresholds."""
    report = Report.load(entry / REPORT_FILE)
    report.thresholds = thresholds or Thresholds()
    report.verdict = decide(report.metrics, report.thresholds)
    report.flow_thresholds = flow_thresholds or FlowThresholds()
    if report.flow.regime != NOT_MEASURED:
        report.flow = decide_flow(report.metrics, report.flow_thresholds)
    report.settings["checkpoint"] = str(checkpoint.path)
    report.timing = {**report.timing, "cached": True}
    return report


def for_step(progress: ProgressHook, label: str) -> ProgressHook:
    """The progress hook of one checkpoint: its stages name the step ("sampling, step 200")."""
    return lambda stage, total: progress(f"{stage}, step {label}", total)


def run_onset(steps: Sequence[RunStep]) -> Onset | None:
    return detect_onset(
        [s.checkpoint.label for s in steps],
        [s.report.verdict.regime for s in steps],
        [s.report.metrics[ONSET_METRIC] for s in steps],
    )


def run_training_log(
    run_dir: str | Path, checkpoints: Sequence[RunCheckpoint], log: str | Path | bool = True
) -> tuple[TrainingLog | None, str | None]:
    """The training log of a run (SPEC "Training logs beside the diagnosis"), read before any
    model loads: `log` a path, that file; True, the one its trainer left beside it (TRL's
    trainer_state.json in the highest step's checkpoint, or the root; veRL's
    tensorboard_log); False, none. (None, why) when there is none."""
    if log is False:
        return None, "not read (--no-train-log)"
    if log is not True:
        return read_log(log), None
    stepped = [c for c in checkpoints if c.step is not None] or list(checkpoints)
    latest = stepped[-1].checkpoint.path if stepped else None
    found, reason = find_log(Path(run_dir), latest)
    return found, (reason or None)


def run_inputs(
    run_dir: Path, settings: Settings, checkpoints: Sequence[RunCheckpoint] | None,
    notes: list[str], training_log: TrainingLog | str | Path | bool,
) -> tuple[Sequence[RunCheckpoint], TrainingLog | None, str | None]:  # fmt: skip
    """A run's checkpoints (found now unless given; what was left out goes into `notes`) and
    its training log (`run_training_log`), with why there is none: before any model loads."""
    if checkpoints is None:
        checkpoints = require_run(run_dir, settings.load.base_model, notes)
    if isinstance(training_log, TrainingLog):
        return checkpoints, training_log, None
    return checkpoints, *run_training_log(run_dir, checkpoints, training_log)


def with_baseline(
    checkpoints: Sequence[RunCheckpoint], baseline: str | Path | Checkpoint | None,
    settings: Settings,
) -> list[RunCheckpoint]:  # fmt: skip
    """The run's checkpoints, after the starting model as step 0 when there is one."""
    if baseline is None:
        return list(checkpoints)
    if not isinstance(baseline, Checkpoint):
        baseline = require_checkpoint(baseline, settings.load.base_model)
    return [RunCheckpoint("baseline", 0, baseline), *checkpoints]


def scan_run(
    run_dir: str | Path,
    prompts: str | Path,
    settings: Settings | None = None,
    *,
    checkpoints: Sequence[RunCheckpoint] | None = None,
    notes: Sequence[str] = (),
    baseline: str | Path | Checkpoint | None = None,
    training_log: TrainingLog | str | Path | bool = True,
    train_keys: Mapping[str, str] | None = None,
    cache_root: str | Path | None = None,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    progress: ProgressHook = silent,
    **flags: Any,
) -> RunReport:
    """Scan each checkpoint of a run directory with the same prompts and seed, in step order,
    through the results cache (`cache_root`, else the default cache). `checkpoints`: those
    `discovery.find_checkpoints` found (with its `notes`), when the caller already has them.
    `training_log`: a log already read, a path, True (the one the trainer left beside the
    run, when there is one) or False (none); a named log is read, and a bad one refused,
    before any model loads."""
    settings = resolve_settings(settings, flags)
    run_dir, notes = Path(run_dir), list(notes)
    checkpoints, training_log, log_reason = run_inputs(
        run_dir, settings, checkpoints, notes, training_log
    )
    checkpoints = with_baseline(checkpoints, baseline, settings)
    advance = progress("run", len(checkpoints))
    steps = []
    for checkpoint in checkpoints:
        report = cached_scan(
            checkpoint.checkpoint,
            prompts,
            settings,
            cache_root=cache_root,
            rescan=rescan,
            thresholds=thresholds,
            flow_thresholds=flow_thresholds,
            progress=for_step(progress, checkpoint.label),
        )
        steps.append(RunStep(checkpoint, report))
        advance(1)
    logged = (training_log, log_reason, train_keys or {})
    return finish_run(run_dir, steps, notes, logged, baseline is not None)


def finish_run(
    run_dir: Path,
    steps: list[RunStep],
    notes: list[str],
    logged: tuple[TrainingLog | None, str | None, Mapping[str, str]],
    baseline: bool,
    traces: str | None = None,
) -> RunReport:
    """The run report from its scanned steps: the run-smoothed z-scores, the onset, and the
    training log (`logged`: the log, why there is none, the --train-key overrides) beside the
    diagnosis. `traces`: where the traces came from, when not sampled from a prompt set."""
    training_log, log_reason, train_keys = logged
    apply_run_ema([s.report.metrics for s in steps])
    run = RunReport(
        run_dir, steps, run_onset(steps), notes, training_log_reason=log_reason, traces=traces
    )
    if training_log is not None:
        beside_the_log(run, training_log, train_keys, baseline)
    return run


def beside_the_log(
    run: RunReport, log: TrainingLog, overrides: Mapping[str, str], baseline: bool
) -> None:
    """The trainer's series per step (SPEC's windows) and the findings, into the run report;
    steps the log has no values for are named in its notes. Never changes a number of the
    scan."""
    keys = series_keys(list(log.points), overrides)
    series = {name: log.series(key) for name, key in keys.items()}
    windows = step_windows(series, [s.checkpoint.step for s in run.steps], baseline)
    for step, values in zip(run.steps, windows, strict=True):
        step.training_log = values
    run.training_log = {
        "source": log.source, "format": log.format, "keys": keys,
        "skipped_nonfinite": log.skipped_nonfinite,
    }  # fmt: skip
    empty = [s.checkpoint.label for s, w in zip(run.steps, windows, strict=True) if not w]
    if baseline:
        empty = empty[1:]
    if empty:
        run.notes.append(
            f"the training log {log.source} has no values for step(s) {', '.join(empty)}"
        )
    labels = [s.checkpoint.label for s in run.steps]
    run.findings = find(labels, [s.report.metrics[ONSET_METRIC] for s in run.steps], windows)
