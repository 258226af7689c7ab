"""Sampled responses as every stage sees them: a response's token ids (and their text), and
a prompt set with its responses. Backends return them, rollout readers and a scan's dump
build them, the cross-scorer reads them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collapsecheck.inputs.prompts import Prompt, RenderedPrompt


@dataclass(frozen=True)
class Sample:
    """One sampled response: its token ids (stop token excluded) and whether the length
    limit cut it before a stop token."""

    ids: tuple[int, ...]
    truncated: bool


@dataclass
class SampledPrompts:
    """Prompts with their sampled responses, ready for reasoning extraction and
    cross-scoring: what a dump or a rollout file holds."""

    prompts: list[Prompt]
    rendered: list[RenderedPrompt]
    samples: list[list[Sample]]
    settings: dict[str, Any]
    rewards: list[list[float]] | None = None  # one per sample, where the rollouts carry them
    # SPEC "Agents across turns": per sample, the turn of its episode it answered (None:
    # single-turn prompts), and the episodes behind them (played, or a multi-turn file's)
    turns: list[list[int]] | None = None
    episodes: list[Any] | None = None  # collapsecheck.inputs.episodes.Episode


def decode_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    """Token ids to text, special tokens kept, no clean-up: what every backend's decode is.
    An image's tokens (its slot, a negative id: `inputs.images`) read as `<image>`."""
    text, run = [], []
    for i, token in enumerate(ids):
        if token >= 0:
            run.append(token)
            continue
        if run:
            text.append(tokenizer.decode(run, skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False))  # fmt: skip
            run = []
        if i == 0 or ids[i - 1] != token:
            text.append("<image>")
    if run or not text:
        text.append(
            tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )
    return "".join(text)
