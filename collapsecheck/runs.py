"""Training runs: scan every checkpoint of a run directory through the results cache, smooth
the z-score along the steps, and find the onset of collapse."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collapsecheck.cache import default_cache_root, scan_key
from collapsecheck.checkpoint import Checkpoint, require_checkpoint
from collapsecheck.discovery import RunCheckpoint, require_run
from collapsecheck.dump import REPORT_FILE
from collapsecheck.flow import NOT_MEASURED, FlowThresholds, decide_flow
from collapsecheck.metrics import apply_run_ema
from collapsecheck.onset import ONSET_METRIC, Onset, detect_onset
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.report import Report
from collapsecheck.run_report import RunReport, RunStep
from collapsecheck.scan import scan
from collapsecheck.settings import Settings, resolve_settings
from collapsecheck.verdict import Thresholds, decide


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
    entry = root / scan_key(checkpoint, prompts, settings.numbers())
    saved = entry / REPORT_FILE
    if saved.is_file() and not rescan:
        report = Report.load(saved)
        report.thresholds = thresholds or Thresholds()
        report.verdict = decide(report.metrics, report.thresholds)
        report.flow_thresholds = flow_thresholds or FlowThresholds()
        if report.flow.regime != NOT_MEASURED:
            report.flow = decide_flow(report.metrics, report.flow_thresholds)
        report.settings["checkpoint"] = str(checkpoint.path)
        report.timing = {**report.timing, "cached": True}
        return report
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


def for_step(progress: ProgressHook, label: str) -> ProgressHook:
    """The progress hook of one checkpoint: its stages name the step ("sampling, step 200")."""
    return lambda stage, total: progress(f"{stage}, step {label}", total)


def run_onset(steps: Sequence[RunStep]) -> Onset | None:
    return detect_onset(
        [s.checkpoint.label for s in steps],
        [s.report.verdict.regime for s in steps],
        [s.report.metrics[ONSET_METRIC] for s in steps],
    )


def scan_run(
    run_dir: str | Path,
    prompts: str | Path,
    settings: Settings | None = None,
    *,
    checkpoints: Sequence[RunCheckpoint] | None = None,
    notes: Sequence[str] = (),
    cache_root: str | Path | None = None,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    progress: ProgressHook = silent,
    **flags: Any,
) -> RunReport:
    """Scan each checkpoint of a run directory with the same prompts and seed, in step order,
    through the results cache (`cache_root`, else the default cache). `checkpoints`: those
    `discovery.find_checkpoints` found (with its `notes`), when the caller already has them."""
    settings = resolve_settings(settings, flags)
    run_dir = Path(run_dir)
    notes = list(notes)
    if checkpoints is None:
        checkpoints = require_run(run_dir, settings.load.base_model, notes)
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
    apply_run_ema([s.report.metrics for s in steps])
    return RunReport(run_dir, steps, run_onset(steps), notes)
