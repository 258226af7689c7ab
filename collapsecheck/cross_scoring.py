"""Cross-scoring (SPEC "The cross log-probability matrix"): every valid trace's reasoning Z
scored under every prompt, as continuation of [prompt j | the trace's own response prefix].

Backend-free: builds `ScoreRequest`s and hands them to whichever backend is in use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapsecheck.backends.base import Backend, Progress, ScoreRequest
from collapsecheck.errors import CollapsecheckError
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


def scored_groups(
    own_groups: np.ndarray, groups: np.ndarray, negatives: int | None, seed: int
) -> list[np.ndarray]:
    """For each row (given its own prompt's group), the distinct prompts (group ids) to score
    it under: all of them, or its own plus `negatives` others drawn at random, seeded per row."""
    distinct = np.unique(groups)
    if negatives is None or negatives >= len(distinct) - 1:
        return [distinct] * len(own_groups)
    chosen = []
    for row, own in enumerate(own_groups):
        rng = np.random.default_rng([seed, row])
        picked = rng.choice(distinct[distinct != own], size=negatives, replace=False)
        chosen.append(np.sort(np.append(picked, own)))
    return chosen


def request_count(
    traces: Sequence[Trace], prompt_ids: Sequence[Sequence[int]], negatives: int | None = None
) -> int:
    """How many requests `cross_score` sends (identical prompts are scored once)."""
    distinct = len(np.unique(column_groups(prompt_ids)))
    per_trace = distinct if negatives is None else min(distinct, negatives + 1)
    return sum(t.valid for t in traces) * per_trace


def cross_score(
    backend: Backend,
    traces: Sequence[Trace],
    prompt_ids: Sequence[Sequence[int]],
    progress: Progress,
    *,
    negatives: int | None = None,
    seed: int = 0,
) -> CrossScores:
    """Score the valid traces under every prompt, or under their own and `negatives` sampled
    others. Duplicate prompts are scored once and their column copied; entries not scored
    are NaN and marked in the matrix's `scored` mask."""
    if negatives is not None and negatives < 1:
        raise CollapsecheckError(f"--negatives must be at least 1, got {negatives}")
    rows = [i for i, t in enumerate(traces) if t.valid]
    valid = [traces[i] for i in rows]
    groups = column_groups(prompt_ids)
    own = groups[[t.prompt_index for t in valid]] if valid else np.array([], dtype=np.int64)
    chosen = scored_groups(own, groups, negatives, seed)
    contexts = {g: tuple(prompt_ids[g]) for g in np.unique(groups)}
    requests, cells = [], []
    for row, (trace, wanted) in enumerate(zip(valid, chosen, strict=True)):
        continuation = trace.prefix_ids + trace.reasoning_ids
        for group in wanted:
            requests.append(ScoreRequest(contexts[group], continuation, len(trace.prefix_ids)))
            cells.append((row, group))
    values = backend.loglikelihood(requests, progress)
    broken = int((~np.isfinite(values)).sum())
    if broken:
        raise CollapsecheckError(
            f"the model gave NaN or infinite log-probabilities for {broken} of {len(values)} "
            "(trace, prompt) pairs: no verdict (check the checkpoint's weights and --dtype)"
        )
    by_group = np.full((len(valid), len(groups)), np.nan)
    scored_group = np.zeros((len(valid), len(groups)), dtype=bool)
    for (row, group), value in zip(cells, values, strict=True):
        by_group[row, group] = value
        scored_group[row, group] = True
    total = by_group[:, groups]  # each column takes its group's value
    lengths = np.array([len(t.reasoning_ids) for t in valid], dtype=np.int64)
    matrix = CrossLogProbs(
        sum=total,
        mean=total / lengths[:, None] if len(valid) else total,
        row_prompt=np.array([t.prompt_index for t in valid], dtype=np.int64),
        column_group=groups,
        scored=scored_group[:, groups],
    )
    return CrossScores(matrix, np.array(rows, dtype=np.int64), lengths)
