"""Training runs: scan every checkpoint of a run directory through the results cache, smooth
the z-score along the steps, and find the onset of collapse."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collapsecheck.cache import scan_key
from collapsecheck.checkpoint import Checkpoint
from collapsecheck.discovery import RunCheckpoint
from collapsecheck.dump import REPORT_FILE
from collapsecheck.metrics import apply_run_ema
from collapsecheck.onset import ONSET_METRIC, Onset, detect_onset
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.report import Report
from collapsecheck.run_report import RunReport, RunStep
from collapsecheck.scan import scan
from collapsecheck.settings import Settings, resolve_settings
from collapsecheck.verdict import Thresholds, decide


def cached_scan(
    checkpoint: Checkpoint,
    prompts: Path,
    settings: Settings | None = None,
    *,
    cache_root: Path,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    progress: ProgressHook = silent,
    **flags: Any,
) -> Report:
    """`scan` through the results cache: a finished scan with the same key is loaded, not
    redone. The key holds only the settings that change the numbers (thresholds excluded:
    the verdict is decided again from the cached metrics)."""
    settings = resolve_settings(settings, flags)
    entry = cache_root / scan_key(checkpoint, prompts, settings.numbers())
    saved = entry / REPORT_FILE
    if saved.is_file() and not rescan:
        report = Report.load(saved)
        report.thresholds = thresholds or Thresholds()
        report.verdict = decide(report.metrics, report.thresholds)
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
        progress=progress,
    )


def run_onset(steps: Sequence[RunStep]) -> Onset | None:
    return detect_onset(
        [s.checkpoint.label for s in steps],
        [s.report.verdict.regime for s in steps],
        [s.report.metrics[ONSET_METRIC] for s in steps],
    )


def scan_run(
    run_dir: Path,
    checkpoints: Sequence[RunCheckpoint],
    prompts: Path,
    settings: Settings | None = None,
    *,
    cache_root: Path,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    progress: ProgressHook = silent,
    **flags: Any,
) -> RunReport:
    """Scan each checkpoint of a run with the same prompts and seed, in step order."""
    settings = resolve_settings(settings, flags)
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
            progress=progress,
        )
        steps.append(RunStep(checkpoint, report))
        advance(1)
    apply_run_ema([s.report.metrics for s in steps])
    return RunReport(run_dir, steps, run_onset(steps))
