"""Scorer exactness: the cached scorer equals plain full-sequence forward passes."""

import numpy as np
import pytest
import torch

from collapsecheck.backends.base import ScoreRequest, no_progress
from collapsecheck.backends.hf import TransformersBackend, length_batches

TOLERANCE = 1e-4  # nats per trace, float32 (the scan issue's bound)


def requests_with_padding():
    """Contexts shared by several requests, prefixes, continuations of unequal lengths."""
    rng = np.random.default_rng(0)
    contexts = [tuple(rng.integers(5, 50, size=n).tolist()) for n in (7, 19, 3)]
    requests = []
    for context in contexts:
        for length in (1, 4, 13, 30):
            continuation = tuple(rng.integers(5, 50, size=length).tolist())
            scored_from = int(rng.integers(0, min(3, length)))
            requests.append(ScoreRequest(context, continuation, scored_from))
    return requests


def reference(model, request):
    """One unpadded forward pass over [context | continuation], summed by hand."""
    ids = torch.tensor([request.context + request.continuation])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
    start = len(request.context) + request.scored_from
    return sum(logprobs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1]))


@pytest.mark.parametrize("batch_tokens", [16, 4096])
def test_cached_and_naive_match_a_plain_forward(random_checkpoint, batch_tokens):
    requests = requests_with_padding()
    results = {}
    for scorer in ("cached", "naive"):
        backend = TransformersBackend.from_checkpoint(
            random_checkpoint,
            device="cpu",
            dtype="float32",
            scorer=scorer,
            batch_tokens=batch_tokens,
        )
        results[scorer] = backend.loglikelihood(requests, no_progress)
    expected = np.array([reference(backend.model, r) for r in requests])
    assert np.abs(results["naive"] - expected).max() < TOLERANCE
    assert np.abs(results["cached"] - expected).max() < TOLERANCE
    assert np.abs(results["cached"] - results["naive"]).max() < TOLERANCE


def test_length_batches_respect_the_token_budget():
    lengths = [5, 30, 2, 17, 17, 9, 1]
    batches = list(length_batches(lengths, 40))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 40
