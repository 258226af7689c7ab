"""The backend contract, after lm-evaluation-harness: every model backend does two things,
(1) sample K responses per prompt and (2) score continuations given contexts. Everything
above the backends (reasoning extraction, cross-scoring, metrics) works on token ids only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.samples import Sample, decode_ids
from collapsecheck.progress import Progress, no_progress

if TYPE_CHECKING:
    from collapsecheck.inputs.formats.base import Checkpoint
    from collapsecheck.settings import LoadSettings, SamplingSettings

__all__ = [
    "Backend",
    "Progress",
    "Sample",
    "SamplingParams",
    "ScoreRequest",
    "TokenLogProbs",
    "decode_ids",
    "no_progress",
]


@dataclass(frozen=True)
class SamplingParams:
    """SPEC "Sampling": what a backend's `generate` needs (validated in SamplingSettings)."""

    k: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    # the JSON schema (as text) every sample is drawn under, None: unconstrained (SPEC "Agents
    # behind an OpenAI client", "Constrained replies"); only the endpoint asks one
    json_schema: str | None = None

    @classmethod
    def of(cls, sampling: SamplingSettings, seed: int) -> SamplingParams:
        return cls(
            sampling.samples,
            sampling.sampling_temperature,
            sampling.top_p,
            sampling.max_new_tokens,
            seed,
        )

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The sampling seed of one prompt: its traces depend on (seed, index) alone, not on
    which other prompts are in the set or how they are batched."""
    return int(np.random.SeedSequence([seed, prompt_index]).generate_state(1)[0])


@dataclass(frozen=True)
class ScoreRequest:
    """Score `continuation[scored_from:]` given `context + continuation[:scored_from]`.

    Keeping the shared context (a prompt) apart from the per-request part lets a backend
    compute each distinct context once. `stem`, when set, says that `continuation[:stem]` is
    shared with other requests of the same context (a reasoning trace whose actions follow):
    a backend may run it once and branch from it. `host`, when set, is a longer stem of other
    requests of the same context that `continuation[:stem]` begins (a reasoning cut short is
    the start of the whole reasoning): a backend may branch from that one's pass instead.
    Neither ever changes the value.
    """

    context: tuple[int, ...]
    continuation: tuple[int, ...]
    scored_from: int = 0
    stem: int | None = None
    host: tuple[int, ...] | None = None

    @property
    def stem_length(self) -> int:
        return len(self.continuation) if self.stem is None else self.stem

    @property
    def stem_row(self) -> tuple[int, ...]:
        """The tokens a backend may run once for this request and others: `host`, or the
        request's own stem."""
        return self.host if self.host is not None else self.continuation[: self.stem_length]


@dataclass(frozen=True)
class TokenLogProbs:
    """What `Backend.loglikelihood_per_token` gives: per request, the sum `loglikelihood`
    gives (`sums`) and the log-probability of each scored token, request i's being
    `values[offsets[i]:offsets[i + 1]]` (float64). `values` and `offsets` are None where the
    backend reads sums only (a caller's function that returns them)."""

    sums: np.ndarray
    values: np.ndarray | None = None
    offsets: np.ndarray | None = None

    @classmethod
    def of(cls, sums: np.ndarray, tokens: Sequence[np.ndarray] | None) -> TokenLogProbs:
        """From the sums and, where read, each request's per-token array."""
        if tokens is None:
            return cls(sums)
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        values = np.concatenate([np.asarray(t, dtype=np.float64) for t in tokens] or [[]])
        return cls(sums, values, offsets)

    @property
    def per_token(self) -> bool:
        return self.values is not None

    def of_request(self, index: int) -> np.ndarray:
        """Request `index`'s per-token values (its scored tokens, in order)."""
        return self.values[self.offsets[index] : self.offsets[index + 1]]


class Backend(Protocol):
    """What every model backend provides. A backend is registered by name in
    `collapsecheck.engines.backends.registry` and builds itself with `from_checkpoint`."""

    name: str
    tokenizer: Any  # a transformers tokenizer: renders prompts, decodes responses
    max_length: int | None  # the model's context length in tokens, where known

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint, settings: LoadSettings, scorer: str | None
    ) -> Backend:
        """Load a checkpoint; `scorer` names this backend's scorer, None when it only samples."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:  # fmt: skip
        """K samples for each prompt (given as token ids), seeded per prompt: prompt i by
        `prompt_seed(params.seed, offset + i)` (`offset`: where these prompts begin in the
        scan's list, so that sampling it in parts draws the same traces), or by `seeds[i]`
        where given (the endpoint's requests, each seeded by its own context); each sample
        under `params.json_schema` where it names one (constrained decoding, on xgrammar)."""
        ...

    def loglikelihood(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> np.ndarray:
        """Sum of log-probabilities of each request's scored tokens (float64, one per request)
        under the policy at `temperature` (softmax of logits / temperature: the distribution
        the traces were sampled from)."""
        ...

    def loglikelihood_per_token(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> TokenLogProbs:
        """`loglikelihood`'s sums, the same numbers, and each scored token's log-probability
        (SPEC "Where the input shows"), in one pass."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text, special tokens kept, no clean-up."""
        ...

    def describe(self) -> dict[str, str]:
        """Backend, device, dtype and scorer, for the report's settings."""
        ...

    def close(self) -> None:
        """Release the model and its engine (worker processes, device memory)."""
        ...


class SumsOfTokens:
    """`loglikelihood` as the sums of `loglikelihood_per_token`, for a backend whose
    per-token pass costs what its sums alone would (vLLM's prompt log-probabilities, a
    server's, a caller's function)."""

    def loglikelihood(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> np.ndarray:
        return self.loglikelihood_per_token(requests, progress, temperature).sums  # type: ignore[attr-defined]


def require_untempered(temperature: float, scorer: str, remedy: str) -> None:
    """A scorer that reads prompt log-probabilities, which are the raw model's whatever the
    temperature (vLLM's, in process or served): another temperature is refused, never read
    wrong."""
    if temperature != 1:
        raise CollapsecheckError(
            f"{scorer} reads the policy at temperature 1 only (its prompt log-probabilities "
            f"ignore temperature), but these traces were sampled at {temperature:g}: {remedy}"
        )


def stop_token_ids(*sources: int | Iterable[int] | None) -> list[int]:
    """End-of-sequence ids, in the order of their sources (generation config, tokenizer),
    each once."""
    ids: list[int] = []
    for source in sources:
        tokens = [source] if source is None or isinstance(source, int) else list(source)
        ids += [int(t) for t in tokens if t is not None and int(t) not in ids]
    return ids


class SplitBackend:
    """Samples with one backend and scores with another over the same checkpoint (vLLM
    sampling with the transformers scorer, say).

    Given a loader instead of a scorer, it runs the phases in order with one copy of the
    weights on the device at a time: sampling, then the sampler is closed (a vLLM engine's
    workers stop and its memory is returned), then the scorer loads, at the first scoring
    call. A scorer given already loaded is used as it is, and the sampler is left open.
    """

    name = "split"

    def __init__(self, sampler: Backend, scorer: Backend | Callable[[], Backend]) -> None:
        self.sampler: Backend | None = sampler
        self.tokenizer = sampler.tokenizer
        self.max_length = sampler.max_length
        self._sampling = sampler.describe()
        if callable(scorer) and not hasattr(scorer, "loglikelihood"):
            self.scorer: Backend | None = None
            self._load_scorer: Callable[[], Backend] | None = scorer
        else:
            self.scorer, self._load_scorer = scorer, None  # type: ignore[assignment]
            if scorer.max_length is not None:
                self.max_length = min(self.max_length or scorer.max_length, scorer.max_length)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:  # fmt: skip
        if self.sampler is None:
            raise RuntimeError("the sampler was closed before sampling")
        return self.sampler.generate(prompts, params, progress, offset, seeds)

    def _scoring_backend(self) -> Backend:
        if self.scorer is None:
            if self.sampler is not None:
                self.sampler.close()
                self.sampler = None
            self.scorer = self._load_scorer()  # type: ignore[misc]
        return self.scorer

    def loglikelihood(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> np.ndarray:
        return self._scoring_backend().loglikelihood(requests, progress, temperature)

    def loglikelihood_per_token(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> TokenLogProbs:
        scorer = self._scoring_backend()
        return scorer.loglikelihood_per_token(requests, progress, temperature)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def describe(self) -> dict[str, str]:
        scoring = self._scoring_backend().describe()
        return {
            **scoring,
            "backend": f"{self._sampling['backend']} sampling, {scoring['backend']} scoring",
        }

    def close(self) -> None:
        for backend in (self.sampler, self.scorer):
            if backend is not None:
                backend.close()
        self.sampler = self.scorer = None
