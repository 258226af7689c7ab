"""Training runs: scan every checkpoint of a run directory through the results cache, smooth
the z-score along the steps, and find the onset of collapse."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.cache import scan_key
from collapsecheck.checkpoint import Checkpoint
from collapsecheck.discovery import RunCheckpoint
from collapsecheck.dump import REPORT_FILE, write_text_atomic
from collapsecheck.metrics import apply_run_ema, point_value
from collapsecheck.onset import ONSET_METRIC, Onset, detect_onset
from collapsecheck.reasoning import ReasoningSpec
from collapsecheck.report import KEY_METRICS, Report
from collapsecheck.scan import ProgressHook, scan, silent
from collapsecheck.verdict import Thresholds, decide

RUN_FORMAT = 1
EMA_KEYS = ("mi_zscore_ema", "mi_zscore_ema_seq", "marginal_std_ema", "marginal_std_ema_seq")


def cache_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The scan options that change the numbers, in JSON-able form (thresholds excluded:
    the verdict is decided again from the cached metrics)."""
    return {
        key: value.to_dict() if isinstance(value, ReasoningSpec) else value
        for key, value in options.items()
    }


def cached_scan(
    checkpoint: Checkpoint,
    prompts: Path,
    *,
    cache_root: Path,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    progress: ProgressHook = silent,
    **options: Any,
) -> Report:
    """`scan` through the results cache: a finished scan with the same key is loaded, not redone."""
    entry = cache_root / scan_key(checkpoint, prompts, cache_settings(options))
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
        dump=entry,
        resume=True,
        thresholds=thresholds,
        progress=progress,
        **options,
    )


@dataclass
class RunStep:
    checkpoint: RunCheckpoint
    report: Report


@dataclass
class RunReport:
    run_dir: Path
    steps: list[RunStep]
    onset: Onset | None

    @property
    def onset_step(self) -> int | str | None:
        if self.onset is None:
            return None
        checkpoint = self.steps[self.onset.index].checkpoint
        return checkpoint.step if checkpoint.step is not None else checkpoint.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RUN_FORMAT,
            "run_dir": str(self.run_dir),
            "onset_step": self.onset_step,
            "onset": self.onset.to_dict() if self.onset else None,
            "steps": [
                {
                    "name": s.checkpoint.name,
                    "step": s.checkpoint.step,
                    "checkpoint": str(s.checkpoint.checkpoint.path),
                    "format": s.checkpoint.checkpoint.kind,
                    "dump": str(s.report.dump_dir) if s.report.dump_dir else None,
                    "report": s.report.to_dict(),
                }
                for s in self.steps
            ],
        }

    def to_frame(self) -> Any:
        """One row per checkpoint: key metrics, the run-smoothed z-scores and the regime."""
        import pandas as pd

        rows = []
        for step in self.steps:
            metrics = step.report.metrics
            row: dict[str, Any] = {"step": step.checkpoint.label}
            row.update({key: point_value(metrics[key]) for key in (*KEY_METRICS, *EMA_KEYS)})
            row["regime"] = step.report.verdict.regime
            rows.append(row)
        return pd.DataFrame(rows).set_index("step")

    def save(self, path: Path) -> Path:
        import json

        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


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
    *,
    cache_root: Path,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    progress: ProgressHook = silent,
    **options: Any,
) -> RunReport:
    """Scan each checkpoint of a run with the same prompts and seed, in step order."""
    advance = progress("run", len(checkpoints))
    steps = []
    for checkpoint in checkpoints:
        report = cached_scan(
            checkpoint.checkpoint,
            prompts,
            cache_root=cache_root,
            rescan=rescan,
            thresholds=thresholds,
            progress=progress,
            **options,
        )
        steps.append(RunStep(checkpoint, report))
        advance(1)
    apply_run_ema([s.report.metrics for s in steps])
    return RunReport(run_dir, steps, run_onset(steps))
