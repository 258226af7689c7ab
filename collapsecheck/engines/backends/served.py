"""The policy where it is served (SPEC "The policy where it is served"): a backend over a
running vLLM server's HTTP API (`served_api`), with no checkpoint and no second copy of the
weights. It samples with `/v1/completions` on token-id prompts (every sampling field sent,
explicit seeds, the token ids returned) and scores with the same route's prompt
log-probabilities (`prompt_logprobs: 0`, several prompts a request); prompts are rendered by
the server's own chat template and tokenizer (`ServedTokenizer`), so every id is the server's.
Prompt log-probabilities are untempered: scoring is exact at temperature 1 only. A fixed
canary, scored before and after the work, and the weight version the server states where it
states one, tell whether the weights changed meanwhile (`weights`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    ScoreRequest,
    SumsOfTokens,
    TokenLogProbs,
    decode_ids,
    prompt_seed,
    require_untempered,
)
from collapsecheck.engines.backends.served_api import PolicyServer, ServerInfo
from collapsecheck.errors import CollapsecheckError

SCORED_PER_REQUEST = 16  # prompts in one request of prompt log-probabilities
CANARY = "The quick brown fox jumps over the lazy dog. 0123456789"  # scored as plain text
# a canary's log-probabilities are read to this many decimals for its digest: a server's
# rounding between batches stays below it, any change of weights moves them far more
CANARY_DECIMALS = 3


@dataclass(frozen=True)
class Weights:
    """The served weights as the scan can tell them: the server's stated version (None where
    it states none) and the canary's digest (`ServedBackend.canary_digest`)."""

    version: str | None
    digest: str

    def __str__(self) -> str:
        stated = f"version {self.version}, " if self.version is not None else ""
        return f"{stated}canary digest {self.digest}"


class ServedTokenizer:
    """The server's tokenizer and chat template, through its `/tokenize` and `/detokenize`,
    where `render_prompt` and `decode_ids` use a transformers tokenizer: messages are rendered
    and tokenized by the server in one call, and the rendered text's ids are remembered, so
    nothing is tokenized twice."""

    chat_template = "the server's chat template"

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self.name_or_path = server.url
        self.rendered: dict[str, list[int]] = {}  # a chat rendering's text -> its ids
        self.decoded: dict[tuple[int, ...], str] = {}

    def apply_chat_template(
        self, messages: Sequence[Any], *, add_generation_prompt: bool = True,
        tokenize: bool = False, **template_kwargs: Any,
    ) -> str:  # fmt: skip
        ids = self.server.tokenize_chat(messages, template_kwargs)
        text = self.decode(ids)
        self.rendered[text] = ids
        return text

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        if text in self.rendered and not add_special_tokens:
            return {"input_ids": self.rendered[text]}
        return {"input_ids": self.server.tokenize_text(text, add_special_tokens)}

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        key = tuple(int(i) for i in ids)
        if key not in self.decoded:
            self.decoded[key] = self.server.detokenize(key) if key else ""
        return self.decoded[key]


class ServedBackend(SumsOfTokens):
    """Backend over a served policy: `url` is the server's (up to /v1, or host:port)."""

    name = "served"

    def __init__(self, url: str) -> None:
        self.server = PolicyServer(url)
        self.info: ServerInfo = self.server.discover()
        self.tokenizer = ServedTokenizer(self.server)
        self.max_length = self.info.max_model_len
        self.policy_note = ""  # what the report says it describes (`runs.served`)

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, settings: Any = None, scorer: Any = None) -> Any:
        raise CollapsecheckError("a served policy is reached by its URL, not a checkpoint")

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "device": self.info.url, "dtype": "the server's",
                "scorer": f"vllm {self.info.version} server"}  # fmt: skip

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:  # fmt: skip
        """K samples of each prompt from one request at its seed (vLLM draws a request's n
        samples from its seed, as the in-process engine does), every sampling field sent so
        none falls back to the model's generation config."""
        if seeds is None:
            seeds = [prompt_seed(params.seed, offset + i) for i in range(len(prompts))]
        pairs = zip(prompts, seeds, strict=True)
        bodies = [self.sampling_body(ids, params, seed) for ids, seed in pairs]
        answers = self.server.completions(bodies, lambda index: progress(1))
        return [[served_sample(c) for c in a["choices"]] for a in answers]

    def sampling_body(self, ids: Sequence[int], params: SamplingParams, seed: int) -> dict:
        body: dict[str, Any] = {
            "model": self.info.model, "prompt": list(ids), "n": params.k, "seed": seed,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": -1,
            "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "repetition_penalty": 1.0, "max_tokens": params.max_new_tokens,
            "return_token_ids": True, "skip_special_tokens": False,
        }  # fmt: skip
        if params.json_schema is not None:
            body["structured_outputs"] = {"json": params.json_schema}
        return body

    def loglikelihood_per_token(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> TokenLogProbs:
        """Each scored token's prompt log-probability, read by its own id from the entry the
        server returns for its position, SCORED_PER_REQUEST prompts a request."""
        require_untempered(
            temperature,
            "a served policy's scorer",
            "sample at --temperature 1, or scan the checkpoint's files",
        )
        rows = [[*r.context, *r.continuation] for r in requests]
        chunks = [range(i, min(i + SCORED_PER_REQUEST, len(rows)))
                  for i in range(0, len(rows), SCORED_PER_REQUEST)]  # fmt: skip
        bodies = [{"model": self.info.model, "prompt": [rows[i] for i in chunk],
                   "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}
                  for chunk in chunks]  # fmt: skip
        answers = self.server.completions(bodies, lambda index: progress(len(chunks[index])))
        entries = [c["prompt_logprobs"] for a in answers for c in a["choices"]]
        tokens = []
        for request, row, entry in zip(requests, rows, entries, strict=True):
            start = len(request.context) + request.scored_from
            read = [position_logprob(entry, row, t) for t in range(start, len(row))]
            tokens.append(np.array(read, dtype=np.float64))
        return TokenLogProbs.of(np.array([t.sum() for t in tokens]), tokens)

    def weights(self) -> Weights:
        """What tells the served weights apart: the version the server states, where it
        states one, and the canary's digest."""
        return Weights(self.server.weight_version(), self.canary_digest())

    def canary_digest(self) -> str:
        """A digest of the fixed canary's log-probabilities (CANARY_DECIMALS): the same while
        the server's weights are."""
        ids = self.server.tokenize_text(CANARY, special=True)
        scored = self.loglikelihood_per_token([ScoreRequest(tuple(ids[:1]), tuple(ids[1:]))],
                                              lambda n: None)  # fmt: skip
        rounded = np.round(scored.of_request(0), CANARY_DECIMALS) + 0.0  # no -0.0
        return hashlib.sha256(rounded.astype(np.float64).tobytes()).hexdigest()[:16]

    def close(self) -> None:
        """The connections closed; the server is the job's."""
        self.server.close()


def position_logprob(entry: Sequence[Any], row: Sequence[int], position: int) -> float:
    """The log-probability the server gave row[position] at that position, read by its id."""
    given = entry[position] if position < len(entry) else None
    token = str(row[position])
    if not given or token not in given:
        raise CollapsecheckError(
            f"the server returned no prompt log-probability for token {token} at position "
            f"{position} (a server started with --max-logprobs 0 gives none)"
        )
    return float(given[token]["logprob"])


def served_sample(choice: dict[str, Any]) -> Sample:
    """A choice as a sample: its token ids, without the stop token that ended it (vLLM keeps
    an end-of-sequence token in them)."""
    ids = choice.get("token_ids")
    if ids is None:
        raise CollapsecheckError(
            "the server returned no token ids (vLLM 0.10.2 or later returns them with "
            "return_token_ids)"
        )
    reason = choice.get("finish_reason")
    if reason == "stop" and ids and not isinstance(choice.get("stop_reason"), str):
        ids = ids[:-1]  # the end-of-sequence or stop token (a stop string is not in the ids)
    return Sample(tuple(int(i) for i in ids), truncated=reason == "length")
