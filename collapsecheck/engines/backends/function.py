"""A backend whose scorer is the caller's own batched log-likelihood function: a trainer that
already runs its policy (veRL's actor `compute_log_prob`, RAGEN's cross-scoring) scores the
cross pairs itself, and collapsecheck never loads a model. It samples nothing: the caller
brings the responses too (`collapsecheck.integrations.any_trainer`). Built by the caller, not
by name from a checkpoint, so it is not in the registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collapsecheck.engines.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    ScoreRequest,
    decode_ids,
)
from collapsecheck.errors import CollapsecheckError

# (contexts, continuations) as token ids -> per pair, the sum of log p(continuation | context)
LogLikelihood = Callable[[list[list[int]], list[list[int]]], Sequence[float]]
DEFAULT_CALL_SIZE = 256  # pairs per call of the caller's function


class FunctionBackend:
    """Scores with `loglikelihood`, decodes with `tokenizer`; `call_size` pairs per call."""

    name = "function"

    def __init__(
        self,
        loglikelihood: LogLikelihood,
        tokenizer: Any,
        *,
        call_size: int = DEFAULT_CALL_SIZE,
    ) -> None:
        self.function = loglikelihood
        self.tokenizer = tokenizer
        self.call_size = call_size
        self.max_length: int | None = None  # the caller's contexts fit its model already

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0,
    ) -> list[list[Sample]]:  # fmt: skip
        raise CollapsecheckError("the caller's log-likelihood function scores; it cannot sample")

    def loglikelihood(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> np.ndarray:
        """Each request as one (context, continuation) pair: the prompt and the part of the
        continuation before the scored tokens as context, the scored tokens as continuation.
        The caller's function reads the policy at the temperature it applies itself (veRL's
        `compute_log_prob` divides by the rollout temperature), so `temperature` is not
        applied here; the report records the function as the scorer."""
        values = np.empty(len(requests), dtype=np.float64)
        for start in range(0, len(requests), self.call_size):
            chunk = requests[start : start + self.call_size]
            contexts = [[*r.context, *r.continuation[: r.scored_from]] for r in chunk]
            continuations = [list(r.continuation[r.scored_from :]) for r in chunk]
            scored = np.asarray(self.function(contexts, continuations), dtype=np.float64)
            if scored.shape != (len(chunk),):
                raise CollapsecheckError(
                    f"the log-likelihood function returned shape {scored.shape} for "
                    f"{len(chunk)} pairs: it must return one number per pair"
                )
            values[start : start + len(chunk)] = scored
            progress(len(chunk))
        return values

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def describe(self) -> dict[str, str]:
        name = getattr(self.function, "__qualname__", type(self.function).__name__)
        return {"backend": self.name, "device": "the caller's", "dtype": "the caller's",
                "scorer": f"the caller's function {name}"}  # fmt: skip

    def close(self) -> None:
        """The caller owns its model: nothing to release."""
