"""A run diagnosed from its own rollouts: the traces the trainer sampled at each step, found
beside the run (TRL's `completions/`) or in `--rollouts DIR` (veRL's `rollout_data_dir`),
each step's scored under the checkpoint whose weights sampled it, through the results cache,
with one model load per checkpoint.

Pairing (docs/runs.md): the rollouts of step s were sampled by the policy before update s
(TRL writes them after update s from what it generated before it; veRL dumps them at the end
of step s from the batch it generated at its start), so by the checkpoint saved at step
s - 1, else the nearest earlier one (the baseline, with --baseline, is step 0). The gap is
the number of updates between that checkpoint and the sampling weights: 0 is an exact
pairing. Steps with no checkpoint at or before s - 1 are skipped, and counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.engines.reasoning import action_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.prompts import file_sha256
from collapsecheck.inputs.rollouts import ParsedRollouts, RolloutOptions, parse_rollouts
from collapsecheck.inputs.trainer_rollouts import RolloutFile, rollout_files, rollouts_beside
from collapsecheck.inputs.training_logs import TrainingLog
from collapsecheck.measures.flow import FlowThresholds
from collapsecheck.measures.verdict import Thresholds
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.dump import REPORT_FILE
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import Pairing, RunReport, RunStep
from collapsecheck.runs.cache import cache_entry, default_cache_root
from collapsecheck.runs.cost import count, plan_work
from collapsecheck.runs.diagnose import open_backend, require_decoded_inputs, score
from collapsecheck.runs.run import finish_run, for_step, load_cached, run_inputs, with_baseline
from collapsecheck.settings import Settings, resolve_settings

TRAINERS = {"trl": "TRL", "verl": "veRL"}


@dataclass(frozen=True)
class RunRollouts:
    """The rollout files of a run, and where they were found."""

    folder: Path
    files: list[RolloutFile]

    @property
    def trainers(self) -> set[str]:
        return {f.trainer for f in self.files}

    def describe(self) -> str:
        names = ", ".join(sorted(TRAINERS.get(t, t) for t in self.trainers))
        return f"the trainer's own rollouts ({names}, {self.folder}), not sampled again"


def find_run_rollouts(run_dir: Path, rollouts: Path | None) -> RunRollouts | None:
    """The rollouts of a run: those in `rollouts` (--rollouts DIR, which must hold some),
    else those its trainer keeps beside its checkpoints, else None."""
    if rollouts is None:
        folder = rollouts_beside(run_dir)
        return None if folder is None else RunRollouts(folder, rollout_files(folder))
    if not rollouts.is_dir():
        raise CollapsecheckError(f"--rollouts {rollouts}: not a folder")
    files = rollout_files(rollouts)
    if not files:
        raise CollapsecheckError(
            f"--rollouts {rollouts}: no trainer rollout files in it (TRL's "
            "completions_NNNNN.parquet, veRL's STEP.jsonl with input, output and score)"
        )
    return RunRollouts(rollouts, files)


def run_rollouts(run_dir: Path, rollouts: str | Path | RunRollouts | None) -> RunRollouts:
    """The rollouts given, or found in their folder or beside the run; an error when none."""
    if isinstance(rollouts, RunRollouts):
        return rollouts
    found = find_run_rollouts(run_dir, Path(rollouts) if rollouts is not None else None)
    if found is None:
        raise CollapsecheckError(f"{run_dir}: no rollouts beside the run (give --rollouts)")
    return found


def pair_rollouts(
    files: Sequence[RolloutFile], checkpoints: Sequence[RunCheckpoint]
) -> tuple[list[Pairing], list[RolloutFile]]:
    """Each step's rollouts with the checkpoint at step s - 1, else the nearest earlier one;
    and the steps that have none."""
    numbered = sorted((c for c in checkpoints if c.step is not None), key=lambda c: c.step)
    pairings, skipped = [], []
    for rollouts in files:
        earlier = [c for c in numbered if c.step <= rollouts.step - 1]
        if earlier:
            pairings.append(Pairing(rollouts, earlier[-1]))
        else:
            skipped.append(rollouts)
    return pairings, skipped


def skipped_note(skipped: Sequence[RolloutFile], folder: Path) -> str:
    steps = ", ".join(str(f.step) for f in skipped)
    return (
        f"skipped {len(skipped)} rollout step(s) of {folder} ({steps}): no checkpoint at or "
        "before the step before them sampled them (--baseline names the starting model, step 0)"
    )


def parse_all(
    pairings: Sequence[Pairing], options: RolloutOptions, training_prompts: Path | None
) -> dict[Path, ParsedRollouts]:
    """Every paired file read and checked before any model loads."""
    parsed = {}
    for pairing in pairings:
        path = pairing.rollouts.path
        parsed[path] = parse_rollouts(path, options)
        if training_prompts is not None:
            require_decoded_inputs(parsed[path], path, training_prompts)
    return parsed


def score_key(settings: Settings, training_prompts: Path | None) -> dict[str, Any]:
    """The cache key's settings for rollouts: those that change the numbers, less sampling
    (nothing is sampled), with the training prompts the inputs were matched to."""
    key = {k: v for k, v in settings.numbers().items() if k != "sampling"}
    key["traces"] = "trainer rollouts"
    if training_prompts is not None:
        key["training_prompts_sha256"] = file_sha256(training_prompts)
    return key


def rollout_entry(
    root: Path, pairing: Pairing, settings: Settings, training_prompts: Path | None
) -> Path:
    checkpoint = pairing.checkpoint.checkpoint
    key = score_key(settings, training_prompts)
    return cache_entry(root, checkpoint, pairing.rollouts.path, key)


@dataclass(frozen=True)
class RolloutPlan:
    """What scoring a run's rollouts costs: no sampling, X->Z and flow pairs per step."""

    steps: int
    skipped: int
    checkpoints: int
    cached: int
    responses: int
    xz_pairs: int
    flow_pairs: int

    def line(self) -> str:
        cached = f", {self.cached} cached" if self.cached else ""
        skipped = f" ({self.skipped} skipped: no checkpoint to pair with)" if self.skipped else ""
        flow = f", {count(self.flow_pairs)} flow pairs" if self.flow_pairs else ""
        return (
            f"plan: {self.steps} rollout steps of the trainer{skipped} under {self.checkpoints} "
            f"checkpoint{'s' * (self.checkpoints != 1)}{cached}, {count(self.responses)} "
            f"responses, {count(self.xz_pairs)} X->Z pairs{flow}; nothing to sample"
        )


@dataclass(frozen=True)
class RunRolloutWork:
    """A run's rollouts paired, parsed and checked: everything known before a model loads."""

    rollouts: RunRollouts
    pairings: list[Pairing]
    skipped: list[RolloutFile]
    parsed: dict[Path, ParsedRollouts]

    def plan(self, settings: Settings, cache_root: Path | None, training_prompts: Path | None,
             rescan: bool) -> RolloutPlan:  # fmt: skip
        root = cache_root if cache_root is not None else default_cache_root()
        cached = 0 if rescan else sum(
            (rollout_entry(root, p, settings, training_prompts) / REPORT_FILE).is_file()
            for p in self.pairings
        )  # fmt: skip
        flow = action_spec(settings.scoring) is not None
        plans = [
            plan_work(len(groups), max(len(g) for g in groups), 0,
                      settings.scoring.negatives_bound, flow)
            for groups in (self.parsed[p.rollouts.path].groups for p in self.pairings)
        ]  # fmt: skip
        return RolloutPlan(
            len(self.pairings), len(self.skipped),
            len({p.checkpoint.name for p in self.pairings}), cached,
            sum(len(g) for p in self.pairings for g in self.parsed[p.rollouts.path].groups),
            sum(p.xz_pairs for p in plans), sum(p.flow_pairs for p in plans),
        )  # fmt: skip


def prepare_run_rollouts(
    rollouts: RunRollouts,
    checkpoints: Sequence[RunCheckpoint],
    settings: Settings,
    training_prompts: Path | None = None,
) -> RunRolloutWork:
    """Pair each step's rollouts with its checkpoint and read every paired file; an error when
    no step pairs, or a file or --prompts does not fit."""
    pairings, skipped = pair_rollouts(rollouts.files, checkpoints)
    if not pairings:
        raise CollapsecheckError(
            skipped_note(skipped, rollouts.folder).replace("skipped", "cannot score", 1)
        )
    if training_prompts is not None and rollouts.trainers != {"verl"}:
        raise CollapsecheckError(
            f"--prompts {training_prompts}: the rollouts in {rollouts.folder} hold their "
            "prompts; --prompts with a run's rollouts names veRL's training prompt file (pass "
            "--sample to sample afresh from a prompt set)"
        )
    parsed = parse_all(pairings, RolloutOptions.of(settings), training_prompts)
    return RunRolloutWork(rollouts, pairings, skipped, parsed)


def score_run(
    run_dir: str | Path,
    rollouts: str | Path | RunRollouts | RunRolloutWork | None = None,
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
    folder, else the one the trainer keeps beside the run, or the work `prepare_run_rollouts`
    already made of them with these checkpoints, baseline and training prompts), each scored
    under the checkpoint that sampled it; `training_prompts`: veRL's training prompt file,
    which its decoded inputs are matched to. The other arguments are `scan_run`'s."""
    settings = resolve_settings(settings, flags)
    run_dir, notes = Path(run_dir), list(notes)
    checkpoints, training_log, log_reason = run_inputs(
        run_dir, settings, checkpoints, notes, training_log
    )
    prompts = Path(training_prompts) if training_prompts is not None else None
    if isinstance(rollouts, RunRolloutWork):
        work = rollouts
    else:
        rows = with_baseline(checkpoints, baseline, settings)
        work = prepare_run_rollouts(run_rollouts(run_dir, rollouts), rows, settings, prompts)
    if work.skipped:
        notes.append(skipped_note(work.skipped, work.rollouts.folder))
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    advance = progress("run", len(work.pairings))
    reports: list[Report] = []
    for checkpoint, group in itertools.groupby(work.pairings, key=lambda p: p.checkpoint):
        pairs = list(group)
        entries = [rollout_entry(root, p, settings, prompts) for p in pairs]
        fresh = [rescan or not (e / REPORT_FILE).is_file() for e in entries]
        model = checkpoint.checkpoint
        with open_backend(model, None, settings) if any(fresh) else nullcontext() as backend:
            for pairing, entry, todo in zip(pairs, entries, fresh, strict=True):
                if todo:
                    report = score(
                        model, pairing.rollouts.path, settings,
                        thresholds=thresholds, flow_thresholds=flow_thresholds, dump=entry,
                        progress=for_step(progress, str(pairing.rollouts.step)),
                        loaded=backend, training_prompts=prompts,
                        parsed=work.parsed[pairing.rollouts.path],
                    )  # fmt: skip
                else:
                    report = load_cached(entry, model, thresholds, flow_thresholds)
                reports.append(report)
                advance(1)
    steps = [
        RunStep(p.row, report, sampled_by=p)
        for p, report in zip(work.pairings, reports, strict=True)
    ]
    logged = (training_log, log_reason, train_keys or {})
    return finish_run(run_dir, steps, notes, logged, False, traces=work.rollouts.describe())
