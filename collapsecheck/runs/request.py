"""`scan` as one request, carried out on one route: the request is planned (`runs.plan`:
sampled afresh or from the trainer's rollouts, one checkpoint or a run), cut to a shard's
share where one is asked for, printed as its plan line, run by the executor the user chose
(this process, a shard or Slurm array task, Ray tasks) and, for a run, joined."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint, find_checkpoints
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.outputs import check_keep_rollout_prompts, check_outputs, option_name
from collapsecheck.runs.shards import Shard, resolve_shard, share_of
from collapsecheck.settings import EnvSettings, OutputSettings, Settings

if TYPE_CHECKING:
    from collapsecheck.reports.report import Report
    from collapsecheck.reports.run_report import RunReport
    from collapsecheck.runs.join import RunContext
    from collapsecheck.runs.pairing import RunRollouts
    from collapsecheck.runs.plan import ScanPlan

Say = Callable[[str], None]  # a line for the user (stderr), never part of the results


@dataclass(frozen=True)
class ScanRequest:
    """What `scan` was asked for: the target (a checkpoint, or a run directory), where its
    traces come from (`prompts` to sample from; a run's `rollouts`, found beside it unless
    named; `sample` forces sampling), the run's extras (`baseline`, `training_log`,
    `train_keys`), the settings and outputs, and where the work runs (`shard`, `ray`,
    `dry_run`)."""

    target: Path
    settings: Settings
    outputs: OutputSettings
    verdicts: VerdictThresholds = field(default_factory=VerdictThresholds)
    prompts: Path | None = None
    rollouts: Path | None = None
    sample: bool = False
    baseline: Path | None = None
    training_log: Path | bool = True
    train_keys: Mapping[str, str] = field(default_factory=dict)
    shard: str | None = None
    ray: str | None = None
    dry_run: bool = False
    rescan: bool = False
    env: EnvSettings = field(default_factory=EnvSettings)


@dataclass(frozen=True)
class Planned:
    """A request planned: its units, the run they make (None: one checkpoint), the prompt
    file kept prompts are read from when the traces were sampled, and the shard's share to
    run (None: all of it)."""

    plan: ScanPlan
    run: RunContext | None
    prompt_file: Path | None
    shard: Shard | None = None


def plan_request(request: ScanRequest, say: Say = lambda line: None) -> Planned:
    """Everything checked and read that can be before any model loads, into one plan. The
    target, the options that go with it and every output path are checked first, before the
    planning imports an array, model or framework library (docs/decisions.md, "Start-up")."""
    notes: list[str] = []
    single, run = find_checkpoints(request.target, request.settings.load.base_model, notes)
    if not run:
        for note in notes:
            say(f"note: {note}")
    check_combinations(request, bool(run))
    shard = requested_shard(request, bool(run))
    found = None if request.env.env is not None else run_rollouts_of(request, bool(run))
    if request.env.env is not None or found is not None:
        check_outputs(request.outputs)
    if request.env.env is not None:
        return replace(plan_env(request, single, run, notes, say), shard=shard)
    if found is not None:
        return replace(plan_from_rollouts(request, found, run, notes, say), shard=shard)
    if request.prompts is None:
        raise CollapsecheckError("--prompts FILE is needed to scan a checkpoint")
    check_outputs(request.outputs, request.settings.rewards, request.prompts)
    outputs, settings = request.outputs, request.settings
    if not run:
        return Planned(plan_single(request, single), None, request.prompts, shard)
    from collapsecheck.runs.plan import plan_sampled
    from collapsecheck.runs.run import start_of

    rows, context = request_run(request, run, notes)
    plan = plan_sampled(
        rows, request.prompts, settings, cache=outputs.out, rescan=request.rescan,
        prior=start_of(rows, context),
    )  # fmt: skip
    return Planned(plan, context, request.prompts, shard)


def plan_env(
    request: ScanRequest, single: Checkpoint | None, run: list[RunCheckpoint], notes: list[str],
    say: Say,
) -> Planned:  # fmt: skip
    """A checkpoint (or every one of a run) played in the environment `--env` names, loaded
    and checked now (SPEC "Agents across turns")."""
    from collapsecheck.runs.plan import plan_played
    from collapsecheck.runs.run import single_row
    from collapsecheck.runs.units import PlayedTraces

    loaded = PlayedTraces.load(request.env, {
        "--prompts": request.prompts, "--rollouts": request.rollouts,
        "--baseline": request.baseline, "--reward-fn": request.settings.rewards.reward_fn,
        "--keep-prompts": request.outputs.keep_prompts,
    }, near=Path(request.target))  # fmt: skip
    played, settings = loaded.resolved(request.settings)
    for note in played.notes():
        say(f"note: {note}")
    outputs = request.outputs
    if not run:
        plan = plan_played(
            [single_row(single)], played, settings, cache=outputs.out,
            cached=outputs.out is not None, dump=outputs.dump, rescan=request.rescan,
        )  # fmt: skip
        return Planned(plan, None, None)
    rows, context = request_run(request, run, notes)
    plan = plan_played(rows, played, settings, cache=outputs.out, rescan=request.rescan)
    return Planned(plan, context, None)


def plan_single(request: ScanRequest, checkpoint: Checkpoint) -> ScanPlan:
    """One checkpoint; with --baseline, after the baseline's own scan (through the results
    cache), which its reasoning scored under the baseline is read against (SPEC "Scored
    under the start")."""
    from collapsecheck.inputs.baseline import require_baseline
    from collapsecheck.runs.plan import plan_sampled
    from collapsecheck.runs.run import single_row

    outputs, settings, prompts = request.outputs, request.settings, request.prompts
    prior = None
    if request.baseline is not None:
        load = settings.load
        prior = require_baseline(
            request.baseline, [checkpoint], load.base_model, load.trust_remote_code
        )
    plan = plan_sampled(
        [single_row(checkpoint)], prompts, settings, cache=outputs.out,
        cached=outputs.out is not None, dump=outputs.dump, rescan=request.rescan, prior=prior,
    )  # fmt: skip
    if prior is None:
        return plan
    start = plan_sampled([RunCheckpoint("baseline", 0, prior)], prompts, settings,
                         cache=outputs.out, rescan=request.rescan)  # fmt: skip
    return replace(plan, units=start.units + plan.units, costs=start.costs + plan.costs)


def request_run(
    request: ScanRequest, run: list[RunCheckpoint], notes: list[str]
) -> tuple[list[RunCheckpoint], RunContext]:
    """The run's rows (after the baseline) and what its report holds beside them."""
    from collapsecheck.runs.run import run_context

    return run_context(
        request.target, request.settings, run, notes, request.training_log,
        request.train_keys, request.baseline,
    )  # fmt: skip


def plan_from_rollouts(
    request: ScanRequest, found: RunRollouts, run: list[RunCheckpoint], notes: list[str],
    say: Say,
) -> Planned:  # fmt: skip
    """A run scored from its trainer's rollouts; --keep-prompts keeps from its last step."""
    from collapsecheck.runs.plan import plan_run_rollouts

    rows, context = request_run(request, run, notes)
    plan = plan_run_rollouts(
        found, rows, request.settings, cache=request.outputs.out,
        training_prompts=request.prompts, rescan=request.rescan,
    )  # fmt: skip
    if request.outputs.keep_prompts is not None:
        last = plan.units[-1].traces.path
        check_keep_rollout_prompts(
            request.outputs.keep_prompts, last, plan.parsed[last], request.prompts
        )
    say(f"traces: {found.describe()}")
    return Planned(plan, context, None)


def check_combinations(request: ScanRequest, is_run: bool) -> None:
    """Options that do not go together with what the target is, refused before any work."""
    outputs, target = request.outputs, request.target
    if outputs.dump is not None and (is_run or outputs.out is not None):
        raise CollapsecheckError(
            "--dump takes one checkpoint without --out (cached scans keep their dump under --out)"
        )
    if outputs.plot is not None and not is_run:
        raise CollapsecheckError(f"--plot draws a run: {target} is a single checkpoint")
    if not is_run and isinstance(request.training_log, Path):
        raise CollapsecheckError(
            f"--train-log goes with a run directory, not one checkpoint: {target}"
        )
    if request.ray is not None and not is_run:
        raise CollapsecheckError(f"--ray spreads a run directory: {target} is one checkpoint")


def run_rollouts_of(request: ScanRequest, is_run: bool) -> RunRollouts | None:
    """The run's own rollouts when they are to be scored, else None: the scan samples."""
    if request.rollouts is not None and request.sample:
        raise CollapsecheckError(
            "--rollouts scores the trainer's rollouts, --sample samples: choose one"
        )
    if request.rollouts is not None and not is_run:
        raise CollapsecheckError(
            f"--rollouts goes with a run directory: {request.target} is one checkpoint (score "
            "ROLLOUT_FILE --checkpoint CHECKPOINT scores one file)"
        )
    if request.sample or not is_run:
        return None
    from collapsecheck.runs.pairing import find_run_rollouts

    return find_run_rollouts(request.target, request.rollouts)


def requested_shard(request: ScanRequest, is_run: bool) -> Shard | None:
    """--shard I/N, or a Slurm array task's share, checked against the request: a shard
    splits a run and writes only the results cache (the join writes the rest)."""
    if not is_run and request.shard is None:
        return None  # a Slurm array task scanning one checkpoint scans all of it
    shard = resolve_shard(request.shard, os.environ)
    if shard is None:
        return None
    if not is_run:
        raise CollapsecheckError(
            f"--shard splits a run directory: {request.target} is one checkpoint"
        )
    if request.ray is not None:
        raise CollapsecheckError(
            "--ray and --shard (or a Slurm array task) both split the run: choose one"
        )
    outputs = request.outputs
    written = [
        f.name
        for f in fields(outputs)
        if not f.metadata["directory"] and getattr(outputs, f.name) is not None
    ]
    if written:
        raise CollapsecheckError(
            f"a shard writes only the results cache: {', '.join(map(option_name, written))} "
            "belong to the join (the same command without --shard)"
        )
    return shard


@dataclass(frozen=True)
class Outcome:
    """What a request came to: its plan, and the report (one checkpoint's, or the run's;
    None after --dry-run or a shard's share, which only fills the results cache)."""

    planned: Planned
    report: Report | RunReport | None

    @property
    def last_report(self) -> Report | None:
        """The report --per-prompt and --keep-prompts read: a run's last step's."""
        from collapsecheck.reports.run_report import RunReport

        if isinstance(self.report, RunReport):
            return self.report.steps[-1].report
        return self.report


def carry_out(
    request: ScanRequest, say: Say = lambda line: None, progress: ProgressHook = silent
) -> Outcome:
    """Plan the request, then run it where the user said; `say` gets the lines a user reads
    on stderr (the plan, a shard's share, the Ray cluster joined)."""
    planned = plan_request(request, say)
    from collapsecheck.runs.executors import connect_ray, run_here, run_on_ray
    from collapsecheck.runs.join import join, read_against_start

    shard, plan = planned.shard, planned.plan
    if shard is not None:
        plan = share_of(plan, shard)
        say(f"{shard.describe()}: {len(plan.by_checkpoint())} checkpoint(s) of this run")
        planned = replace(planned, plan=plan)
    if request.dry_run:
        return Outcome(planned, None)
    if request.ray is not None:
        say(connect_ray(request.ray))
    say(plan.line())
    if shard is not None:
        run_here(plan, request.verdicts, progress)
        done = ", ".join(u.label for u in plan.units) or "nothing"
        say(f"{shard.describe()} done: {done} in the results cache; the same command without "
            "--shard joins the run")  # fmt: skip
        return Outcome(planned, None)
    if request.ray is not None:
        hosts = run_on_ray(plan, progress)
        where = ", ".join(sorted(set(hosts))) or "no host"
        say(f"Ray: {len(hosts)} checkpoint(s) scanned on {where}; writing the run report from "
            "the results cache")  # fmt: skip
        plan = replace(plan, rescan=False)  # the tasks just ran; the join reads what they wrote
    reports = run_here(plan, request.verdicts, progress, labelled=planned.run is not None)
    if planned.run is None:
        if len(reports) > 1:  # the baseline's own scan, then the checkpoint's (its --dump)
            read_against_start(reports[1:], reports[0], save=not plan.units[-1].cached)
        return Outcome(planned, reports[-1])
    return Outcome(planned, join(plan, reports, planned.run))
