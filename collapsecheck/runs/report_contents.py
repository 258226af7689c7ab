"""What a diagnosis records beside its numbers: how they were made (settings, versions),
examples, counts, timing, and the evidence its page draws."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import Backend
from collapsecheck.engines.cross_scoring import CrossScores, FlowScores
from collapsecheck.engines.reasoning import (
    Decode,
    Trace,
    action_spec,
    reasoning_spec,
    token_pieces,
)
from collapsecheck.inputs.images import image_runs, swap_reason
from collapsecheck.inputs.prompts import (
    Prompt,
)
from collapsecheck.inputs.samples import SampledPrompts
from collapsecheck.measures.flow import (
    FlowLogProbs,
)
from collapsecheck.measures.token_information import TokenInformation
from collapsecheck.reports.evidence import Evidence
from collapsecheck.runs.loading import versions
from collapsecheck.runs.preparation import Prepared
from collapsecheck.settings import (
    Settings,
    swap_count,
)


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
        if trace.valid and trace.prompt_index not in seen:
            seen.add(trace.prompt_index)
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


def flow_estimator(flow: FlowScores | None, bound: int | None) -> str | None:
    """How the flow's swap matrices were filled (SPEC "Sampled negatives and swaps")."""
    if flow is None:
        return None
    if np.isfinite(flow.logprobs.reasoning).all():
        return "full matrices"
    return f"sampled swaps: own prompt's traces + {swap_count(bound)} others per action"


def report_settings(
    settings: Settings,
    recorded: dict[str, Any],
    prepared: Prepared,
    scores: CrossScores,
    backend: Backend,
) -> dict[str, Any]:
    """The report's `settings`: how the numbers were made (SPEC "Dump format"), after what
    was `recorded` before scoring (source, sampling)."""
    prompts, scoring = settings.prompts, settings.scoring
    bound = scoring.negatives_bound
    estimator = (
        "full matrix"
        if scores.matrix.is_full
        else f"sampled negatives: own prompt + {bound} others per trace"
    )
    return {
        **recorded,
        "as_chat": prompts.as_chat,
        "system_prompt": prompts.system_prompt,
        "truncate_prompts": prompts.truncate_prompts,
        "truncated_prompts": prepared.truncated,
        "chat_template_kwargs": prompts.chat_template_kwargs,
        "num_prompts": len(prepared.rendered),
        "prompt_sources": [list(rows) for rows in prepared.sources],
        "reasoning": reasoning_spec(scoring).to_dict(),
        "action": action.to_dict() if (action := action_spec(scoring)) else None,
        "cross_scoring": {
            "negatives": scoring.negatives,
            "estimator": estimator,
            "flow_estimator": flow_estimator(scores.flow, bound),
            "early_answer_fractions": list(scoring.early_fractions) or None,
        },
        "bootstrap_resamples": settings.analysis.bootstrap,
        **image_settings(prepared),
        **backend.describe(),
        "versions": versions(),
    }


def image_settings(prepared: Prepared) -> dict[str, Any]:
    """For prompts with images: how many, and whether the image's share was measured (SPEC
    "What the image carries") or why not."""
    with_images = sum(bool(image_runs(ids)) for ids in prepared.ids)
    if not with_images:
        return {}
    reason = swap_reason(prepared.ids)
    return {"images": {"prompts_with_images": with_images, "image_share": reason or "measured"}}


def trace_counts(
    prepared: Prepared, traces: Sequence[Trace], scores: CrossScores
) -> dict[str, int | float]:
    return {
        "prompts": len(prepared.rendered),
        "input_rows": prepared.input_rows,
        "fewest_samples_per_prompt": min(
            np.bincount([t.prompt_index for t in traces], minlength=len(prepared.rendered))
        ).item(),
        "responses": len(traces),
        "scored_traces": len(scores.row_trace_index),
        "scored_prompts": len(set(scores.matrix.row_prompt.tolist())),
        "flow_valid_traces": len(scores.flow.row_trace_index) if scores.flow else 0,
        "truncated_responses": sum(t.truncated for t in traces),
        "prompts_opening_reasoning": sum(prepared.opened),
        "reasoning_tokens_mean": float(scores.reasoning_tokens.mean()),
    }


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


def elapsed(since: float) -> float:
    return round(time.perf_counter() - since, 3)


def evidence(
    scores: CrossScores, traces: Sequence[Trace], prepared: Prepared, flow: FlowLogProbs | None,
    tokens: TokenInformation | None, decode: Decode,
) -> Evidence:  # fmt: skip
    """What the report's page draws, kept in memory where no dump holds it."""
    reasoning = [traces[int(i)].reasoning for i in scores.row_trace_index]
    rendered = prepared.rendered
    images = [tuple(image for _, image in p.images) for p in rendered]
    text = scored_pieces(scores, traces, decode) if tokens is not None else []
    return Evidence(
        scores.matrix, reasoning, [p.text for p in rendered], flow, images, tokens, text
    )


def scored_pieces(scores: CrossScores, traces: Sequence[Trace], decode: Decode) -> list[str]:
    """The text of each reasoning token of the scored rows, rows in the matrix's order."""
    return token_pieces([traces[int(i)].reasoning_ids for i in scores.row_trace_index], decode)


def prompt_rows(
    data: SampledPrompts, rollouts: str | Path, training_prompts: str | Path | None
) -> dict[str, Any]:
    """The row of the file each scored prompt came from (the training file's, for inputs
    matched to one; else the rollout file's), so --keep-prompts can write those rows back
    from a fresh or a cached report. None: no row (a dump's prompt, an unmatched input)."""
    source = training_prompts if training_prompts is not None else rollouts
    return {"file": str(source), "rows": [p.number for p in data.prompts]}
