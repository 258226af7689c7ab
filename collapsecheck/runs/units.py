"""A unit of work: one checkpoint, where its traces come from, and where its dump goes (a
results-cache entry, the user's --dump, or nowhere). Every scan, of one checkpoint or of a
run, sampled afresh or read from the trainer's rollouts, is a list of these (`runs.plan`),
run by an executor (`runs.executors`) and read back by the join (`runs.join`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collapsecheck.engines.backends.base import Backend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.environments import (
    EnvironmentSource,
    Resolved,
    load_environment,
    parse_env_args,
)
from collapsecheck.inputs.prompts import file_sha256
from collapsecheck.inputs.rollouts import ParsedRollouts, RolloutOptions
from collapsecheck.inputs.sampled_temperature import SampledTemperature
from collapsecheck.measures.episodes import NOT_MEASURED as EPISODES_NOT_MEASURED
from collapsecheck.measures.episodes import read_episodes
from collapsecheck.measures.flow import NOT_MEASURED, decide_flow
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.measures.verdict import Support, decide
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.dump import REPORT_FILE
from collapsecheck.reports.report import Report
from collapsecheck.reports.run_report import Pairing
from collapsecheck.runs.cache import cache_entry, checkpoint_fingerprint, samples_entry
from collapsecheck.runs.diagnose import play, scan, score
from collapsecheck.runs.loading import PriorBaseline
from collapsecheck.runs.sampling import SampleStore
from collapsecheck.settings import EnvSettings, Settings


@dataclass(frozen=True)
class SampledTraces:
    """Traces sampled afresh from a prompt set. `images_sha256`: the digest of the images its
    prompts name (`inputs.images.images_digest`), None where they name none."""

    prompts: Path
    images_sha256: str | None = None

    def cache_key(self, settings: Settings) -> tuple[Path, dict[str, Any]]:
        """The file and the settings that key this unit's cache entry, with the images the
        file names (an image changed in place changes the numbers too)."""
        return self.prompts, self._with_images(settings.numbers())

    def samples_entry(self, root: Path, checkpoint: Checkpoint, settings: Settings) -> Path:
        """Where a checkpoint's traces of these prompts are kept under `root`: keyed by the
        settings that change the traces alone (`Settings.sampling_key`), with the images."""
        key = self._with_images(settings.sampling_key())
        return samples_entry(root, checkpoint, self.prompts, key)

    def _with_images(self, key: dict[str, Any]) -> dict[str, Any]:
        if self.images_sha256 is not None:
            key["prompt_images_sha256"] = self.images_sha256
        return key


@dataclass(frozen=True)
class RolloutTraces:
    """Traces already sampled: one rollout file (a trainer's own, or any rollout file) read
    with `options`. `training_prompts`: veRL's training prompt file its decoded inputs are
    matched to; `pairing`: the run's step these rollouts are and the checkpoint scoring them;
    `sampled`: the temperature they were sampled at, decided while planning."""

    path: Path
    options: RolloutOptions
    training_prompts: Path | None = None
    pairing: Pairing | None = None
    sampled: SampledTemperature | None = None

    def cache_key(self, settings: Settings) -> tuple[Path, dict[str, Any]]:
        """Those that change the numbers, less sampling and the sampler's version (nothing is
        sampled), with the training prompts the inputs were matched to and the temperature
        the rollouts were sampled at where it came from outside their file (--temperature, a
        saved config)."""
        unsampled = ("sampling", "samples_version")
        key = {k: v for k, v in settings.numbers().items() if k not in unsampled}
        key["traces"] = "trainer rollouts"
        if self.training_prompts is not None:
            key["training_prompts_sha256"] = file_sha256(self.training_prompts)
        if self.sampled is not None and self.sampled.keyed:
            key["sampled_temperature"] = self.sampled.value
        return self.path, key


@dataclass(frozen=True)
class PlayedTraces:
    """Traces sampled by playing the checkpoint in an environment (SPEC "Agents across
    turns"): the loaded SPEC and how it is played (`env`, resolved: its seeds and turns set by
    the flags or the environment's own config)."""

    environment: EnvironmentSource
    env: EnvSettings
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def load(
        cls, env: EnvSettings, given: Mapping[str, Any], near: Path | None = None
    ) -> PlayedTraces:
        """`--env`'s environment loaded and checked now, before any model (`near`: the
        checkpoint or run, beside which a framework's saved config is looked for); the options
        of other trace sources that were given (`given`: each flag and its value, None where
        not given) refused in one line; --prompts goes to the environment, whose adapter plays
        a dataset's rows as start states or refuses it."""
        named = [flag for flag, value in given.items() if value is not None and flag != PROMPTS]
        if named:
            raise CollapsecheckError(
                f"--env plays the checkpoint in its environment: {', '.join(named)} do not go "
                "with it (the environment gives the states and the rewards)"
            )
        environment = load_environment(
            env.env, parse_env_args(env.env_arg), near, env.env_config, given.get(PROMPTS),
            env.env_timeout,
        )  # fmt: skip
        return cls(environment, env)

    def resolved(self, settings: Settings) -> tuple[PlayedTraces, Settings]:
        """These traces and the settings as the environment plays them: the flags where given,
        else its own config's seeds, turns, start states, episodes and temperature."""
        found: Resolved = self.environment.resolved(self.env, settings.sampling)
        played = replace(self, env=found.env, sources=found.sources)
        return played, replace(settings, sampling=found.sampling)

    def notes(self) -> list[str]:
        """What the scan says before it plays: where each value its environment's config gave
        came from, and what the environment's adapter noticed."""
        said = list(self.environment.notes)
        if self.sources:
            values = "; ".join(f"{name} {value}" for name, value in self.sources.items())
            said.insert(0, f"--env {self.environment.spec} plays by {values}")
        return said

    def cache_key(self, settings: Settings) -> tuple[Path, dict[str, Any]]:
        """The environment's code (as a prompt file is keyed), with every setting that
        changes the numbers and how the episodes are played."""
        key = settings.numbers()
        key["env"] = {**self.env.numbers(), **self.environment.key()}
        return self.environment.origin, key


Traces = SampledTraces | RolloutTraces | PlayedTraces
PROMPTS = "--prompts"  # a dataset whose rows are a framework's start states (SkyRL's, TRL's)


@dataclass(frozen=True)
class WorkUnit:
    """One checkpoint (`row`: as the run table labels it) with its traces. `dump`: where its
    dump goes; `cached`: whether that is a results-cache entry (read back once it holds a
    report); `samples`: the samples entry its sampled traces are kept in and read back from
    (`runs.sampling`), None where nothing is sampled or nothing is cached; `resample`: its
    kept samples are forgotten and drawn afresh (--rescan); `prior`: the baseline its
    reasoning is also scored under (SPEC "Scored under the start"), None for none."""

    row: RunCheckpoint
    traces: Traces
    dump: Path | None = None
    cached: bool = False
    samples: Path | None = None
    resample: bool = False
    prior: Checkpoint | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        return self.row.checkpoint

    @property
    def label(self) -> str:
        return self.row.label

    def finished(self) -> bool:
        if not (self.cached and self.dump is not None and (self.dump / REPORT_FILE).is_file()):
            return False
        return not made_before_its_rules(self.dump / REPORT_FILE)


def made_before_its_rules(report: Path) -> bool:
    """A cached report whose numbers these rules would make otherwise, so it is scanned again
    rather than read: made before identical contexts counted as one prompt, from prompts that
    held copies (its N counted each copy), before traces sampled at a temperature other
    than 1 were scored at it, or from a multi-turn file before its episodes were read (SPEC
    "Agents across turns")."""
    try:
        saved = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # read as before: a broken entry says so where it is loaded
    counts, settings = saved.get("counts", {}), saved.get("settings", {})
    copies = "input_rows" not in counts and counts.get("distinct_prompts") != counts.get("prompts")
    sampled_at = (settings.get("sampling") or {}).get("temperature", 1)
    untempered = "scoring_temperature" not in settings and sampled_at not in (0, 1)
    without_episodes = "multi_turn" in settings and "episodes" not in saved
    return copies or untempered or without_episodes


def cached_unit(
    row: RunCheckpoint, traces: Traces, settings: Settings, root: Path, resample: bool = False,
    prior: Checkpoint | None = None,
) -> WorkUnit:  # fmt: skip
    """A unit whose dump is its entry in the results cache under `root` (and, for sampled
    traces, its samples entry there too), keyed by the baseline's content where it has one."""
    source, key = traces.cache_key(settings)
    if prior is not None:
        key["prior_baseline_sha256"] = checkpoint_fingerprint(prior)
    entry = cache_entry(root, row.checkpoint, source, key)
    samples = None
    if isinstance(traces, SampledTraces):
        samples = traces.samples_entry(root, row.checkpoint, settings)
    return WorkUnit(row, traces, entry, cached=True, samples=samples, resample=resample,
                    prior=prior)  # fmt: skip


def load_cached(entry: Path, checkpoint: Checkpoint, verdicts: VerdictThresholds) -> Report:
    """A finished cache entry's report, its verdicts decided again with these thresholds."""
    report = Report.load(entry / REPORT_FILE)
    report.thresholds = verdicts.thresholds
    report.verdict = decide(report.metrics, Support.of(report.counts), report.thresholds)
    report.flow_thresholds = verdicts.flow
    if report.flow.regime != NOT_MEASURED:
        report.flow = decide_flow(report.metrics, report.flow_thresholds)
    report.early_answer = report.early_answer.decided(report.metrics, verdicts.flow.early_post_hoc)
    if report.episodes.regime != EPISODES_NOT_MEASURED:
        said = report.episodes
        report.episodes = replace(read_episodes(
            said.metrics, verdicts.flow.looping_line, verdicts.flow.stalling_line,
            said.episodes, said.starts,
        ), info=said.info)  # fmt: skip
    report.settings["checkpoint"] = str(checkpoint.path)
    report.timing = {**report.timing, "cached": True}
    return report


def for_step(progress: ProgressHook, label: str) -> ProgressHook:
    """The progress hook of one unit of a run: its stages name the step ("sampling, step
    200")."""
    return lambda stage, total: progress(f"{stage}, step {label}", total)


def run_unit(
    unit: WorkUnit, settings: Settings, verdicts: VerdictThresholds, *, rescan: bool = False,
    progress: ProgressHook = silent, backend: Backend | None = None,
    parsed: Mapping[Path, ParsedRollouts] | None = None, baseline: Backend | None = None,
) -> Report:  # fmt: skip
    """The unit's report: read from its finished cache entry (unless `rescan`), else made:
    sampled and scored (`diagnose.scan`), or its rollouts scored (`diagnose.score`).
    `backend`: the checkpoint already loaded; `parsed`: rollout files already read;
    `baseline`: the unit's prior baseline already loaded."""
    if unit.finished() and not rescan:
        return load_cached(unit.dump, unit.checkpoint, verdicts)
    if unit.resample and unit.samples is not None:
        SampleStore(unit.samples).clear()
    common = {
        "thresholds": verdicts.thresholds, "flow_thresholds": verdicts.flow, "dump": unit.dump,
        "progress": progress, "loaded": backend,
    }  # fmt: skip
    if isinstance(unit.traces, PlayedTraces):
        played = unit.traces
        return play(
            unit.checkpoint, played.environment, settings, env=played.env,
            sources=dict(played.sources), **common,
        )  # fmt: skip
    if isinstance(unit.traces, SampledTraces):
        prior = PriorBaseline(unit.prior, baseline) if unit.prior is not None else None
        return scan(
            unit.checkpoint, unit.traces.prompts, settings, samples=unit.samples, prior=prior,
            **common,
        )  # fmt: skip
    traces = unit.traces
    return score(
        unit.checkpoint, traces.path, settings, rollout_options=traces.options,
        training_prompts=traces.training_prompts, parsed=(parsed or {}).get(traces.path),
        sampled=traces.sampled, **common,
    )  # fmt: skip
