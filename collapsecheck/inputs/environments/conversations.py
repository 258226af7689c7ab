"""Episodes assembled from the endpoint's recording (SPEC "Agents behind an OpenAI client"): a
request whose messages are an earlier request's messages, then one assistant message (that
request's reply as the harness wrote it back, perhaps rewritten: a suffix added, tool calls
turned into text), then whatever followed it, continues that earlier request's episode; among
twins with the same messages, the one whose reply is closest to that assistant message. Any
other request starts an episode. An adapter that knows its episodes names them on each request
instead (`EPISODE_HEADER`). A turn is one request: the model's own reply, and its state, the
newest user or tool message (a text completion's: the text added since the reply it
continues)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collapsecheck.inputs.environments.endpoint import Exchange
from collapsecheck.inputs.environments.openai_wire import CHAT, WireRequest

STATE_ROLES = ("user", "tool")


@dataclass
class Conversation:
    """One episode as the harness played it: its exchanges in order, and whether it branched
    off another episode's earlier turn (a harness that retried, or forked)."""

    exchanges: list[Exchange] = field(default_factory=list)
    forked: bool = False

    @property
    def start(self) -> str:
        """Its start state: the first request's messages and tools (or prompt), as a key."""
        return request_key(self.exchanges[0].request)

    def turns(self) -> list[tuple[Exchange, str, tuple[dict[str, Any], ...]]]:
        """Each turn's exchange, its state and what followed its reply in the next request
        (nothing for the last turn: the harness has not said)."""
        played = []
        for index, exchange in enumerate(self.exchanges):
            previous = self.exchanges[index - 1] if index else None
            following = self.exchanges[index + 1] if index + 1 < len(self.exchanges) else None
            returned = followed(exchange, following.request) if following else ()
            played.append((exchange, state_of(exchange.request, previous), returned))
        return played


def request_key(request: WireRequest) -> str:
    if request.kind != CHAT:
        return request.prompt
    body = {"messages": [canonical(m) for m in request.messages], "tools": list(request.tools)}
    return json.dumps(body, sort_keys=True)


def canonical(message: dict[str, Any]) -> list[Any]:
    """A message as compared: its role, its content stripped, its tool calls' names and
    arguments (a harness may write the reply back with other whitespace, ids or key order)."""
    calls = [[c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True)]
             for c in message.get("tool_calls") or ()]  # fmt: skip
    return [message["role"], (message.get("content") or "").strip(), calls]


def reply_canonical(exchange: Exchange) -> list[Any]:
    """A chat exchange's reply as the model wrote it, canonical."""
    reply = exchange.reply.message()
    reply["tool_calls"] = [
        {"function": {"name": c.name, "arguments": dict(c.arguments)}}
        for c in exchange.reply.tool_calls
    ]
    return canonical(reply)


def closeness(reply: list[Any], sent: list[Any]) -> float:
    """How alike the model's reply and the assistant message the harness sent back are, 1 when
    equal: the share of their text in common (difflib's ratio over content and calls)."""
    if reply == sent:
        return 1.0
    said = [" ".join([m[1], *(" ".join(call) for call in m[2])]) for m in (reply, sent)]
    return difflib.SequenceMatcher(None, *said, autojunk=False).ratio()


def followed(exchange: Exchange, following: WireRequest) -> tuple[dict[str, Any], ...]:
    """What the harness added after the reply before its next request: chat messages, or a
    text completion's added text as one user message."""
    if exchange.request.kind == CHAT:
        return tuple(dict(m) for m in following.messages[len(exchange.request.messages) + 1 :])
    added = following.prompt[len(exchange.request.prompt) + len(exchange.reply.text) :]
    return ({"role": "user", "content": added},) if added else ()


def state_of(request: WireRequest, previous: Exchange | None) -> str:
    """A turn's state: the newest user or tool message of its request (a text completion's:
    the text added since the previous reply, or the whole first prompt)."""
    if request.kind != CHAT:
        if previous is None:
            return request.prompt
        return request.prompt[len(previous.request.prompt) + len(previous.reply.text) :]
    for message in reversed(request.messages):
        if message["role"] in STATE_ROLES:
            return message.get("content") or ""
    return ""


def assemble(exchanges: Sequence[Exchange]) -> list[Conversation]:
    """The episodes in the recording, each in the order its requests arrived: the named ones
    by their names, the others by their messages."""
    named: dict[str, Conversation] = {}
    threads = Threads()
    for exchange in sorted(exchanges, key=lambda e: e.number):
        if exchange.episode is not None:
            named.setdefault(exchange.episode, Conversation()).exchanges.append(exchange)
        else:
            threads.add(exchange)
    return [*named.values(), *threads.conversations]


class Threads:
    """Requests threaded into conversations by their messages: each chat exchange indexed by
    its request's messages, so a request finds the longest earlier one it continues."""

    def __init__(self) -> None:
        self.conversations: list[Conversation] = []
        self.by_request: dict[str, list[tuple[Conversation, int, list[Any]]]] = {}
        self.texts: list[tuple[str, Conversation, int]] = []

    def add(self, exchange: Exchange) -> None:
        found = self.continued(exchange.request)
        if found is None:
            conversation = Conversation()
            self.conversations.append(conversation)
        else:
            conversation, at = found
            if at + 1 < len(conversation.exchanges):  # a branch off an earlier turn
                conversation = Conversation(conversation.exchanges[: at + 1], forked=True)
                self.conversations.append(conversation)
        conversation.exchanges.append(exchange)
        self.index(exchange, conversation, len(conversation.exchanges) - 1)

    def continued(self, request: WireRequest) -> tuple[Conversation, int] | None:
        """The conversation and turn the request continues: the longest earlier request whose
        messages the request's begin with, followed by an assistant message; among those
        (twins), the one whose reply is closest to it, then one whose turn is still its
        episode's newest, then the earliest."""
        if request.kind != CHAT:
            found = [(len(t), c, i) for t, c, i in self.texts if request.prompt.startswith(t)]
            return max(found, key=lambda f: f[0])[1:] if found else None
        messages = [canonical(m) for m in request.messages]
        for length in range(len(messages) - 1, 0, -1):
            if messages[length][0] != "assistant":
                continue
            places = self.by_request.get(json.dumps(messages[:length]))
            if places:
                sent = messages[length]
                best = max(
                    enumerate(places),
                    key=lambda p: (closeness(p[1][2], sent),
                                   p[1][1] + 1 == len(p[1][0].exchanges), -p[0]),
                )  # fmt: skip
                return best[1][:2]
        return None

    def index(self, exchange: Exchange, conversation: Conversation, at: int) -> None:
        if exchange.request.kind != CHAT:
            self.texts.append((exchange.request.prompt + exchange.reply.text, conversation, at))
            return
        key = json.dumps([canonical(m) for m in exchange.request.messages])
        self.by_request.setdefault(key, []).append((conversation, at, reply_canonical(exchange)))
