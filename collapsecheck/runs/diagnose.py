"""The pipeline, as the Python API: prompts and checkpoint in, sampling, reasoning extraction,
cross-scoring, metrics, verdict, report out. `scan` samples its traces; `score` reads traces
that were already sampled (rollouts, or a scan's dump). Both share every stage after the
traces exist, so they report exactly alike.

    scan:  read prompts -> load backend -> prepare (render, fit, distinct) -> sample ─┐
    score: load backend -> read rollouts -> prepare ───────────────────────────────────┤
           extract traces -> cross-score -> measure (metrics, verdict) -> report <─────┘
"""

from __future__ import annotations

import math
import platform
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import Backend, SamplingParams
from collapsecheck.engines.backends.registry import load_backend
from collapsecheck.engines.cross_scoring import CrossScores, FlowScores, column_groups, cross_score
from collapsecheck.engines.reasoning import (
    ReasoningSpec,
    Trace,
    action_spec,
    closes_reasoning,
    extract_traces,
    opens_reasoning,
    reasoning_spec,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.files import locked
from collapsecheck.inputs.checkpoint import Checkpoint, require_checkpoint
from collapsecheck.inputs.images import image_runs, swap_reason
from collapsecheck.inputs.prompts import (
    Prompt,
    RenderedPrompt,
    file_sha256,
    load_prompts,
    render_prompts,
)
from collapsecheck.inputs.rewards import load_reward_fn, score_responses
from collapsecheck.inputs.rollouts import (
    ParsedRollouts,
    RolloutOptions,
    match_decoded_inputs,
    parse_rollouts,
    read_rollouts,
)
from collapsecheck.inputs.samples import Sample, SampledPrompts
from collapsecheck.measures.flow import (
    FLOW_KEYS,
    FlowLogProbs,
    FlowThresholds,
    compute_flow_metrics,
    decide_flow,
    not_measured_reason,
)
from collapsecheck.measures.image_share import image_share_metrics
from collapsecheck.measures.metrics import (
    PromptCounts,
    compute_metrics,
    count_per_prompt,
    row_statistics,
)
from collapsecheck.measures.per_prompt import per_prompt_rows
from collapsecheck.measures.snr import PromptRewards, RowStatistics, snr_section
from collapsecheck.measures.verdict import Thresholds, decide
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.dump import (
    REPORT_FILE,
    write_matrix,
    write_per_prompt,
    write_samples,
)
from collapsecheck.reports.evidence import Evidence
from collapsecheck.reports.report import Report
from collapsecheck.runs.sampling import SampleStore, reasoning_check, sample_prompts
from collapsecheck.setting_checks import checked
from collapsecheck.settings import (
    AnalysisSettings,
    PromptSettings,
    Settings,
    resolve_settings,
    swap_count,
)

__all__ = ["scan", "score"]


def versions() -> dict[str, str]:
    import numpy
    import torch
    import transformers

    from collapsecheck.version import __version__

    return {
        "collapsecheck": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def checkpoint_name(checkpoint: str | Path | Checkpoint) -> str:
    return str(checkpoint.path if isinstance(checkpoint, Checkpoint) else checkpoint)


def resolve(
    checkpoint: str | Path | Checkpoint, loaded: Backend | None, settings: Settings
) -> str | Path | Checkpoint:
    """The recognised checkpoint (an error saying what the folder holds when there is none),
    unless the caller brought a loaded backend."""
    if loaded is not None or isinstance(checkpoint, Checkpoint):
        return checkpoint
    return require_checkpoint(checkpoint, settings.load.base_model)


def checkpoint_notes(checkpoint: str | Path | Checkpoint) -> dict[str, str]:
    """The report's word on what was read, where it is not simply the folder named."""
    note = checkpoint.note if isinstance(checkpoint, Checkpoint) else None
    return {"checkpoint_note": note} if note else {}


@contextmanager
def open_backend(
    checkpoint: str | Path | Checkpoint, given: Backend | None, settings: Settings
) -> Iterator[Backend]:
    """The caller's backend, or one loaded for this scan from the checkpoint `resolve`
    recognised, and closed after it (a vLLM engine stops its workers and returns their
    memory)."""
    if given is not None:
        yield given
        return
    backend = load_backend(checkpoint, settings.load)
    try:
        yield backend
    finally:
        backend.close()


# -- preparation: prompts rendered, fitted to the context, distinct ----------------------


@dataclass(frozen=True)
class Prepared:
    """The prompts of a scan as the model sees them."""

    prompts: list[Prompt]
    rendered: list[RenderedPrompt]
    groups: np.ndarray  # per prompt, the first prompt with identical ids (SPEC: one column)
    truncated: int  # prompts cut to fit the context (--truncate-prompts)
    opened: list[bool]  # per prompt, its rendering opened the reasoning (R1 distills, QwQ)

    @property
    def ids(self) -> list[tuple[int, ...]]:
        return [r.ids for r in self.rendered]


def fit_context(
    rendered: Sequence[RenderedPrompt],
    prompts: Sequence[Prompt],
    reserve: Sequence[int],
    backend: Backend,
    truncate: bool,
) -> tuple[list[RenderedPrompt], int]:
    """Prompts that leave `reserve[i]` tokens of the model's context free for the response.

    A prompt too long is an error naming it, unless `truncate`: then it keeps its last tokens
    (the start, where a system prompt sits, is cut), and the number cut is reported."""
    limit = backend.max_length
    if limit is None:
        return list(rendered), 0
    fitted, cut = [], 0
    for prompt, render, room in zip(prompts, rendered, (limit - r for r in reserve), strict=True):
        if len(render.ids) <= room:
            fitted.append(render)
            continue
        if not truncate or room < 1:
            raise CollapsecheckError(
                f"{prompt.origin}: the prompt has {len(render.ids)} tokens and the response needs "
                f"{limit - room} of the model's {limit}-token context: shorten the prompt, lower "
                "--max-new-tokens, or pass --truncate-prompts (keeps its last tokens, reported)"
            )
        ids = render.ids[-room:]
        if ids[0] < 0 and render.ids[-room - 1] == ids[0]:
            raise CollapsecheckError(
                f"{prompt.origin}: --truncate-prompts would cut through one of the prompt's "
                "images: shorten the prompt or lower --max-new-tokens"
            )
        kept = tuple(pair for pair in render.images if pair[0] in ids)
        fitted.append(RenderedPrompt(backend.decode(ids), ids, kept))
        cut += 1
    return fitted, cut


def reasoning_opened(
    prompts: Sequence[Prompt],
    rendered: Sequence[RenderedPrompt],
    spec: ReasoningSpec,
    tokenizer: Any,
) -> list[bool]:
    """Per prompt, whether its rendering opened the reasoning (SPEC "The reasoning segment");
    a rendering that already closed it is an error, never a silent zero."""
    for prompt, render in zip(prompts, rendered, strict=True):
        if closes_reasoning(render.text, spec):
            template = getattr(tokenizer, "name_or_path", "") or "the checkpoint"
            raise CollapsecheckError(
                f"{prompt.origin}: the chat template of {template} ends the prompt with "
                f"{spec.close_tag!r} (thinking switched off), so the response holds no reasoning "
                "to score; switch thinking on (Qwen3: --chat-template-kwargs "
                "'{\"enable_thinking\": true}') or score the whole response (--whole-response)"
            )
    return [opens_reasoning(render.text, spec) for render in rendered]


def prepare(
    prompts: Sequence[Prompt],
    rendered: Sequence[RenderedPrompt],
    reserve: Sequence[int],
    backend: Backend,
    settings: Settings,
    source: str,
) -> Prepared:
    """Fit the rendered prompts to the context, check that at least two differ and see where
    the reasoning opens: before any sampling or scoring."""
    truncate = settings.prompts.truncate_prompts
    fitted, cut = fit_context(rendered, prompts, reserve, backend, truncate)
    groups = column_groups([r.ids for r in fitted])
    if len(set(groups.tolist())) < 2:
        raise CollapsecheckError(f"{source}: all prompts render to the same tokens")
    opened = reasoning_opened(prompts, fitted, reasoning_spec(settings.scoring), backend.tokenizer)
    return Prepared(list(prompts), fitted, groups, cut, opened)


def reward_function(
    prompts: Sequence[Prompt], settings: Settings
) -> tuple[Callable[[Sequence[Trace]], list[list[float]] | None], str | None]:
    """The rewards of a scan's traces by --reward-fn (loaded now, before any model), or none."""
    spec = settings.rewards.reward_fn
    if spec is None:
        return (lambda traces: None), None
    function = load_reward_fn(spec)

    def rewards(traces: Sequence[Trace]) -> list[list[float]]:
        responses: list[list[str]] = [[] for _ in prompts]
        for trace in traces:
            responses[trace.prompt_index].append(trace.response)
        return score_responses(function, prompts, responses)

    return rewards, f"--reward-fn {spec}"


def sampling_warnings(params: SamplingParams) -> tuple[str, ...]:
    """Sampling other than the policy's own distribution skews what the scorer reads."""
    if params.temperature == 1 and params.top_p == 1:
        return ()
    return (
        f"sampled at temperature {params.temperature:g} and top-p {params.top_p:g}, not the "
        "policy's own distribution (temperature 1, top-p 1), while the scorer reads the policy "
        "at temperature 1: entropy and MI describe these skewed traces, not the policy",
    )


def read_prompt_set(path: Path, settings: Settings) -> list[Prompt]:
    """The prompts of a scan (the first --num-prompts), at least two."""
    prompts = load_prompts(
        path, num_prompts=settings.sampling.num_prompts, field=settings.prompts.prompt_field
    )
    require_two_prompts(len(prompts), path)
    return prompts


def require_two_prompts(count: int, source: str | Path, note: str | None = None) -> None:
    """At least two prompts to cross-score; `note`: what the reading of them said, if any."""
    if count < 2:
        raise CollapsecheckError(
            f"{source}: cross-scoring needs at least 2 prompts, found {count}"
            + (f" ({note})" if note else "")
        )


# -- sampling ----------------------------------------------------------------------------


def sample(
    backend: Backend,
    prepared: Prepared,
    params: SamplingParams,
    settings: Settings,
    progress: ProgressHook,
    samples: Path | None,
) -> tuple[list[list[Sample]], int]:
    """K samples per prompt (`runs.sampling`): those a samples entry keeps read back, the
    rest sampled, the first checked for a reasoning segment before the others are drawn.
    Returns them and how many prompts' samples were read back."""
    check = reasoning_check(
        backend.decode, reasoning_spec(settings.scoring), prepared.opened,
        no_reasoning_hint(prepared, backend.tokenizer, settings.prompts),
    )  # fmt: skip
    store = SampleStore(samples) if samples is not None else None
    return sample_prompts(backend, prepared.rendered, params, progress, store, check)


# -- from traces to the report -----------------------------------------------------------


def no_reasoning_hint(prepared: Prepared, tokenizer: Any, rendering: PromptSettings) -> str:
    """What to try when no response has a reasoning segment: the prompt rendering first, when
    plain-text prompts went to a chat model verbatim, else another segment."""
    plain = not any(p.is_chat for p in prepared.prompts)
    if plain and not rendering.as_chat and getattr(tokenizer, "chat_template", None):
        return (
            "the prompts are plain text given to the model verbatim, but the checkpoint has a "
            "chat template: pass --as-chat (and --system-prompt TEXT if the policy was trained "
            "with one) so they are rendered as in training"
        )
    return (
        "pick another segment with --reasoning-tags OPEN,CLOSE, --reasoning-regex or "
        "--whole-response"
    )


def score_traces(
    backend: Backend,
    prepared: Prepared,
    traces: Sequence[Trace],
    settings: Settings,
    progress: ProgressHook,
) -> CrossScores:
    """SPEC "The cross log-probability matrix" of the valid traces."""
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
    scores: CrossScores, counts: PromptCounts, analysis: AnalysisSettings, checkpoint: str
) -> dict[str, Any]:
    """SPEC "Metrics" with their bootstrap intervals; NaN log-probabilities refuse a verdict."""
    try:
        metrics = compute_metrics(
            scores.matrix, counts, resamples=analysis.bootstrap, seed=analysis.seed
        )
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


def prompt_summary(prompt: Prompt) -> str:
    """The user's own words of a prompt: the string, or the last chat message's content (an
    image as [image FILE])."""
    if isinstance(prompt.content, str):
        return prompt.content
    content = prompt.content[-1]["content"]
    if isinstance(content, str):
        return content
    return " ".join(
        f"[image {Path(p['image'].source).name}]" if p["type"] == "image" else p["text"]
        for p in content
    )


def example_traces(
    traces: Sequence[Trace], prepared: Prepared, count: int = 2
) -> list[dict[str, Any]]:
    """The first valid trace of `count` different prompts, to show a template by eye."""
    seen: set[int] = set()
    examples = []
    for trace in traces:
        group = int(prepared.groups[trace.prompt_index])
        if trace.valid and group not in seen:
            seen.add(group)
            prompt = prepared.prompts[trace.prompt_index]
            examples.append(
                {
                    "prompt_index": trace.prompt_index,
                    "prompt": prompt_summary(prompt),
                    "reasoning": trace.reasoning,
                }
            )
        if len(examples) == count:
            break
    return examples


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
    # the rewards of the traces, one per response (None: no rewards), and where they came from
    rewards: Callable[[Sequence[Trace]], list[list[float]] | None] = lambda traces: None
    reward_source: str | None = None


def flow_estimator(flow: FlowScores | None, bound: int | None) -> str | None:
    """How the flow's swap matrices were filled (SPEC "Sampled negatives and swaps")."""
    if flow is None:
        return None
    if np.isfinite(flow.logprobs.reasoning).all():
        return "full matrices"
    return f"sampled swaps: own prompt's traces + {swap_count(bound)} others per action"


def report_settings(
    diagnosis: Diagnosis, prepared: Prepared, scores: CrossScores, backend: Backend
) -> dict[str, Any]:
    """The report's `settings`: how the numbers were made (SPEC "Dump format")."""
    prompts, scoring = diagnosis.settings.prompts, diagnosis.settings.scoring
    bound = scoring.negatives_bound
    estimator = (
        "full matrix"
        if scores.matrix.is_full
        else f"sampled negatives: own prompt + {bound} others per trace"
    )
    return {
        **diagnosis.recorded,
        "as_chat": prompts.as_chat,
        "system_prompt": prompts.system_prompt,
        "truncate_prompts": prompts.truncate_prompts,
        "truncated_prompts": prepared.truncated,
        "chat_template_kwargs": prompts.chat_template_kwargs,
        "num_prompts": len(prepared.rendered),
        "reasoning": reasoning_spec(scoring).to_dict(),
        "action": action.to_dict() if (action := action_spec(scoring)) else None,
        "cross_scoring": {
            "negatives": scoring.negatives,
            "estimator": estimator,
            "flow_estimator": flow_estimator(scores.flow, bound),
        },
        "bootstrap_resamples": diagnosis.settings.analysis.bootstrap,
        **image_settings(prepared),
        **backend.describe(),
        "versions": versions(),
    }


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
        rollouts, model.tokenizer, options, settings.prompts, parsed, vision_of(model)
    )


def vision_of(backend: Backend) -> Any:
    """A vision-language backend's `Vision` (images in prompts), None for a text one."""
    return getattr(backend, "vision", None)


def image_settings(prepared: Prepared) -> dict[str, Any]:
    """For prompts with images: how many, and whether the image's share was measured (SPEC
    "What the image carries") or why not."""
    with_images = sum(bool(image_runs(ids)) for ids in prepared.ids)
    if not with_images:
        return {}
    reason = swap_reason(prepared.ids)
    return {"images": {"prompts_with_images": with_images, "image_share": reason or "measured"}}


def diagnose(
    backend: Backend, prepared: Prepared, samples: Sequence[Sequence[Sample]], diagnosis: Diagnosis
) -> Report:
    """From samples to the report: reasoning extraction, cross-scoring, metrics, verdict,
    and (with a dump directory) the SPEC dump, each file as soon as it is known."""
    settings, dump_dir = diagnosis.settings, diagnosis.dump_dir
    spec, action = reasoning_spec(settings.scoring), action_spec(settings.scoring)
    traces = extract_traces(samples, backend.decode, spec, prepared.opened, action)
    rewards = diagnosis.rewards(traces)  # before scoring: a failing reward loses no work
    if dump_dir is not None:
        write_samples(dump_dir, prepared.rendered, traces)
    started = time.perf_counter()
    scores = score_traces(backend, prepared, traces, settings, diagnosis.progress)
    scoring_s = round(time.perf_counter() - started, 3)
    if dump_dir is not None:
        write_matrix(dump_dir, scores)
    counts = prompt_counts(traces, len(prepared.rendered))
    metrics = measure(scores, counts, settings.analysis, diagnosis.recorded["checkpoint"])
    flow_metrics, not_measured = measure_flow(scores, settings.analysis, settings.scoring.no_flow)
    metrics.update(flow_metrics)
    measured_flow = scores.flow.logprobs if scores.flow and not_measured is None else None
    why = explain(scores, traces, prepared, counts, measured_flow, rewards, diagnosis)
    report = Report(
        metrics=metrics,
        verdict=decide(metrics, diagnosis.thresholds),
        flow=decide_flow(metrics, diagnosis.flow_thresholds, not_measured),
        thresholds=diagnosis.thresholds,
        flow_thresholds=diagnosis.flow_thresholds,
        settings=report_settings(diagnosis, prepared, scores, backend),
        counts=trace_counts(prepared, traces, scores),
        examples=example_traces(traces, prepared),
        timing={**diagnosis.timing, **scoring_timing(scores, scoring_s)},
        warnings=list(diagnosis.warnings),
        snr=why.snr,
        snr_reason=why.snr_reason,
        per_prompt=why.per_prompt,
        prompts=list(prepared.prompts),
    )
    if dump_dir is not None:
        write_per_prompt(dump_dir, why.per_prompt)
        report.save(dump_dir / REPORT_FILE)
        report.dump_dir = dump_dir
    else:
        report.evidence = evidence(scores, traces, prepared, measured_flow)
    return report


def evidence(
    scores: CrossScores, traces: Sequence[Trace], prepared: Prepared, flow: FlowLogProbs | None
) -> Evidence:
    """What the report's page draws, kept in memory where no dump holds it."""
    reasoning = [traces[int(i)].reasoning for i in scores.row_trace_index]
    rendered = prepared.rendered
    images = [tuple(image for _, image in p.images) for p in rendered]
    return Evidence(scores.matrix, reasoning, [p.text for p in rendered], flow, images)


NO_REWARDS = (
    "no rewards: pass --reward-fn FILE.py[:NAME] (scan) or rollouts with a reward or score "
    "field (score, --reward-field)"
)


@dataclass(frozen=True)
class Why:
    """SPEC's SNR section (None without rewards, with the reason) and the per-prompt table."""

    snr: dict[str, Any] | None
    snr_reason: str | None
    per_prompt: list[dict[str, Any]]


def explain(
    scores: CrossScores,
    traces: Sequence[Trace],
    prepared: Prepared,
    counts: PromptCounts,
    measured: FlowLogProbs | None,
    rewards: list[list[float]] | None,
    diagnosis: Diagnosis,
) -> Why:
    """Why it collapsed, from the rewards (SPEC "Why: reward variance"), and which prompts;
    `measured`: the flow's matrices where it was measured."""
    n = len(prepared.rendered)
    rows = row_stats(scores)
    per_reward = PromptRewards.of(rewards) if rewards is not None else None
    table = per_prompt_rows(
        [prompt_summary(p) for p in prepared.prompts], counts.responses, counts.valid,
        counts.distinct_reasoning, rows, measured, per_reward,
    )  # fmt: skip
    if per_reward is None:
        return Why(None, NO_REWARDS, table)
    analysis = diagnosis.settings.analysis
    snr = snr_section(
        per_reward, rows, distinct_behaviour(traces, n),
        top_p=diagnosis.settings.rewards.snr_top_p, resamples=analysis.bootstrap,
        seed=analysis.seed,
    )  # fmt: skip
    snr["rewards"] = diagnosis.reward_source
    return Why(snr, None, table)


def row_stats(scores: CrossScores) -> RowStatistics:
    rows = row_statistics(scores.matrix)
    return RowStatistics(
        scores.matrix.row_prompt, rows["matched_seq"] - rows["marginal_seq"], rows["hit@1"]
    )


def distinct_behaviour(traces: Sequence[Trace], n: int) -> np.ndarray:
    """Per prompt: distinct actions (or, with no action segment, distinct responses) over its
    responses."""
    acting = any(t.flow_valid for t in traces)
    seen: list[set[str]] = [set() for _ in range(n)]
    for trace in traces:
        if trace.flow_valid or not acting:
            seen[trace.prompt_index].add(trace.action if acting else trace.response)
    responses = np.bincount([t.prompt_index for t in traces], minlength=n)
    return np.array([len(s) for s in seen]) / np.maximum(responses, 1)


def trace_counts(
    prepared: Prepared, traces: Sequence[Trace], scores: CrossScores
) -> dict[str, int | float]:
    return {
        "prompts": len(prepared.rendered),
        "distinct_prompts": len(set(prepared.groups.tolist())),
        "responses": len(traces),
        "scored_traces": len(scores.row_trace_index),
        "flow_valid_traces": len(scores.flow.row_trace_index) if scores.flow else 0,
        "truncated_responses": sum(t.truncated for t in traces),
        "prompts_opening_reasoning": sum(prepared.opened),
        "reasoning_tokens_mean": float(scores.reasoning_tokens.mean()),
    }


@contextmanager
def holding(dump: str | Path | None) -> Iterator[Path | None]:
    """The dump directory (None without one), locked for this scan while it writes there."""
    if dump is None:
        yield None
        return
    with locked(Path(dump)):
        yield Path(dump)


def scoring_timing(scores: CrossScores, scoring_s: float) -> dict[str, Any]:
    """How long scoring took, how many tokens it read (so the next scan can be predicted
    from the plan's pairs), and the host it ran on (a run joined from shards names them)."""
    return {
        "scoring_s": scoring_s,
        "tokens_scored": scores.tokens_scored,
        "tokens_scored_per_s": round(scores.tokens_scored / max(scoring_s, 1e-9), 1),
        "host": socket.gethostname(),
    }


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _elapsed(since: float) -> float:
    return round(time.perf_counter() - since, 3)


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
    **flags: Any,
) -> Report:
    """Diagnose one checkpoint on one prompt set (SPEC.md defines every number). How: the
    `settings`, or their flags by name (`k=8`, `device="cpu"`; an unknown name is an error).
    `loaded`: an already loaded backend (inside a training loop, say) instead of loading one.
    `samples`: a samples entry of the results cache (`runs.sampling`): the samples it keeps
    for these prompts are read back, not drawn again, and those drawn now are added to it."""
    settings = checked(resolve_settings(settings, flags))
    started, started_at = time.perf_counter(), utc_now()
    prompt_path = Path(prompts)
    prompt_list = read_prompt_set(prompt_path, settings)
    rewards, reward_source = reward_function(prompt_list, settings)
    name, checkpoint = checkpoint_name(checkpoint), resolve(checkpoint, loaded, settings)
    params = SamplingParams.of(settings.sampling, settings.analysis.seed)
    with open_backend(checkpoint, loaded, settings) as model:
        rendered = render_prompts(prompt_list, model.tokenizer, settings.prompts, vision_of(model))
        reserve = [params.max_new_tokens] * len(rendered)
        prepared = prepare(prompt_list, rendered, reserve, model, settings, str(prompt_path))
        loaded = time.perf_counter()
        with holding(dump) as dump_dir:
            with holding(samples) as samples_dir:  # held while sampling, not while scoring
                drawn, reused = sample(model, prepared, params, settings, progress, samples_dir)
            recorded = {
                "checkpoint": name,
                **checkpoint_notes(checkpoint),
                "prompts": str(prompt_path),
                "prompts_sha256": file_sha256(prompt_path),
                "samples_per_prompt": params.k,
                "sampling": params.to_dict(),
            }
            timing = {
                "started_at": started_at,
                "load_s": round(loaded - started, 3),
                "sampling_s": _elapsed(loaded),
                "sampled_tokens": sum(len(s.ids) for group in drawn for s in group),
                **({"samples_reused": reused} if reused else {}),
            }
            diagnosis = Diagnosis(
                settings, thresholds or Thresholds(), flow_thresholds or FlowThresholds(),
                recorded, timing, dump_dir, progress, sampling_warnings(params), rewards,
                reward_source,
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
    **flags: Any,
) -> Report:
    """Diagnose traces already sampled (rollouts, or a scan's dump) under the checkpoint that
    produced them: cross-scoring only. Reports as `scan` does; `loaded`: as for `scan`.
    `training_prompts`: the trainer's prompt file, whose rows veRL's decoded inputs are matched
    to, so that they are scored in the context the trainer rendered. `parsed`: the rollout
    file as the caller already read it (`rollouts.parse_rollouts`), not read again."""
    settings = checked(resolve_settings(settings, flags))
    started, started_at = time.perf_counter(), utc_now()
    options = rollout_options or RolloutOptions.of(settings)
    # a bad row is refused before any model loads
    parsed = parsed or parse_rollouts(rollouts, options)
    if training_prompts is not None:
        require_decoded_inputs(parsed, rollouts, Path(training_prompts))
    name, checkpoint = checkpoint_name(checkpoint), resolve(checkpoint, loaded, settings)
    with open_backend(checkpoint, loaded, settings) as model:
        loaded = time.perf_counter()
        data = rollouts_for(model, rollouts, options, settings, parsed, training_prompts)
        require_two_prompts(len(data.prompts), rollouts, data.settings.get("prompt_matching"))
        prepared = prepare_rollouts(data, model, settings)
        with holding(dump) as dump_dir:
            diagnosis = Diagnosis(
                settings,
                thresholds or Thresholds(),
                flow_thresholds or FlowThresholds(),
                recorded={
                    "checkpoint": name,
                    **checkpoint_notes(checkpoint),
                    "prompts": data.settings["rollouts"],
                    "prompts_sha256": data.settings["rollouts_sha256"],
                    "samples_per_prompt": max(len(s) for s in data.samples),
                    "prompt_rows": prompt_rows(data, rollouts, training_prompts),
                    **data.settings,
                },
                timing={"started_at": started_at, "load_s": round(loaded - started, 3)},
                dump_dir=dump_dir,
                progress=progress,
                rewards=lambda traces: data.rewards,
                reward_source=(
                    f"rollouts, {data.settings['rewards']}" if data.rewards is not None else None
                ),
            )
            return diagnose(model, prepared, data.samples, diagnosis)


def prompt_rows(
    data: SampledPrompts, rollouts: str | Path, training_prompts: str | Path | None
) -> dict[str, Any]:
    """The row of the file each scored prompt came from (the training file's, for inputs
    matched to one; else the rollout file's), so --keep-prompts can write those rows back
    from a fresh or a cached report. None: no row (a dump's prompt, an unmatched input)."""
    source = training_prompts if training_prompts is not None else rollouts
    return {"file": str(source), "rows": [p.number for p in data.prompts]}


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


def prepare_rollouts(data: SampledPrompts, backend: Backend, settings: Settings) -> Prepared:
    """Rollout prompts fitted to the context, each leaving room for its longest response."""
    reserve = [max((len(s.ids) for s in group), default=0) for group in data.samples]
    return prepare(
        data.prompts, data.rendered, reserve, backend, settings, data.settings["rollouts"]
    )
