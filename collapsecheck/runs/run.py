"""The Python API of runs: a checkpoint through the results cache (`cached_scan`; played in
an environment, `cached_play`), every
checkpoint of a run sampled afresh (`scan_run`), a run from the rollouts its trainer wrote
(`score_run`). Each builds its plan (`runs.plan`), runs it in this process
(`runs.executors.run_here`) and, for a run, joins it (`runs.join`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from collapsecheck.inputs.baseline import require_baseline
from collapsecheck.inputs.checkpoint import Checkpoint, require_checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint, require_run
from collapsecheck.inputs.training_logs import TrainingLog, find_log, read_log
from collapsecheck.measures.flow import FlowThresholds
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.measures.verdict import Thresholds
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import RunReport
from collapsecheck.runs.executors import run_here
from collapsecheck.runs.join import RunContext, join
from collapsecheck.runs.pairing import RunRollouts, run_rollouts
from collapsecheck.runs.plan import plan_played, plan_run_rollouts, plan_sampled
from collapsecheck.runs.units import PROMPTS, PlayedTraces
from collapsecheck.settings import EnvSettings, Settings, resolve_settings


def single_row(checkpoint: Checkpoint) -> RunCheckpoint:
    """One checkpoint as a row of a plan (no step)."""
    return RunCheckpoint(checkpoint.path.name, None, checkpoint)


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
    prior: str | Path | Checkpoint | None = None,
    **flags: Any,
) -> Report:
    """`scan` through the results cache (`cache_root`, else the default cache): a finished
    scan with the same key is loaded, not redone. The key holds only the settings that change
    the numbers (thresholds excluded: the verdict is decided again from cached metrics).
    `prior`: the baseline the reasoning is also scored under, checked first as
    `inputs.baseline.require_baseline` does (its typicality needs the baseline's own scan:
    `runs.join.read_against_start`)."""
    settings = resolve_settings(settings, flags)
    load = settings.load
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = require_checkpoint(checkpoint, load.base_model)
    if prior is not None:
        prior = require_baseline(prior, [checkpoint], load.base_model, load.trust_remote_code)
    root = Path(cache_root) if cache_root is not None else None
    plan = plan_sampled([single_row(checkpoint)], Path(prompts), settings, cache=root,
                        rescan=rescan, prior=prior)  # fmt: skip
    verdicts = VerdictThresholds.of(thresholds, flow_thresholds)
    return run_here(plan, verdicts, progress, labelled=False)[0]


def cached_play(
    checkpoint: str | Path | Checkpoint,
    env: EnvSettings,
    settings: Settings | None = None,
    *,
    cache_root: str | Path | None = None,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    progress: ProgressHook = silent,
    say: Callable[[str], None] = lambda line: None,
    prompts: str | Path | None = None,
    **flags: Any,
) -> Report:
    """`scan --env` of one checkpoint through the results cache, its dump (episodes.jsonl
    among it) kept in the cache entry: what `compare A B --env` pairs by start state. The
    environment is loaded (its config found beside the checkpoint; `prompts`: a dataset whose
    rows are its start states, SkyRL's or TRL's) before the model; `say` gets its notes."""
    settings = resolve_settings(settings, flags)
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = require_checkpoint(checkpoint, settings.load.base_model)
    dataset = {PROMPTS: None if prompts is None else Path(prompts)}
    played, settings = PlayedTraces.load(env, dataset, near=checkpoint.path).resolved(settings)
    for note in played.notes():
        say(f"note: {note}")
    root = Path(cache_root) if cache_root is not None else None
    plan = plan_played([single_row(checkpoint)], played, settings, cache=root, rescan=rescan)
    verdicts = VerdictThresholds.of(thresholds, flow_thresholds)
    return run_here(plan, verdicts, progress, labelled=False)[0]


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


def with_baseline(
    checkpoints: Sequence[RunCheckpoint], baseline: str | Path | Checkpoint | None,
    settings: Settings,
) -> list[RunCheckpoint]:  # fmt: skip
    """The run's checkpoints, after the starting model as step 0 when there is one (checked
    as `inputs.baseline.require_baseline` does, against each of them)."""
    if baseline is None:
        return list(checkpoints)
    load = settings.load
    start = require_baseline(
        baseline, [c.checkpoint for c in checkpoints], load.base_model, load.trust_remote_code
    )
    return [RunCheckpoint("baseline", 0, start), *checkpoints]


def start_of(rows: Sequence[RunCheckpoint], context: RunContext) -> Checkpoint | None:
    """The baseline every other row's reasoning is scored under (SPEC "Scored under the
    start"): the run's step 0 when --baseline named one."""
    return rows[0].checkpoint if context.baseline else None


def run_context(
    run_dir: Path, settings: Settings, checkpoints: Sequence[RunCheckpoint] | None,
    notes: Sequence[str], training_log: TrainingLog | str | Path | bool,
    train_keys: Mapping[str, str] | None, baseline: str | Path | Checkpoint | None,
) -> tuple[list[RunCheckpoint], RunContext]:  # fmt: skip
    """A run's rows (its checkpoints, found now unless given, after the baseline) and what
    its report holds beside them: what was left out, its training log (or why there is
    none). Everything here is read before any model loads."""
    notes = list(notes)
    if checkpoints is None:
        checkpoints = require_run(run_dir, settings.load.base_model, notes)
    if isinstance(training_log, TrainingLog):
        log, reason = training_log, None
    else:
        log, reason = run_training_log(run_dir, checkpoints, training_log)
    rows = with_baseline(checkpoints, baseline, settings)
    context = RunContext(
        run_dir, tuple(notes), log, reason, dict(train_keys or {}), baseline is not None
    )
    return rows, context


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
    run_dir = Path(run_dir)
    rows, context = run_context(
        run_dir, settings, checkpoints, notes, training_log, train_keys, baseline
    )
    root = Path(cache_root) if cache_root is not None else None
    plan = plan_sampled(
        rows, Path(prompts), settings, cache=root, rescan=rescan, prior=start_of(rows, context)
    )
    reports = run_here(plan, VerdictThresholds.of(thresholds, flow_thresholds), progress)
    return join(plan, reports, context)


def score_run(
    run_dir: str | Path,
    rollouts: str | Path | RunRollouts | None = None,
    settings: Settings | None = None,
    *,
    checkpoints: Sequence[RunCheckpoint] | None = None,
    notes: Sequence[str] = (),
    baseline: str | Path | Checkpoint | None = None,
    training_prompts: str | Path | None = None,
    training_log: TrainingLog | str | Path | bool = True,
    train_keys: Mapping[str, str] | None = None,
    cache_root: str | Path | None = None,
    rescan: bool = False,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    progress: ProgressHook = silent,
    **flags: Any,
) -> RunReport:
    """Diagnose a run from the rollouts its trainer wrote, step by step (`rollouts`: their
    folder, else the one the trainer keeps beside the run), each scored under the checkpoint
    that sampled it (`runs.pairing`); `training_prompts`: veRL's training prompt file, which
    its decoded inputs are matched to. The other arguments are `scan_run`'s."""
    settings = resolve_settings(settings, flags)
    run_dir = Path(run_dir)
    rows, context = run_context(
        run_dir, settings, checkpoints, notes, training_log, train_keys, baseline
    )
    plan = plan_run_rollouts(
        run_rollouts(run_dir, rollouts), rows, settings,
        cache=Path(cache_root) if cache_root is not None else None,
        training_prompts=Path(training_prompts) if training_prompts is not None else None,
        rescan=rescan,
    )  # fmt: skip
    reports = run_here(plan, VerdictThresholds.of(thresholds, flow_thresholds), progress)
    return join(plan, reports, context)
