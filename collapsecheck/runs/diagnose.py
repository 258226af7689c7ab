"""The pipeline, as the Python API: prompts and checkpoint in, sampling, reasoning extraction,
cross-scoring, metrics, verdict, report out. `scan` samples its traces; `score` reads traces
that were already sampled (rollouts, or a scan's dump). Both share every stage after the
traces exist, so they report exactly alike.

    scan:  read prompts -> load backend -> prepare (render, fit, distinct) -> sample ─┐
    score: load backend -> read rollouts -> prepare ───────────────────────────────────┤
           extract traces -> cross-score -> measure (metrics, verdict) -> report <─────┘
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from collapsecheck.engines.backends.base import Backend, SamplingParams
from collapsecheck.engines.cross_scoring import CrossScores, score_own_prompts
from collapsecheck.engines.reasoning import (
    Decode,
    Trace,
    action_spec,
    extract_traces,
    reasoning_spec,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import locked, published, staged
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.environments import DrivenSource, EnvironmentSource
from collapsecheck.inputs.episodes import Episode
from collapsecheck.inputs.prompts import (
    file_sha256,
    render_prompts,
)
from collapsecheck.inputs.rollouts import (
    ParsedRollouts,
    RolloutOptions,
    match_decoded_inputs,
    parse_rollouts,
    read_rollouts,
)
from collapsecheck.inputs.sampled_temperature import SampledTemperature, sampled_temperature
from collapsecheck.inputs.samples import Sample, SampledPrompts
from collapsecheck.measures.by_turn import TurnDependence
from collapsecheck.measures.episodes import NO_EPISODES, EpisodeReading
from collapsecheck.measures.flow import (
    FlowThresholds,
    decide_flow,
)
from collapsecheck.measures.prior import (
    AWAITING_START,
    NO_PRIOR,
    NOT_MEASURED,
    TYPICALITY,
    PriorReading,
)
from collapsecheck.measures.token_information import TokenInformation, WhereInputShows
from collapsecheck.measures.verdict import Support, Thresholds, decide
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.dump import (
    REPORT_FILE,
    write_episodes,
    write_matrix,
    write_per_prompt,
    write_prior,
    write_samples,
    write_token_information,
)
from collapsecheck.reports.report import Report
from collapsecheck.runs.action_reasoning import reasoning_before_action
from collapsecheck.runs.driven import play_driven
from collapsecheck.runs.episodes import Played
from collapsecheck.runs.episodes import play as play_episodes
from collapsecheck.runs.explanation import Rewards, explain, no_rewards, reward_function
from collapsecheck.runs.loading import (
    PriorBaseline,
    checkpoint_name,
    checkpoint_notes,
    open_backend,
    resolve,
    vision_of,
)
from collapsecheck.runs.measuring import (
    measure,
    measure_actions,
    measure_by_turn,
    measure_episodes,
    measure_prior,
    measure_where,
    prompt_counts,
    score_traces,
    with_actions,
)
from collapsecheck.runs.preparation import (
    Prepared,
    prepare,
    prepare_sampled,
    read_prompt_set,
    require_two_prompts,
)
from collapsecheck.runs.report_contents import (
    elapsed,
    evidence,
    example_traces,
    prompt_rows,
    report_settings,
    scored_pieces,
    scoring_timing,
    trace_counts,
    utc_now,
)
from collapsecheck.runs.sampling import (
    sample,
    sampling_warnings,
    scoring_temperature,
    temperature_warnings,
)
from collapsecheck.setting_checks import checked
from collapsecheck.settings import (
    EnvSettings,
    Settings,
    resolve_settings,
)

__all__ = ["play", "scan", "score"]


@dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` needs besides the traces: how to read them and what to record."""

    settings: Settings
    thresholds: Thresholds
    flow_thresholds: FlowThresholds
    recorded: dict[str, Any]  # the report's settings known before scoring (source, sampling)
    timing: dict[str, Any]
    dump_dir: Path | None
    progress: ProgressHook
    warnings: tuple[str, ...] = ()
    # the rewards of the traces under their prompts, one per response (None: no rewards), and
    # where they came from
    rewards: Rewards = no_rewards
    reward_source: str | None = None
    # the temperature the traces were sampled at, which scoring reads the policy at (SPEC
    # "Sampling"); 1 where it is not known (a trainer's rollouts); None: the caller's
    # log-likelihood function applies its own (diagnose_batch)
    temperature: float | None = 1.0
    # the baseline the reasoning is also scored under (SPEC "Scored under the start")
    prior: PriorBaseline | None = None
    # SPEC "Agents across turns": per merged prompt and sample, the turn it answered (None:
    # single-turn prompts), and the episodes behind them (played, or a multi-turn file's)
    turns: list[list[int]] | None = None
    episodes: list[Episode] | None = None


def rollouts_for(
    model: Backend, rollouts: str | Path, options: RolloutOptions, settings: Settings,
    parsed: ParsedRollouts | None, training_prompts: str | Path | None,
) -> SampledPrompts:  # fmt: skip
    """The rollouts read with the model's tokenizer (and its images), their decoded inputs
    matched to the training file's rows where one is named."""
    if parsed is not None and training_prompts is not None:
        parsed = match_decoded_inputs(
            parsed, Path(training_prompts), model.tokenizer, settings.prompts, vision_of(model)
        )
    return read_rollouts(
        rollouts, model.tokenizer, options, settings.prompts, parsed, vision_of(model),
        getattr(model, "stop_ids", ()),
    )  # fmt: skip


def diagnose(
    backend: Backend, prepared: Prepared, samples: Sequence[Sequence[Sample]], diagnosis: Diagnosis
) -> Report:
    """From samples to the report: reasoning extraction, cross-scoring, metrics, verdict,
    and (with a dump directory) the SPEC dump, each file as soon as it is known."""
    settings, dump_dir = diagnosis.settings, diagnosis.dump_dir
    spec, action = reasoning_spec(settings.scoring), action_spec(settings.scoring)
    traces = extract_traces(samples, backend.decode, spec, prepared.opened, action)
    rewards = diagnosis.rewards(prepared.prompts, traces)  # before scoring: it may fail
    diagnosis = with_episodes_read(diagnosis)
    if dump_dir is not None:
        write_samples(dump_dir, prepared.rendered, traces)
        write_episodes(dump_dir, diagnosis.episodes or [])
    started = time.perf_counter()
    scores = score_traces(
        backend, prepared, traces, settings, diagnosis.progress, diagnosis.temperature or 1.0
    )
    scoring_s = round(time.perf_counter() - started, 3)
    if dump_dir is not None:
        write_matrix(dump_dir, scores)
    counts = prompt_counts(traces, len(prepared.rendered))
    checkpoint = diagnosis.recorded["checkpoint"]
    metrics = measure(scores, counts, settings.analysis, checkpoint, prepared.input_rows)
    not_measured, early = measure_actions(
        scores, settings, diagnosis.flow_thresholds.early_post_hoc, metrics
    )
    by_turn, episodes = measure_across_turns(backend, prepared, traces, diagnosis, metrics)
    where, tokens = measure_tokens(diagnosis, scores, traces, backend.decode, metrics)
    prior, prior_timing = measure_under_baseline(diagnosis, prepared, traces, scores, metrics)
    measured_flow = scores.flow.logprobs if scores.flow and not_measured is None else None
    why = explain(
        scores, traces, prepared, counts, measured_flow, rewards, settings, diagnosis.reward_source
    )
    counted = trace_counts(prepared, traces, scores)
    report = Report(
        metrics=metrics,
        verdict=decide(metrics, Support.of(counted), diagnosis.thresholds),
        flow=decide_flow(metrics, diagnosis.flow_thresholds, not_measured),
        early_answer=early,
        prior=prior,
        token_information=where,
        episodes=episodes,
        by_turn=by_turn,
        thresholds=diagnosis.thresholds,
        flow_thresholds=diagnosis.flow_thresholds,
        settings=report_settings(settings, diagnosis.recorded, prepared, scores, backend)
        | {"scoring_temperature": diagnosis.temperature},
        counts=counted,
        examples=example_traces(traces, prepared),
        timing={**diagnosis.timing, **scoring_timing(scores, scoring_s), **prior_timing},
        warnings=list(diagnosis.warnings),
        snr=why.snr,
        snr_reason=why.snr_reason,
        per_prompt=why.per_prompt,
        prompts=list(prepared.prompts),
        episode_records=list(diagnosis.episodes or []),
    )
    return kept(report, dump_dir, lambda: evidence(
        scores, traces, prepared, measured_flow, tokens, backend.decode
    ))  # fmt: skip


def kept(report: Report, dump_dir: Path | None, made: Callable[[], Any]) -> Report:
    """The report with what lies behind its numbers: its dump (the per-prompt table and
    report.json written last) or, without one, the evidence `made` in memory."""
    if dump_dir is not None:
        write_per_prompt(dump_dir, report.per_prompt)
        report.save(dump_dir / REPORT_FILE)
        report.dump_dir = published(dump_dir)
    else:
        report.evidence = made()
    return report


def with_episodes_read(diagnosis: Diagnosis) -> Diagnosis:
    """The diagnosis with its episodes' actions located and start states numbered (a
    file's; played ones have both), before the dump keeps them."""
    if not diagnosis.episodes:
        return diagnosis
    return replace(diagnosis, episodes=with_actions(diagnosis.episodes, diagnosis.settings))


def measure_across_turns(
    backend: Backend, prepared: Prepared, traces: Sequence[Trace], diagnosis: Diagnosis,
    metrics: dict[str, Any],
) -> tuple[list[TurnDependence], EpisodeReading]:  # fmt: skip
    """SPEC "Agents across turns": input dependence by turn (multi-turn pairs), and the
    episodes' metrics (added to `metrics`) with their reading."""
    by_turn = []
    if diagnosis.turns is not None:
        by_turn = measure_by_turn(
            backend, prepared, traces, diagnosis.turns, diagnosis.settings, diagnosis.progress,
            diagnosis.temperature or 1.0,
        )  # fmt: skip
    if not diagnosis.episodes:
        return by_turn, NO_EPISODES
    reading = measure_episodes(diagnosis.episodes, diagnosis.settings, diagnosis.flow_thresholds)
    metrics.update(reading.metrics)
    return by_turn, reading


def measure_tokens(
    diagnosis: Diagnosis, scores: CrossScores, traces: Sequence[Trace], decode: Decode,
    metrics: dict[str, Any],
) -> tuple[WhereInputShows, TokenInformation | None]:  # fmt: skip
    """SPEC "Where the input shows": the section, its summaries added to `metrics`, and each
    token's values (written to the dump with each token's text, where there is one)."""
    skipped = diagnosis.settings.scoring.no_token_information
    where, where_metrics, tokens = measure_where(scores, diagnosis.settings.analysis, skipped)
    metrics.update(where_metrics)
    if tokens is not None and diagnosis.dump_dir is not None:
        text = scored_pieces(scores, traces, decode)
        write_token_information(diagnosis.dump_dir, tokens, text)
    return where, tokens


def measure_under_baseline(
    diagnosis: Diagnosis, prepared: Prepared, traces: Sequence[Trace], scores: CrossScores,
    metrics: dict[str, Any],
) -> tuple[PriorReading, dict[str, float]]:  # fmt: skip
    """SPEC "Scored under the start": each scored row's reasoning under the baseline (loaded
    here unless the caller holds it), at the scoring temperature, its metrics added to
    `metrics`; the reading and the seconds it took (`prior_s`, its load included).
    `prior_typicality` and the reading wait for the baseline's own scan
    (`runs.join.read_against_start`)."""
    baseline = diagnosis.prior
    if baseline is None:
        return PriorReading(**NO_PRIOR), {}
    started = time.perf_counter()
    with open_backend(baseline.checkpoint, baseline.loaded, diagnosis.settings) as model:
        read_images_of(prepared, model, baseline.checkpoint)
        values = score_own_prompts(
            model, traces, prepared.ids, diagnosis.progress, diagnosis.temperature or 1.0
        )
    if diagnosis.dump_dir is not None:
        write_prior(diagnosis.dump_dir, values, scores)
    metrics.update(measure_prior(scores, values, diagnosis.settings.analysis))
    metrics[TYPICALITY] = math.nan
    name = str(baseline.checkpoint.path)
    return PriorReading(NOT_MEASURED, AWAITING_START, name), {"prior_s": elapsed(started)}


def read_images_of(prepared: Prepared, baseline: Backend, checkpoint: Checkpoint) -> None:
    """A baseline scoring prompts with images reads them at the slots the policy's rendering
    gave them (the same images, through its own image processor); a text-only one cannot."""
    if not any(prompt.images for prompt in prepared.rendered):
        return
    vision = vision_of(baseline)
    if vision is None:
        raise CollapsecheckError(
            f"--baseline {checkpoint.path}: a text-only model cannot read the prompts' images"
        )
    vision.read_rendered(prepared.rendered, f"--baseline {checkpoint.path}")


@contextmanager
def holding(directory: str | Path | None) -> Iterator[Path | None]:
    """A directory (None without one), locked for this scan while it writes there: the
    samples entry, which keeps every prompt's traces as soon as they are drawn."""
    if directory is None:
        yield None
        return
    with locked(Path(directory)):
        yield Path(directory)


@contextmanager
def staged_dump(dump: str | Path | None) -> Iterator[Path | None]:
    """Where this scan writes its dump (None without one): a staging folder whose files
    replace the dump's once the scan has finished (`files.staged`); a scan that stops leaves
    the dump as it was (SPEC "Dump format")."""
    if dump is None:
        yield None
        return
    with staged(Path(dump)) as staging:
        yield staging


# -- the two entry points ----------------------------------------------------------------


def scan(
    checkpoint: str | Path | Checkpoint,
    prompts: str | Path,
    settings: Settings | None = None,
    *,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    dump: str | Path | None = None,
    samples: str | Path | None = None,
    progress: ProgressHook = silent,
    loaded: Backend | None = None,
    prior: PriorBaseline | None = None,
    **flags: Any,
) -> Report:
    """Diagnose one checkpoint on one prompt set (SPEC.md defines every number). How: the
    `settings`, or their flags by name (`k=8`, `device="cpu"`; an unknown name is an error).
    `loaded`: an already loaded backend (inside a training loop, say) instead of loading one.
    `samples`: a samples entry of the results cache (`runs.sampling`): the samples it keeps
    for these prompts are read back, not drawn again, and those drawn now are added to it.
    `prior`: the baseline the reasoning is also scored under (SPEC "Scored under the
    start"; its tokenizer checked as `inputs.baseline.require_baseline` does)."""
    settings = checked(resolve_settings(settings, flags))
    started, started_at = time.perf_counter(), utc_now()
    prompt_path = Path(prompts)
    prompt_list = read_prompt_set(prompt_path, settings)
    rewards, reward_source = reward_function(settings)
    name, checkpoint = checkpoint_name(checkpoint), resolve(checkpoint, loaded, settings)
    params = SamplingParams.of(settings.sampling, settings.analysis.seed)
    require_tempered_scorer(settings, scoring_temperature(params.temperature))
    with open_backend(checkpoint, loaded, settings) as model:
        rendered = render_prompts(prompt_list, model.tokenizer, settings.prompts, vision_of(model))
        reserve = [params.max_new_tokens] * len(rendered)
        prepared = prepare(prompt_list, rendered, reserve, model, settings, str(prompt_path))
        loaded = time.perf_counter()
        with staged_dump(dump) as dump_dir:
            with holding(samples) as samples_dir:  # held while sampling, not while scoring
                drawn, reused = sample(model, prepared, params, settings, progress, samples_dir)
            recorded = {
                "checkpoint": name,
                **checkpoint_notes(checkpoint, model),
                "prompts": str(prompt_path),
                "prompts_sha256": file_sha256(prompt_path),
                "samples_per_prompt": params.k,
                "sampling": params.to_dict(),
                "sampled_temperature": params.temperature,
            }
            timing = {
                "started_at": started_at,
                "load_s": round(loaded - started, 3),
                "sampling_s": elapsed(loaded),
                "sampled_tokens": sum(len(s.ids) for group in drawn for s in group),
                **({"samples_reused": reused} if reused else {}),
            }
            diagnosis = Diagnosis(
                settings, thresholds or Thresholds(), flow_thresholds or FlowThresholds(),
                recorded, timing, dump_dir, progress, sampling_warnings(params), rewards,
                reward_source, scoring_temperature(params.temperature), prior,
            )  # fmt: skip
            return diagnose(model, prepared, drawn, diagnosis)


def score(
    checkpoint: str | Path | Checkpoint,
    rollouts: str | Path,
    settings: Settings | None = None,
    *,
    rollout_options: RolloutOptions | None = None,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    dump: str | Path | None = None,
    progress: ProgressHook = silent,
    loaded: Backend | None = None,
    training_prompts: str | Path | None = None,
    parsed: ParsedRollouts | None = None,
    sampled: SampledTemperature | None = None,
    **flags: Any,
) -> Report:
    """Diagnose traces already sampled (rollouts, or a scan's dump) under the checkpoint that
    produced them: cross-scoring only. Reports as `scan` does; `loaded`: as for `scan`.
    `training_prompts`: the trainer's prompt file, whose rows veRL's decoded inputs are matched
    to, so that they are scored in the context the trainer rendered. `parsed`: the rollout
    file as the caller already read it (`rollouts.parse_rollouts`), not read again; `sampled`:
    the temperature they were sampled at as the caller already decided it (else decided here,
    `inputs.sampled_temperature`: the rows, --temperature, the trainer's saved config, 1)."""
    settings = checked(resolve_settings(settings, flags))
    started, started_at = time.perf_counter(), utc_now()
    options = rollout_options or RolloutOptions.of(settings)
    # a bad row is refused before any model loads
    parsed = parsed or parse_rollouts(rollouts, options)
    if training_prompts is not None:
        require_decoded_inputs(parsed, rollouts, Path(training_prompts))
    name, checkpoint = checkpoint_name(checkpoint), resolve(checkpoint, loaded, settings)
    sampled = sampled or sampled_temperature(
        Path(rollouts), parsed, settings.sampling.temperature, checkpoint_path(checkpoint)
    )
    require_tempered_scorer(settings, scoring_temperature(sampled.value))
    with open_backend(checkpoint, loaded, settings) as model:
        loaded = time.perf_counter()
        data = rollouts_for(model, rollouts, options, settings, parsed, training_prompts)
        require_two_prompts(len(data.prompts), rollouts, data.settings.get("prompt_matching"))
        rows = prompt_rows(data, rollouts, training_prompts)  # each row's, before merging
        prepared, data = prepare_sampled(data, model, settings, data.settings["rollouts"])
        with staged_dump(dump) as dump_dir:
            diagnosis = Diagnosis(
                settings,
                thresholds or Thresholds(),
                flow_thresholds or FlowThresholds(),
                recorded=rollouts_record(name, checkpoint, data, rows, sampled),
                timing={"started_at": started_at, "load_s": round(loaded - started, 3)},
                dump_dir=dump_dir,
                progress=progress,
                rewards=lambda prompts, traces: data.rewards,
                reward_source=(
                    f"rollouts, {data.settings['rewards']}" if data.rewards is not None else None
                ),
                turns=data.turns,
                episodes=data.episodes,
                **rollouts_temperature(sampled),
            )
            return diagnose(model, prepared, data.samples, diagnosis)


def play(
    checkpoint: str | Path | Checkpoint,
    environment: EnvironmentSource | DrivenSource,
    settings: Settings | None = None,
    *,
    env: EnvSettings | None = None,
    sources: dict[str, str] | None = None,
    thresholds: Thresholds | None = None,
    flow_thresholds: FlowThresholds | None = None,
    dump: str | Path | None = None,
    progress: ProgressHook = silent,
    loaded: Backend | None = None,
    **flags: Any,
) -> Report:
    """Play the checkpoint in `environment` (`inputs.environments.load_environment`), -n
    start states and -k episodes from each (`env`: seeds, turns, context window), then
    diagnose every turn's response as a multi-turn rollout (SPEC "Agents across turns"):
    pooled as `score` reads a multi-turn file, by turn, and the episodes' own metrics.
    `sources`: the settings are resolved already (`runs.units.PlayedTraces.resolved`), these
    the values the environment's config gave; else they are resolved here."""
    settings = checked(resolve_settings(settings, flags))
    env = env or EnvSettings(env=environment.spec)
    if sources is None:
        env, settings, sources = resolved_play(environment, env, settings)
    started, started_at = time.perf_counter(), utc_now()
    name, checkpoint = checkpoint_name(checkpoint), resolve(checkpoint, loaded, settings)
    params = SamplingParams.of(settings.sampling, settings.analysis.seed)
    require_tempered_scorer(settings, scoring_temperature(params.temperature))
    source = f"--env {environment.spec}"
    with open_backend(checkpoint, loaded, settings) as model:
        loaded_at = time.perf_counter()
        played = played_in(model, environment, env, params, settings, progress, name)
        params = dataclasses.replace(params, temperature=played.temperature or params.temperature)
        settings, heard = read_as_played(settings, environment.spec, played)
        digest = environment.code_sha256
        notes = (*environment.notes, *heard)
        data = played.sampled({"env": played_settings(env, digest, sources, notes)})
        prepared, data = prepare_sampled(data, model, settings, source)
        with staged_dump(dump) as dump_dir:
            recorded = {
                "checkpoint": name, **checkpoint_notes(checkpoint), "prompts": source,
                "prompts_sha256": digest, "samples_per_prompt": max(len(s) for s in data.samples),
                "sampling": params.to_dict(), "sampled_temperature": params.temperature,
                **data.settings,
            }  # fmt: skip
            timing = {"started_at": started_at, "load_s": round(loaded_at - started, 3),
                      "sampling_s": elapsed(loaded_at),
                      "sampled_tokens": sum(len(s.ids) for s in played.samples)}  # fmt: skip
            diagnosis = Diagnosis(
                settings, thresholds or Thresholds(), flow_thresholds or FlowThresholds(),
                recorded, timing, dump_dir, progress,
                (*sampling_warnings(params), *heard), lambda prompts, traces: data.rewards,
                ENVIRONMENT_REWARDS if data.rewards is not None else HARNESS_KEEPS_REWARDS,
                scoring_temperature(params.temperature), turns=data.turns,
                episodes=data.episodes,
            )  # fmt: skip
            return diagnose(model, prepared, data.samples, diagnosis)


def read_as_played(
    settings: Settings, spec: str, played: Played
) -> tuple[Settings, tuple[str, ...]]:
    """The settings the played replies are read with (their reasoning before a parsed action,
    where they have no reasoning tags), and what playing and reading them noticed."""
    settings, said = reasoning_before_action(settings, spec, played.episodes)
    return settings, (*played.notes, *([said] if said else []))


def played_in(
    model: Backend, environment: EnvironmentSource | DrivenSource, env: EnvSettings,
    params: SamplingParams, settings: Settings, progress: ProgressHook, name: str,
) -> Played:  # fmt: skip
    """The episodes: played turn by turn, or by a harness driving the model itself."""
    if hasattr(environment, "drive"):
        return play_driven(model, environment, env, settings, name)
    return play_episodes(model, environment, env, params, settings, progress)


ENVIRONMENT_REWARDS = "the environment, each turn the total of its episode"
HARNESS_KEEPS_REWARDS = (
    "no rewards: the harness keeps its rewards (a command: harness sends collapsecheck only its "
    "requests)"
)


def played_settings(
    env: EnvSettings, digest: str, sources: dict[str, str], notes: Sequence[str] = ()
) -> dict[str, Any]:
    """The report's `settings.env`: how the environment was played, its code's digest, where
    each value its own config gave came from, and what its adapter noticed loading it (that
    its episodes are not reproducible by seed, say)."""
    return {
        **env.numbers(), "env_sha256": digest, **({"env_sources": sources} if sources else {}),
        **({"env_notes": list(notes)} if notes else {}),
    }  # fmt: skip


def resolved_play(
    environment: EnvironmentSource, env: EnvSettings, settings: Settings
) -> tuple[EnvSettings, Settings, dict[str, str]]:
    """The flags where given, else the environment's own config's values, with their
    sources (`runs.units.PlayedTraces.resolved`, for a caller of the Python API)."""
    found = environment.resolved(env, settings.sampling)
    return found.env, dataclasses.replace(settings, sampling=found.sampling), found.sources


def rollouts_record(
    name: str, checkpoint: str | Path | Checkpoint, data: SampledPrompts,
    rows: dict[str, Any], sampled: SampledTemperature,
) -> dict[str, Any]:  # fmt: skip
    """The report's settings of scored rollouts known before scoring: the checkpoint, the
    rollout file, what reading it decided and the temperature they were sampled at."""
    return {
        "checkpoint": name,
        **checkpoint_notes(checkpoint),
        "prompts": data.settings["rollouts"],
        "prompts_sha256": data.settings["rollouts_sha256"],
        "samples_per_prompt": max(len(s) for s in data.samples),
        "prompt_rows": rows,
        **data.settings,
        **sampled.recorded(),
    }


def rollouts_temperature(sampled: SampledTemperature) -> dict[str, Any]:
    """The temperature rollouts are scored at, and what the user is told of it."""
    return {
        "temperature": scoring_temperature(sampled.value),
        "warnings": (
            *sampled.warnings,
            *temperature_warnings(sampled.value, "the rollouts were sampled"),
        ),
    }


def checkpoint_path(checkpoint: str | Path | Checkpoint) -> Path | None:
    """The folder of the checkpoint scoring rollouts (a trainer's saved config may lie above
    it), where it is one (not a model the caller loaded)."""
    if isinstance(checkpoint, Checkpoint):
        return checkpoint.path
    return Path(checkpoint) if isinstance(checkpoint, str | Path) else None


def require_tempered_scorer(settings: Settings, temperature: float) -> None:
    """vLLM's prompt log-probabilities are the raw model's: refused at another temperature,
    before any model loads."""
    if settings.load.scorer == "vllm":
        from collapsecheck.engines.backends.base import require_untempered
        from collapsecheck.engines.backends.vllm import UNTEMPERED

        require_untempered(temperature, *UNTEMPERED)


def require_decoded_inputs(
    parsed: ParsedRollouts | None, rollouts: str | Path, prompts: Path
) -> None:
    """--prompts with `score` matches veRL's decoded inputs; other rollouts hold their
    prompts themselves."""
    trainer = (parsed.settings.get("trainer_rollouts") or {}).get("trainer") if parsed else None
    if trainer != "verl":
        raise CollapsecheckError(
            f"--prompts {prompts}: score matches it to a veRL rollout dump's decoded inputs; "
            f"{rollouts} holds its prompts itself"
        )
    if not prompts.is_file():
        raise CollapsecheckError(f"prompt file not found: {prompts}")
