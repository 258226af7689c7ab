"""The backend contract, after lm-evaluation-harness: every model backend does two things,
(1) sample K responses per prompt and (2) score continuations given contexts. Everything
above the backends (reasoning extraction, cross-scoring, metrics) works on token ids only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from collapsecheck.errors import CollapsecheckError

Progress = Callable[[int], None]

# Tokens per scoring batch (batch size x longest sequence): "auto" sizes it to the memory.
DEFAULT_BATCH_TOKENS = "auto"
# Sequences decoded together while sampling (prompts per batch = this // K).
DEFAULT_SAMPLE_ROWS = 128


def no_progress(_: int) -> None:
    """Progress callback that reports nothing."""


@dataclass(frozen=True)
class SamplingParams:
    """SPEC "Sampling": the policy's own distribution, as in training rollouts."""

    k: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise CollapsecheckError(f"-k/--samples must be at least 1, got {self.k}")
        if self.temperature < 0:
            raise CollapsecheckError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise CollapsecheckError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise CollapsecheckError(
                f"--max-new-tokens must be at least 1, got {self.max_new_tokens}"
            )

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The sampling seed of one prompt: its traces depend on (seed, index) alone, not on
    which other prompts are in the set or how they are batched."""
    return int(np.random.SeedSequence([seed, prompt_index]).generate_state(1)[0])


@dataclass(frozen=True)
class Sample:
    """One sampled response: its token ids (stop token excluded) and whether the length
    limit cut it before a stop token."""

    ids: tuple[int, ...]
    truncated: bool


@dataclass(frozen=True)
class ScoreRequest:
    """Score `continuation[scored_from:]` given `context + continuation[:scored_from]`.

    Keeping the shared context (a prompt) apart from the per-request part lets a backend
    compute each distinct context once.
    """

    context: tuple[int, ...]
    continuation: tuple[int, ...]
    scored_from: int = 0


class Backend(Protocol):
    """What every model backend provides."""

    tokenizer: Any  # a transformers tokenizer: renders prompts, decodes responses
    max_length: int | None  # the model's context length in tokens, where known

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress
    ) -> list[list[Sample]]:
        """K samples for each prompt (given as token ids), seeded per prompt."""
        ...

    def loglikelihood(self, requests: Sequence[ScoreRequest], progress: Progress) -> np.ndarray:
        """Sum of log-probabilities of each request's scored tokens (float64, one per request)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text, special tokens kept, no clean-up."""
        ...

    def describe(self) -> dict[str, str]:
        """Backend, device, dtype and scorer, for the report's settings."""
        ...


def close_backend(backend: Backend) -> None:
    """Release a backend's engine (worker processes, device memory) where it holds one."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


class SplitBackend:
    """Samples with one backend and scores with another, both over the same checkpoint (vLLM
    sampling with the transformers scorer, say)."""

    def __init__(self, sampler: Backend, scorer: Backend) -> None:
        self.sampler, self.scorer = sampler, scorer
        self.tokenizer = sampler.tokenizer
        limits = [b.max_length for b in (sampler, scorer) if b.max_length is not None]
        self.max_length = min(limits) if limits else None

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress
    ) -> list[list[Sample]]:
        return self.sampler.generate(prompts, params, progress)

    def loglikelihood(self, requests: Sequence[ScoreRequest], progress: Progress) -> np.ndarray:
        return self.scorer.loglikelihood(requests, progress)

    def decode(self, ids: Sequence[int]) -> str:
        return self.sampler.decode(ids)

    def describe(self) -> dict[str, str]:
        sampling, scoring = self.sampler.describe(), self.scorer.describe()
        return {
            **scoring,
            "backend": f"{sampling['backend']} sampling, {scoring['backend']} scoring",
        }

    def close(self) -> None:
        close_backend(self.sampler)
        close_backend(self.scorer)
