"""A policy server's HTTP API, as a live RL job serves its current policy (SPEC "The policy
where it is served"): vLLM's OpenAI-compatible server, reached with httpx. Discovery
(`/v1/models`, `/version`), its own tokenizer and chat template (`/tokenize`, `/detokenize`),
and `/v1/completions` on token-id prompts. Transient faults (a refused or reset connection, a
timeout, HTTP 502/503/504) are retried with backoff and counted; any other fault is one line
naming the URL and what the server said."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from collapsecheck.errors import CollapsecheckError

SCHEMES = ("http://", "https://")
TRANSIENT_STATUS = (502, 503, 504)
RETRY_DELAYS_S = (0.5, 1, 2, 4, 8, 15, 30, 30)  # about 90 s in all: a server restarting
TIMEOUT_S = 600.0  # one request: a long batch of prompt log-probabilities on a busy server
IN_FLIGHT = 8  # requests in flight at once


def is_served(target: object) -> bool:
    """Whether a scan's target is a server's URL rather than a checkpoint's folder."""
    return isinstance(target, str) and target.startswith(SCHEMES)


def api_base(url: str) -> str:
    """The URL up to and with /v1, as `OPENAI_BASE_URL` names a server: a bare host:port
    gets /v1."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


@dataclass(frozen=True)
class ServerInfo:
    """What discovery found: the server (vLLM's version), the model it serves, and the model's
    window in tokens."""

    url: str
    version: str
    model: str
    max_model_len: int | None


class PolicyServer:
    """One server's API: each call retried through transient faults, counted in `retries`."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        self.url = api_base(url)
        self.root = self.url.removesuffix("/v1")
        self.timeout = timeout
        self.retries = 0
        self.model = ""
        # transient faults are retried once the server has answered: one unreachable from the
        # start is one line within seconds
        self.retrying = False
        self.loop: Any = None  # an event loop and a client of its own, made at the first call
        self.client: Any = None

    def discover(self) -> ServerInfo:
        """The model the server serves and which server it is (vLLM's `/version`); a server
        that answers neither as vLLM does is one line."""
        models = self.call("GET", f"{self.url}/models").get("data") or []
        if not models:
            raise CollapsecheckError(f"{self.url}: the server lists no model (GET /v1/models)")
        served = models[0]
        self.model = str(served.get("id"))
        version = self.call("GET", f"{self.root}/version", missing_ok=True)
        # a router in front of vLLM (vllm-router: prime-rl's, SkyRL's) may not pass /version
        # on; /tokenize it does, and a server without it is not one collapsecheck can read
        if version is None and self.call("POST", f"{self.root}/tokenize",
                                         {"model": self.model, "prompt": "a"},
                                         missing_ok=True) is None:  # fmt: skip
            raise CollapsecheckError(
                f"{self.url}: not a vLLM server (no /version, no /tokenize): collapsecheck "
                "reads token ids and prompt log-probabilities from vLLM's OpenAI-compatible "
                "server"
            )
        window = served.get("max_model_len")
        self.retrying = True
        said = str(version.get("version")) if version else "(its version not said)"
        return ServerInfo(self.url, said, self.model, int(window) if window else None)

    def weight_version(self) -> str | None:
        """The weight version vLLM's server states (`GET /weight_info`, served where it runs
        with VLLM_SERVER_DEV_MODE=1, set by the trainer's `/update_weight_version` or
        `/finish_weight_update`); None where it states none."""
        info = self.call("GET", f"{self.root}/weight_info", missing_ok=True)
        version = info.get("weight_version") if isinstance(info, dict) else None
        return None if version is None else str(version)

    def tokenize_chat(self, messages: Sequence[Any], template_kwargs: dict[str, Any]) -> list[int]:
        """The messages rendered by the server's chat template, with the generation prompt,
        as its token ids."""
        body = {"model": self.model, "messages": list(messages), "add_generation_prompt": True,
                "chat_template_kwargs": template_kwargs}  # fmt: skip
        return list(self.call("POST", f"{self.root}/tokenize", body)["tokens"])

    def tokenize_text(self, text: str, special: bool) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": special}
        return list(self.call("POST", f"{self.root}/tokenize", body)["tokens"])

    def detokenize(self, ids: Sequence[int]) -> str:
        body = {"model": self.model, "tokens": list(ids)}
        return str(self.call("POST", f"{self.root}/detokenize", body)["prompt"])

    def completions(
        self, bodies: Sequence[dict[str, Any]], done: Callable[[int], None]
    ) -> list[Any]:  # fmt: skip
        """`/v1/completions` for each body, IN_FLIGHT at a time, the answers in the bodies'
        order; `done(i)` as body i is answered."""
        import asyncio

        async def all_of() -> list[Any]:
            gate = asyncio.Semaphore(IN_FLIGHT)

            async def one(index: int, body: dict[str, Any]) -> Any:
                async with gate:
                    answer = await self.send("POST", f"{self.url}/completions", body)
                done(index)
                return answer

            return await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))

        return self.run(all_of())

    def call(
        self, method: str, url: str, body: dict[str, Any] | None = None, missing_ok: bool = False
    ) -> Any:  # fmt: skip
        """One request, its JSON answer (None: a 404 where `missing_ok`)."""
        return self.run(self.send(method, url, body, missing_ok))

    def run(self, work: Any) -> Any:
        """`work` (a coroutine) run on this server's own event loop, whose one client keeps
        its connections open from call to call."""
        import asyncio

        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(work)

    def close(self) -> None:
        """The client's connections closed, and the loop."""
        if self.loop is None:
            return
        if self.client is not None:
            self.loop.run_until_complete(self.client.aclose())
        self.loop.close()
        self.loop = self.client = None

    async def send(self, method: str, url: str, body: Any, missing_ok: bool = False) -> Any:
        """A request's JSON answer, retried through transient faults (RETRY_DELAYS_S)."""
        import asyncio

        import httpx

        if self.client is None:
            self.client = httpx.AsyncClient(timeout=self.timeout)
        for delay in (*RETRY_DELAYS_S, None):
            try:
                response = await self.client.request(method, url, json=body)
            except httpx.TransportError as err:
                fault = f"cannot reach the server ({type(err).__name__}: {err})"
            else:
                if response.status_code not in TRANSIENT_STATUS:
                    return read(url, response, missing_ok)
                fault = f"HTTP {response.status_code}"
            if delay is None or not self.retrying:
                break
            self.retries += 1
            await asyncio.sleep(delay)
        after = f", still after {len(RETRY_DELAYS_S)} retries" if self.retrying else ""
        raise CollapsecheckError(f"{url}: {fault}{after}")


def read(url: str, response: Any, missing_ok: bool = False) -> Any:
    """The answer's JSON; an HTTP error is one line with the server's own message."""
    if response.status_code == 404 and missing_ok:
        return None
    if response.status_code >= 400:
        raise CollapsecheckError(f"{url}: HTTP {response.status_code}: {said(response)}")
    try:
        return response.json()
    except ValueError:
        raise CollapsecheckError(f"{url}: the answer is not JSON") from None


def said(response: Any) -> str:
    """What an error answer says: its OpenAI-style message, else its first line."""
    try:
        body = response.json()
    except ValueError:
        return (response.text.strip().splitlines() or ["(no body)"])[0][:300]
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else body.get("message", body)
    return " ".join(str(message).split())[:300]
