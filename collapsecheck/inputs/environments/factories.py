"""Environments a factory makes (`scan --env FILE.py:FACTORY`, SPEC "Agents across turns"),
played as collapsecheck plays them: each turn's context the chat of observations and responses,
the action the response's action segment.

SPEC is `path/to/file.py:factory`, `package.module:factory` or a built-in name
(`frozenlake`). The factory, called with the `--env-arg KEY=VALUE` pairs as keyword
arguments, returns a fresh environment; one is made per episode. Two protocols are read:

- RAGEN's `BaseEnv`: `reset(seed=s)` returns the observation text; `step(action_text)`
  returns `(observation, reward, done, info)`;
- gymnasium's: `reset(seed=s)` returns `(observation, info)`; `step(action_text)` returns
  `(observation, reward, terminated, truncated, info)`.

`info` may carry RAGEN's `success`, `action_is_valid` and `action_is_effective`; they are
kept. An environment that fails or answers in another shape is one line naming it, the seed
and the turn. The user's file is the only code run; nothing is imported before it is named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import call_within
from collapsecheck.inputs.environments.protocol import Resolved, TurnPlayed
from collapsecheck.inputs.episodes import EpisodeTurn
from collapsecheck.inputs.prompts import Messages, Prompt, RenderedPrompt, render_prompts
from collapsecheck.inputs.user_files import file_module, run_file_module

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, PromptSettings, SamplingSettings

DEFAULT_TURNS = 5  # turns per episode where --max-turns is not given

BUILT_IN = {"frozenlake": "collapsecheck.inputs.frozenlake:FrozenLake"}
INFO_KEYS = ("success", "action_is_valid", "action_is_effective")


def parse_env_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    """--env-arg KEY=VALUE pairs as keyword arguments: a value that reads as JSON (4, 0.8,
    true, "text") is that value, any other is the text as given."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not (sep and key.strip().isidentifier()):
            raise CollapsecheckError(f"--env-arg expects KEY=VALUE, got {pair!r}")
        try:
            kwargs[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key.strip()] = value
    return kwargs


@dataclass(frozen=True, eq=False)
class EnvironmentSpec:
    """A loaded SPEC: its factory, the arguments it is called with, and the digest of the
    code it came from (the user's file or module; the built-in's module), which keys the
    results cache with the arguments."""

    spec: str
    factory: Callable[..., Any]
    origin: Path
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # a factory's environment is played as loaded: nothing to say

    @property
    def code_sha256(self) -> str:
        return hashlib.sha256(self.origin.read_bytes()).hexdigest()

    def make(self, seed: int) -> Any:
        """A fresh environment (one per episode)."""
        try:
            return self.factory(**self.kwargs)
        except Exception as err:  # the user's factory can fail in any way
            raise CollapsecheckError(
                f"--env {self.spec}: the factory failed for seed {seed} "
                f"({type(err).__name__}: {err})"
            ) from None

    def __reduce__(self) -> tuple[Any, tuple[str, str, dict[str, Any]]]:
        """Pickled as its SPEC (a file's path made absolute) and arguments, loaded again where
        it is unpickled (a Ray task's process), never as the factory's code."""
        where, _, name = BUILT_IN.get(self.spec, self.spec).rpartition(":")
        found = f"{self.origin}:{name}" if where.endswith(".py") else self.spec
        return reloaded, (self.spec, found, dict(self.kwargs))

    def key(self) -> dict[str, Any]:
        """What keys the results cache of a played scan beside its settings (the code's file
        is keyed as a prompt file is)."""
        return {"env": self.spec, "env_args": dict(self.kwargs)}

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved:
        """The seeds and turns the flags give, else collapsecheck's defaults (seeds from 0, 5
        turns); the sampling as given."""
        first = 0 if env.env_seed is None else env.env_seed
        turns = DEFAULT_TURNS if env.max_turns is None else env.max_turns
        return Resolved(dataclasses.replace(env, env_seed=first, max_turns=turns), sampling, {})

    def game(self, seed: int, env: EnvSettings, prompts: PromptSettings) -> FactoryGame:
        """One episode's environment, reset at `seed`."""
        return FactoryGame(Environment(self, seed, env.env_timeout), env.context_window, prompts)


def load_factory(
    spec: str, kwargs: Mapping[str, Any], timeout: float = 0
) -> tuple[EnvironmentSpec, Any]:
    """The SPEC's factory, loaded and checked, before any model loads, and a fresh environment
    it made (so a factory that fails says so now, and an adapter can recognise what it
    makes)."""
    target = BUILT_IN.get(spec, spec)
    where, sep, name = target.rpartition(":")
    if not (sep and where and name):
        raise CollapsecheckError(
            f"--env {spec}: expected FILE.py:FACTORY, package.module:FACTORY or one of "
            f"{', '.join(BUILT_IN)}"
        )
    module, origin = _module(spec, where)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CollapsecheckError(f"--env {spec}: {where} has no factory {name!r}")
    loaded = EnvironmentSpec(spec, factory, origin.resolve(), dict(kwargs))
    return loaded, call_within(timeout, f"--env {spec} (seed 0, made)", lambda: loaded.make(0))


def reloaded(spec: str, found: str, kwargs: Mapping[str, Any]) -> EnvironmentSpec:
    """A pickled SPEC loaded again from `found` (its file's absolute path), named as given."""
    return dataclasses.replace(load_factory(found, kwargs)[0], spec=spec)


def _module(spec: str, where: str) -> tuple[Any, Path]:
    """The module a SPEC names, and its file."""
    if where.endswith(".py"):
        path = Path(where)
        module = file_module(path, f"collapsecheck_env_{path.stem}", f"--env {spec}")
        sys.modules[module.__name__] = module  # dataclasses in the file look themselves up
        _run(spec, lambda: run_file_module(module))
        return module, path
    module = _run(spec, lambda: importlib.import_module(where))
    origin = getattr(module, "__file__", None)
    if not origin:
        raise CollapsecheckError(f"--env {spec}: {where} has no file (a namespace package)")
    return module, Path(origin)


def _run(spec: str, load: Callable[[], Any]) -> Any:
    try:
        return load()
    except ModuleNotFoundError as err:
        extra = " (pip install 'collapsecheck[env]')" if err.name == "gymnasium" else ""
        raise CollapsecheckError(f"--env {spec}: no module named {err.name!r}{extra}") from None
    except Exception as err:  # the user's module can fail in any way
        raise CollapsecheckError(
            f"--env {spec}: failed to load ({type(err).__name__}: {err})"
        ) from None


@dataclass(frozen=True)
class Step:
    """What one action did: the next observation, its reward, whether the episode ended,
    and the info the environment gave (RAGEN's keys among it)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


class Environment:
    """One episode's environment, read through either protocol; every answer checked, an
    error naming the environment, the seed and the turn."""

    def __init__(self, spec: EnvironmentSpec, seed: int, timeout: float = 0) -> None:
        self.spec, self.seed, self.timeout = spec, seed, timeout
        self.env = self._call(None, lambda: spec.make(seed))

    @property
    def system_prompt(self) -> str | None:
        prompt = getattr(self.env, "system_prompt", None)
        prompt = prompt() if callable(prompt) else prompt
        return prompt if isinstance(prompt, str) and prompt else None

    def _where(self, turn: int | None) -> str:
        at = "reset" if turn is None else f"turn {turn}"
        return f"--env {self.spec.spec} (seed {self.seed}, {at})"

    def reset(self) -> str:
        answer = self._call(None, lambda: self.env.reset(seed=self.seed))
        if isinstance(answer, tuple) and len(answer) == 2:  # gymnasium: (observation, info)
            answer = answer[0]
        return self._observation(answer, None)

    def step(self, action: str, turn: int) -> Step:
        answer = self._call(turn, lambda: self.env.step(action))
        if not isinstance(answer, tuple) or len(answer) not in (4, 5):
            raise CollapsecheckError(
                f"{self._where(turn)}: step returned {_shape(answer)}; expected (observation, "
                "reward, done, info) or (observation, reward, terminated, truncated, info)"
            )
        observation, reward, *ended, info = answer
        if (
            isinstance(reward, bool)
            or not isinstance(reward, int | float)
            or not math.isfinite(float(reward))
        ):
            raise CollapsecheckError(f"{self._where(turn)}: reward {reward!r} is not a number")
        if info is None:
            info = {}
        if not isinstance(info, dict):
            raise CollapsecheckError(f"{self._where(turn)}: info is {_shape(info)}, not a dict")
        done = any(bool(x) for x in ended)
        return Step(self._observation(observation, turn), float(reward), done, info)

    def _call(self, turn: int | None, call: Callable[[], Any]) -> Any:
        return call_within(self.timeout, self._where(turn), call)

    def _observation(self, value: Any, turn: int | None) -> str:
        if not isinstance(value, str):
            raise CollapsecheckError(
                f"{self._where(turn)}: the observation is {_shape(value)}, not text"
            )
        return value

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            self._call(None, close)


class FactoryGame:
    """One episode of a factory's environment: the context of turn t the system message
    (--system-prompt, else the environment's own), each earlier observation (user) and
    response (assistant) --context-window keeps, then observation t; the action the
    response's action segment."""

    def __init__(self, environment: Environment, window: int, prompts: PromptSettings) -> None:
        self.environment, self.window, self.prompts = environment, window, prompts
        self.seed = environment.seed
        self.system = None if prompts.system_prompt else environment.system_prompt
        self.turns: list[EpisodeTurn] = []
        self.observation = environment.reset()

    def messages(self) -> Messages:
        """The chat of the next turn: the system message, the kept earlier turns, the
        observation now."""
        turns, window = self.turns, self.window
        kept = turns if window == -1 else turns[max(0, len(turns) - (window - 1)) :]
        chat: Messages = [{"role": "system", "content": self.system}] if self.system else []
        for turn in kept:
            chat += [{"role": "user", "content": turn.state},
                     {"role": "assistant", "content": turn.response}]  # fmt: skip
        return [*chat, {"role": "user", "content": self.observation}]

    def context(
        self, tokenizer: Any, settings: PromptSettings, origin: str
    ) -> tuple[Prompt, RenderedPrompt]:
        prompt = Prompt(self.messages(), origin)
        return prompt, render_prompts([prompt], tokenizer, settings)[0]

    def play(self, response: str, located: str, turn: int) -> TurnPlayed:
        """The response's action segment played in the environment."""
        step = self.environment.step(located, turn)
        played = EpisodeTurn(self.observation, response, located, step.reward, kept_info(step.info))
        self.turns.append(played)
        self.observation = step.observation
        success = bool(step.info["success"]) if "success" in step.info else None
        return TurnPlayed(played, step.observation, step.done, success)

    def close(self) -> None:
        self.environment.close()


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"


def kept_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The info an episode's dump keeps: the JSON-able entries (RAGEN's keys as booleans)."""
    kept = {}
    for key, value in info.items():
        if key in INFO_KEYS:
            kept[key] = bool(value)
        elif isinstance(value, str | int | float | bool) or value is None:
            kept[key] = value
    return kept
