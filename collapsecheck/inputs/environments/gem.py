"""GEM's environments (`--env gem:ID`, SPEC "Every framework's environment"), played as GEM's
own trainers (examples/train_oat) play them: `gem.make(ID, **--env-arg)` wrapped by GEM's own
observation wrappers (`get_wrapper_fns`, default `concat`, the documented game recipe; another
by `--env-arg wrappers=NAMES`), reset at the episode's seed; each turn's prompt built afresh as
one user message, the observation the wrappers built; the whole reply to `step`; the step's
reward; the episode over when it is terminated or truncated, a success where it ended on GEM's
success reward (1.0). The action is the reply's last `\\boxed{...}` as GEM extracts it; the state
is what is new this turn (the environment's own observation and its `suffix`). A bare
FILE.py:FACTORY whose environment is a `gem.core.Env` is played so too."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import io
import logging
from collections.abc import Callable, Iterator, Mapping
from numbers import Real
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
from collapsecheck.inputs.environments.factories import DEFAULT_TURNS, EnvironmentSpec
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

DEFAULT_WRAPPERS = "concat"
# these render the checkpoint's chat template inside the observation (GEM's math and QA recipe,
# played with no prompt template): collapsecheck renders each turn's one user message itself
TEMPLATED = ("concat_chat", "concat_chat_on_reset")
SUCCESS = 1.0  # GEM's LanguageGameReward.success_reward, which its trainers count as solved
STEP_SHAPE = "(observation, reward, terminated, truncated, info)"


@contextlib.contextmanager
def quiet_root() -> Iterator[None]:
    """The root logger as it was: `import gem` calls `logging.basicConfig(level=INFO)`."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@dataclasses.dataclass(frozen=True)
class Gem:
    """What is used of GEM: its registry and `make`, its wrapper factory, how its observation
    wrappers join a text, and how its trainers extract a reply's last `\\boxed{}`."""

    registry: Mapping[str, Any]
    make: Callable[..., Any]
    factory: Any
    join: Callable[[str], str]
    boxed: Callable[[str], str | None]


def import_gem(spec: str) -> Gem:
    """GEM, imported with the console left as it was, or one line naming the extra."""
    with quiet_root():
        gem = import_framework("gem", "gem", spec)
        factory = import_framework("gem.wrappers.wrapper_factory", "gem", spec)
        wrapped = import_framework("gem.wrappers.observation_wrapper", "gem", spec)
        parsing = import_framework("gem.utils.parsing", "gem", spec)
    return Gem(gem.envs.registration.ENV_REGISTRY, gem.make, factory,
               wrapped.maybe_add_new_line, parsing.extract_last_boxed_answer)  # fmt: skip


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"


class Checked:
    """The environment under GEM's wrappers, its answers checked before they see them, and what
    is new each turn kept (`newest`: its own observation and the info's `suffix`, joined as
    GEM's wrappers join them); every other attribute the environment's."""

    def __init__(self, env: Any, join: Callable[[str], str]) -> None:
        self.env, self.join, self.newest = env, join, ""

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not yet set (an object made without __init__)
            raise AttributeError(name)
        return getattr(self.env, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.env)) | set(object.__dir__(self)))

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    def _keep(self, observation: Any, info: Any, call: str) -> None:
        if not isinstance(observation, str):
            raise EnvironmentFault(
                f"{call}: the observation is a {type(observation).__name__}, not text"
            )
        if not isinstance(info, Mapping):
            raise EnvironmentFault(f"{call}: the info is a {type(info).__name__}, not a dict")
        self.newest = self.join(observation) + str(info.get("suffix", ""))

    def reset(self, seed: int | None = None) -> Any:
        answer = self.env.reset(seed=seed)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise EnvironmentFault(f"reset returned {_shape(answer)}, not (observation, info)")
        self._keep(answer[0], answer[1], "reset")
        return answer

    def step(self, action: str) -> Any:
        answer = self.env.step(action)
        if not (isinstance(answer, tuple) and len(answer) == 5):
            raise EnvironmentFault(f"step returned {_shape(answer)}, not {STEP_SHAPE}")
        if not isinstance(answer[1], Real):
            raise EnvironmentFault(
                f"step: the reward is a {type(answer[1]).__name__}, not a number"
            )
        self._keep(answer[0], answer[4], "step")
        return answer


class GemSession(PlainSession):
    """One episode: the environment under GEM's wrappers, its draws from the global generators
    its own (`OwnRandom`); each turn's context only the newest user message."""

    keeps_chat = False

    def __init__(self, gem: Gem, make: Callable[[], Any], wrappers: list, seed: int) -> None:
        self.boxed, self.seed, self.random = gem.boxed, seed, OwnRandom(seed)
        with self.random.drawing():
            self.checked = Checked(make(), gem.join)
            self.env = self.checked
            for wrap in wrappers:
                self.env = wrap(self.env)

    @property
    def limit(self) -> int | None:
        """The environment's own turn limit (`max_turns`), where it has one."""
        turns = getattr(self.checked.unwrapped, "max_turns", None)
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            return None
        return turns

    def start(self) -> Opening:
        with self.random.drawing():
            observation, _ = self.env.reset(seed=self.seed)
        return Opening([{"role": "user", "content": observation}], self.checked.newest)

    def step(self, reply: str, turn: int) -> Answer:
        with self.random.drawing():
            observation, reward, terminated, truncated, info = self.env.step(reply)
        done = bool(terminated or truncated)
        success = (float(reward) == SUCCESS) if done else None
        return Answer(
            reply, [{"role": "user", "content": observation}], float(reward), done,
            self.checked.newest, action=self.boxed(reply) or "", success=success, info=dict(info),
        )  # fmt: skip


def wrapper_fns(gem: Gem, names: str, spec: str) -> list:
    """GEM's wrappers by name, as its trainers get them (what GEM prints of them kept off the
    console); a name GEM does not have, or one that renders a chat template, in one line."""
    wanted = [name for name in names.split(",") if name]
    unknown = [name for name in wanted if name not in gem.factory.WRAPPER_FACTORY]
    if unknown:
        raise CollapsecheckError(
            f"--env {spec}: GEM has no wrapper {unknown[0]!r} "
            f"(it has {', '.join(gem.factory.WRAPPER_FACTORY)})"
        )
    templated = [name for name in wanted if name in TEMPLATED]
    if templated:
        raise CollapsecheckError(
            f"--env {spec}: GEM's {templated[0]} wrapper renders the chat template inside the "
            "observation; collapsecheck renders each turn's one user message with the "
            "checkpoint's template itself: use wrappers=concat or wrappers=concat_with_action"
        )
    with contextlib.redirect_stdout(io.StringIO()):
        return list(gem.factory.get_wrapper_fns(",".join(wanted)))


def played_with(names: str) -> str:
    """How the wrappers are named in the note said before the scan."""
    wanted = [name for name in names.split(",") if name]
    if not wanted:
        return "no observation wrapper (each turn only the newest observation)"
    return f"GEM's {' and '.join(wanted)} wrapper{'s' if len(wanted) > 1 else ''}"


def source_of(entry: Any) -> Path:
    """The file of a registered environment's class (an entry point "module:Class" or the
    class itself)."""
    if isinstance(entry, str):
        return module_file(entry.partition(":")[0])
    return Path(inspect.getfile(entry)).resolve()


def own_turns(loaded: FrameworkSpec, first: EnvSettings) -> int:
    """The environment's own turn limit at the first seed, else collapsecheck's default."""
    game = loaded.game(0, first, None)
    limit = game.session.limit
    game.close()
    return DEFAULT_TURNS if limit is None else limit


def played(
    spec: str, gem: Gem, make: Callable[[int], Any], names: str, files: tuple[Path, ...],
    reload: tuple[Callable[..., Any], tuple[Any, ...]], timeout: float,
) -> FrameworkSpec:  # fmt: skip
    """The spec of an environment `make(seed)` makes, played under GEM's wrappers `names`;
    checked at the first seed (its turn limit, whether it follows the seed)."""
    wrappers = wrapper_fns(gem, names, spec)

    def open_session(seed: int, env: EnvSettings) -> GemSession:
        return GemSession(gem, lambda: make(seed), wrappers, seed)

    loaded = FrameworkSpec(spec, "GEM", open_session, files, package_version("gem-llm"), reload)
    first = EnvSettings(env=spec, env_seed=0, env_timeout=timeout)
    loaded = dataclasses.replace(loaded, turns=own_turns(loaded, first))
    note = f"--env {spec}: played with {played_with(names)}"
    return loaded.noting((note, *seed_note(loaded, first)))


def load_gem(name: str, loading: Loading) -> FrameworkSpec:
    """`--env gem:ID`: the ID looked up in GEM's registry (`gem:FILE.py:FACTORY`: a factory's
    GEM environment), so a missing one says so before the model."""
    spec = f"gem:{name}"
    refuse_unused(spec, loading, ("--env-arg",),
                  "--env-arg goes to gem.make, and wrappers=NAMES to GEM's wrappers")  # fmt: skip
    gem = import_gem(spec)
    kwargs = dict(loading.kwargs)
    names = str(kwargs.pop("wrappers", DEFAULT_WRAPPERS))
    reload = (load_gem, (name, Loading(dict(loading.kwargs), timeout=loading.timeout)))
    entry = gem.registry.get(name)
    if entry is not None:
        files = (source_of(entry.entry_point),)
        return played(spec, gem, lambda seed: gem.make(name, **kwargs), names, files, reload,
                      loading.timeout)  # fmt: skip
    factory = claimed_factory(
        spec, name, kwargs, loading.timeout, recognises, "a GEM environment (a gem.core.Env)"
    )
    if factory is not None:
        return played(spec, gem, factory.make, names, (factory.origin,), reload, loading.timeout)
    near = difflib.get_close_matches(name, list(gem.registry), n=3)
    hint = f"did you mean {' or '.join(near)}?" if near else "gem.print_envs() lists them"
    raise CollapsecheckError(f"--env {spec}: GEM has no environment {name!r} ({hint})")


def recognises(environment: Any) -> bool:
    """A GEM environment: its class is one of GEM's or derives from one (`gem.core.Env`)."""
    return made_by(environment, "gem")


def adopt(factory: EnvironmentSpec, loading: Loading) -> FrameworkSpec:
    """A bare FILE.py:FACTORY's GEM environment, played under GEM's default wrapper (its
    --env-arg pairs went to the factory)."""
    refuse_unused(factory.spec, loading, ("--env-arg",), "a GEM environment from its factory")
    gem = import_gem(factory.spec)
    reload = (adopt, (factory, Loading(dict(loading.kwargs), timeout=loading.timeout)))
    return played(factory.spec, gem, factory.make, DEFAULT_WRAPPERS, (factory.origin,), reload,
                  loading.timeout)  # fmt: skip


GEM = Adapter(load_gem, recognises, adopt)
