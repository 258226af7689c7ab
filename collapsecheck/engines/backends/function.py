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
    SumsOfTokens,
    TokenLogProbs,
    decode_ids,
)
from collapsecheck.errors import CollapsecheckError

# (contexts, continuations) as token ids -> per pair, the sum of log p(continuation | context),
# or the log-probability of each of its tokens (`per_pair_tokens` reads both ways)
LogLikelihood = Callable[[list[list[int]], list[list[int]]], Any]
DEFAULT_CALL_SIZE = 256  # pairs per call of the caller's function


def per_pair_tokens(returned: Any, continuations: list[list[int]]) -> np.ndarray | list:
    """What the caller's function returned, read as one sum per pair (a 1-D array, returned
    as it is) or as each pair's per-token log-probabilities (a list of arrays): one sequence
    per pair of its continuation's length, or a right-padded (pairs, width) array such as
    veRL's `old_log_probs`, read up to each continuation's length."""
    pairs = len(continuations)
    if isinstance(returned, np.ndarray) or hasattr(returned, "shape"):
        array = np.asarray(returned, dtype=np.float64)
        if array.shape == (pairs,):
            return array
        longest = max((len(c) for c in continuations), default=0)
        if array.ndim == 2 and array.shape[0] == pairs and array.shape[1] >= longest:
            return [array[i, : len(c)] for i, c in enumerate(continuations)]
        raise CollapsecheckError(
            f"the log-likelihood function returned shape {array.shape} for {pairs} pairs: it "
            f"must return one number per pair, or a (pairs, width >= {longest}) array of "
            "per-token log-probabilities"
        )
    values = list(returned)
    if len(values) != pairs:
        raise CollapsecheckError(
            f"the log-likelihood function returned {len(values)} values for {pairs} pairs: it "
            "must return one number per pair, or each pair's per-token log-probabilities"
        )
    if all(np.ndim(v) == 0 for v in values):
        return np.asarray(values, dtype=np.float64)
    tokens = [np.asarray(v, dtype=np.float64).reshape(-1) for v in values]
    for i, (t, c) in enumerate(zip(tokens, continuations, strict=True)):
        if len(t) != len(c):
            raise CollapsecheckError(
                f"the log-likelihood function returned {len(t)} per-token values for pair "
                f"{i + 1}, whose continuation has {len(c)} tokens"
            )
    return tokens


class FunctionBackend(SumsOfTokens):
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
        offset: int = 0, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:  # fmt: skip
        raise CollapsecheckError("the caller's log-likelihood function scores; it cannot sample")

    def loglikelihood_per_token(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> TokenLogProbs:
        """Each request as one (context, continuation) pair: the prompt and the part of the
        continuation before the scored tokens as context, the scored tokens as continuation.
        The caller's function reads the policy at the temperature it applies itself (veRL's
        `compute_log_prob` divides by the rollout temperature), so `temperature` is not
        applied here; the report records the function as the scorer. Per-token values where
        the function gives them (`per_pair_tokens`), sums only where it gives sums."""
        sums = np.empty(len(requests), dtype=np.float64)
        tokens: list[np.ndarray] | None = []
        for start in range(0, len(requests), self.call_size):
            chunk = requests[start : start + self.call_size]
            contexts = [[*r.context, *r.continuation[: r.scored_from]] for r in chunk]
            continuations = [list(r.continuation[r.scored_from :]) for r in chunk]
            scored = per_pair_tokens(self.function(contexts, continuations), continuations)
            if isinstance(scored, np.ndarray):  # sums only: no per-token values for any
                sums[start : start + len(chunk)] = scored
                tokens = None
            else:
                sums[start : start + len(chunk)] = [float(np.sum(t)) for t in scored]
                if tokens is not None:
                    tokens.extend(scored)
            progress(len(chunk))
        return TokenLogProbs.of(sums, tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def describe(self) -> dict[str, str]:
        name = getattr(self.function, "__qualname__", type(self.function).__name__)
        return {"backend": self.name, "device": "the caller's", "dtype": "the caller's",
                "scorer": f"the caller's function {name}"}  # fmt: skip

    def close(self) -> None:
        """The caller owns its model: nothing to release."""
