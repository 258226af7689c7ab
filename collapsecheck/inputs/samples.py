"""Sampled responses as every stage sees them: a response's token ids, and a prompt set with
its responses. Backends return them, rollout readers and a scan's dump build them, the
cross-scorer reads them."""

from __future__ import annotations

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
