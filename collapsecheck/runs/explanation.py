"""Why it collapsed (SPEC "Why: reward variance"): the rewards of the traces and the
per-prompt table, with the signal-to-noise section where rewards are known."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collapsecheck.engines.cross_scoring import CrossScores
from collapsecheck.engines.reasoning import (
    Trace,
)
from collapsecheck.inputs.prompts import (
    Prompt,
)
from collapsecheck.inputs.rewards import load_reward_fn, score_responses
from collapsecheck.measures.flow import (
    FlowLogProbs,
)
from collapsecheck.measures.metrics import (
    PromptCounts,
    row_statistics,
)
from collapsecheck.measures.per_prompt import per_prompt_rows
from collapsecheck.measures.snr import PromptRewards, RowStatistics, snr_section
from collapsecheck.runs.preparation import Prepared
from collapsecheck.runs.report_contents import prompt_summary
from collapsecheck.settings import (
    Settings,
)

Rewards = Callable[[Sequence[Prompt], Sequence[Trace]], list[list[float]] | None]


def no_rewards(prompts: Sequence[Prompt], traces: Sequence[Trace]) -> None:
    return None


def reward_function(settings: Settings) -> tuple[Rewards, str | None]:
    """The rewards of a scan's traces under their prompts by --reward-fn (loaded now, before
    any model), or none."""
    spec = settings.rewards.reward_fn
    if spec is None:
        return no_rewards, None
    function = load_reward_fn(spec)

    def rewards(prompts: Sequence[Prompt], traces: Sequence[Trace]) -> list[list[float]]:
        responses: list[list[str]] = [[] for _ in prompts]
        for trace in traces:
            responses[trace.prompt_index].append(trace.response)
        return score_responses(function, prompts, responses)

    return rewards, f"--reward-fn {spec}"


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
    settings: Settings,
    reward_source: str | None,
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
    if per_reward is None:  # a source that has none says why in its place
        return Why(None, reward_source or NO_REWARDS, table)
    analysis = settings.analysis
    snr = snr_section(
        per_reward, rows, distinct_behaviour(traces, n),
        top_p=settings.rewards.snr_top_p, resamples=analysis.bootstrap,
        seed=analysis.seed,
    )  # fmt: skip
    snr["rewards"] = reward_source
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
