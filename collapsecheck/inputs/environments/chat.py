"""Environments whose trainers play a chat (SkyRL-gym, TRL's tool environments, TextArena, GEM,
OpenEnv; SPEC "Every framework's environment"): the whole reply goes to the environment, and
what it returns is appended to the chat in the roles its trainer gives it; each turn's context
is that chat rendered by the checkpoint's chat template.

A framework's adapter gives a `Session` per episode (its environment, reset at the seed; one
reply played as its trainer plays it), which `ChatGame` plays; `framework.FrameworkSpec` opens
the sessions. Every call into the environment goes through `calls.call_within`."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from collapsecheck.inputs.environments.calls import call_within
from collapsecheck.inputs.environments.factories import kept_info
from collapsecheck.inputs.environments.protocol import TurnPlayed
from collapsecheck.inputs.episodes import EpisodeTurn
from collapsecheck.inputs.prompts import Messages, Prompt, RenderedPrompt, render_prompt

if TYPE_CHECKING:
    from collapsecheck.settings import PromptSettings


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


def is_text_chat(value: Any) -> bool:
    """A list of messages with a string role and a string content each."""
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )


class Session(Protocol):
    """One episode's environment as a framework's trainer drives it. `keeps_chat`: each turn's
    context is the whole chat (False: only the newest observation, as GEM's trainers rebuild
    the prompt each turn); `attach` gives it the checkpoint's tokenizer before the first turn
    and answers the chat template arguments its trainer renders with (TRL parses tool calls
    with the tokenizer, and swaps in its training template where the checkpoint's is not
    prefix-preserving); `rendered` tells it each turn's context (TRL's parser reads the
    context a reply continues)."""

    keeps_chat: bool

    def attach(self, tokenizer: Any) -> Mapping[str, Any]: ...

    def rendered(self, context: RenderedPrompt) -> None: ...

    def start(self) -> Opening: ...

    def step(self, reply: str, turn: int) -> Answer: ...

    def close(self) -> None: ...


class PlainSession:
    """What most sessions share: the whole chat kept, rendered as the flags say, no tokenizer
    or context needed, nothing to close."""

    keeps_chat = True

    def attach(self, tokenizer: Any) -> Mapping[str, Any]:
        return {}

    def rendered(self, context: RenderedPrompt) -> None:
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
        self.template: dict[str, Any] | None = None  # the session's, once it has the tokenizer

    def _call(self, turn: int | None, call: Callable[[], Any]) -> Any:
        at = "reset" if turn is None else f"turn {turn}"
        return call_within(self.timeout, f"{self.where}, seed {self.seed}, {at})", call)

    def context(
        self, tokenizer: Any, settings: PromptSettings, origin: str
    ) -> tuple[Prompt, RenderedPrompt]:
        if self.template is None:
            self.template = dict(self._call(None, lambda: self.session.attach(tokenizer)))
        chat = self.chat if self.session.keeps_chat else self.chat[-1:]
        prompt = Prompt([dict(m) for m in chat], origin)
        kwargs = {**(settings.chat_template_kwargs or {}), **self.template}
        if self.tools:
            kwargs["tools"] = self.tools
        rendered = render_prompt(
            prompt, tokenizer, system_prompt=settings.system_prompt, template_kwargs=kwargs
        )
        self.session.rendered(rendered)
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
