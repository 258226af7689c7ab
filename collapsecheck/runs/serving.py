"""The scan's backend answering the endpoint's requests (SPEC "Agents behind an OpenAI client"):
each request rendered by the checkpoint's chat template (its tools included), sampled once at
a seed derived from --seed, its context and how many times that context came before (under the
JSON schema a `response_format` or a forced `tool_choice` asks), its tool calls read in the
template's format (or out of a forced reply's JSON). Requests that arrive together are sampled
in one `generate` call (each with its own seed, so a batch's make-up never changes a reply)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import Backend, SamplingParams, no_progress
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.openai_wire import (
    CHAT,
    Unservable,
    WireReply,
    WireRequest,
)
from collapsecheck.inputs.environments.tool_calls import (
    forced_calls,
    parsed_reply,
    require_tool_format,
)
from collapsecheck.inputs.prompts import Prompt, RenderedPrompt, render_prompt
from collapsecheck.inputs.samples import Sample
from collapsecheck.settings import Settings

GATHER_S = 0.02  # how long the sampler waits for more requests to join a batch
GATHER_LIMIT_S = 1.0  # and at most, while requests are still being rendered


@dataclass(frozen=True)
class Served:
    """What the scan keeps of one request: the prompt as rendered, the one sample, the
    temperature it was sampled at, and what constrained it ("": nothing; else such as
    "response_format json_schema")."""

    prompt: Prompt
    rendered: RenderedPrompt
    sample: Sample
    temperature: float
    constrained: str = ""


def request_seed(seed: int, ids: Sequence[int], repeat: int) -> int:
    """The seed of a request whose context is `ids`, the `repeat`-th request of that context
    (0 the first): a rerun that sends the same requests in another order draws the same
    replies for them."""
    digest = hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return int(np.random.SeedSequence([seed, *words, repeat]).generate_state(1)[0])


def at_stop(
    sample: Sample, stops: Sequence[str], decode: Callable[[Sequence[int]], str]
) -> tuple[Sample, str]:
    """The reply as vLLM's server returns it to a request with stop strings (SPEC "Agents
    behind an OpenAI client"): its text ends before the stop string that its sampled text
    completes first (earliest end, then earliest start), which is left out, and the reply is
    not cut by the token limit (finish "stop"). The sample keeps the tokens whose text lies
    before that point: what the harness received, short of a token where the string begins
    inside one. The tokens after a stop string change none before it, so the cut is what
    stopping there would have drawn. Without a stop string in the text, as sampled."""
    text = decode(sample.ids)
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    if not found:
        return sample, text
    cut = min(found)[1]
    kept = len(sample.ids)
    while kept and len(decode(sample.ids[:kept])) > cut:
        kept -= 1
    return Sample(tuple(sample.ids[:kept]), truncated=False), text[:cut]


class BackendChat:
    """`endpoint.ChatModel` over the scan's backend."""

    def __init__(self, backend: Backend, settings: Settings, name: str, where: str) -> None:
        self.backend, self.settings, self.name, self.where = backend, settings, name, where
        self.sampler = Sampler(backend)
        self.lock = threading.Lock()
        self.seen: Counter[bytes] = Counter()

    def answer(self, request: WireRequest) -> tuple[WireReply, Served]:
        with self.sampler.preparing():
            found, prompt, rendered, params = self.prepared(request)
            with self.lock:
                key = np.asarray(rendered.ids, dtype=np.int64).tobytes()
                repeat = self.seen[key]
                self.seen[key] += 1
            seed = request_seed(self.settings.analysis.seed, rendered.ids, repeat)
            waiting = self.sampler.submit(rendered.ids, params, seed)
        sample, text = at_stop(waiting.result(), request.stop, self.backend.decode)
        constrained = request.constrained
        if constrained is not None and constrained.forced:
            content, calls = forced_calls(text, constrained, seed)
        else:
            content, calls = parsed_reply(text, found, self.backend.tokenizer, seed)
        pieces = self.pieces(sample.ids, text) if request.stream else ()
        named = constrained is not None and constrained.function is not None
        reply = WireReply(text, content, calls, sample.truncated, len(rendered.ids),
                          len(sample.ids), seed, pieces, named=named)  # fmt: skip
        asked = constrained.asked if constrained is not None else ""
        return reply, Served(prompt, rendered, sample, params.temperature, asked)

    def prepared(
        self, request: WireRequest
    ) -> tuple[str | None, Prompt, RenderedPrompt, SamplingParams]:
        """The request's tool format, its prompt as rendered and its sampling."""
        tokenizer = self.backend.tokenizer
        chat = request.kind == CHAT
        found = require_tool_format(tokenizer, request.tools) if chat else None
        found = found if request.calls else None
        prompt, rendered = self.rendered(request)
        return found, prompt, rendered, self.params(request, len(rendered.ids))

    def rendered(self, request: WireRequest) -> tuple[Prompt, RenderedPrompt]:
        """The request's context as the model reads it: chat messages through the chat
        template (with the request's tools and --chat-template-kwargs), a text prompt as is."""
        if request.kind != CHAT:
            prompt = Prompt(request.prompt, self.where)
            return prompt, render_prompt(prompt, self.backend.tokenizer)
        prompt = Prompt([dict(m) for m in request.messages], self.where)
        kwargs = dict(self.settings.prompts.chat_template_kwargs or {})
        if request.tools:
            kwargs["tools"] = [dict(t) for t in request.tools]
        try:
            return prompt, render_prompt(prompt, self.backend.tokenizer, template_kwargs=kwargs)
        except CollapsecheckError as err:  # the template cannot render these messages
            raise Unservable(str(err).removeprefix(f"{self.where}: ")) from None

    def params(self, request: WireRequest, context: int) -> SamplingParams:
        """The request's sampling within the scan's: --temperature where given, else the
        request's (else 1); its token limit, at most --max-new-tokens; its top_p, else --top-p."""
        sampling = self.settings.sampling
        temperature = sampling.temperature
        if temperature is None:
            temperature = 1.0 if request.temperature is None else request.temperature
        limit = min(request.max_tokens or sampling.max_new_tokens, sampling.max_new_tokens)
        room = self.backend.max_length
        if room is not None and context + limit > room:
            raise Unservable(
                f"the context has {context} tokens and the reply may take {limit} of the "
                f"model's {room}"
            )
        top_p = sampling.top_p if request.top_p is None else min(request.top_p, 1.0) or 1.0
        schema = request.constrained.schema if request.constrained is not None else None
        return SamplingParams(1, float(temperature), top_p, limit, 0, json_schema=schema)

    def pieces(self, ids: Sequence[int], text: str) -> tuple[str, ...]:
        """The reply a token at a time, as a stream sends it: each token's new text, held back
        while it ends inside a character, the pieces joined the whole text."""
        pieces, sent = [], 0
        for end in range(1, len(ids) + 1):
            so_far = self.backend.decode(ids[:end]) if end < len(ids) else text
            if so_far.endswith("\ufffd") and end < len(ids):
                pieces.append("")
                continue
            pieces.append(so_far[sent:])
            sent = len(so_far)
        return tuple(pieces)

    def close(self) -> None:
        self.sampler.close()


class Sampler:
    """One thread sampling for every request: what arrives while it samples, or while other
    requests are still being rendered (or within GATHER_S of the last), is sampled together,
    one `generate` call per sampling setting, each request at its own seed."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.waiting: queue.Queue[Any] = queue.Queue()
        self.lock = threading.Lock()
        self.rendering = 0  # requests being rendered, soon to join
        self.thread = threading.Thread(target=self.run, daemon=True, name="collapsecheck-sampler")
        self.thread.start()

    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        """Marks a request on its way to `submit` (rendered, seeded): a batch waits for it."""
        with self.lock:
            self.rendering += 1
        try:
            yield
        finally:
            with self.lock:
                self.rendering -= 1

    def submit(
        self, ids: Sequence[int], params: SamplingParams, seed: int
    ) -> concurrent.futures.Future[Sample]:
        done: concurrent.futures.Future[Sample] = concurrent.futures.Future()
        self.waiting.put((tuple(ids), params, seed, done))
        return done

    def run(self) -> None:
        while (first := self.waiting.get()) is not None:
            batch, more = self.gathered(first)
            self.sample_batch(batch)
            if more is None:
                return

    def gathered(self, first: Any) -> tuple[list[Any], Any]:
        """`first` and what joins it: until the queue has been empty GATHER_S with no request
        being rendered (at most GATHER_LIMIT_S in all); the sentinel None where it came."""
        batch, deadline = [first], time.monotonic() + GATHER_LIMIT_S
        while time.monotonic() < deadline:
            try:
                more = self.waiting.get(timeout=GATHER_S)
            except queue.Empty:
                with self.lock:
                    if not self.rendering:
                        break
                continue
            if more is None:
                return batch, None
            batch.append(more)
        return batch, first

    def sample_batch(self, batch: list[Any]) -> None:
        groups: dict[SamplingParams, list[Any]] = {}
        for item in batch:
            groups.setdefault(item[1], []).append(item)
        for params, items in groups.items():
            try:
                drawn = self.backend.generate([i[0] for i in items], params, no_progress,
                                              seeds=[i[2] for i in items])  # fmt: skip
            except BaseException as err:  # carried to each waiting request's thread
                for item in items:
                    item[3].set_exception(err)
                continue
            for item, (sample,) in zip(items, drawn, strict=True):
                item[3].set_result(sample)

    def close(self) -> None:
        self.waiting.put(None)
        self.thread.join(60)
