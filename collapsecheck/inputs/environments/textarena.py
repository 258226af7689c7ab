"""TextArena's games (`--env textarena:ID`, SPEC "Every framework's environment"), played as
verifiers' TextArena task set plays them: `ta.make(ID)` with the game's default wrappers, reset
with one player at the episode's seed; the first user message the whole first observation, the
whole reply (stripped) to `step`, and after each step the newest message of the game's log (the
text after its last `[GAME]`) as the next user message; the game's reward for player 0 when it
ends. A game for several players is refused in one line. A bare FILE.py:FACTORY whose object
is a TextArena game is played so too."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import EnvironmentFault
from collapsecheck.inputs.environments.chat import (
    Answer,
    Opening,
    OwnRandom,
    PlainSession,
)
from collapsecheck.inputs.environments.factories import EnvironmentSpec
from collapsecheck.inputs.environments.framework import (
    FrameworkSpec,
    claimed_factory,
    import_framework,
    made_by,
    module_file,
    package_version,
    seed_note,
)
from collapsecheck.inputs.environments.protocol import Adapter, Loading, refuse_unused
from collapsecheck.settings import EnvSettings

GAME_MARK = "[GAME]"


def newest_message(log: str) -> str:
    """The newest message of a game's log: the text after its last `[GAME]` (the whole log
    where it has none)."""
    return log.rpartition(GAME_MARK)[2].strip() if GAME_MARK in log else log.strip()


class TextArenaSession(PlainSession):
    """One game, its draws from the global generators its own (`OwnRandom`)."""

    def __init__(self, ta: Any, game: str, make: Callable[[], Any], seed: int) -> None:
        self.ta, self.game, self.random = ta, game, OwnRandom(seed)
        with self.random.drawing():
            self.env = make()
            try:
                self.env.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError) as err:
                raise EnvironmentFault(_not_single(game, str(err))) from None
        if not isinstance(self.env.state, ta.SinglePlayerState):
            raise EnvironmentFault(
                _not_single(game, f"its state is {type(self.env.state).__name__}")
            )

    def _log(self) -> str:
        answer = self.env.get_observation()
        if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], str)):
            raise EnvironmentFault("get_observation did not return (player, text)")
        return answer[1]

    def start(self) -> Opening:
        with self.random.drawing():
            log = self._log()
        return Opening([{"role": "user", "content": log}], newest_message(log))

    def step(self, reply: str, turn: int) -> Answer:
        given = reply.strip()
        with self.random.drawing():
            answer = self.env.step(given)
            if not (isinstance(answer, tuple) and len(answer) == 2):
                raise EnvironmentFault("step did not return (done, info)")
            done, info = answer
            if not done:
                state = newest_message(self._log())
                return Answer(given, [{"role": "user", "content": state}], 0.0, False, state,
                              info=dict(info or {}))  # fmt: skip
            rewards, game_info = self.env.close()
        reward = float(rewards.get(0, 0.0))
        ended = dict(game_info.get(0, {})) if isinstance(game_info, dict) else {}
        state = str(ended.get("reason", ""))
        return Answer(given, [], reward, True, state, success=reward >= 1.0, info=ended)


def _not_single(game: str, why: str) -> str:
    return f"TextArena's {game} is not a single-player game ({why}): only those are played"


def load_textarena(game: str, loading: Loading) -> FrameworkSpec:
    """`--env textarena:ID`: the game looked up in TextArena's registry and reset once at the
    first seed, so a missing game or one for several players says so before the model
    (`textarena:FILE.py:FACTORY`: a factory's game)."""
    spec = f"textarena:{game}"
    refuse_unused(spec, loading, ("--env-arg",), "--env-arg goes to ta.make")
    ta = import_framework("textarena", "textarena", spec)
    factory = claimed_factory(
        spec, game, loading.kwargs, loading.timeout, recognises, "a TextArena environment"
    )
    if factory is not None:
        return adopt(factory, loading)
    entry = ta.envs.registration.ENV_REGISTRY.get(game)
    if entry is None:
        raise CollapsecheckError(f"--env {spec}: TextArena has no game {game!r}")
    kwargs = dict(loading.kwargs)
    source = module_file(entry.entry_point.partition(":")[0])
    reload = (load_textarena, (game, Loading(kwargs, timeout=loading.timeout)))
    return played(spec, ta, game, lambda: ta.make(game, **kwargs), source, reload, loading)


def played(
    spec: str, ta: Any, game: str, make: Callable[[], Any], source: Path,
    reload: tuple[Callable[..., Any], tuple[Any, ...]], loading: Loading,
) -> FrameworkSpec:  # fmt: skip
    """The spec whose episodes are TextArena games `make` makes, checked at the first seed."""

    def open_session(seed: int, env: EnvSettings) -> TextArenaSession:
        return TextArenaSession(ta, game, make, seed)

    loaded = FrameworkSpec(
        spec, "TextArena", open_session, (source,), package_version("textarena"), reload
    )
    first = EnvSettings(env=spec, env_seed=0, env_timeout=loading.timeout)
    return loaded.noting(seed_note(loaded, first))


def recognises(environment: Any) -> bool:
    """A TextArena game (wrapped or not): its classes are TextArena's or derive from them."""
    return made_by(environment, "textarena")


def adopt(factory: EnvironmentSpec, loading: Loading) -> FrameworkSpec:
    """A bare FILE.py:FACTORY that makes a TextArena game (`ta.make(...)`, wrapped as the user
    likes), played as `textarena:ID` is (its --env-arg pairs went to the factory)."""
    refuse_unused(factory.spec, loading, ("--env-arg",), "a TextArena game from its factory")
    ta = import_framework("textarena", "textarena", factory.spec)
    reload = (adopt, (factory, Loading(dict(loading.kwargs), timeout=loading.timeout)))
    make = functools.partial(factory.factory, **factory.kwargs)
    return played(factory.spec, ta, factory.spec, make, factory.origin, reload, loading)


TEXTARENA = Adapter(load_textarena, recognises, adopt)
