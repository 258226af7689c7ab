"""Environments whose trainers play a chat (SkyRL-gym, TRL's tool environments, TextArena, GEM,
OpenEnv, verifiers; SPEC "Every framework's environment"): the whole reply goes to the
environment, and what it returns is appended to the chat in the roles its trainer gives it;
each turn's context is that chat rendered by the checkpoint's chat template.

A framework's adapter gives a `Session` per episode (its environment, reset at the seed; one
reply played as its trainer plays it) and a `FrameworkSpec` (how sessions are opened, the code
the cache is keyed by). Every call into the environment goes through `calls.call_within`."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.metadata
import inspect
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import call_within
from collapsecheck.inputs.environments.factories import (
    DEFAULT_TURNS,
    EnvironmentSpec,
    kept_info,
    load_factory,
)
from collapsecheck.inputs.environments.protocol import Loading, Resolved, TurnPlayed
from collapsecheck.inputs.episodes import EpisodeTurn
from collapsecheck.inputs.prompts import Messages, Prompt, RenderedPrompt, render_prompt
from collapsecheck.settings import DEFAULT_STARTS

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, PromptSettings, SamplingSettings


@dataclass(frozen=True)
class Opening:
    """An episode's start: the first prompt's chat, the state it shows (SPEC: the newest
    observation) and the tools the chat template is given (TRL's; empty elsewhere)."""

    messages: Messages
    state: str
    tools: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Answer:
    """What the environment did with one reply: the reply as it was given it (`given`: the
    whole reply, or the tool calls), the messages it returned as the trainer appends them, the
    reward, whether the episode ended, the newest observation (the state), the action it
    parsed (None: the reply's action segment stands for it), success where it says, its info;
    `assistant`: the reply's message as the trainer records it (None: the reply as text)."""

    given: str
    messages: Messages
    reward: float
    done: bool
    state: str
    action: str | None = None
    success: bool | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    assistant: dict[str, Any] | None = None


class Session(Protocol):
    """One episode's environment as a framework's trainer drives it. `keeps_chat`: each turn's
    context is the whole chat (False: only the newest observation, as GEM's trainers rebuild
    the prompt each turn); `attach` gives it the checkpoint's tokenizer before the first turn
    (TRL parses tool calls with it)."""

    keeps_chat: bool

    def attach(self, tokenizer: Any) -> None: ...

    def start(self) -> Opening: ...

    def step(self, reply: str, turn: int) -> Answer: ...

    def close(self) -> None: ...


class PlainSession:
    """What most sessions share: the whole chat kept, no tokenizer needed, nothing to close."""

    keeps_chat = True

    def attach(self, tokenizer: Any) -> None:
        return None

    def close(self) -> None:
        return None


class OwnRandom:
    """An episode's own draws from Python's and numpy's global generators, which TextArena's
    and GEM's games seed at reset and draw from while they play: swapped in around each call
    into the episode's environment, so episodes played side by side draw as each would alone
    (SPEC "Every framework's environment")."""

    def __init__(self, seed: int) -> None:
        import numpy as np

        saved = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.state = random.getstate(), np.random.get_state()
        random.setstate(saved[0])
        np.random.set_state(saved[1])

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        import numpy as np

        saved = random.getstate(), np.random.get_state()
        random.setstate(self.state[0])
        np.random.set_state(self.state[1])
        try:
            yield
        finally:
            self.state = random.getstate(), np.random.get_state()
            random.setstate(saved[0])
            np.random.set_state(saved[1])


class ChatGame:
    """One episode of a chat-playing framework (`protocol.Game`): the chat so far, rendered
    whole each turn with --system-prompt (where given) and --chat-template-kwargs."""

    def __init__(self, where: str, seed: int, session: Session, timeout: float) -> None:
        """`where`: "--env SPEC (Framework", which each call's fault completes."""
        self.where, self.seed, self.session, self.timeout = where, seed, session, timeout
        opening = self._call(None, session.start)
        self.chat: Messages = list(opening.messages)
        self.tools = [dict(tool) for tool in opening.tools]
        self.observation = opening.state
        self.attached = False

    def _call(self, turn: int | None, call: Callable[[], Any]) -> Any:
        at = "reset" if turn is None else f"turn {turn}"
        return call_within(self.timeout, f"{self.where}, seed {self.seed}, {at})", call)

    def context(
        self, tokenizer: Any, settings: PromptSettings, origin: str
    ) -> tuple[Prompt, RenderedPrompt]:
        if not self.attached:
            self._call(None, lambda: self.session.attach(tokenizer))
            self.attached = True
        chat = self.chat if self.session.keeps_chat else self.chat[-1:]
        prompt = Prompt([dict(m) for m in chat], origin)
        kwargs = dict(settings.chat_template_kwargs or {})
        if self.tools:
            kwargs["tools"] = self.tools
        rendered = render_prompt(
            prompt, tokenizer, system_prompt=settings.system_prompt, template_kwargs=kwargs
        )
        return prompt, rendered

    def play(self, response: str, located: str, turn: int) -> TurnPlayed:
        """The whole reply given to the environment; what it returned appended to the chat."""
        answer: Answer = self._call(turn, lambda: self.session.step(response, turn))
        action = located if answer.action is None else answer.action
        played = EpisodeTurn(
            self.observation, response, action, answer.reward, kept_info(answer.info),
            given=answer.given, returned=tuple(dict(m) for m in answer.messages),
        )  # fmt: skip
        reply = answer.assistant or {"role": "assistant", "content": response}
        self.chat += [reply, *answer.messages]
        self.observation = answer.state
        return TurnPlayed(played, answer.state, answer.done, answer.success)

    def close(self) -> None:
        self._call(None, self.session.close)


def package_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def import_framework(module: str, extra: str, spec: str) -> Any:
    """The framework's package, or one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] != module.split(".")[0]:
            raise CollapsecheckError(
                f"--env {spec}: {module} needs {err.name!r}, which is not installed "
                f"(pip install 'collapsecheck[{extra}]')"
            ) from None
        raise CollapsecheckError(
            f"--env {spec}: {module} is not installed (pip install 'collapsecheck[{extra}]')"
        ) from None


def module_file(name: str) -> Path:
    """The file of the module an environment's code is in, which keys the cache."""
    return Path(inspect.getfile(importlib.import_module(name))).resolve()


def claimed_factory(
    spec: str, name: str, loading: Loading, recognises: Callable[[Any], bool], framework: str
) -> EnvironmentSpec | None:
    """`PREFIX:FILE.py:FACTORY` (`name` the part after the prefix): the factory, named by the
    whole spec, whose object must be the framework's; None where `name` names no file."""
    if not name.rpartition(":")[0].endswith(".py"):
        return None
    factory, made = load_factory(name, loading.kwargs, loading.timeout)
    if not recognises(made):
        raise CollapsecheckError(
            f"--env {spec}: the factory makes a {type(made).__name__}, not a {framework} "
            "environment"
        )
    return dataclasses.replace(factory, spec=spec)


@dataclass(frozen=True, eq=False)
class FrameworkSpec:
    """A loaded `FRAMEWORK:ID` (or a factory whose object a framework recognises): how an
    episode's session is opened at a seed, the files its code and data came from (their
    digests key the results cache with the framework's version), what loading noticed, and
    how it is loaded again in another process (`reload`: a function and its arguments)."""

    spec: str
    framework: str
    open_session: Callable[[int, EnvSettings], Session]
    files: tuple[Path, ...]
    version: str
    reload: tuple[Callable[..., Any], tuple[Any, ...]]
    notes: tuple[str, ...] = ()
    turns: int = DEFAULT_TURNS
    starts: int | None = None  # a dataset's rows: the start states there are

    @property
    def origin(self) -> Path:
        return self.files[0]

    @property
    def code_sha256(self) -> str:
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def key(self) -> dict[str, Any]:
        return {"env": self.spec, "framework": f"{self.framework} {self.version}",
                "env_files": [str(p) for p in self.files[1:]]}  # fmt: skip

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved:
        """The flags where given, else seeds from 0 and the adapter's turns; a dataset's start
        states are its rows (SPEC "Every framework's environment")."""
        if env.context_window != -1:
            raise CollapsecheckError(
                f"--context-window goes with FILE.py:FACTORY environments: --env {self.spec} "
                f"is played as {self.framework}'s trainer plays it, the whole chat each turn"
            )
        first = 0 if env.env_seed is None else env.env_seed
        turns = self.turns if env.max_turns is None else env.max_turns
        played = dataclasses.replace(env, env_seed=first, max_turns=turns)
        if self.starts is None:
            return Resolved(played, sampling, {})
        wanted = sampling.num_prompts or min(self.starts - first, DEFAULT_STARTS)
        if first + wanted > self.starts or first < 0:
            raise CollapsecheckError(
                f"--env {self.spec}: --env-seed {first} and -n {wanted} ask for rows "
                f"{first}..{first + wanted - 1} of a dataset of {self.starts}"
            )
        sources = {} if sampling.num_prompts else {"num_prompts": f"{wanted} (the dataset's rows)"}
        return Resolved(played, dataclasses.replace(sampling, num_prompts=wanted), sources)

    def game(self, seed: int, env: EnvSettings, prompts: PromptSettings) -> ChatGame:
        where = f"--env {self.spec} ({self.framework}"
        session = call_within(env.env_timeout, f"{where}, seed {seed}, reset)",
                              lambda: self.open_session(seed, env))  # fmt: skip
        return ChatGame(where, seed, session, env.env_timeout)

    def noting(self, notes: tuple[str, ...]) -> FrameworkSpec:
        return dataclasses.replace(self, notes=self.notes + notes)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """Pickled as how it was loaded, loaded again where it is unpickled (a Ray task)."""
        return self.reload


def seed_note(spec: FrameworkSpec, env: EnvSettings) -> tuple[str, ...]:
    """Said once where two sessions opened at one seed start differently: the framework's
    reset does not follow the seed (SPEC "Every framework's environment")."""
    openings = []
    for _ in range(2):
        game = spec.game(env.env_seed or 0, env, None)
        openings.append((game.chat, game.observation))
        game.close()
    if openings[0] == openings[1]:
        return ()
    return (
        f"--env {spec.spec}: two {spec.framework} environments reset at seed {env.env_seed or 0} "
        "start differently: its episodes are not reproducible by seed (a second scan plays "
        "other start states)",
    )
