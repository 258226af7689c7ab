"""Which inputs collapsed (SPEC "Per-prompt table"): one row per prompt, built from what the
scan already computed. Pure: numpy on the per-row statistics; the rows are plain dicts, and
`to_frame` makes them a pandas frame."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from collapsecheck.measures.flow import FlowLogProbs, distinct_actions, flow_rows
from collapsecheck.measures.metrics import per_prompt_mean
from collapsecheck.measures.snr import PromptRewards, RowStatistics, own_mi_per_prompt

TEXT_CHARS = 80


def _number(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def per_prompt_rows(
    texts: Sequence[str],
    responses: np.ndarray,
    valid: np.ndarray,
    distinct_reasoning: np.ndarray,
    rows: RowStatistics,
    flow: FlowLogProbs | None = None,
    rewards: PromptRewards | None = None,
) -> list[dict[str, Any]]:
    """One dict per prompt: index, text (first 80 characters), responses, valid traces, its
    own MI (/ log N), retrieval hit rate and distinct reasoning rate; where measured, its flow
    MIs (/ log N), distinct action rate, reward mean and std."""
    n = len(texts)
    log_n = math.log(n)
    table: dict[str, np.ndarray] = {
        "own_mi": own_mi_per_prompt(rows, n),
        "retrieval_hit_rate": per_prompt_mean(rows.row_prompt, rows.hit, n),
        "distinct_reasoning_rate": distinct_reasoning / np.maximum(responses, 1),
    }
    if flow is not None:
        per_row = flow_rows(flow)
        for name in ("state", "reasoning", "input"):
            values = per_prompt_mean(flow.row_prompt, per_row[name], n)
            table[f"action_{name}_nmi"] = values / log_n
        distinct, acting = distinct_actions(flow)
        with np.errstate(invalid="ignore", divide="ignore"):
            table["distinct_action_rate"] = distinct / acting
    if rewards is not None:
        table["reward_mean"], table["reward_std"] = rewards.mean, rewards.std
    out = []
    for j, text in enumerate(texts):
        row: dict[str, Any] = {
            "index": j,
            "text": text[:TEXT_CHARS],
            "responses": int(responses[j]),
            "valid_traces": int(valid[j]),
        }
        row.update({key: _number(values[j]) for key, values in table.items()})
        out.append(row)
    return out


def most_collapsed(table: Sequence[dict[str, Any]], count: int = 3) -> list[dict[str, Any]]:
    """The prompts of lowest own MI (those without a scored trace last)."""
    return sorted(table, key=lambda r: (r["own_mi"] is None, r["own_mi"] or 0.0))[:count]


def to_frame(table: Sequence[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(list(table)).set_index("index")
