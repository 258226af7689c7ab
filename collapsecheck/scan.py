"""The scan pipeline: prompts and checkpoint in, sampling, reasoning extraction, cross-scoring,
metrics, verdict, report out. `scan()` is the Python API; the CLI is a thin layer over it.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collapsecheck.backends.base import (
    DEFAULT_BATCH_TOKENS,
    DEFAULT_SAMPLE_ROWS,
    Backend,
    Progress,
    Sample,
    SamplingParams,
    SplitBackend,
    close_backend,
    no_progress,
)
from collapsecheck.checkpoint import Checkpoint, require_checkpoint
from collapsecheck.cross_scoring import column_groups, cross_score, request_count
from collapsecheck.dump import (
    PROMPTS_FILE,
    REPORT_FILE,
    TRACES_FILE,
    locked,
    write_matrix,
    write_samples,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.metrics import DEFAULT_RESAMPLES, compute_metrics, count_per_prompt
from collapsecheck.prompts import (
    Prompt,
    RenderedPrompt,
    file_sha256,
    load_prompts,
    render_prompt,
)
from collapsecheck.reasoning import ReasoningSpec, Trace, extract_traces
from collapsecheck.report import Report
from collapsecheck.rollouts import RolloutOptions, read_dump_samples, read_rollouts
from collapsecheck.verdict import Thresholds, decide

# Called once per stage with a description and the number of work units; returns the
# callback that advances the stage. The CLI turns it into rich progress bars.
ProgressHook = Callable[[str, int], Progress]


def silent(_: str, __: int) -> Progress:
    return no_progress


def versions() -> dict[str, str]:
    import numpy
    import torch
    import transformers

    from collapsecheck import __version__

    return {
        "collapsecheck": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def prompt_summary(prompt: Prompt) -> str:
    """The user's own words of a prompt: the string, or the last chat message's content."""
    return prompt.content if isinstance(prompt.content, str) else prompt.content[-1]["content"]


def example_traces(
    traces: Sequence[Trace], prompts: Sequence[Prompt], groups: Any, count: int = 2
) -> list[dict[str, Any]]:
    """The first valid trace of `count` different prompts, to show a template by eye."""
    seen: set[int] = set()
    examples = []
    for trace in traces:
        group = int(groups[trace.prompt_index])
        if trace.valid and group not in seen:
            seen.add(group)
            examples.append(
                {
                    "prompt_index": trace.prompt_index,
                    "prompt": prompt_summary(prompts[trace.prompt_index]),
                    "reasoning": trace.reasoning,
                }
            )
        if len(examples) == count:
            break
    return examples


def _no_reasoning_error(spec: ReasoningSpec, responses: int) -> CollapsecheckError:
    return CollapsecheckError(
        f"no response had a reasoning segment {spec.describe()} (0 of {responses}); "
        "pick another segment with --reasoning-tags OPEN,CLOSE, --reasoning-regex or "
        "--whole-response"
    )


ENGINES = ("auto", "transformers", "vllm")


def resolve_engine(engine: str, device: str) -> str:
    """`auto`: vLLM where it is installed and a GPU is present, transformers otherwise."""
    if engine not in ENGINES:
        raise CollapsecheckError(f"--backend must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    import torch

    from collapsecheck.backends.vllm import vllm_available

    gpu = device != "cpu" and torch.cuda.is_available()
    return "vllm" if gpu and vllm_available() else "transformers"


def load_backend(
    checkpoint: str | Path | Checkpoint,
    *,
    engine: str = "transformers",
    device: str = "auto",
    dtype: str = "auto",
    scorer: str = "auto",
    batch_tokens: int | str = DEFAULT_BATCH_TOKENS,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    trust_remote_code: bool = False,
    trust_checkpoint_pickle: bool = False,
    base_model: str | Path | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
) -> Backend:
    """The backend of a checkpoint in any supported format. Scorers: `cached` and `naive`
    (transformers), `vllm` (vLLM's prompt log-probabilities); `auto` is the engine's default:
    the transformers cached scorer for both engines (see docs/benchmarks.md)."""
    from collapsecheck.backends.hf import TransformersBackend

    if not isinstance(checkpoint, Checkpoint):
        base = Path(base_model) if base_model is not None else None
        checkpoint = require_checkpoint(checkpoint, base)
    engine = resolve_engine(engine, device)
    if engine == "transformers" and scorer == "vllm":
        raise CollapsecheckError("--scorer vllm needs --backend vllm")

    def transformers_backend() -> Backend:
        return TransformersBackend.from_checkpoint(
            checkpoint,
            device=device,
            dtype=dtype,
            scorer="cached" if scorer == "auto" else scorer,
            batch_tokens=batch_tokens,
            sample_rows=sample_rows,
            trust_remote_code=trust_remote_code,
            trust_checkpoint_pickle=trust_checkpoint_pickle,
        )

    if engine == "transformers":
        return transformers_backend()
    from collapsecheck.backends.vllm import VLLMBackend

    sampler = VLLMBackend(
        checkpoint,
        device=device,
        dtype=dtype,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        trust_remote_code=trust_remote_code,
    )
    if scorer == "vllm":
        return sampler
    return SplitBackend(sampler, transformers_backend())


@contextmanager
def backend_for(
    checkpoint: str | Path | Checkpoint, backend: Backend | None, **load: Any
) -> Iterator[Backend]:
    """The caller's backend, or one loaded for this scan and closed after it (a vLLM engine
    stops its worker processes and returns their memory)."""
    if backend is not None:
        yield backend
        return
    created = load_backend(checkpoint, **load)
    try:
        yield created
    finally:
        close_backend(created)


def checkpoint_name(checkpoint: str | Path | Checkpoint) -> str:
    return str(checkpoint.path if isinstance(checkpoint, Checkpoint) else checkpoint)


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
        fitted.append(RenderedPrompt(backend.decode(ids), ids))
        cut += 1
    return fitted, cut


def require_distinct_prompts(rendered: Sequence[RenderedPrompt], source: str) -> Any:
    """The prompts' column groups, or an error when every prompt renders to the same ids."""
    groups = column_groups([r.ids for r in rendered])
    if len(set(groups.tolist())) < 2:
        raise CollapsecheckError(f"{source}: all prompts render to the same tokens")
    return groups


def saved_samples(
    dump_dir: Path, rendered: Sequence[RenderedPrompt], k: int
) -> list[list[Sample]] | None:
    """The samples an interrupted scan left in its dump, if they are for these prompts."""
    if not ((dump_dir / PROMPTS_FILE).is_file() and (dump_dir / TRACES_FILE).is_file()):
        return None
    saved = read_dump_samples(dump_dir)
    same_prompts = [r.ids for r in saved.rendered] == [r.ids for r in rendered]
    if not same_prompts or any(len(group) != k for group in saved.samples):
        return None
    return saved.samples


@dataclass(frozen=True)
class Analysis:
    """How traces become a report, the same for `scan` and `score`."""

    spec: ReasoningSpec
    thresholds: Thresholds
    negatives: int | None
    seed: int
    resamples: int
    progress: ProgressHook


def rendering_settings(
    as_chat: bool, system_prompt: str | None, truncate_prompts: bool, truncated: int
) -> dict[str, Any]:
    return {
        "as_chat": as_chat,
        "system_prompt": system_prompt,
        "truncate_prompts": truncate_prompts,
        "truncated_prompts": truncated,
    }


def diagnose(
    backend: Backend,
    prompts: Sequence[Prompt],
    rendered: Sequence[RenderedPrompt],
    traces: Sequence[Trace],
    analysis: Analysis,
    *,
    settings: dict[str, Any],
    dump_dir: Path | None,
    timing: dict[str, Any],
) -> Report:
    """From prompts and traces to the report: cross-scoring, metrics, verdict (and the dump).

    Shared by `scan` (traces it sampled) and `score` (traces read from rollouts)."""
    prompt_ids = [r.ids for r in rendered]
    groups = require_distinct_prompts(rendered, settings["prompts"])
    if dump_dir is not None:
        write_samples(dump_dir, rendered, traces)
    if not any(t.valid for t in traces):
        raise _no_reasoning_error(analysis.spec, len(traces))
    started = time.perf_counter()
    negatives = analysis.negatives
    total = request_count(traces, prompt_ids, negatives)
    scores = cross_score(
        backend,
        traces,
        prompt_ids,
        analysis.progress("scoring", total),
        negatives=negatives,
        seed=analysis.seed,
    )
    scored = time.perf_counter()
    if dump_dir is not None:
        write_matrix(dump_dir, scores)
    counts = count_per_prompt(
        len(rendered),
        [t.prompt_index for t in traces],
        [t.valid for t in traces],
        [t.truncated for t in traces],
        [t.reasoning for t in traces],
    )
    try:
        metrics = compute_metrics(
            scores.matrix, counts, resamples=analysis.resamples, seed=analysis.seed
        )
    except ValueError as err:
        raise CollapsecheckError(
            f"{settings['checkpoint']}: no verdict: {err} (check the weights and --dtype)"
        ) from None
    estimator = (
        "full matrix"
        if scores.matrix.is_full
        else f"sampled negatives: own prompt + {negatives} others per trace"
    )
    report = Report(
        metrics=metrics,
        verdict=decide(metrics, analysis.thresholds),
        thresholds=analysis.thresholds,
        settings={
            **settings,
            "num_prompts": len(rendered),
            "reasoning": analysis.spec.to_dict(),
            "cross_scoring": {"negatives": negatives, "estimator": estimator},
            "bootstrap_resamples": analysis.resamples,
            **backend.describe(),
            "versions": versions(),
        },
        counts={
            "prompts": len(rendered),
            "distinct_prompts": len(set(groups.tolist())),
            "responses": len(traces),
            "scored_traces": len(scores.row_trace_index),
            "truncated_responses": sum(t.truncated for t in traces),
            "reasoning_tokens_mean": float(scores.reasoning_tokens.mean()),
        },
        examples=example_traces(traces, prompts, groups),
        timing={**timing, "scoring_s": round(scored - started, 3)},
    )
    if dump_dir is not None:
        report.save(dump_dir / REPORT_FILE)
        report.dump_dir = dump_dir
    return report


def scan(
    checkpoint: str | Path | Checkpoint,
    prompts: str | Path,
    *,
    k: int = 8,
    num_prompts: int | None = None,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    reasoning: ReasoningSpec | None = None,
    thresholds: Thresholds | None = None,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    negatives: int | None = None,
    as_chat: bool = False,
    system_prompt: str | None = None,
    prompt_field: str | None = None,
    truncate_prompts: bool = False,
    resamples: int = DEFAULT_RESAMPLES,
    dump: str | Path | None = None,
    resume: bool = False,
    progress: ProgressHook = silent,
    backend: Backend | None = None,
    **load: Any,
) -> Report:
    """Diagnose one checkpoint on one prompt set; see SPEC.md for every number it returns.

    `load` holds the options of `load_backend` (device, dtype, scorer, batch_tokens,
    trust_remote_code, trust_checkpoint_pickle, base_model). `backend` lets a caller pass an
    already loaded model (for example inside a training loop) instead. With `resume`, samples
    that `dump` already holds for the same prompts are reused instead of sampled again (the
    results cache's entries are keyed by every setting, so there they are always the same).
    """
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    params = SamplingParams(k, temperature, top_p, max_new_tokens, seed)
    if num_prompts is not None and num_prompts < 2:
        raise CollapsecheckError(f"--num-prompts must be at least 2, got {num_prompts}")
    prompt_path = Path(prompts)
    prompt_list = load_prompts(prompt_path, num_prompts=num_prompts, field=prompt_field)
    if len(prompt_list) < 2:
        raise CollapsecheckError(
            f"{prompt_path}: cross-scoring needs at least 2 prompts, found {len(prompt_list)}"
        )
    with backend_for(checkpoint, backend, sample_rows=sample_rows, **load) as backend:
        rendered = [
            render_prompt(p, backend.tokenizer, as_chat=as_chat, system_prompt=system_prompt)
            for p in prompt_list
        ]
        reserve = [max_new_tokens] * len(rendered)
        rendered, cut = fit_context(rendered, prompt_list, reserve, backend, truncate_prompts)
        require_distinct_prompts(rendered, str(prompt_path))  # before any sampling
        loaded = time.perf_counter()
        dump_dir = Path(dump) if dump is not None else None
        with locked(dump_dir) if dump_dir else nullcontext():
            samples = saved_samples(dump_dir, rendered, params.k) if resume and dump_dir else None
            if samples is None:
                samples = backend.generate(
                    [r.ids for r in rendered], params, progress("sampling", len(rendered))
                )
            spec = reasoning or ReasoningSpec()
            traces = extract_traces(samples, backend.decode, spec)
            return diagnose(
                backend,
                prompt_list,
                rendered,
                traces,
                Analysis(spec, thresholds or Thresholds(), negatives, seed, resamples, progress),
                settings={
                    "checkpoint": checkpoint_name(checkpoint),
                    "prompts": str(prompt_path),
                    "prompts_sha256": file_sha256(prompt_path),
                    "samples_per_prompt": params.k,
                    "sampling": params.to_dict(),
                    **rendering_settings(as_chat, system_prompt, truncate_prompts, cut),
                },
                dump_dir=dump_dir,
                timing={
                    "started_at": started_at,
                    "load_s": round(loaded - started, 3),
                    "sampling_s": round(time.perf_counter() - loaded, 3),
                },
            )


def score(
    checkpoint: str | Path | Checkpoint,
    rollouts: str | Path,
    *,
    rollout_options: RolloutOptions | None = None,
    seed: int = 0,
    reasoning: ReasoningSpec | None = None,
    thresholds: Thresholds | None = None,
    negatives: int | None = None,
    as_chat: bool = False,
    system_prompt: str | None = None,
    truncate_prompts: bool = False,
    resamples: int = DEFAULT_RESAMPLES,
    dump: str | Path | None = None,
    progress: ProgressHook = silent,
    backend: Backend | None = None,
    **load: Any,
) -> Report:
    """Diagnose traces that were already sampled (rollouts, or a scan's dump) under the
    checkpoint that produced them: no generation, only cross-scoring. Reports exactly as
    `scan` does."""
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    with backend_for(checkpoint, backend, **load) as backend:
        loaded = time.perf_counter()
        options = rollout_options or RolloutOptions(seed=seed)
        data = read_rollouts(
            rollouts, backend.tokenizer, options, as_chat=as_chat, system_prompt=system_prompt
        )
        if len(data.prompts) < 2:
            raise CollapsecheckError(
                f"{rollouts}: cross-scoring needs at least 2 prompts, found {len(data.prompts)}"
            )
        reserve = [max((len(s.ids) for s in group), default=0) for group in data.samples]
        rendered, cut = fit_context(data.rendered, data.prompts, reserve, backend, truncate_prompts)
        spec = reasoning or ReasoningSpec()
        traces = extract_traces(data.samples, backend.decode, spec)
        dump_dir = Path(dump) if dump is not None else None
        with locked(dump_dir) if dump_dir else nullcontext():
            return diagnose(
                backend,
                data.prompts,
                rendered,
                traces,
                Analysis(spec, thresholds or Thresholds(), negatives, seed, resamples, progress),
                settings={
                    "checkpoint": checkpoint_name(checkpoint),
                    "prompts": data.settings["rollouts"],
                    "prompts_sha256": data.settings["rollouts_sha256"],
                    "samples_per_prompt": max(len(s) for s in data.samples),
                    **data.settings,
                    **rendering_settings(as_chat, system_prompt, truncate_prompts, cut),
                },
                dump_dir=dump_dir,
                timing={"started_at": started_at, "load_s": round(loaded - started, 3)},
            )
