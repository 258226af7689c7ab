"""The join: a run's units, run or read back from the results cache, made into the run
report: the run-smoothed z-scores, the onset of collapse, and the trainer's own log beside
the diagnosis (SPEC "Training logs beside the diagnosis")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapsecheck.inputs.training_logs import TrainingLog
from collapsecheck.measures.findings import find, series_keys, step_windows, strategy_narrowing
from collapsecheck.measures.metrics import Estimate, apply_run_ema
from collapsecheck.measures.onset import ONSET_METRIC, Onset, detect_onset
from collapsecheck.measures.prior import BASELINE_ENTROPY, TYPICALITY, read_prior, typicality
from collapsecheck.reports.dump import REPORT_FILE
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import Pairing, RunReport, RunStep
from collapsecheck.runs.plan import ScanPlan
from collapsecheck.runs.units import RolloutTraces, Traces


@dataclass(frozen=True)
class RunContext:
    """What a run report holds beside its units: the run's folder, what was left out of it
    (`notes`), its training log (or why there is none) with the --train-key overrides, and
    whether its first row is the starting model (--baseline, step 0)."""

    run_dir: Path
    notes: tuple[str, ...] = ()
    training_log: TrainingLog | None = None
    log_reason: str | None = None
    train_keys: Mapping[str, str] = field(default_factory=dict)
    baseline: bool = False


def join(plan: ScanPlan, reports: Sequence[Report], context: RunContext) -> RunReport:
    """The run report of a plan's units and their reports (in the plan's order)."""
    steps = [
        RunStep(unit.row, report, sampled_by=pairing_of(unit.traces))
        for unit, report in zip(plan.units, reports, strict=True)
    ]
    if context.baseline and plan.sampled:
        read_against_start([s.report for s in steps[1:]], steps[0].report)
    run = run_of(context.run_dir, steps, [*context.notes, *plan.notes],
                 training_log_reason=context.log_reason, traces=plan.traces)  # fmt: skip
    if context.training_log is not None:
        # a run of the trainer's rollouts has no baseline row: its first row is a step
        baseline = context.baseline and plan.sampled
        beside_the_log(run, context.training_log, context.train_keys, baseline)
    return with_narrowing(run)


def run_of(
    run_dir: Path | str, steps: list[RunStep], notes: list[str], **extra: Any
) -> RunReport:  # fmt: skip
    """The run report of its steps, in order: the run's smoothed series and its onset
    (`extra`: the run report's other fields)."""
    apply_run_ema([s.report.metrics for s in steps])
    return RunReport(run_dir, steps, run_onset(steps), notes, **extra)


def with_narrowing(run: RunReport) -> RunReport:
    """The run with its strategy-narrowing finding, where its steps show one."""
    steps = run.steps
    narrowing = strategy_narrowing(
        [s.checkpoint.label for s in steps], [s.report.metrics for s in steps]
    )
    if narrowing is not None:
        run.findings.append(narrowing)
    return run


def read_against_start(reports: Sequence[Report], start: Report, save: bool = False) -> None:
    """SPEC "Scored under the start": each report whose reasoning was scored under the
    baseline gets its `prior_typicality` against `start`, the baseline's own scan of the
    same prompts and settings, and its reading. `save`: its report.json is written again (a
    user's --dump; a results-cache entry keeps its scan as made, read against the start
    again each time it is read)."""
    entropy = start.metrics.get(BASELINE_ENTROPY)
    for report in reports:
        if report.prior.baseline is None or not isinstance(entropy, Estimate):
            continue
        prior_seq = report.metrics["prior_logprob_seq"]
        report.metrics[TYPICALITY] = typicality(prior_seq, entropy)
        report.prior = read_prior(report.metrics, entropy, report.prior.baseline)
        if save and report.dump_dir is not None:
            report.save(report.dump_dir / REPORT_FILE)


def pairing_of(traces: Traces) -> Pairing | None:
    return traces.pairing if isinstance(traces, RolloutTraces) else None


def run_onset(steps: Sequence[RunStep]) -> Onset | None:
    return detect_onset(
        [s.checkpoint.label for s in steps],
        [s.report.verdict.regime for s in steps],
        [s.report.metrics[ONSET_METRIC] for s in steps],
    )


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
