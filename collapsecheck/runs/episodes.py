"""Playing a checkpoint in its environment (`scan --env`, SPEC "Agents across turns"): -n
start states (seeds), -k episodes from each, turn by turn. Every live episode of a turn is
sampled in one batch through the backend's `generate` (so transformers and vLLM play alike),
each (episode, turn) seeded by its own number: the same command plays the same episodes.

The context of turn t is the episode's chat so far, rendered by the chat template as
prompts are: the system message (--system-prompt, else the environment's own), each earlier
observation (user) and response (assistant), then observation t; --context-window W keeps
the last W observations with their responses. The action is the response's action segment,
located as the flow locates it ("" where there is none)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from collapsecheck.engines.backends.base import Backend, SamplingParams
from collapsecheck.engines.reasoning import ActionSpec, action_spec, located_action, reasoning_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import Environment, EnvironmentSpec, kept_info
from collapsecheck.inputs.episodes import Episode, EpisodeTurn
from collapsecheck.inputs.prompts import Messages, Prompt, RenderedPrompt, render_prompts
from collapsecheck.inputs.samples import Sample, SampledPrompts
from collapsecheck.progress import ProgressHook
from collapsecheck.settings import DEFAULT_STARTS, EnvSettings, Settings


@dataclass
class Playing:
    """One episode while it is played: its environment, what it saw and did so far."""

    start: int
    seed: int
    env: Environment
    observation: str
    turns: list[EpisodeTurn] = dataclasses.field(default_factory=list)
    contexts: list[tuple[Prompt, RenderedPrompt, Sample]] = dataclasses.field(default_factory=list)
    done: bool = False
    success: bool | None = None

    def messages(self, system: str | None, window: int) -> Messages:
        """The chat of the next turn: the system message, the kept earlier turns, the
        observation now."""
        kept = self.turns if window == -1 else self.turns[max(0, len(self.turns) - (window - 1)) :]
        chat: Messages = [{"role": "system", "content": system}] if system else []
        for turn in kept:
            chat += [{"role": "user", "content": turn.state},
                     {"role": "assistant", "content": turn.response}]  # fmt: skip
        return [*chat, {"role": "user", "content": self.observation}]

    def episode(self) -> Episode:
        return Episode(self.start, self.seed, tuple(self.turns), self.observation, self.done,
                       self.success)  # fmt: skip


@dataclass(frozen=True)
class Played:
    """The episodes, and every turn as a prompt with its one response (play order)."""

    episodes: list[Episode]
    prompts: list[Prompt]
    rendered: list[RenderedPrompt]
    samples: list[Sample]
    turn_numbers: list[int]
    rewards: list[float]

    def sampled(self, settings: dict[str, object]) -> SampledPrompts:
        """Each turn one prompt with its one response (identical contexts are merged later,
        as everywhere); its reward the episode's total, as RAGEN's trajectories carry."""
        return SampledPrompts(
            list(self.prompts), list(self.rendered), [[s] for s in self.samples], settings,
            [[r] for r in self.rewards], [[t] for t in self.turn_numbers], list(self.episodes),
        )  # fmt: skip


def play(
    backend: Backend, spec: EnvironmentSpec, env: EnvSettings, params: SamplingParams,
    settings: Settings, progress: ProgressHook,
) -> Played:  # fmt: skip
    """Every episode played to its end or to --max-turns."""
    starts = settings.sampling.num_prompts or DEFAULT_STARTS
    playing = [
        Playing(start, env.env_seed + start, game, "")
        for start in range(starts)
        for game in (Environment(spec, env.env_seed + start) for _ in range(params.k))
    ]
    for episode in playing:
        episode.observation = episode.env.reset()
    system = None if settings.prompts.system_prompt else playing[0].env.system_prompt
    spec_of_action = action_spec(settings.scoring) or ActionSpec()
    one = dataclasses.replace(params, k=1)
    advance = progress("playing", len(playing) * env.max_turns)
    for turn in range(1, env.max_turns + 1):
        live = [e for e in playing if not e.done]
        if not live:
            break
        prompts = [
            Prompt(e.messages(system, env.context_window),
                   f"--env {spec.spec} seed {e.seed} episode {i} turn {turn}")
            for i, e in enumerate(live)
        ]  # fmt: skip
        rendered = render_prompts(prompts, backend.tokenizer, settings.prompts)
        require_room(prompts, rendered, backend, params.max_new_tokens)
        offset = (turn - 1) * len(playing)
        drawn = backend.generate([r.ids for r in rendered], one, advance, offset=offset)
        for episode, prompt, render, (sample,) in zip(live, prompts, rendered, drawn, strict=True):
            take_turn(episode, turn, backend, prompt, render, sample, settings, spec_of_action)
    for episode in playing:
        episode.env.close()
    return collect(playing)


def take_turn(
    episode: Playing, turn: int, backend: Backend, prompt: Prompt, render: RenderedPrompt,
    sample: Sample, settings: Settings, spec_of_action: ActionSpec,
) -> None:  # fmt: skip
    """The response's action played in the episode's environment."""
    response = backend.decode(sample.ids)
    action = located_action(
        response, reasoning_spec(settings.scoring), spec_of_action, sample.truncated,
        render.text,
    )  # fmt: skip
    step = episode.env.step(action, turn)
    episode.turns.append(
        EpisodeTurn(episode.observation, response, action, step.reward, kept_info(step.info))
    )
    episode.contexts.append((prompt, render, sample))
    episode.observation, episode.done = step.observation, step.done
    if "success" in step.info:
        episode.success = bool(step.info["success"])


def require_room(
    prompts: Sequence[Prompt], rendered: Sequence[RenderedPrompt], backend: Backend, room: int
) -> None:
    """A turn's context must leave --max-new-tokens of the model's context free."""
    limit = backend.max_length
    for prompt, render in zip(prompts, rendered, strict=True):
        if limit is not None and len(render.ids) + room > limit:
            raise CollapsecheckError(
                f"{prompt.origin}: the context has {len(render.ids)} tokens and the response "
                f"needs {room} of the model's {limit}: lower --max-turns or --max-new-tokens, or "
                "keep fewer turns (--context-window)"
            )


def collect(playing: Sequence[Playing]) -> Played:
    """The played episodes and their turns, episode by episode."""
    prompts, rendered, samples, numbers, rewards = [], [], [], [], []
    for episode in playing:
        total = sum(t.reward or 0.0 for t in episode.turns)
        for number, (prompt, render, sample) in enumerate(episode.contexts, start=1):
            prompts.append(prompt)
            rendered.append(render)
            samples.append(sample)
            numbers.append(number)
            rewards.append(total)
    episodes = [e.episode() for e in playing]
    return Played(episodes, prompts, rendered, samples, numbers, rewards)
