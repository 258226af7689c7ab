"""Playing a checkpoint in its environment (`scan --env`, SPEC "Agents across turns"): -n
start states (seeds), -k episodes from each, turn by turn. Every live episode of a turn is
sampled in one batch through the backend's `generate` (so transformers and vLLM play alike),
each (episode, turn) seeded by its own number: the same command plays the same episodes.

Each episode is a `Game` of its environment's adapter (`inputs.environments`), which renders
the turn's prompt and plays the reply as its trainer does: a factory's environment sees the
chat of observations and responses and the response's action segment (`factories`), RAGEN's
own environments RAGEN's prompts and manager (`ragen`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from collapsecheck.engines.backends.base import Backend, SamplingParams
from collapsecheck.engines.reasoning import ActionSpec, action_spec, located_action, reasoning_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import EnvironmentSource, Game
from collapsecheck.inputs.episodes import Episode, EpisodeTurn
from collapsecheck.inputs.prompts import Prompt, RenderedPrompt
from collapsecheck.inputs.samples import Sample, SampledPrompts
from collapsecheck.progress import ProgressHook
from collapsecheck.settings import DEFAULT_STARTS, EnvSettings, Settings


@dataclass
class Playing:
    """One episode while it is played: its game, what it did so far."""

    start: int
    game: Game
    turns: list[EpisodeTurn] = dataclasses.field(default_factory=list)
    contexts: list[tuple[Prompt, RenderedPrompt, Sample]] = dataclasses.field(default_factory=list)
    done: bool = False
    success: bool | None = None

    def episode(self) -> Episode:
        return Episode(self.start, self.game.seed, tuple(self.turns), self.game.observation,
                       self.done, self.success)  # fmt: skip


@dataclass(frozen=True)
class Played:
    """The episodes, and every turn as a prompt with its one response (play order)."""

    episodes: list[Episode]
    prompts: list[Prompt]
    rendered: list[RenderedPrompt]
    samples: list[Sample]
    turn_numbers: list[int]
    rewards: list[float] | None  # None: no turn has a reward (a harness that gives none)
    temperature: float | None = None  # the replies' where a harness asked another (`driven`)
    notes: tuple[str, ...] = ()  # what playing noticed (a harness's refused requests, say)

    def sampled(self, settings: dict[str, object]) -> SampledPrompts:
        """Each turn one prompt with its one response (identical contexts are merged later,
        as everywhere); its reward the episode's total, as RAGEN's trajectories carry."""
        rewards = None if self.rewards is None else [[r] for r in self.rewards]
        return SampledPrompts(
            list(self.prompts), list(self.rendered), [[s] for s in self.samples], settings,
            rewards, [[t] for t in self.turn_numbers], list(self.episodes),
        )  # fmt: skip


def play(
    backend: Backend, source: EnvironmentSource, env: EnvSettings, params: SamplingParams,
    settings: Settings, progress: ProgressHook,
) -> Played:  # fmt: skip
    """Every episode played to its end or to the turn limit (`env`: resolved, its seeds and
    turns set)."""
    starts = settings.sampling.num_prompts or DEFAULT_STARTS
    first, turns = env.env_seed, env.max_turns
    assert first is not None and turns is not None, "the environment resolves them first"
    playing = [
        Playing(start, source.game(first + start, env, settings.prompts))
        for start in range(starts)
        for _ in range(params.k)
    ]
    spec_of_action = action_spec(settings.scoring) or ActionSpec()
    one = dataclasses.replace(params, k=1)
    advance = progress("playing", len(playing) * turns)
    for turn in range(1, turns + 1):
        live = [e for e in playing if not e.done]
        if not live:
            break
        contexts = [
            e.game.context(backend.tokenizer, settings.prompts,
                           f"--env {source.spec} seed {e.game.seed} episode {i} turn {turn}")
            for i, e in enumerate(live)
        ]  # fmt: skip
        require_room(contexts, backend, params.max_new_tokens)
        offset = (turn - 1) * len(playing)
        rendered = [render for _, render in contexts]
        drawn = backend.generate([r.ids for r in rendered], one, advance, offset=offset)
        for episode, context, (sample,) in zip(live, contexts, drawn, strict=True):
            take_turn(episode, turn, backend, context, sample, settings, spec_of_action)
    for episode in playing:
        episode.game.close()
    return collect(playing)


def take_turn(
    episode: Playing, turn: int, backend: Backend, context: tuple[Prompt, RenderedPrompt],
    sample: Sample, settings: Settings, spec_of_action: ActionSpec,
) -> None:  # fmt: skip
    """The response played in the episode's game."""
    prompt, render = context
    response = backend.decode(sample.ids)
    located = located_action(
        response, reasoning_spec(settings.scoring), spec_of_action, sample.truncated,
        render.text,
    )  # fmt: skip
    played = episode.game.play(response, located, turn)
    episode.turns.append(played.turn)
    episode.contexts.append((prompt, render, sample))
    episode.done = played.done
    if played.success is not None:
        episode.success = played.success


def require_room(
    contexts: Sequence[tuple[Prompt, RenderedPrompt]], backend: Backend, room: int
) -> None:
    """A turn's context must leave --max-new-tokens of the model's context free."""
    limit = backend.max_length
    for prompt, render in contexts:
        if limit is not None and len(render.ids) + room > limit:
            raise CollapsecheckError(
                f"{prompt.origin}: the context has {len(render.ids)} tokens and the response "
                f"needs {room} of the model's {limit}: lower --max-turns or --max-new-tokens, or "
                "keep fewer turns (FILE.py:FACTORY: --context-window; ragen:TAG: its config's "
                "max_context_window with context_window_mode limited_multi_turn)"
            )


def collect(playing: Sequence[Playing]) -> Played:
    """The played episodes and their turns, episode by episode."""
    return turns_played([(e.episode(), e.contexts) for e in playing])


def turns_played(
    episodes: Sequence[tuple[Episode, Sequence[tuple[Prompt, RenderedPrompt, Sample]]]],
    rewarded: bool = True, temperature: float | None = None, notes: tuple[str, ...] = (),
) -> Played:  # fmt: skip
    """Each episode's turns (its contexts with their one sample each), episode by episode, each
    carrying its episode's total reward (None for all where `rewarded` is False: none known)."""
    prompts, rendered, samples, numbers, rewards = [], [], [], [], []
    for episode, contexts in episodes:
        total = sum((t.reward or 0.0) + (t.penalty or 0.0) for t in episode.turns)
        for number, (prompt, render, sample) in enumerate(contexts, start=1):
            prompts.append(prompt)
            rendered.append(render)
            samples.append(sample)
            numbers.append(number)
            rewards.append(total)
    return Played([e for e, _ in episodes], prompts, rendered, samples, numbers,
                  rewards if rewarded else None, temperature, notes)  # fmt: skip
