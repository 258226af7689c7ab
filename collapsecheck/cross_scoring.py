"""Cross-scoring (SPEC "The cross log-probability matrix"): every valid trace's reasoning Z
scored under every prompt, as continuation of [prompt j | the trace's own response prefix].

Backend-free: builds `ScoreRequest`s and hands them to whichever backend is in use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapsecheck.backends.base import Backend, Progress, ScoreRequest
from collapsecheck.metrics import CrossLogProbs
from collapsecheck.reasoning import Trace


@dataclass(frozen=True)
class CrossScores:
    """The matrices plus, per row, which trace it is and how many tokens Z has."""

    matrix: CrossLogProbs
    row_trace_index: np.ndarray
    reasoning_tokens: np.ndarray


def column_groups(prompt_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """For each prompt, the index of the first prompt with identical rendered ids."""
    first: dict[tuple[int, ...], int] = {}
    return np.array([first.setdefault(tuple(ids), j) for j, ids in enumerate(prompt_ids)])


def cross_requests(
    traces: Sequence[Trace], contexts: Sequence[Sequence[int]]
) -> list[ScoreRequest]:
    """One request per (trace, context) pair, trace-major. Each trace's continuation and each
    context is one shared tuple, so the requests hold M + N sequences, not M x N."""
    shared_contexts = [tuple(context) for context in contexts]
    requests = []
    for trace in traces:
        continuation = trace.prefix_ids + trace.reasoning_ids
        requests += [
            ScoreRequest(context, continuation, len(trace.prefix_ids))
            for context in shared_contexts
        ]
    return requests


def request_count(traces: Sequence[Trace], prompt_ids: Sequence[Sequence[int]]) -> int:
    """How many requests `cross_score` sends (identical prompts are scored once)."""
    return sum(t.valid for t in traces) * len(np.unique(column_groups(prompt_ids)))


def cross_score(
    backend: Backend,
    traces: Sequence[Trace],
    prompt_ids: Sequence[Sequence[int]],
    progress: Progress,
) -> CrossScores:
    """Score the valid traces under every prompt; duplicate prompts are scored once."""
    rows = [i for i, t in enumerate(traces) if t.valid]
    valid = [traces[i] for i in rows]
    groups = column_groups(prompt_ids)
    distinct = np.unique(groups)
    sums = backend.loglikelihood(
        cross_requests(valid, [prompt_ids[j] for j in distinct]), progress
    ).reshape(len(valid), len(distinct))
    # expand the distinct columns back to all N prompts
    total = sums[:, np.searchsorted(distinct, groups)]
    lengths = np.array([len(t.reasoning_ids) for t in valid], dtype=np.int64)
    matrix = CrossLogProbs(
        sum=total,
        mean=total / lengths[:, None] if len(valid) else total,
        row_prompt=np.array([t.prompt_index for t in valid], dtype=np.int64),
        column_group=groups,
    )
    return CrossScores(matrix, np.array(rows, dtype=np.int64), lengths)
