"""Playing a checkpoint under a harness that drives the model itself (`--env command:...`,
`--env verifiers:...`; SPEC "Agents behind an OpenAI client"): the scan's backend answers the
harness through collapsecheck's endpoint, every request is recorded, and the recording becomes
the episodes and turns every other played scan has (`episodes.Played`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collapsecheck.engines.backends.base import Backend
from collapsecheck.engines.reasoning import ActionSpec, action_spec, located_action, reasoning_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.conversations import Conversation, assemble
from collapsecheck.inputs.environments.endpoint import Endpoint, Exchange, Recorder, endpoint_app
from collapsecheck.inputs.environments.protocol import DrivenSource, EpisodeEnd
from collapsecheck.inputs.environments.tool_calls import calls_action, calls_given
from collapsecheck.inputs.episodes import Episode, EpisodeTurn
from collapsecheck.runs.episodes import Played, turns_played
from collapsecheck.runs.serving import BackendChat, Served
from collapsecheck.settings import EnvSettings, Settings


def served_name(checkpoint: str) -> str:
    """The name the endpoint serves a checkpoint under (`{model}`, `/v1/models`): its folder's
    name, a plain name that an SDK reads as a model's, never a path it would split at a slash
    into a provider prefix. Requests may name any model: each is answered by the checkpoint."""
    return Path(checkpoint).name or "policy"


def drive(
    backend: Backend, source: DrivenSource, env: EnvSettings, settings: Settings, name: str
) -> tuple[list[Conversation], dict[str, EpisodeEnd], list[str], float | None]:
    """The harness run against the endpoint to its end: its conversations, the ends its
    adapter knows, what was noticed, and the one temperature its replies were sampled at where
    that is not the scan's (a fault the harness met at the endpoint stops the scan)."""
    served = served_name(name)
    chat = BackendChat(backend, settings, served, f"--env {source.spec}")
    recorder = Recorder()
    try:
        endpoint = Endpoint(endpoint_app(chat, recorder), recorder, served)
        driven = source.drive(endpoint, env, settings.sampling)
    finally:
        chat.close()
    if recorder.fault is not None:
        raise recorder.fault
    notes = [*driven.notes, *([recorder.refused()] if recorder.refusals else [])]
    conversations = assemble(recorder.exchanges)
    forks = sum(c.forked for c in conversations)
    if forks:
        notes.append(
            f"--env {source.spec}: {forks} request{'s' if forks > 1 else ''} continued an "
            "earlier turn another request had already continued (a retry or a branch): each "
            "branch is an episode of its own, with the turns before it"
        )
    constrained = constrained_note(recorder.exchanges, source.spec)
    if constrained:
        notes.append(constrained)
    if len(recorder.exchanges) > 1 and all(len(c.exchanges) == 1 for c in conversations):
        notes.append(
            f"--env {source.spec}: each request is its own episode: the harness sends no "
            "earlier reply back"
        )
    return conversations, dict(driven.ends), notes, single_temperature(recorder, settings)


def constrained_note(exchanges: Sequence[Exchange], spec: str) -> str:
    """How many replies were sampled under a constraint the harness asked, and by what; each
    is scored as the unconstrained policy's trace (SPEC "Constrained replies")."""
    asked = Counter(e.kept.constrained for e in exchanges if e.kept.constrained)
    if not asked:
        return ""
    count, replies = sum(asked.values()), "reply" if len(exchanges) == 1 else "replies"
    kinds = ", ".join(f"{n} by {kind}" for kind, n in sorted(asked.items()))
    return (
        f"--env {spec}: {count} of {len(exchanges)} {replies} "
        f"{'was' if count == 1 else 'were'} constrained ({kinds}): each is scored as the "
        "policy's own trace, under the unconstrained policy"
    )


def single_temperature(recorder: Recorder, settings: Settings) -> float | None:
    """The temperature every reply was sampled at, where the harness asked one other than the
    scan's; the harness asking several is one line (the traces are scored at one)."""
    asked = sorted({e.kept.temperature for e in recorder.exchanges})
    if len(asked) > 1:
        listed = ", ".join(f"{t:g}" for t in asked)
        raise CollapsecheckError(
            f"the harness asked temperatures {listed}: the traces are scored at the one they "
            "were sampled at; give --temperature to sample every reply at one"
        )
    scans = settings.sampling.sampling_temperature
    return asked[0] if asked and asked[0] != scans else None


def start_order(
    conversations: Sequence[Conversation], ends: dict[str, EpisodeEnd]
) -> list[tuple[int, int, Conversation]]:
    """Each conversation with its start state's number and seed, in play order: a named
    episode's from its adapter; otherwise start states are distinct first requests, numbered
    in the order of their text, each seeded by a digest of it (so two policies' episodes
    pair only where they began alike), their episodes in the order of their replies."""
    placed = []
    unnamed = [c for c in conversations if c.exchanges[0].episode not in ends]
    keys = sorted({c.start for c in unnamed})
    numbers = {key: index for index, key in enumerate(keys)}
    for conversation in conversations:
        end = ends.get(conversation.exchanges[0].episode or "")
        if end is not None:
            placed.append((end.start, end.seed, conversation))
        else:
            key = conversation.start
            placed.append((numbers[key], start_seed(key), conversation))
    return sorted(placed, key=lambda p: (p[0], [e.reply.text for e in p[2].exchanges]))


def start_seed(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:7], 16)


def episode_of(
    conversation: Conversation, start: int, seed: int, end: EpisodeEnd | None,
    settings: Settings, action: ActionSpec,
) -> Episode:  # fmt: skip
    """The conversation as a played episode: each request a turn."""
    rewards = end.rewards if end is not None else ()
    turns = []
    for number, (exchange, state, returned) in enumerate(conversation.turns()):
        reward = rewards[number] if number < len(rewards) else None
        turns.append(EpisodeTurn(
            state, exchange.reply.text, turn_action(exchange, settings, action), reward,
            {}, given=given(exchange), returned=returned,
        ))  # fmt: skip
    if end is None:
        return Episode(start, seed, tuple(turns))
    return Episode(start, seed, tuple(turns), end.final_state, end.done, end.success)


def turn_action(exchange: Exchange, settings: Settings, action: ActionSpec) -> str:
    """The reply's tool calls as `name(arguments)` where it made some, else its action segment
    located as every played turn's is."""
    calls = tool_call_dicts(exchange)
    if calls:
        return calls_action(calls)
    kept: Served = exchange.kept
    return located_action(
        exchange.reply.text, reasoning_spec(settings.scoring), action, kept.sample.truncated,
        kept.rendered.text,
    )  # fmt: skip


def given(exchange: Exchange) -> str:
    """The reply as the harness got it: its tool calls as JSON where it made some, else its
    text."""
    calls = tool_call_dicts(exchange)
    return calls_given(calls) if calls else exchange.reply.text


def tool_call_dicts(exchange: Exchange) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": dict(c.arguments)} for c in exchange.reply.tool_calls]


def episodes_played(
    conversations: Sequence[Conversation], ends: dict[str, EpisodeEnd], settings: Settings
) -> list[tuple[Episode, Conversation]]:
    """Every conversation as an episode, in play order."""
    action = action_spec(settings.scoring) or ActionSpec()
    return [
        (episode_of(c, start, seed, ends.get(c.exchanges[0].episode or ""), settings, action), c)
        for start, seed, c in start_order(conversations, ends)
    ]


def play_driven(
    backend: Backend, source: DrivenSource, env: EnvSettings, settings: Settings, name: str
) -> Played:
    """The harness played to its end, its recording as played episodes: each turn a prompt
    with its one response, its reward the episode's total where the adapter knows rewards."""
    conversations, ends, notes, temperature = drive(backend, source, env, settings, name)
    if temperature is not None:
        notes.append(
            f"--env {source.spec}: every reply was sampled at temperature {temperature:g}, as "
            "the harness asked, and is scored at it (--temperature samples every reply at one)"
        )
    played = [
        (episode, [(e.kept.prompt, e.kept.rendered, e.kept.sample) for e in c.exchanges])
        for episode, c in episodes_played(conversations, ends, settings)
    ]
    return turns_played(played, bool(ends), temperature, tuple(notes))
