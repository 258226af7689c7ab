"""What every environment adapter gives the play loop (`runs.episodes`): a loaded spec
(`EnvironmentSource`) that resolves the seeds, turns and sampling it is played with and makes
one `Game` per episode, the episode's environment as its trainer plays it, and what one turn
did (`TurnPlayed`). A framework's adapter is one module and one line of
`inputs.environments.ADAPTERS`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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


class EnvironmentSource(Protocol):
    """A loaded `--env` spec: its name, the file its cache entries are keyed by and that file's
    digest (with the code's), its key, what it noticed while loading (said before the scan),
    and the games it makes."""

    spec: str
    notes: tuple[str, ...]

    @property
    def origin(self) -> Path: ...

    @property
    def code_sha256(self) -> str: ...

    def key(self) -> dict[str, Any]: ...

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved: ...

    def game(self, seed: int, env: EnvSettings, prompts: PromptSettings) -> Game: ...
