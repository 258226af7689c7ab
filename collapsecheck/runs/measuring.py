"""From traces to numbers: the cross log-probability matrix, the metrics with their
intervals (SPEC "Metrics") and the information flow (SPEC "Information flow")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import Backend
from collapsecheck.engines.cross_scoring import CrossScores, cross_score
from collapsecheck.engines.reasoning import (
    ActionSpec,
    Trace,
    action_spec,
    located_action,
    reasoning_spec,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.episodes import Episode, EpisodeTurn
from collapsecheck.inputs.images import swap_reason
from collapsecheck.measures.by_turn import TurnDependence, turn_entry
from collapsecheck.measures.early_answer import EarlyAnswer, compute_early_answer
from collapsecheck.measures.early_answer import not_measured as early_not_measured
from collapsecheck.measures.episodes import (
    EpisodeReading,
    compute_episode_metrics,
    episode_ids,
    info_shares,
    read_episodes,
    start_numbers,
)
from collapsecheck.measures.flow import (
    FLOW_KEYS,
    FlowThresholds,
    compute_flow_metrics,
    not_measured_reason,
)
from collapsecheck.measures.image_share import image_share_metrics
from collapsecheck.measures.metrics import (
    MetricValue,
    PromptCounts,
    compute_metrics,
    count_per_prompt,
)
from collapsecheck.measures.prior import PriorLogProbs, compute_prior
from collapsecheck.measures.token_information import (
    TokenInformation,
    WhereInputShows,
    compute_where,
    row_summaries,
    token_information,
)
from collapsecheck.measures.token_information import not_measured as where_not_measured
from collapsecheck.progress import ProgressHook
from collapsecheck.runs.preparation import Prepared
from collapsecheck.runs.sampling import no_reasoning_hint
from collapsecheck.settings import (
    AnalysisSettings,
    Settings,
)


def score_traces(
    backend: Backend,
    prepared: Prepared,
    traces: Sequence[Trace],
    settings: Settings,
    progress: ProgressHook,
    temperature: float = 1.0,
) -> CrossScores:
    """SPEC "The cross log-probability matrix" of the valid traces, read at `temperature` (the
    one they were sampled at)."""
    spec = reasoning_spec(settings.scoring)
    if not any(t.valid for t in traces):
        hint = no_reasoning_hint(prepared, backend.tokenizer, settings.prompts)
        raise CollapsecheckError(
            f"no response had a reasoning segment {spec.describe()} (0 of {len(traces)}); " + hint
        )
    return cross_score(
        backend,
        traces,
        prepared.ids,
        progress,
        negatives=settings.scoring.negatives_bound,
        seed=settings.analysis.seed,
        flow=action_spec(settings.scoring) is not None,
        image_swap=swap_reason(prepared.ids) is None,
        temperature=temperature,
        early_fractions=settings.scoring.early_fractions,
        token_information=not settings.scoring.no_token_information,
    )


def measure_flow(
    scores: CrossScores, analysis: AnalysisSettings, skipped: bool
) -> tuple[dict[str, Any], str | None]:
    """SPEC "Information flow" metrics (NaN where not measured) and why they were not."""
    flow = scores.flow.logprobs if scores.flow is not None else None
    reason = "--no-flow" if skipped else not_measured_reason(flow)
    if reason is not None:
        return {key: math.nan for key in FLOW_KEYS}, reason
    return compute_flow_metrics(flow, resamples=analysis.bootstrap, seed=analysis.seed), None


def measure_early(
    scores: CrossScores, analysis: AnalysisSettings, flow_reason: str | None, post_hoc: float
) -> tuple[EarlyAnswer, dict[str, MetricValue]]:
    """SPEC "Early answering": the curve, its regime (`post_hoc`: the threshold) and its
    summaries; not measured where the flow is not, or with --no-early-answer."""
    early = scores.flow.early if scores.flow is not None else None
    if flow_reason is not None:
        return early_not_measured(flow_reason)
    if early is None:
        return early_not_measured("--no-early-answer")
    return compute_early_answer(
        early, resamples=analysis.bootstrap, seed=analysis.seed, post_hoc=post_hoc
    )


def measure_actions(
    scores: CrossScores, settings: Settings, post_hoc: float, metrics: dict[str, Any]
) -> tuple[str | None, EarlyAnswer]:
    """The flow's and early answering's metrics, added to `metrics`; why the flow was not
    measured (None where it was) and early answering's section."""
    flow_metrics, not_measured = measure_flow(scores, settings.analysis, settings.scoring.no_flow)
    metrics.update(flow_metrics)
    early, early_metrics = measure_early(scores, settings.analysis, not_measured, post_hoc)
    metrics.update(early_metrics)
    return not_measured, early


def prompt_counts(traces: Sequence[Trace], num_prompts: int) -> PromptCounts:
    """Per prompt: responses, valid and truncated traces, distinct reasoning strings."""
    return count_per_prompt(
        num_prompts,
        [t.prompt_index for t in traces],
        [t.valid for t in traces],
        [t.truncated for t in traces],
        [t.reasoning for t in traces],
    )


def measure(
    scores: CrossScores, counts: PromptCounts, analysis: AnalysisSettings, checkpoint: str,
    input_rows: int,
) -> dict[str, Any]:  # fmt: skip
    """SPEC "Metrics" with their bootstrap intervals; NaN log-probabilities refuse a verdict.
    `input_rows`: the rows the distinct prompts came from (`mi_upper_bound`)."""
    try:
        metrics = compute_metrics(
            scores.matrix, counts, resamples=analysis.bootstrap, seed=analysis.seed,
            input_rows=input_rows,
        )  # fmt: skip
        if scores.image_swapped is not None:
            swapped, resamples = scores.image_swapped, analysis.bootstrap
            image = image_share_metrics(
                scores.matrix, swapped, resamples=resamples, seed=analysis.seed
            )
            metrics.update(image)
        return metrics
    except ValueError as err:
        raise CollapsecheckError(
            f"{checkpoint}: no verdict: {err} (check the weights and --dtype)"
        ) from None


def measure_prior(
    scores: CrossScores, prior: np.ndarray, analysis: AnalysisSettings
) -> dict[str, MetricValue]:
    """SPEC "Scored under the start": `prior`, each scored row's reasoning under the
    baseline, against the policy's own (the matrix's entry under the row's own prompt)."""
    matrix = scores.matrix
    own = matrix.sum[np.arange(len(matrix.row_prompt)), matrix.row_prompt]
    logprobs = PriorLogProbs(
        prior, own, scores.reasoning_tokens, matrix.row_prompt, matrix.num_prompts
    )
    return compute_prior(logprobs, resamples=analysis.bootstrap, seed=analysis.seed)


SUMS_ONLY = "the scorer gave one sum per pair, not each token's log-probability"


def measure_where(
    scores: CrossScores, analysis: AnalysisSettings, skipped: bool
) -> tuple[WhereInputShows, dict[str, MetricValue], TokenInformation | None]:
    """SPEC "Where the input shows": the section, its summaries, and each token's
    information and own-prompt posterior; not measured with --no-token-information or where
    the scorer reads sums only."""
    if skipped or scores.tokens is None:
        return (*where_not_measured("--no-token-information" if skipped else SUMS_ONLY), None)
    matrix = scores.matrix
    tokens = token_information(scores.tokens)
    rows = row_summaries(tokens, matrix.row_prompt, matrix.num_prompts)
    section, metrics = compute_where(rows, resamples=analysis.bootstrap, seed=analysis.seed)
    return section, metrics, tokens


def measure_by_turn(
    backend: Backend, prepared: Prepared, traces: Sequence[Trace], turns: Sequence[Sequence[int]],
    settings: Settings, progress: ProgressHook, temperature: float,
) -> list[TurnDependence]:  # fmt: skip
    """SPEC "Agents across turns", input dependence by turn: for each turn index, the pairs
    the scan scored at that turn cross-scored among the distinct contexts they came from
    (negatives as the pooled matrix draws them), read with the metrics of SPEC "Metrics"."""
    turn_of = [turns[t.prompt_index][t.sample_index] for t in traces]
    entries = []
    for number in sorted(set(turn_of)):
        chosen = [t for t, n in zip(traces, turn_of, strict=True) if n == number]
        contexts = sorted({t.prompt_index for t in chosen})
        scored = sorted({t.prompt_index for t in chosen if t.valid})
        if len(scored) < 2:
            entries.append(turn_entry(number, len(contexts), len(chosen), None))
            continue
        column = {p: i for i, p in enumerate(scored)}
        kept = [dataclasses.replace(t, prompt_index=column[t.prompt_index])
                for t in chosen if t.prompt_index in column]  # fmt: skip
        scores = cross_score(
            backend, kept, [prepared.ids[p] for p in scored], for_turn(progress, number),
            negatives=settings.scoring.negatives_bound, seed=settings.analysis.seed,
            temperature=temperature,
        )  # fmt: skip
        analysis = settings.analysis
        metrics = compute_metrics(
            scores.matrix, prompt_counts(kept, len(scored)), resamples=analysis.bootstrap,
            seed=analysis.seed,
        )  # fmt: skip
        entries.append(turn_entry(number, len(contexts), len(chosen), metrics))
    return entries


def for_turn(progress: ProgressHook, number: int) -> ProgressHook:
    return lambda stage, total: progress(f"{stage}, turn {number}", total)


def with_actions(episodes: Sequence[Episode], settings: Settings) -> list[Episode]:
    """A file's episodes with each turn's action located in its response as the flow locates
    it and their start states numbered (played episodes have both already)."""
    spec = reasoning_spec(settings.scoring)
    acting = action_spec(settings.scoring) or ActionSpec()

    def located(turn: EpisodeTurn) -> EpisodeTurn:
        if turn.action is not None:
            return turn
        action = located_action(turn.response, spec, acting, False)
        return dataclasses.replace(turn, action=action)

    starts = start_numbers([episode.turns[0].state for episode in episodes])
    return [
        dataclasses.replace(
            episode, turns=tuple(located(t) for t in episode.turns),
            start=start if episode.start is None else episode.start,
        )
        for episode, start in zip(episodes, starts, strict=True)
    ]  # fmt: skip


def measure_episodes(
    episodes: Sequence[Episode], settings: Settings, lines: FlowThresholds
) -> EpisodeReading:
    """SPEC "Agents across turns": the episodes' metrics (each turn's action located:
    `with_actions`) with their intervals over start states, and their reading."""
    ids, starts = episode_ids(episodes)
    analysis = settings.analysis
    metrics = compute_episode_metrics(ids, starts, resamples=analysis.bootstrap, seed=analysis.seed)
    reading = read_episodes(metrics, lines.looping_line, lines.stalling_line, len(ids), starts)
    flags = {
        key: [bool(t.info[key]) for e in episodes for t in e.turns if key in t.info]
        for key in ("action_is_valid", "action_is_effective")
    }
    return dataclasses.replace(reading, info=info_shares(flags))
