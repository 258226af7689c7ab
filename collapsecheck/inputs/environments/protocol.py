"""What every environment adapter gives the play loop (`runs.episodes`): a loaded spec
(`EnvironmentSource`) that resolves the seeds, turns and sampling it is played with and makes
one `Game` per episode, the episode's environment as its trainer plays it, and what one turn
did (`TurnPlayed`). A framework's adapter is one module and one line of
`inputs.environments.ADAPTERS`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.episodes import EpisodeTurn
from collapsecheck.inputs.prompts import Prompt, RenderedPrompt

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, PromptSettings, SamplingSettings


@dataclass(frozen=True)
class Resolved:
    """The settings a spec is played with: the flags where given, else what the framework's
    own configuration says (`sources`: each value a configuration gave, with where from)."""

    env: EnvSettings
    sampling: SamplingSettings
    sources: dict[str, str]


@dataclass(frozen=True)
class TurnPlayed:
    """One turn as the episode records it, the observation after it, whether the episode
    ended, and whether it succeeded (None: the environment has not said)."""

    turn: EpisodeTurn
    observation: str
    done: bool
    success: bool | None


class Game(Protocol):
    """One episode: its seed, the observation the policy sees now, the turn's prompt as the
    trainer renders it, the reply played as the trainer plays it."""

    seed: int

    @property
    def observation(self) -> str: ...

    def context(
        self, tokenizer: Any, settings: PromptSettings, origin: str
    ) -> tuple[Prompt, RenderedPrompt]: ...

    def play(self, response: str, located: str, turn: int) -> TurnPlayed: ...

    def close(self) -> None: ...


class LoadedSpec(Protocol):
    """What every loaded `--env` spec has: its name, the file its cache entries are keyed by
    and that file's digest (with the code's), its key, what it noticed while loading (said
    before the scan), and the settings it is played with."""

    spec: str
    notes: tuple[str, ...]

    @property
    def origin(self) -> Path: ...

    @property
    def code_sha256(self) -> str: ...

    def key(self) -> dict[str, Any]: ...

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved: ...


class EnvironmentSource(LoadedSpec, Protocol):
    """A loaded `--env` spec whose episodes collapsecheck plays: the games it makes."""

    def game(self, seed: int, env: EnvSettings, prompts: PromptSettings) -> Game: ...


@dataclass(frozen=True)
class EpisodeEnd:
    """What an adapter whose environment plays itself (verifiers) knows of one episode that the
    endpoint's recording does not: its start state and seed, each turn's reward (None: not
    said), the state after its last turn, whether it ended and succeeded."""

    start: int
    seed: int
    rewards: tuple[float | None, ...]
    final_state: str | None = None
    done: bool | None = None
    success: bool | None = None


@dataclass(frozen=True)
class Driven:
    """What a harness that drove the endpoint left beside its recording: each named episode's
    end (by the name its requests carried), and what the adapter noticed while it ran."""

    ends: Mapping[str, EpisodeEnd] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


class DrivenSource(LoadedSpec, Protocol):
    """A loaded `--env` spec whose harness (a command, verifiers' rollouts) drives the model
    itself through collapsecheck's endpoint (SPEC "Agents behind an OpenAI client"): instead of
    games it runs the harness against `endpoint` (its ASGI app and recorder,
    `inputs.environments.endpoint`) until it is done (`env`, `sampling`: resolved, the start
    states, episodes and token limit it plays with)."""

    def drive(self, endpoint: Any, env: EnvSettings, sampling: SamplingSettings) -> Driven: ...


@dataclass(frozen=True)
class Loading:
    """What a SPEC is loaded with: the --env-arg pairs, the checkpoint (beside which a
    framework's saved config is looked for), --env-config, a dataset whose rows are the start
    states (--prompts) and --env-timeout. An adapter refuses in one line what it cannot use."""

    kwargs: Mapping[str, Any] = field(default_factory=dict)
    near: Path | None = None
    config: Path | None = None
    dataset: Path | None = None
    timeout: float = 60.0


@dataclass(frozen=True)
class Adapter:
    """A framework's adapter: `load(NAME, loading)` for `--env PREFIX:NAME`; where a bare
    FILE.py:FACTORY's environment can be its framework's, `recognises(environment)` says so by
    what the object has and `adopt(factory_spec, loading)` plays it so."""

    load: Callable[[str, Loading], EnvironmentSource | DrivenSource]
    recognises: Callable[[Any], bool] | None = None
    adopt: Callable[[Any, Loading], EnvironmentSource] | None = None


def refuse_unused(spec: str, loading: Loading, takes: tuple[str, ...], why: str) -> None:
    """One line where the SPEC is given an option its adapter does not use (`takes`: the ones
    it does, of --env-arg, --env-config and --prompts; `why`: how it is built instead)."""
    given = {
        "--env-arg": bool(loading.kwargs),
        "--env-config": loading.config is not None,
        "--prompts": loading.dataset is not None,
    }
    unused = [flag for flag, on in given.items() if on and flag not in takes]
    if unused:
        verb = "does" if len(unused) == 1 else "do"
        raise CollapsecheckError(f"--env {spec}: {', '.join(unused)} {verb} not go with it ({why})")
