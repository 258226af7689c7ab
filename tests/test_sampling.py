"""Sampling through the transformers backend: seeded, batched, from the policy's distribution."""

import numpy as np
import pytest
import torch

from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.prompts import load_prompts, render_prompt
from collapsecheck.settings import LoadSettings, SamplingSettings
from tests.conftest import HEALTHY, PROMPTS, STATEFUL_KINDS


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


def reference_samples(model, prompt, k, seed, params, stop):
    """The sampler as plainly as it can be written (SPEC "Sampling"): one prompt, its K rows
    decoded together with no key/value cache (the whole sequence run again each step); the
    prompt's uniforms, (steps, K), drawn at once from its own generator; each row's token the
    first whose running sum of probabilities (numpy, float64) passes u x the row's total; a
    row's tokens after its stop token ignored."""
    generator = torch.Generator().manual_seed(seed)
    uniforms = torch.rand((params.max_new_tokens, k), generator=generator, dtype=torch.float64)
    rows = torch.tensor([list(prompt)] * k)
    with torch.no_grad():
        for step in range(params.max_new_tokens):
            logits = model(input_ids=rows).logits[:, -1].float() / params.temperature
            probs = torch.softmax(logits, dim=-1)
            if params.top_p < 1:
                ordered, order = probs.sort(dim=-1, descending=True)
                outside = ordered.cumsum(dim=-1) - ordered >= params.top_p
                probs = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(outside, 0))
            tokens = []
            for row, u in zip(probs.double().numpy(), uniforms[step].tolist(), strict=True):
                running = np.cumsum(row)
                tokens.append(int(np.searchsorted(running, u * running[-1], side="right")))
            rows = torch.cat([rows, torch.tensor(tokens)[:, None]], dim=1)
    out = []
    for row in rows[:, len(prompt) :].tolist():
        end = next((i for i, t in enumerate(row) if t == stop), None)
        out.append(tuple(row[:end]))
    return out


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gemma2", *STATEFUL_KINDS])
@pytest.mark.parametrize("read_every", [1, 8])
def test_batched_sampling_draws_what_one_prompt_at_a_time_draws(
    kind, read_every, demo_tokenizer, monkeypatch
):
    """Prompts of different lengths decoded together, rows leaving the batch as they end,
    the tokens drawn for all rows at once, which rows have ended read every step (a CPU's
    way) or every few (a GPU's), the cache laid out for decoding (`decode_cache`; Gemma 2's
    sliding-window layer kept as transformers makes it; the states of Qwen3.5's linear
    attention and Mamba's state-space layers repeated and picked by row, MiniMax's own cache
    repeated by its own method): the same traces as the plain loop above, for every batch
    size, left padding included."""
    from collapsecheck.engines.backends import hf
    from collapsecheck.engines.backends.base import prompt_seed
    from tests.conftest import tiny_model

    monkeypatch.setitem(hf.ENDED_READ_EVERY, "cpu", read_every)

    # a seed whose rows end at different steps (checked below)
    model = tiny_model(kind, len(demo_tokenizer), seed={"gemma2": 5, "mamba": 2}.get(kind, 1))
    stop = demo_tokenizer.eos_token_id
    model.generation_config.eos_token_id = stop
    texts = ["state 1 2", "a longer prompt of more tokens than the others", "x", "state 3 4 go"]
    prompts = [demo_tokenizer(t)["input_ids"] for t in texts]
    params = SamplingParams(k=4, temperature=0.8, top_p=0.9, max_new_tokens=24, seed=5)
    expected = [
        reference_samples(model, p, 4, prompt_seed(5, i), params, stop)
        for i, p in enumerate(prompts)
    ]
    lengths = {len(ids) for per_prompt in expected for ids in per_prompt}
    assert len(lengths) > 2  # rows end at different steps: some leave the batch early
    for sample_batch in (4, 16, 128):
        backend = TransformersBackend(model, demo_tokenizer, sample_batch=sample_batch)
        got = backend.generate(prompts, params, no_progress)
        assert ids_of(got) == expected, sample_batch
    later = backend.generate(prompts[2:], params, no_progress, offset=2)
    assert ids_of(later) == expected[2:]  # sampled in parts, seeded by the prompt's index


def prefilled_rows(model):
    """The rows of each prefill `model` runs (a call with more than one position), as a list
    that fills while the hook stays on the model."""
    rows = []

    def count(_, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            rows.append(ids.shape[0])

    return rows, model.register_forward_pre_hook(count, with_kwargs=True)


@pytest.mark.parametrize("kind", ["llama", "gemma2", *STATEFUL_KINDS])
@pytest.mark.parametrize("k", [1, 3])
def test_rows_that_share_a_context_are_prefilled_once_and_draw_what_each_draws_alone(
    kind, k, demo_tokenizer
):
    """SPEC "Sampling": prompts whose ids are identical (the K episodes of a start state, a
    harness's requests with the same messages), each with its own seed, are prefilled once and
    decoded from that one prefill, each drawing what it draws alone (the plain loop above),
    for every kind of cache: plain layers copied apart into the decode's buffers, Gemma 2's
    sliding window, the states of Qwen3.5's and Mamba's layers, MiniMax's own cache picked
    by its own method."""
    from tests.conftest import tiny_model

    model = tiny_model(kind, len(demo_tokenizer), seed={"gemma2": 5, "mamba": 2}.get(kind, 1))
    stop = demo_tokenizer.eos_token_id
    model.generation_config.eos_token_id = stop
    board, other = (demo_tokenizer(t)["input_ids"] for t in ("state 1 2 go", "x"))
    prompts = [board, other, board, board, other]
    seeds = [11, 12, 13, 14, 15]
    params = SamplingParams(k=k, temperature=0.8, max_new_tokens=16)
    expected = [
        reference_samples(model, p, k, seed, params, stop)
        for p, seed in zip(prompts, seeds, strict=True)
    ]
    assert expected[0] != expected[2]  # one context, two seeds: two draws
    backend = TransformersBackend(model, demo_tokenizer, sample_batch=64)
    rows, hook = prefilled_rows(model)
    try:
        got = backend.generate(prompts, params, no_progress, seeds=seeds)
    finally:
        hook.remove()
    assert ids_of(got) == expected
    assert rows == [2]  # two distinct contexts, one prefill each, in one batch


def test_auto_sample_batch_decodes_what_the_memory_holds(backend, monkeypatch):
    from collapsecheck.engines.backends import hf
    from collapsecheck.settings import SAMPLE_BATCH_CAP

    model, length = backend.model, 100
    assert hf.auto_sample_batch(model, length) == SAMPLE_BATCH_CAP["cpu"]
    per_sequence = hf.kv_bytes_per_token(model) * length + 6 * model.config.vocab_size * 4
    monkeypatch.setattr(hf, "CPU_SCORING_BUDGET", 10 * per_sequence)
    assert hf.auto_sample_batch(model, length) == 10
    auto = TransformersBackend(model, backend.tokenizer)
    assert auto.sequences_per_batch([[1] * 36], SamplingParams(max_new_tokens=64)) == 10
    assert (
        TransformersBackend(model, backend.tokenizer, sample_batch=7).sequences_per_batch(
            [[1] * 36], SamplingParams()
        )
        == 7
    )
    with pytest.raises(CollapsecheckError, match="--sample-batch"):
        LoadSettings(sample_batch="lots")


def test_inverse_cdf_draws_each_token_with_its_share_and_never_one_of_probability_0():
    from collapsecheck.engines.backends.hf import inverse_cdf

    probs = torch.tensor(
        [[0.0, 0.1, 0.0, 0.3, 0.6, 0.0], [0.35, 0.0, 0.0, 0.35, 0.0, 0.0]]  # the second cut
    )  # fmt: skip
    draws = 200_000
    generator = torch.Generator().manual_seed(0)
    uniforms = torch.rand((draws, 2), generator=generator, dtype=torch.float64)
    tokens = inverse_cdf(probs.repeat(draws, 1), uniforms.reshape(-1)).reshape(draws, 2)
    for row in range(2):
        counts = torch.bincount(tokens[:, row], minlength=6).double()
        share = probs[row].double() / probs[row].sum()
        spread = (draws * share * (1 - share)).sqrt()
        assert (counts - draws * share).abs().le(5 * spread + 1e-9).all(), (row, counts)
        assert counts[share == 0].sum() == 0
    ends = torch.tensor([0.0, 1 - 2**-53], dtype=torch.float64)  # the draws' extremes
    assert inverse_cdf(probs[[0, 0]], ends).tolist() == [1, 4]
    assert inverse_cdf(probs[[1, 1]], ends).tolist() == [0, 3]
    not_finite = torch.full((1, 6), float("nan"))
    assert inverse_cdf(not_finite, ends[:1]).tolist() == [5]  # in range; the scan then stops


def test_preallocated_layer_holds_what_concatenation_holds():
    from collapsecheck.engines.backends.decode_cache import PreallocatedLayer, Readers

    keys, values = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    picked = torch.tensor([1, 0, 1, 1])  # prefilled row 1 read by three decoded rows
    assert Readers.of(picked).repeats is None and Readers.of(picked.flip(0)).repeats is None
    in_order = torch.tensor([0, 0, 1, 1])  # a plain scan's K = 2: one copy does them all
    assert Readers.of(in_order).repeats == 2
    repeated = PreallocatedLayer(keys, values, Readers.of(in_order), capacity=6)
    assert torch.equal(repeated.keys, keys[in_order])
    layer = PreallocatedLayer(keys, values, Readers.of(picked), capacity=6)
    expected_keys = keys[picked]
    assert torch.equal(layer.values, values[picked])
    for step in range(4):  # two within the capacity, then past it
        new_keys, new_values = torch.randn(4, 3, 1, 5), torch.randn(4, 3, 1, 5)
        got_keys, got_values = layer.update(new_keys, new_values)
        expected_keys = torch.cat([expected_keys, new_keys], dim=-2)
        assert torch.equal(got_keys, expected_keys)
        assert torch.equal(got_values[..., -1:, :], new_values)
        assert layer.get_seq_length() == 5 + step
        if step < 2:  # a view of the buffer: no copy of the keys before it
            assert got_keys.data_ptr() == layer.key_buffer.data_ptr()
    layer.batch_select_indices(torch.tensor([3, 0]))
    assert torch.equal(layer.keys, expected_keys[[3, 0]])
    layer.update(torch.zeros(2, 3, 1, 5), torch.zeros(2, 3, 1, 5))
    assert torch.equal(layer.keys[..., :-1, :], expected_keys[[3, 0]])


def test_a_row_is_sampleable_unless_nan_positive_infinity_or_all_negative_infinity():
    from collapsecheck.engines.backends.hf import inverse_cdf, sampleable

    inf, nan = float("inf"), float("nan")
    fine = torch.tensor([[0.5, -inf, 1.0, -inf], [2.0, 1.0, 0.0, -1.0]])
    assert bool(sampleable(fine))
    # a token at -inf is probability 0: never drawn
    probs = torch.softmax(fine, dim=-1)
    uniforms = torch.rand(2000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    drawn = inverse_cdf(probs[[0]].repeat(2000, 1), uniforms)
    assert set(drawn.tolist()) == {0, 2}
    for bad in ([0.0, nan, 1.0, 2.0], [0.0, inf, 1.0, 2.0], [-inf] * 4):
        assert not bool(sampleable(torch.cat([fine, torch.tensor([bad])]))), bad
