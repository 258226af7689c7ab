"""OpenEnv's environments (`--env openenv:FILE.py:CLASS` or `openenv:package.module:CLASS`, SPEC
"Every framework's environment"), run in this process as OpenEnv's server runs them (no server,
no container): the class built with the --env-arg pairs, `reset(seed=s)` and `step(Action)`
each answering an Observation (its `done`, `reward`, `metadata`), Python's and numpy's global
generators the episode's own, seeded at s. The whole reply is the Action's one required text
field; the first user message is reset's observation as text, and each step's observation a
new user message. A bare FILE.py:FACTORY whose object is an OpenEnv Environment is played so."""

from __future__ import annotations

import inspect
import json
import math
import typing
from dataclasses import dataclass
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import EnvironmentFault, call_within
from collapsecheck.inputs.environments.chat import (
    Answer,
    Opening,
    OwnRandom,
    PlainSession,
)
from collapsecheck.inputs.environments.factories import EnvironmentSpec
from collapsecheck.inputs.environments.framework import (
    FrameworkSpec,
    import_framework,
    made_by,
    named_factory,
    package_version,
    seed_note,
)
from collapsecheck.inputs.environments.protocol import Adapter, Loading, refuse_unused
from collapsecheck.settings import EnvSettings

OBSERVATION_OWN = {"done", "reward", "metadata"}  # Observation's own fields: not its text
WRAP = "wrap it as a TRL environment_factory class, as TRL's OpenEnv examples do"


def observation_text(observation: Any) -> str:
    """An Observation as text: where it has a non-empty `messages` list, the newest message's
    content; else its one field (beside done, reward, metadata) where that is text; else the
    JSON of those fields."""
    try:
        fields = observation.model_dump(mode="json", exclude=OBSERVATION_OWN)
    except ValueError as err:  # pydantic's serialisation error
        raise EnvironmentFault(f"its {type(observation).__name__} is not JSON ({err})") from None
    messages = fields.get("messages")
    if isinstance(messages, list) and messages:
        newest = messages[-1]
        content = newest.get("content") if isinstance(newest, dict) else None
        if not isinstance(content, str):
            raise EnvironmentFault("the newest of the observation's messages has no text content")
        return content
    if len(fields) == 1 and isinstance(only := next(iter(fields.values())), str):
        return only
    return json.dumps(fields, ensure_ascii=False)


@dataclass(frozen=True)
class ActionShape:
    """The environment's Action class and the one text field the whole reply goes to."""

    cls: type
    field: str

    def of(self, reply: str) -> Any:
        return self.cls(**{self.field: reply})


class OpenEnvSession(PlainSession):
    """One episode: a fresh environment, reset at the seed, its draws from the global
    generators its own (`OwnRandom`)."""

    def __init__(self, core: Any, factory: EnvironmentSpec, action: ActionShape, seed: int) -> None:
        self.core, self.action, self.seed, self.random = core, action, seed, OwnRandom(seed)
        with self.random.drawing():
            self.env = factory.factory(**factory.kwargs)

    def _observed(self, answer: Any, call: str) -> Any:
        if not isinstance(answer, self.core.Observation):
            raise EnvironmentFault(
                f"{call} returned {type(answer).__name__}, not an OpenEnv Observation"
            )
        return answer

    def start(self) -> Opening:
        with self.random.drawing():
            observation = self._observed(self.env.reset(seed=self.seed), "reset")
        text = observation_text(observation)
        return Opening([{"role": "user", "content": text}], text)

    def step(self, reply: str, turn: int) -> Answer:
        with self.random.drawing():
            observation = self._observed(self.env.step(self.action.of(reply)), "step")
        text, metadata = observation_text(observation), dict(observation.metadata)
        success = metadata.get("success")
        return Answer(
            reply, [{"role": "user", "content": text}], _reward(observation.reward),
            bool(observation.done), text, success=success if isinstance(success, bool) else None,
            info=metadata,
        )  # fmt: skip

    def close(self) -> None:
        with self.random.drawing():
            self.env.close()


def _reward(reward: Any) -> float:
    if reward is None:
        return 0.0
    if not math.isfinite(float(reward)):
        raise EnvironmentFault(f"reward {reward!r} is not a finite number")
    return float(reward)


def action_class(core: Any, env_type: type) -> type | None:
    """The environment's Action class: step's annotation of its action, else the first
    parameter of the `Environment[Action, Observation, State]` it subclasses (None: neither
    names a class of its own)."""
    step = env_type.step
    names = list(inspect.signature(step).parameters)
    try:
        hints = typing.get_type_hints(step)
    except (NameError, TypeError):  # an annotation only a type checker can read
        hints = {}
    found = [hints.get(names[1]) if len(names) > 1 else None]
    for base in env_type.__mro__:
        for parameterised in getattr(base, "__orig_bases__", ()):
            origin, args = typing.get_origin(parameterised), typing.get_args(parameterised)
            if isinstance(origin, type) and issubclass(origin, core.Environment) and args:
                found.append(args[0])
    own = [c for c in found if isinstance(c, type) and issubclass(c, core.Action)]
    return next((c for c in own if c is not core.Action), None)


def action_shape(spec: str, core: Any, env_type: type) -> ActionShape:
    """Where the reply goes, or one line saying why this environment's Action cannot take it."""
    name = env_type.__name__
    if issubclass(env_type, core.MCPEnvironment):
        raise CollapsecheckError(
            f"--env {spec}: {name} is an MCP environment, its actions tool calls ({WRAP})"
        )
    cls = action_class(core, env_type)
    if cls is None:
        raise CollapsecheckError(
            f"--env {spec}: {name} names no Action class of its own (annotate step's action, "
            "or subclass Environment[YourAction, YourObservation, State])"
        )
    fields = cls.model_fields
    required = [n for n, f in fields.items() if f.is_required()]
    if len(required) != 1 or fields[required[0]].annotation is not str:
        own = [n for n in fields if n not in core.Action.model_fields]
        shown = ", ".join(f"{n}: {_type_name(fields[n].annotation)}" for n in own)
        raise CollapsecheckError(
            f"--env {spec}: {name}'s action {cls.__name__} ({shown}) does not have exactly one "
            f"required text field for the whole reply ({WRAP})"
        )
    return ActionShape(cls, required[0])


def _type_name(annotation: Any) -> str:
    named = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return named.replace("typing.", "")


def _type_of(spec: str, env: Any, timeout: float) -> type:
    """The type of an environment made to be looked at, which is then closed."""
    close = getattr(env, "close", None)
    if callable(close):
        call_within(timeout, f"--env {spec} (seed 0, made)", close)
    return type(env)


def opened(spec: str, factory: EnvironmentSpec, timeout: float) -> FrameworkSpec:
    """The factory's environment played as OpenEnv's (one made to read its classes); how the
    spec is pickled (the factory as its SPEC) and loaded again where it is unpickled."""
    import_framework("openenv.core", "openenv", spec)
    made = call_within(timeout, f"--env {spec} (seed 0, made)", lambda: factory.make(0))
    return _played(spec, factory, _type_of(spec, made, timeout), timeout)


def _played(spec: str, factory: EnvironmentSpec, env_type: type, timeout: float) -> FrameworkSpec:
    core = import_framework("openenv.core", "openenv", spec)
    if not issubclass(env_type, core.Environment):
        raise CollapsecheckError(
            f"--env {spec}: the factory makes a {env_type.__name__}, not an OpenEnv Environment"
        )
    action = action_shape(spec, core, env_type)

    def open_session(seed: int, env: EnvSettings) -> OpenEnvSession:
        return OpenEnvSession(core, factory, action, seed)

    loaded = FrameworkSpec(
        spec, "OpenEnv", open_session, (factory.origin,), package_version("openenv-core"),
        (opened, (spec, factory, timeout)),
    )  # fmt: skip
    settings = EnvSettings(env=spec, env_seed=0, env_timeout=timeout)
    return loaded.noting(seed_note(loaded, settings))


def load_openenv(name: str, loading: Loading) -> FrameworkSpec:
    """`--env openenv:FILE.py:CLASS` (or `package.module:CLASS`): OpenEnv imported first (so
    its absence is one line naming the extra), then the class loaded, made once and checked
    before the model loads."""
    spec = f"openenv:{name}"
    refuse_unused(spec, loading, ("--env-arg",), "--env-arg goes to the class's constructor")
    import_framework("openenv.core", "openenv", spec)
    factory, made = named_factory(spec, name, loading.kwargs, loading.timeout)
    return _played(spec, factory, _type_of(spec, made, loading.timeout), loading.timeout)


def is_openenv(environment: Any) -> bool:
    """Whether an object is an OpenEnv Environment, by its classes' modules (OpenEnv is not
    imported to ask)."""
    return made_by(environment, "openenv")


def adopt_openenv(factory: EnvironmentSpec, loading: Loading) -> FrameworkSpec:
    refuse_unused(factory.spec, loading, ("--env-arg",), "an OpenEnv Environment from its factory")
    return opened(factory.spec, factory, loading.timeout)


OPENENV = Adapter(load_openenv, is_openenv, adopt_openenv)
