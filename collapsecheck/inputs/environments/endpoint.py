"""collapsecheck's own OpenAI-compatible endpoint (SPEC "Agents behind an OpenAI client"): an
ASGI app (Starlette) answering `/v1/models`, `/v1/chat/completions` (streamed as server-sent
events where asked), `/v1/completions` and the Responses API's `/v1/responses`
(`responses_wire`, streamed as its events) from a `ChatModel` (the scan's backend, seeded),
and recording every request with its reply; any other route is a 404 naming it. `command:`
serves it on 127.0.0.1 (uvicorn, a free port); `verifiers:` reaches it in process
(`in_process_client`: httpx's ASGI transport, no socket). What the recording holds becomes
episodes in `conversations`."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.openai_wire import (
    CHAT,
    TEXT,
    Unservable,
    WireReply,
    WireRequest,
    completion_body,
    error_body,
    models_body,
    read_request,
    stream_events,
)
from collapsecheck.inputs.environments.responses_wire import ResponsesAPI

EPISODE_HEADER = "x-collapsecheck-episode"  # an adapter that knows its episodes names them


class ChatModel(Protocol):
    """What answers the endpoint's requests (`runs.serving`): the reply, and what the scan
    keeps of it (the rendered context and the sample). Raises `Unservable` for a request it
    cannot serve, `CollapsecheckError` for a fault that stops the scan. Called from worker
    threads, several at once."""

    name: str

    def answer(self, request: WireRequest) -> tuple[WireReply, Any]: ...


@dataclass(frozen=True)
class Exchange:
    """One request served: its number in arrival order, the request, the reply, the episode
    an adapter named (None: assembled from the messages), what the model kept of it."""

    number: int
    request: WireRequest
    reply: WireReply
    episode: str | None
    kept: Any


class Recorder:
    """Every exchange, every refusal, and whether the harness is waiting on the endpoint (a
    request in flight) or has been quiet since `quiet_since`; the first fault that stops the
    scan."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exchanges: list[Exchange] = []
        self.refusals: list[str] = []
        self.fault: CollapsecheckError | None = None
        self.in_flight = 0
        self.requests = 0
        self.quiet_since = time.monotonic()

    def arrived(self) -> int:
        with self.lock:
            self.in_flight += 1
            self.requests += 1
            return self.requests - 1

    def answered(self, exchange: Exchange | None = None, refusal: str | None = None) -> None:
        with self.lock:
            self.in_flight -= 1
            self.quiet_since = time.monotonic()
            if exchange is not None:
                self.exchanges.append(exchange)
            if refusal is not None:
                self.refusals.append(refusal)

    def faulted(self, fault: CollapsecheckError) -> None:
        with self.lock:
            self.fault = self.fault or fault
            self.in_flight -= 1
            self.quiet_since = time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the endpoint last answered, where no request is in flight (0 while
        one is: the harness waits on the model, not the other way round)."""
        with self.lock:
            return 0.0 if self.in_flight else time.monotonic() - self.quiet_since

    def refused(self) -> str:
        """The refusals in a phrase, for a note or a fault's line ("" where none)."""
        if not self.refusals:
            return ""
        count = len(self.refusals)
        return (f"the endpoint refused {count} request{'s' if count > 1 else ''} "
                f"(first: {self.refusals[0]})")  # fmt: skip


@dataclass(frozen=True)
class Endpoint:
    """What a harness is driven against: the endpoint's app, its recording and the name it
    serves the checkpoint under."""

    app: Any
    recorder: Recorder
    model: str


def endpoint_app(model: ChatModel, recorder: Recorder) -> Any:
    """The endpoint as an ASGI app."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def models(_: Any) -> Any:
        return JSONResponse(models_body(model.name))

    apis = {"/v1/chat/completions": Completions(CHAT), "/v1/completions": Completions(TEXT),
            "/v1/responses": ResponsesAPI()}  # fmt: skip

    async def answer(request: Any) -> Any:
        return await served(request, apis[request.url.path], model, recorder)

    async def unserved(request: Any) -> Any:
        said = (f"{request.method} {request.url.path}: the endpoint serves GET /v1/models and "
                f"POST {', '.join(apis)}")  # fmt: skip
        recorder.arrived()
        recorder.answered(refusal=said)
        return JSONResponse(error_body(said), status_code=404)

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        *(Route(path, answer, methods=["POST"]) for path in apis),
        Route("/{path:path}", unserved, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ])  # fmt: skip


class WireAPI(Protocol):
    """An API the endpoint speaks: a body read into the request the model answers, the reply
    written back whole or streamed, and what the API keeps of it (a response to continue)."""

    def read(self, body: Any) -> WireRequest: ...

    def body(self, request: WireRequest, reply: WireReply) -> dict[str, Any]: ...

    def events(self, request: WireRequest, reply: WireReply) -> Iterator[str]: ...

    def keep(self, request: WireRequest, reply: WireReply) -> None: ...


@dataclass(frozen=True)
class Completions:
    """`/v1/chat/completions` (CHAT) or `/v1/completions` (TEXT), as vLLM's server speaks
    them (`openai_wire`)."""

    kind: str

    def read(self, body: Any) -> WireRequest:
        return read_request(self.kind, body)

    def body(self, request: WireRequest, reply: WireReply) -> dict[str, Any]:
        return completion_body(request, reply)

    def events(self, request: WireRequest, reply: WireReply) -> Iterator[str]:
        return stream_events(request, reply)

    def keep(self, request: WireRequest, reply: WireReply) -> None:
        """Nothing: a completion is continued by sending its messages again."""


async def served(http: Any, api: WireAPI, model: ChatModel, recorder: Recorder) -> Any:
    """One request: read, answered by the model in a worker thread, recorded, sent back whole
    or streamed; refused with an OpenAI-style error where it cannot be served."""
    from anyio import to_thread
    from starlette.responses import JSONResponse, StreamingResponse

    number = recorder.arrived()
    try:
        request = api.read(json.loads(await http.body() or b"null"))
        reply, kept = await to_thread.run_sync(model.answer, request)
    except (Unservable, json.JSONDecodeError) as refusal:
        said = f"request {number} ({http.url.path}): {refusal}"
        recorder.answered(refusal=said)
        return JSONResponse(error_body(str(refusal)), status_code=400)
    except CollapsecheckError as fault:
        recorder.faulted(fault)
        return JSONResponse(error_body(str(fault)), status_code=500)
    recorder.answered(Exchange(number, request, reply, http.headers.get(EPISODE_HEADER), kept))
    api.keep(request, reply)
    if request.stream:
        return StreamingResponse(api.events(request, reply), media_type="text/event-stream")
    return JSONResponse(api.body(request, reply))


class Serving:
    """The endpoint served on 127.0.0.1 at a free port (uvicorn, in a thread of its own) while
    the `with` block runs: `base_url` ends in /v1."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        port = self.socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        config = uvicorn.Config(app, log_level="critical", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True,
            name="collapsecheck-endpoint",
        )  # fmt: skip

    def __enter__(self) -> Serving:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise CollapsecheckError(f"the endpoint did not start at {self.base_url}")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.socket.close()


@dataclass(frozen=True)
class InProcess:
    """How an adapter in the scan's own process reaches the endpoint: httpx's ASGI transport
    over the app, no socket."""

    app: Any
    base_url: str = "http://collapsecheck.endpoint/v1"
    api_key: str = "collapsecheck"

    def async_client(self, episode: str | None = None) -> Any:
        """An `openai.AsyncOpenAI` whose requests the app answers (`episode`: named on each)."""
        import httpx
        from openai import AsyncOpenAI

        headers = {EPISODE_HEADER: episode} if episode is not None else None
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), timeout=None)
        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, http_client=http,
                           default_headers=headers, max_retries=0)  # fmt: skip
