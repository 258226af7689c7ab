"""Sampling through the transformers backend: seeded, batched, from the policy's distribution."""

import pytest
import torch

from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import load_prompts, render_prompt
from collapsecheck.settings import LoadSettings, SamplingSettings
from tests.conftest import HEALTHY, PROMPTS


@pytest.fixture(scope="module")
def backend():
    return TransformersBackend.from_checkpoint(HEALTHY, LoadSettings(device="cpu", sample_batch=16))


@pytest.fixture(scope="module")
def prompt_ids(backend):
    prompts = load_prompts(PROMPTS, num_prompts=5)
    return [render_prompt(p, backend.tokenizer).ids for p in prompts]


def ids_of(samples):
    return [[s.ids for s in per_prompt] for per_prompt in samples]


def test_same_seed_same_traces_other_seed_other_traces(backend, prompt_ids):
    params = SamplingParams(k=4, max_new_tokens=48, seed=3)
    first = backend.generate(prompt_ids, params, no_progress)
    again = backend.generate(prompt_ids, params, no_progress)
    other = backend.generate(
        prompt_ids, SamplingParams(k=4, max_new_tokens=48, seed=4), no_progress
    )
    assert ids_of(first) == ids_of(again)
    assert ids_of(first) != ids_of(other)
    assert [len(p) for p in first] == [4] * 5


def test_greedy_and_tiny_top_p_are_the_argmax_path(backend, prompt_ids):
    greedy = backend.generate(prompt_ids[:2], SamplingParams(k=3, temperature=0), no_progress)
    nucleus = backend.generate(prompt_ids[:2], SamplingParams(k=3, top_p=1e-6), no_progress)
    assert ids_of(greedy) == ids_of(nucleus)
    for per_prompt in greedy:
        assert len({s.ids for s in per_prompt}) == 1
    # the argmax path, one token at a time, without the backend
    ids = torch.tensor([list(prompt_ids[0])])
    expected = []
    with torch.no_grad():
        for _ in range(len(greedy[0][0].ids) + 1):
            token = int(backend.model(input_ids=ids).logits[0, -1].argmax())
            expected.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    assert [*greedy[0][0].ids, backend.tokenizer.eos_token_id] == expected


def test_length_limit_marks_truncation(backend, prompt_ids):
    samples = backend.generate(prompt_ids[:2], SamplingParams(k=2, max_new_tokens=5), no_progress)
    for per_prompt in samples:
        for sample in per_prompt:
            assert sample.truncated and len(sample.ids) == 5


def test_sampling_parameters_are_checked():
    with pytest.raises(CollapsecheckError, match="top-p"):
        SamplingSettings(top_p=0)
    with pytest.raises(CollapsecheckError, match="temperature"):
        SamplingSettings(temperature=-1)
