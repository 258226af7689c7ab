"""The scorers never make the device wait on the host inside a scoring call (issue 57, item
4): whether a row is branched, which positions are scored and where each value goes are read
off the requests on the host, and the values stay on the device until `Scored.flush` reads
them back in one copy.

Checked on PyTorch's meta device, whose tensors have shapes but no values: anything that
reads a value back (`.item()`, `bool()`, indexing by a boolean mask, `.cpu()`) raises there,
so a call that runs through on it asked the device nothing. The values themselves are checked
on CPU: flushed after every batch or once, they are the same."""

import numpy as np
import pytest
import torch

from collapsecheck.engines.backends import hf_scoring
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.logit_head import LogitHead
from collapsecheck.settings import LoadSettings
from tests.test_logit_head import branched_requests, no_progress, small


@pytest.fixture(scope="module")
def meta_model(demo_tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = small(LlamaConfig, len(demo_tokenizer), pad_token_id=0)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("scorer", ["cached", "naive"])
@pytest.mark.parametrize("path", ["tiled head", "full logits"])
def test_no_value_is_read_back_before_the_call_ends(
    meta_model, demo_tokenizer, scorer, path, monkeypatch
):
    reads = []
    monkeypatch.setattr(hf_scoring.Scored, "flush", lambda self: reads.append(len(self._sums)))
    backend = TransformersBackend(meta_model, demo_tokenizer, scorer=scorer, batch_tokens=64)
    assert backend.device == "meta"
    # a head on the meta device is taken for one offloaded by --device-map: set it here
    backend.head = LogitHead(meta_model.lm_head.weight, (7, 16)) if path == "tiled head" else None
    requests = branched_requests(np.random.default_rng(1))
    backend.loglikelihood_per_token(requests, no_progress)
    backend.loglikelihood(requests, no_progress)
    # one read-back per call, each after many batches (of 64 tokens at most)
    assert len(reads) == 2 and min(reads) > 3, reads


@pytest.mark.parametrize("scorer", ["cached", "naive"])
def test_values_read_back_after_every_batch_are_the_same(random_checkpoint, scorer, monkeypatch):
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cpu", dtype="float32", batch_tokens=64), scorer
    )
    requests = branched_requests(np.random.default_rng(4))
    once = backend.loglikelihood_per_token(requests, no_progress, 0.8)
    monkeypatch.setattr(hf_scoring, "PENDING_VALUES", 1)
    flushes = []
    flush = hf_scoring.Scored.flush
    monkeypatch.setattr(hf_scoring.Scored, "flush", lambda self: (flushes.append(1), flush(self)))
    every = backend.loglikelihood_per_token(requests, no_progress, 0.8)
    assert len(flushes) > 3
    assert np.array_equal(once.sums, every.sums)
    assert np.array_equal(once.values, every.values)
    assert np.array_equal(once.offsets, every.offsets)
