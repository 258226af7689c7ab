"""Rollouts in: traces that training already sampled, so a diagnosis needs no generation.

Three sources, all turned into prompts and (ids, truncated) samples per prompt:

- Single-turn rollout rows (JSONL or parquet): a prompt (text or chat messages), a response
  (text, or `--response-ids-field` token ids) and optionally a group id; rows are grouped
  by the group id, else by the prompt. This covers RAGEN's JSONL trajectory export and veRL's
  rollout dumps given the right field names.
- Multi-turn rows: a `turns` list, each turn its own context (prompt or messages) and
  response. (trajectory, turn) pairs are sampled as RAGEN-2 does (turn-uniform,
  trajectory-uniform, or each trajectory's first turn); each sampled turn is one prompt with
  one trace, scored against the other sampled turns' contexts.
- A `--dump` directory of a scan: its rendered prompt ids and sampled response ids, exactly.

A trainer's own rollout file or step folder (TRL, veRL, slime, SkyRL, AReaL, ROLL, prime-rl,
RAGEN) is recognised by `collapsecheck.inputs.trainer_rollouts` and read as rows of the same
forms, which may also carry the trainer's exact ids (`prompt_ids`, `response_ids`, with a kept
context's `prompt_images`) or a context kept as rendered text (`rendered`): those are scored as
they stand, not rendered again (SPEC "Traces the trainer sampled").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.episodes import Episode, from_trajectories
from collapsecheck.inputs.images import hold_images
from collapsecheck.inputs.prompts import (
    Prompt,
    RenderedPrompt,
    content_key,
    content_sha256,
    kept_ids_with_images,
    load_prompts,
    numbered_rows,
    prompt_from_row,
    render_prompts,
)
from collapsecheck.inputs.rewards import as_reward
from collapsecheck.inputs.samples import Sample, SampledPrompts, decode_ids
from collapsecheck.inputs.scan_dump import read_dump_samples
from collapsecheck.inputs.trainer_rollouts import rollout_files, trainer_reader, trainer_rollouts
from collapsecheck.inputs.trainer_rollouts.base import Row
from collapsecheck.settings import PromptSettings, Settings

RESPONSE_FIELDS = ("response", "output", "completion")
REWARD_FIELDS = ("reward", "score")
GROUP_FIELDS = ("uid", "group_id", "prompt_id", "group")
TURNS_FIELD = "turns"
TURN_SAMPLINGS = ("turn", "trajectory", "first")


@dataclass(frozen=True)
class RolloutOptions:
    """Field names and, for multi-turn rollouts, how turns are sampled."""

    prompt_field: str | None = None
    response_field: str | None = None
    response_ids_field: str | None = None
    group_field: str | None = None
    turn_sampling: str = "turn"
    pairs: int | None = None
    seed: int = 0
    reward_field: str | None = None
    state_regex: str | None = None  # SPEC "Agents across turns": the state in an observation

    @classmethod
    def of(cls, settings: Settings) -> RolloutOptions:
        """The options a file with the default field names needs, from the settings."""
        return cls(
            prompt_field=settings.prompts.prompt_field,
            seed=settings.analysis.seed,
            reward_field=settings.rewards.reward_field,
            state_regex=settings.scoring.state_regex,
        )

    def __post_init__(self) -> None:
        if self.turn_sampling not in TURN_SAMPLINGS:
            raise CollapsecheckError(
                f"--turn-sampling must be one of {', '.join(TURN_SAMPLINGS)}, "
                f"got {self.turn_sampling!r}"
            )
        if self.pairs is not None and self.pairs < 2:
            raise CollapsecheckError(f"--pairs must be at least 2, got {self.pairs}")


@dataclass(frozen=True)
class _Turn:
    prompt: Prompt
    response: Any  # text, or token ids
    truncated: bool
    reward: float | None = None
    prompt_ids: tuple[int, ...] | None = None  # the exact context, where the trainer kept it
    rendered: bool = False  # the prompt is the context as text, chat markers and all
    images: tuple[Any, ...] = ()  # a kept context's images (`inputs.images.PromptImage`)
    temperature: float | None = None  # the one it was sampled at, where the row names it
    turn: int | None = None  # its number in its trajectory (multi-turn rows)


def _reward(row: dict[str, Any], options: RolloutOptions, where: str) -> float | None:
    """The row's reward (`--reward-field`, else `reward` or `score`), None when it has none."""
    names = (options.reward_field,) if options.reward_field else REWARD_FIELDS
    name = next((n for n in names if n in row), None)
    return None if name is None else as_reward(row[name], f"{where} ({name!r})")


def _field(row: dict[str, Any], wanted: str | None, defaults: Sequence[str], where: str) -> Any:
    names = (wanted,) if wanted else defaults
    name = next((n for n in names if n in row), None)
    if name is None:
        raise CollapsecheckError(f"{where}: no {' or '.join(repr(n) for n in names)} field")
    return row[name]


def _turn(
    row: dict[str, Any], options: RolloutOptions, where: str, number: int, base: Path,
    reward: float | None = None,
) -> _Turn:  # fmt: skip
    """One response with its context and the number of the file's row it came from (so
    --keep-prompts can write that row back); its reward is the row's own, else `reward` (a
    trajectory's, for each of its turns)."""
    ids_only = "prompt_ids" in row and "prompt" not in row  # its text: the ids decoded, later
    content = "" if ids_only else prompt_from_row(row, options.prompt_field, where, base)
    prompt = Prompt(content, where, number=number)
    ids_field = options.response_ids_field or ("response_ids" if "response_ids" in row else None)
    if ids_field:
        response: Any = token_ids(_field(row, ids_field, (), where), where, ids_field)
    else:
        response = _field(row, options.response_field, RESPONSE_FIELDS, where)
        if not isinstance(response, str):
            raise CollapsecheckError(f"{where}: the response must be text")
    own = _reward(row, options, where)
    truncated = bool(row.get("truncated", False))
    context = token_ids(row["prompt_ids"], where, "prompt_ids") if "prompt_ids" in row else None
    rendered = bool(row.get("rendered", False))
    images = tuple(row.get("prompt_images", ()))
    own = own if own is not None else reward
    temperature = _temperature(row, where)
    return _Turn(prompt, response, truncated, own, context, rendered, images, temperature)


def _temperature(row: dict[str, Any], where: str) -> float | None:
    """The temperature the row's response was sampled at, where the row names one."""
    value = row.get("temperature")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise CollapsecheckError(f"{where}: 'temperature' must be a number >= 0, got {value!r}")
    return float(value)


def token_ids(value: Any, where: str, name: str) -> tuple[int, ...]:
    ids = value.tolist() if hasattr(value, "tolist") else value
    if not (isinstance(ids, list | tuple) and all(isinstance(i, int) for i in ids)):
        raise CollapsecheckError(f"{where}: {name} must be token ids")
    return tuple(ids)


def text_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """Text a trainer kept, as ids: tokenized as it stands, no special token added."""
    return tuple(int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"])


def _sample(turn: _Turn, tokenizer: Any, stop_ids: Sequence[int]) -> Sample:
    """The response as ids: those the trainer kept, else its text tokenized; a stop token at
    the end (a trainer that keeps special tokens kept it) dropped, as sampling drops it."""
    kept = isinstance(turn.response, tuple)
    ids = turn.response if kept else text_ids(tokenizer, turn.response)
    return Sample(ids[:-1] if ids and ids[-1] in stop_ids else ids, turn.truncated)


def _group_single_turns(rows: list[Row], options: RolloutOptions, base: Path) -> list[list[_Turn]]:
    groups: dict[str, list[_Turn]] = {}
    for where, row, number in rows:
        turn = _turn(row, options, where, number, base)
        if options.group_field or any(f in row for f in GROUP_FIELDS):
            key = json.dumps(_field(row, options.group_field, GROUP_FIELDS, where), default=str)
        else:
            key = context_key(turn)
        groups.setdefault(key, []).append(turn)
    return list(groups.values())


def context_key(turn: _Turn) -> str:
    """What a turn was sampled under, before any tokenizer: the exact context with its images'
    contents where the trainer kept its ids, else the prompt itself (an image by its content).
    Turns with equal keys render to one context; `prepare` merges by the rendered ids."""
    if turn.prompt_ids is not None:
        return json.dumps([turn.prompt_ids, [image.sha256 for image in turn.images]])
    return content_key(turn.prompt)


def _sample_turns(
    rows: list[Row], options: RolloutOptions, base: Path
) -> tuple[list[list[_Turn]], dict[str, Any]]:
    """(trajectory, turn) pairs drawn without replacement: every pair equally likely
    (turn-uniform), every trajectory equally likely then a turn within it
    (trajectory-uniform), or each trajectory's first turn."""
    pairs, weights = [], []
    for where, row, line in rows:
        turns = row[TURNS_FIELD]
        if not isinstance(turns, list) or not turns:
            raise CollapsecheckError(f"{where}: '{TURNS_FIELD}' must be a non-empty list")
        for number, turn in enumerate(turns, start=1):
            if options.turn_sampling == "first" and number > 1:
                break
            if not isinstance(turn, dict):
                raise CollapsecheckError(f"{where} turn {number}: expected an object")
            trajectory_reward = _reward(row, options, where)
            where_turn = f"{where} turn {number}"
            read = _turn(turn, options, where_turn, line, base, trajectory_reward)
            pairs.append(dataclasses.replace(read, turn=number))
            weights.append(1.0 / len(turns) if options.turn_sampling == "trajectory" else 1.0)
    count = min(options.pairs or len(pairs), len(pairs))
    rng = np.random.default_rng(options.seed)
    p = np.array(weights) / sum(weights)
    chosen = sorted(rng.choice(len(pairs), size=count, replace=False, p=p))
    settings = {"turn_sampling": options.turn_sampling, "pairs": count, "available": len(pairs)}
    return [[pairs[i]] for i in chosen], settings


@dataclass(frozen=True)
class ParsedRollouts:
    """A rollout file's responses grouped by prompt, every row checked; not yet tokenized."""

    groups: list[list[_Turn]]
    rewards: list[list[float]] | None
    settings: dict[str, Any]
    episodes: list[Episode] | None = None  # a multi-turn file's trajectories


def parse_rollouts(path: str | Path, options: RolloutOptions) -> ParsedRollouts | None:
    """Every row of a rollout file read and checked, before any model loads; None for a dump
    directory (read with the tokenizer, by `read_rollouts`)."""
    path = Path(path)
    if not is_scan_dump(path):
        return _parse_file(path, options)
    steps = rollout_files(path)
    if steps:
        raise CollapsecheckError(
            f"{path}: a folder of {steps[0].trainer} rollout steps ({len(steps)}): score one "
            f"step ({steps[-1].path}), or scan the run with --rollouts {path}"
        )
    return None


def is_scan_dump(path: Path) -> bool:
    """A folder that is no trainer's step folder: a scan's dump."""
    return path.is_dir() and trainer_reader(path) is None


def _parse_file(path: Path, options: RolloutOptions) -> ParsedRollouts:
    if not path.exists():
        raise CollapsecheckError(f"rollouts not found: {path}")
    settings: dict[str, Any] = {"rollouts": str(path), "rollouts_sha256": content_sha256(path)}
    written = trainer_rollouts(path)
    if written is not None:
        rows = written.rows
        settings["trainer_rollouts"] = {
            "trainer": written.trainer, "step": written.step, "notes": written.notes,
        }  # fmt: skip
    else:
        rows = numbered_rows(path)
    if not rows:
        raise CollapsecheckError(f"{path}: no rollouts found (the file is empty)")
    episodes = None
    if TURNS_FIELD in rows[0][1]:
        groups, sampled = _sample_turns(rows, options, path.parent)
        settings["multi_turn"] = sampled
        episodes = from_trajectories(rows, options.state_regex)
    else:
        groups = _group_single_turns(rows, options, path.parent)
    rewards, source = _rewards(groups, rows, options)
    if source is not None:
        settings["rewards"] = source
    settings.update(sampled_temperature(groups, path))
    return ParsedRollouts(groups, rewards, settings, episodes)


def sampled_temperature(groups: list[list[_Turn]], path: Path) -> dict[str, Any]:
    """`{"sampled_temperature": T}` where the rows name the temperature they were sampled at
    (one for all of them: a matrix reads one policy), else nothing (scored at 1)."""
    named = sorted({t.temperature for group in groups for t in group if t.temperature is not None})
    if len(named) > 1:
        raise CollapsecheckError(
            f"{path}: responses sampled at temperatures {', '.join(f'{t:g}' for t in named)}: "
            "score the rows of one temperature at a time (each is a different policy)"
        )
    return {"sampled_temperature": named[0]} if named else {}


def match_decoded_inputs(
    parsed: ParsedRollouts, source: Path, tokenizer: Any, rendering: PromptSettings,
    vision: Any = None,
) -> ParsedRollouts:  # fmt: skip
    """veRL's dumps hold each prompt decoded with special tokens skipped, not the context the
    policy saw. Each training prompt is rendered as the trainer renders it (with its images,
    `vision`: the backend's) and decoded the same way; a group whose input equals one takes
    that training row as its prompt (rendered exactly, chat markers and images and all). An
    input that several rows decode to, rows that differ in what decoding drops (their images,
    say: veRL's dumps keep none), cannot say which it was: it keeps its decoded text. The
    settings say how many matched, and why the others did not."""
    training = load_prompts(source, field=rendering.prompt_field)
    rows: dict[str, dict[tuple[Any, ...], Prompt]] = {}
    for prompt, rendered in zip(
        training, render_prompts(training, tokenizer, rendering, vision), strict=True
    ):
        text = tokenizer.decode([t for t in rendered.ids if t >= 0], skip_special_tokens=True)
        rows.setdefault(text, {}).setdefault(rendered.identity, prompt)
    groups, matched, ambiguous = [], 0, 0
    for group in parsed.groups:
        content = group[0].prompt.content
        candidates = rows.get(content, {}) if isinstance(content, str) else {}
        row = next(iter(candidates.values())) if len(candidates) == 1 else None
        matched += row is not None
        ambiguous += len(candidates) > 1
        # an unmatched input keeps its decoded text and has no row of the training file
        prompt = row or dataclasses.replace(group[0].prompt, number=None)
        groups.append([dataclasses.replace(t, prompt=prompt) for t in group])
    settings = {
        **parsed.settings,
        "prompt_matching": matching_note(matched, ambiguous, len(groups), source),
    }
    return ParsedRollouts(groups, parsed.rewards, settings, parsed.episodes)


def matching_note(matched: int, ambiguous: int, total: int, source: Path) -> str:
    note = (
        f"{matched} of {total} inputs matched a row of {source} and are scored in the "
        "context the trainer rendered from it"
    )
    if ambiguous:
        note += (
            f"; {ambiguous} decode as several rows that differ in what decoding drops (their "
            "images: veRL's dumps keep none), so which one is unknown"
        )
    if matched < total:
        note += "; the unmatched are scored as their decoded text"
    return note


def read_rollouts(
    path: str | Path,
    tokenizer: Any,
    options: RolloutOptions,
    rendering: PromptSettings | None = None,
    parsed: ParsedRollouts | None = None,
    vision: Any = None,
    stop_ids: Sequence[int] = (),
) -> SampledPrompts:
    """Prompts and samples of a rollout file (`parsed` already, or parsed here) or a dump
    directory (`vision`: the backend's, for prompts with images; `stop_ids`: the model's)."""
    if is_scan_dump(Path(path)):
        saved = read_dump_samples(Path(path))
        hold_images(saved.rendered, vision, str(path))
        return saved
    parsed = parsed or _parse_file(Path(path), options)
    rendered = _rendered(parsed.groups, tokenizer, rendering or PromptSettings(), vision)
    prompts = [
        group[0].prompt
        if group[0].prompt.content
        else dataclasses.replace(group[0].prompt, content=r.text)
        for group, r in zip(parsed.groups, rendered, strict=True)
    ]
    samples = [[_sample(turn, tokenizer, stop_ids) for turn in group] for group in parsed.groups]
    turns = None
    if parsed.episodes is not None:
        turns = [[turn.turn for turn in group] for group in parsed.groups]
    return SampledPrompts(
        prompts, rendered, samples, parsed.settings, parsed.rewards, turns, parsed.episodes
    )


def _rendered(
    groups: list[list[_Turn]], tokenizer: Any, rendering: PromptSettings, vision: Any
) -> list[RenderedPrompt]:
    """Each group's context: the ids the trainer kept, exactly; a context kept as text (chat
    markers and all) tokenized as it stands; else its prompt rendered."""
    kept = [group[0].prompt_ids or as_context(group[0], tokenizer) for group in groups]
    to_render = [group[0].prompt for group, ids in zip(groups, kept, strict=True) if ids is None]
    rendered = iter(render_prompts(to_render, tokenizer, rendering, vision))
    return [
        next(rendered) if ids is None else kept_context(group[0], ids, tokenizer, vision)
        for group, ids in zip(groups, kept, strict=True)
    ]


def kept_context(turn: _Turn, ids: tuple[int, ...], tokenizer: Any, vision: Any) -> RenderedPrompt:
    """A context the trainer kept as ids, its images (if any) in their slots."""
    if not turn.images:
        return RenderedPrompt(decode_ids(tokenizer, ids), ids)
    slotted_ids, slotted = kept_ids_with_images(ids, turn.images, vision, turn.prompt.origin)
    return RenderedPrompt(decode_ids(tokenizer, slotted_ids), tuple(slotted_ids), slotted)


def as_context(turn: _Turn, tokenizer: Any) -> tuple[int, ...] | None:
    """A context the trainer kept as rendered text, as ids (no special tokens added)."""
    if not turn.rendered:
        return None
    return text_ids(tokenizer, turn.prompt.content)


def _rewards(
    groups: list[list[_Turn]], rows: list[Row], options: RolloutOptions
) -> tuple[list[list[float]] | None, str | None]:
    """Every response's reward and where they came from ("per response", "per turn", "per
    trajectory"), or (None, None) when no row has one; some but not all is an error."""
    turns = [turn for group in groups for turn in group]
    missing = [turn.prompt.origin for turn in turns if turn.reward is None]
    if len(missing) == len(turns):
        return None, None
    if missing:
        raise CollapsecheckError(f"{missing[0]}: no reward, though other rows have one")
    if TURNS_FIELD not in rows[0][1]:
        source = "per response"
    else:
        own = any(_reward(t, options, w) is not None for w, r, _ in rows for t in r[TURNS_FIELD])
        source = "per turn" if own else "per trajectory"
    return [[turn.reward for turn in group] for group in groups], source
