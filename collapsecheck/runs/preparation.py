"""Prompts as the model sees them, before anything is sampled or scored: rendered, fitted
to the context, distinct, and where their rendering opens the reasoning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import Backend
from collapsecheck.engines.cross_scoring import column_groups
from collapsecheck.engines.reasoning import (
    ReasoningSpec,
    closes_reasoning,
    opens_reasoning,
    reasoning_spec,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import (
    Prompt,
    RenderedPrompt,
    load_prompts,
)
from collapsecheck.inputs.samples import SampledPrompts
from collapsecheck.settings import (
    Settings,
)


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


def prepare_rollouts(data: SampledPrompts, backend: Backend, settings: Settings) -> Prepared:
    """Rollout prompts fitted to the context, each leaving room for its longest response."""
    reserve = [max((len(s.ids) for s in group), default=0) for group in data.samples]
    return prepare(
        data.prompts, data.rendered, reserve, backend, settings, data.settings["rollouts"]
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
