"""Prompts as the model sees them, before anything is sampled or scored: rendered, fitted
to the context, identical contexts merged into one prompt (SPEC "Identical contexts are one
prompt"), and where their rendering opens the reasoning."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from collapsecheck.engines.backends.base import Backend
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

T = TypeVar("T")


@dataclass(frozen=True)
class Prepared:
    """The prompts of a scan as the model sees them: one per distinct context (SPEC
    "Identical contexts are one prompt"), each the first of the input rows that render to
    it; `sources[i]`: the positions, among the rows given to `prepare`, of prompt i's rows."""

    prompts: list[Prompt]
    rendered: list[RenderedPrompt]
    sources: tuple[tuple[int, ...], ...]
    truncated: int  # prompts cut to fit the context (--truncate-prompts)
    opened: list[bool]  # per prompt, its rendering opened the reasoning (R1 distills, QwQ)

    @property
    def ids(self) -> list[tuple[int, ...]]:
        return [r.ids for r in self.rendered]

    @property
    def input_rows(self) -> int:
        """How many rows (prompts as given: a file's rows, a rollout file's groups) the
        distinct prompts came from."""
        return sum(len(rows) for rows in self.sources)

    def merged(self, per_row: Sequence[Sequence[T]]) -> list[list[T]]:
        """Per distinct prompt, its rows' items one after another, in row order (the samples,
        rewards or cut marks of rows given one list per row)."""
        return [[item for row in rows for item in per_row[row]] for rows in self.sources]


def distinct_contexts(rendered: Sequence[RenderedPrompt]) -> tuple[tuple[int, ...], ...]:
    """Per distinct context (token ids and images' contents), in order of first appearance,
    the positions of the renderings that are it."""
    positions: dict[Any, list[int]] = {}
    for i, render in enumerate(rendered):
        positions.setdefault(render.identity, []).append(i)
    return tuple(tuple(rows) for rows in positions.values())


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
    """Fit the rendered prompts to the context, merge identical contexts into one prompt,
    check that at least two remain and see where the reasoning opens: before any sampling
    or scoring."""
    truncate = settings.prompts.truncate_prompts
    fitted, cut = fit_context(rendered, prompts, reserve, backend, truncate)
    sources = distinct_contexts(fitted)
    if len(sources) < 2:
        raise CollapsecheckError(f"{source}: all prompts render to the same tokens")
    firsts = [rows[0] for rows in sources]
    distinct = [prompts[i] for i in firsts]
    kept = [fitted[i] for i in firsts]
    opened = reasoning_opened(distinct, kept, reasoning_spec(settings.scoring), backend.tokenizer)
    return Prepared(distinct, kept, sources, cut, opened)


def prepare_sampled(
    data: SampledPrompts, backend: Backend, settings: Settings, source: str
) -> tuple[Prepared, SampledPrompts]:
    """Prompts that were already sampled (rollouts, a dump, a trainer's batch, played turns)
    prepared, each leaving room for its longest response, and their samples, rewards and turn
    numbers merged as their prompts are: one list per distinct context."""
    reserve = [max((len(s.ids) for s in group), default=0) for group in data.samples]
    prepared = prepare(data.prompts, data.rendered, reserve, backend, settings, source)
    rewards = prepared.merged(data.rewards) if data.rewards is not None else None
    turns = prepared.merged(data.turns) if data.turns is not None else None
    merged = dataclasses.replace(
        data,
        prompts=prepared.prompts,
        rendered=prepared.rendered,
        samples=prepared.merged(data.samples),
        rewards=rewards,
        turns=turns,
    )
    return prepared, merged


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
