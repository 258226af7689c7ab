"""One plan for every scan: the work a scan request asks for, as a list of units (one
checkpoint with its traces and its dump, `runs.units`), known before any weights load. Every
executor (`runs.executors`: this process, a shard or Slurm array task, Ray tasks) takes a
plan, and the join (`runs.join`) reads its units back; `--dry-run` prints its line.

Three kinds of plan: checkpoints sampled afresh from a prompt set (`plan_sampled`), a run's
own rollouts each scored under the checkpoint that sampled them (`plan_run_rollouts`), and
one rollout file under one checkpoint (`plan_rollout_file`, the `score` command)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from collapsecheck.engines.reasoning import action_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import writable
from collapsecheck.formatting import plural, prompts_phrase
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.images import images_digest
from collapsecheck.inputs.prompts import content_key, load_prompts
from collapsecheck.inputs.rollouts import (
    ParsedRollouts,
    RolloutOptions,
    context_key,
    parse_rollouts,
)
from collapsecheck.inputs.sampled_temperature import run_temperature_notes, sampled_temperature
from collapsecheck.runs.cache import default_cache_root
from collapsecheck.runs.cost import Cost, count, unit_cost
from collapsecheck.runs.diagnose import require_decoded_inputs
from collapsecheck.runs.pairing import RunRollouts, pair_rollouts, skipped_note
from collapsecheck.runs.units import (
    PlayedTraces,
    RolloutTraces,
    SampledTraces,
    WorkUnit,
    cached_unit,
)
from collapsecheck.settings import DEFAULT_STARTS, Settings


@dataclass(frozen=True)
class ScanPlan:
    """The units of a scan, in run order, with what each costs. `rescan`: finished cache
    entries are redone; `traces`: where the traces come from when they were not sampled
    (the run report says it); `notes`: what was left out, and why; `parsed`: the rollout
    files, read and checked while planning, so no executor in this process reads them again."""

    units: tuple[WorkUnit, ...]
    costs: tuple[Cost | None, ...]  # None: not known before the model loads (a dump)
    settings: Settings
    rescan: bool = False
    traces: str | None = None
    notes: tuple[str, ...] = ()
    skipped: int = 0  # rollout steps with no checkpoint to pair with
    parsed: Mapping[Path, ParsedRollouts] = field(default_factory=dict, compare=False)

    @property
    def prior(self) -> Checkpoint | None:
        """The baseline the units' reasoning is also scored under (SPEC "Scored under the
        start"), None for none."""
        return next((u.prior for u in self.units if u.prior is not None), None)

    @property
    def sampled(self) -> bool:
        return all(isinstance(u.traces, SampledTraces) for u in self.units)

    @property
    def played(self) -> PlayedTraces | None:
        """How the units' episodes are played, where they are (`scan --env`)."""
        traces = self.units[0].traces if self.units else None
        return traces if isinstance(traces, PlayedTraces) else None

    def todo(self) -> list[WorkUnit]:
        """The units still to run: every one with --rescan, else those not in the cache."""
        return [u for u in self.units if self.rescan or not u.finished()]

    def by_checkpoint(self) -> list[list[WorkUnit]]:
        """The units in runs of the same checkpoint (one model load each)."""
        return [list(g) for _, g in itertools.groupby(self.units, key=lambda u: u.row.name)]

    def only(self, units: Sequence[WorkUnit]) -> ScanPlan:
        """The plan of some of its units (a shard's share)."""
        wanted = set(units)
        kept = [i for i, u in enumerate(self.units) if u in wanted]
        return replace(
            self, units=tuple(self.units[i] for i in kept), costs=tuple(self.costs[i] for i in kept)
        )

    def line(self) -> str:
        """The plan in one line: what is scanned, how much of it is cached, the pairs scored
        and a bound on the tokens."""
        cached = len(self.units) - len(self.todo())
        checkpoints = len({u.row.name for u in self.units})
        if self.played is not None:
            return played_line(self.costs, checkpoints, cached, self.played, self.settings)
        if self.sampled:
            return sampled_line(self.costs, checkpoints, cached)
        return rollouts_line(self.costs, checkpoints, cached, self.skipped)


# The flow is scored only for responses whose action segment is found (SPEC "Information
# flow"): before sampling, its pairs are a bound.
FLOW_IF = " (if the responses hold an action segment)"


def sampled_line(costs: Sequence[Cost | None], checkpoints: int, cached: int) -> str:
    """Every sampled unit has the same prompts and settings: its cost once, per checkpoint."""
    if not costs:
        return "plan: no checkpoints in this share"
    cost = costs[0]
    assert cost is not None  # a sampled unit's cost is known from its prompt file
    negatives = "all prompts" if cost.negatives is None else f"{cost.negatives} negatives"
    flow = f", up to {count(cost.flow_pairs)} flow pairs" if cost.flow_pairs else ""
    return (
        f"plan: {plural(checkpoints, 'checkpoint')}{f' ({cached} cached)' if cached else ''}, "
        f"{prompts_phrase(cost.prompts, cost.rows)} x {cost.samples} samples, "
        f"{count(cost.xz_pairs)} X->Z pairs "
        f"({negatives}){flow} per checkpoint{FLOW_IF if cost.flow_pairs else ''}; at most "
        f"{count(cost.max_tokens * (len(costs) - cached))} tokens to sample and score"
    )


def played_line(
    costs: Sequence[Cost | None], checkpoints: int, cached: int, played: PlayedTraces,
    settings: Settings,
) -> str:  # fmt: skip
    """Episodes end when they end: the turns are a bound."""
    if not costs:
        return "plan: no checkpoints in this share"
    cost, env = costs[0], played.env
    cached_said = f" ({cached} cached)" if cached else ""
    if cost is None:
        return (
            f"plan: {plural(checkpoints, 'checkpoint')}{cached_said} played by the harness of "
            f"--env {played.environment.spec}: its episodes, turns and tokens are the harness's "
            "to decide (not known before it runs)"
        )
    starts = settings.sampling.num_prompts or DEFAULT_STARTS
    return (
        f"plan: {plural(checkpoints, 'checkpoint')}{cached_said} "
        f"played in --env {played.environment.spec}: {plural(starts, 'start state')} x "
        f"{settings.sampling.samples} episodes, up to {plural(env.max_turns or 1, 'turn')} each, "
        "at most "
        f"{count(cost.responses)} responses and {count(cost.xz_pairs)} X->Z pairs pooled per "
        f"checkpoint; at most {count(cost.max_tokens * (len(costs) - cached))} tokens to sample "
        "and score"
    )


def rollouts_line(costs: Sequence[Cost | None], checkpoints: int, cached: int, skipped: int) -> str:
    """Rollout files differ in size: their costs summed."""
    left_out = f" ({skipped} skipped: no checkpoint to pair with)" if skipped else ""
    known = [c for c in costs if c is not None]
    flow = sum(c.flow_pairs for c in known)
    return (
        f"plan: {len(costs)} rollout steps of the trainer{left_out} under "
        f"{plural(checkpoints, 'checkpoint')}{f', {cached} cached' if cached else ''}, "
        f"{count(sum(c.responses for c in known))} responses, "
        f"{count(sum(c.xz_pairs for c in known))} X->Z pairs"
        f"{f', up to {count(flow)} flow pairs{FLOW_IF}' if flow else ''}; nothing to sample"
    )


def has_flow(settings: Settings) -> bool:
    return action_spec(settings.scoring) is not None


def cache_root(root: Path | None) -> Path:
    return root if root is not None else default_cache_root()


def plan_sampled(
    rows: Sequence[RunCheckpoint], prompts: Path, settings: Settings, *,
    cache: Path | None = None, cached: bool = True, dump: Path | None = None,
    rescan: bool = False, prior: Checkpoint | None = None,
) -> ScanPlan:  # fmt: skip
    """Checkpoints sampled afresh from `prompts`, through the results cache (`cache`, else
    the default one) when `cached`; else one checkpoint writing its dump to `dump`, its
    traces still kept in the cache's samples. `prior`: the baseline each row's reasoning is
    also scored under, the baseline's own row excepted. Reads the prompt file and the cache;
    no weights load."""
    listed = load_prompts(
        prompts, num_prompts=settings.sampling.num_prompts, field=settings.prompts.prompt_field
    )
    sampling = settings.sampling
    cost = unit_cost(
        len({content_key(p) for p in listed}), sampling.samples, sampling.max_new_tokens,
        settings.scoring.negatives_bound, has_flow(settings), rows=len(listed),
    )  # fmt: skip
    traces = SampledTraces(prompts, images_digest(listed))
    priors = [None if prior is None or row.checkpoint == prior else prior for row in rows]
    if cached:
        units = [
            cached_unit(row, traces, settings, cache_root(cache), rescan, row_prior)
            for row, row_prior in zip(rows, priors, strict=True)
        ]
    else:
        units = [
            WorkUnit(row, traces, dump, samples=kept_samples(row, traces, settings, cache),
                     resample=rescan, prior=row_prior)
            for row, row_prior in zip(rows, priors, strict=True)
        ]  # fmt: skip
    return ScanPlan(tuple(units), (cost,) * len(units), settings, rescan)


def plan_played(
    rows: Sequence[RunCheckpoint], played: PlayedTraces, settings: Settings, *,
    cache: Path | None = None, cached: bool = True, dump: Path | None = None,
    rescan: bool = False,
) -> ScanPlan:  # fmt: skip
    """Checkpoints played in an environment (SPEC "Agents across turns"), through the results
    cache when `cached`, else one checkpoint writing its dump to `dump`. Its cost is a bound:
    every episode to --max-turns, every context distinct; unknown (None) where a harness
    decides its episodes (`command:`, SPEC "Agents behind an OpenAI client")."""
    starts = settings.sampling.num_prompts or DEFAULT_STARTS
    k, turns = settings.sampling.samples, played.env.max_turns
    cost = None if turns is None else unit_cost(
        starts * k * turns, 1, settings.sampling.max_new_tokens,
        settings.scoring.negatives_bound, has_flow(settings),
    )  # fmt: skip
    if cached:
        units = [cached_unit(row, played, settings, cache_root(cache), rescan) for row in rows]
    else:
        units = [WorkUnit(row, played, dump) for row in rows]
    traces = f"played by collapsecheck in --env {played.environment.spec}"
    return ScanPlan(tuple(units), (cost,) * len(units), settings, rescan, traces)


def kept_samples(
    row: RunCheckpoint, traces: SampledTraces, settings: Settings, cache: Path | None
) -> Path | None:
    """Where a scan whose results are not cached keeps its traces all the same (SPEC
    "Sampling": sampled once): its samples entry under the cache root, or none where that
    cannot be written."""
    root = cache_root(cache)
    if not writable(root):
        return None
    return traces.samples_entry(root, row.checkpoint, settings)


def rollout_cost(parsed: ParsedRollouts, settings: Settings) -> Cost:
    """The groups' cost with identical contexts counted once, as the scan will count them."""
    contexts: dict[str, int] = {}
    for group in parsed.groups:
        key = context_key(group[0])
        contexts[key] = contexts.get(key, 0) + len(group)
    return unit_cost(
        len(contexts), max(contexts.values()), 0, settings.scoring.negatives_bound,
        has_flow(settings), responses=sum(contexts.values()),
    )  # fmt: skip


def read_rollouts_checked(
    path: Path, options: RolloutOptions, training_prompts: Path | None
) -> ParsedRollouts | None:
    """A rollout file read and checked before any model loads (None: a dump directory)."""
    parsed = parse_rollouts(path, options)
    if training_prompts is not None:
        require_decoded_inputs(parsed, path, training_prompts)
    return parsed


def plan_run_rollouts(
    rollouts: RunRollouts, rows: Sequence[RunCheckpoint], settings: Settings, *,
    cache: Path | None = None, training_prompts: Path | None = None, rescan: bool = False,
) -> ScanPlan:  # fmt: skip
    """A run's own rollouts, each step's under the checkpoint that sampled it
    (`pairing.pair_rollouts`), through the results cache; every paired file read and
    checked now. An error when no step pairs, or --prompts does not fit these rollouts."""
    pairings, skipped = pair_rollouts(rollouts.files, rows)
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
    options = RolloutOptions.of(settings)
    parsed = {
        p.rollouts.path: read_rollouts_checked(p.rollouts.path, options, training_prompts)
        for p in pairings
    }
    root = cache_root(cache)
    given = settings.sampling.temperature
    sampled = [
        sampled_temperature(p.rollouts.path, parsed[p.rollouts.path], given, p.row.checkpoint.path)
        for p in pairings
    ]
    units = [
        cached_unit(p.row, RolloutTraces(p.rollouts.path, options, training_prompts, p, at),
                    settings, root)
        for p, at in zip(pairings, sampled, strict=True)
    ]  # fmt: skip
    costs = [rollout_cost(parsed[p.rollouts.path], settings) for p in pairings]
    notes = (skipped_note(skipped, rollouts.folder),) if skipped else ()
    notes += tuple(run_temperature_notes(sampled))
    return ScanPlan(
        tuple(units), tuple(costs), settings, rescan, rollouts.describe(), notes, len(skipped),
        parsed,
    )  # fmt: skip


def plan_rollout_file(
    row: RunCheckpoint, path: Path, options: RolloutOptions, settings: Settings, *,
    training_prompts: Path | None = None, dump: Path | None = None,
    parsed: ParsedRollouts | None = None,
) -> ScanPlan:  # fmt: skip
    """One rollout file (or a scan's dump directory) scored under one checkpoint, its dump
    to `dump`; the file read and checked now, unless the caller already did (`parsed`)."""
    if parsed is None:
        parsed = read_rollouts_checked(path, options, training_prompts)
    sampled = sampled_temperature(path, parsed, settings.sampling.temperature, row.checkpoint.path)
    unit = WorkUnit(row, RolloutTraces(path, options, training_prompts, sampled=sampled), dump)
    costs = (rollout_cost(parsed, settings) if parsed is not None else None,)
    return ScanPlan((unit,), costs, settings, parsed={} if parsed is None else {path: parsed})
