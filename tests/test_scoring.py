"""Scorer exactness: the cached scorer equals plain full-sequence forward passes."""

import numpy as np
import pytest
import torch

from collapsecheck.engines.backends.base import ScoreRequest, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.hf_scoring import (
    common_prefix_length,
    length_batches,
    token_logprobs,
)
from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import LoadSettings

TOLERANCE = 1e-4  # nats per trace, float32 (the scan issue's bound)


def requests_with_padding():
    """Contexts shared by several requests, prefixes, continuations of unequal lengths."""
    rng = np.random.default_rng(0)
    contexts = [tuple(rng.integers(5, 50, size=n).tolist()) for n in (7, 19, 3)]
    requests = []
    for context in contexts:
        for length in (24, 26, 28, 30):  # unequal, each over 3/4 of the longest: one batch
            continuation = tuple(rng.integers(5, 50, size=length).tolist())
            scored_from = int(rng.integers(0, min(3, length)))
            requests.append(ScoreRequest(context, continuation, scored_from))
    return requests


def reference(model, request, temperature=1.0):
    """One unpadded forward pass over [context | continuation], summed by hand (the policy at
    `temperature`: softmax of logits / temperature)."""
    ids = torch.tensor([request.context + request.continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
        logprobs = torch.log_softmax(logits, dim=-1)
    start = len(request.context) + request.scored_from
    return sum(logprobs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1]))


@pytest.mark.parametrize("batch_tokens", [16, 4096])
def test_cached_and_naive_match_a_plain_forward(random_checkpoint, batch_tokens):
    requests = requests_with_padding()
    results = {}
    for scorer in ("cached", "naive"):
        backend = TransformersBackend.from_checkpoint(
            random_checkpoint,
            LoadSettings(device="cpu", dtype="float32", batch_tokens=batch_tokens),
            scorer=scorer,
        )
        results[scorer] = backend.loglikelihood(requests, no_progress)
    expected = np.array([reference(backend.model, r) for r in requests])
    assert np.abs(results["naive"] - expected).max() < TOLERANCE
    assert np.abs(results["cached"] - expected).max() < TOLERANCE
    assert np.abs(results["cached"] - results["naive"]).max() < TOLERANCE


@pytest.mark.parametrize("scorer", ["cached", "naive"])
def test_scoring_reads_the_policy_at_the_temperature_sampled(random_checkpoint, scorer):
    """SPEC "Sampling": traces sampled at temperature T are scored at T, as veRL's
    compute_log_prob divides the logits by the rollout temperature."""
    requests = requests_with_padding()
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cpu", dtype="float32"), scorer=scorer
    )
    tempered = backend.loglikelihood(requests, no_progress, temperature=0.6)
    expected = np.array([reference(backend.model, r, temperature=0.6) for r in requests])
    assert np.abs(tempered - expected).max() < TOLERANCE
    plain = backend.loglikelihood(requests, no_progress)
    assert np.median(np.abs(tempered - plain)) > 100 * TOLERANCE  # the temperature did something


def test_length_batches_respect_the_token_budget():
    lengths = [5, 30, 2, 17, 17, 9, 1]
    batches = list(length_batches(lengths, 40))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 40
        # padding adds at most a third: every length over 3/4 of the batch's longest
        assert min(lengths[i] for i in batch) > 0.75 * max(lengths[i] for i in batch)


def system_prompt_requests():
    """Contexts that all begin with one long system prompt, then differ."""
    rng = np.random.default_rng(1)
    system = tuple(rng.integers(5, 50, size=25).tolist())
    contexts = [system + tuple(rng.integers(5, 50, size=n).tolist()) for n in (4, 9, 1)]
    return [
        ScoreRequest(context, tuple(rng.integers(5, 50, size=length).tolist()), 1)
        for context in contexts
        for length in (10, 11)  # run as 9 and 10 tokens (the last is scored, not run): one batch
    ]


def record_batch_shapes(model):
    """The input shapes of every pass of the decoder (the model's forward, or the decoder
    alone where the scorer applies the LM head itself)."""
    shapes = []

    def hook(module, args, kwargs):
        shapes.append(tuple(kwargs.get("input_ids", args[0] if args else None).shape))

    return shapes, model.base_model.register_forward_pre_hook(hook, with_kwargs=True)


def test_common_system_prompt_is_computed_once_and_exactly(random_checkpoint):
    requests = system_prompt_requests()
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cpu", dtype="float32")
    )
    shapes, handle = record_batch_shapes(backend.model)
    scores = backend.loglikelihood(requests, no_progress)
    handle.remove()
    expected = np.array([reference(backend.model, r) for r in requests])
    assert np.abs(scores - expected).max() < TOLERANCE
    # the shared 25 tokens once, then only each prompt's own tokens and the continuations
    # (less their last token, which nothing reads)
    assert shapes[0] == (1, 25)
    assert [s for s in shapes[1:] if s[0] == 1] == [(1, 4), (1, 9), (1, 1)]
    assert [s for s in shapes[1:] if s[0] == 2] == [(2, 10)] * 3
    assert len(shapes) == 7
    assert common_prefix_length([(1, 2, 3), (1, 2, 4), (1, 2)]) == 1
    assert common_prefix_length([(7, 8), (9,)]) == 0


@pytest.mark.parametrize("scorer", ["cached", "naive"])
def test_out_of_memory_splits_the_batch_and_stays_exact(random_checkpoint, scorer):
    """A real model that runs out of memory above two sequences: the guard halves the batch."""
    requests = requests_with_padding()
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint,
        LoadSettings(device="cpu", dtype="float32", batch_tokens=4096),
        scorer=scorer,
    )

    def out_of_memory_above_two(module, args, kwargs):
        if kwargs.get("input_ids", args[0] if args else None).shape[0] > 2:
            raise torch.OutOfMemoryError("simulated: CUDA out of memory")

    decoder = backend.model.base_model  # every pass runs it, with or without the LM head
    handle = decoder.register_forward_pre_hook(out_of_memory_above_two, with_kwargs=True)
    try:
        scores = backend.loglikelihood(requests, no_progress)
    finally:
        handle.remove()
    expected = np.array([reference(backend.model, r) for r in requests])
    assert np.abs(scores - expected).max() < TOLERANCE
    assert backend.batch_tokens < 4096


def test_auto_batch_tokens_fits_the_model(random_checkpoint):
    backend = TransformersBackend.from_checkpoint(random_checkpoint, LoadSettings(device="cpu"))
    assert 256 <= backend.batch_tokens <= 2**17
    with pytest.raises(CollapsecheckError, match="--batch-tokens must be auto or a number"):
        LoadSettings(device="cpu", batch_tokens="lots")


def test_log_softmax_accumulates_in_float32_whatever_the_model_dtype():
    """Every scoring path (naive, stems, branches) reads log-probabilities through
    token_logprobs (sampling softmaxes `logits.float()`): bfloat16 logits are normalised in
    float32, not in bfloat16."""
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 4000) * 4).to(torch.bfloat16)
    targets = torch.randint(0, 4000, (3, 5))
    got = token_logprobs(logits, targets)
    in_float32 = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    in_bfloat16 = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    assert got.dtype == torch.float32
    assert torch.allclose(got, in_float32, atol=1e-5)
    assert (got - in_bfloat16.float()).abs().max() > 1e-3  # bfloat16 would round visibly


def branching_requests():
    """Two contexts; under each, stems with actions after them, as the flow asks: the most
    common action (carried on by the stem's row), others leaving the row after the shared
    mid, one leaving inside the mid, one whose scored tokens start before it leaves, one that
    leaves at the first token, and duplicates."""
    rng = np.random.default_rng(2)

    def ids(n):
        return tuple(rng.integers(5, 50, size=n).tolist())

    requests = []
    for context in (ids(6), ids(11)):
        stem, mid = ids(9), (3, 4)
        common, other, longer = ids(3), ids(2), ids(5)
        for act, scored_from in [
            (mid + common, 11), (mid + common, 11), (mid + other, 11), (mid + longer, 11),
            (mid + longer, 11), ((3, 7, *other), 11), (mid + other, 10), (mid + common, 9),
            (mid + common + (8, 9), 14),
        ]:  # fmt: skip
            requests.append(ScoreRequest(context, stem + act, scored_from, len(stem)))
        requests.append(ScoreRequest(context, stem, 2))  # the stem's own X->Z request
        requests.append(ScoreRequest(context, (stem[0] + 1, *other), 0, 1))  # leaves at once
    return requests


def scored_in_passes(checkpoint, requests):
    """The cached scorer's values (one batch budget for all), a plain forward pass's for
    each request, and the shapes of the scorer's forward passes."""
    backend = TransformersBackend.from_checkpoint(
        checkpoint, LoadSettings(device="cpu", dtype="float32", batch_tokens=4096)
    )
    shapes, handle = record_batch_shapes(backend.model)
    scores = backend.loglikelihood(requests, no_progress)
    handle.remove()
    expected = np.array([reference(backend.model, r) for r in requests])
    return scores, expected, shapes


def test_branches_ride_in_their_stems_pass_and_are_exact(random_checkpoint):
    """Every branch is appended to its stem's row: one forward pass per batch of stems (no
    second pass), and each value equals a plain forward pass over the whole sequence."""
    scores, expected, shapes = scored_in_passes(random_checkpoint, branching_requests())
    assert np.abs(scores - expected).max() < TOLERANCE
    # per context: its prefill, then one pass per stem row, the plain rows' first, apart from
    # the branched ones (which run with a mask of their own). The 9-token stem's row is 24
    # wide: stem + mid + common action (14), then its other branches, each once: the other
    # action after the mid (2), the longer one (5), the one leaving inside the mid (1 + 2),
    # the one scored from inside the mid (1 + 2) and the one going on after the row's end
    # (2); each branch less its last token, scored but never run (nothing reads its logits),
    # and the row keeps its last token only because that branch reads it. The one-token
    # stem's row: its token and the action it carries on into, less its last (3 - 1)
    assert shapes == [(1, 6), (1, 2), (1, 24), (1, 11), (1, 2), (1, 24)]


def test_plain_rows_run_apart_from_branched_ones(random_checkpoint):
    """A context's plain rows (a stem and the action it carries on into) run in batches of
    their own, causal with no mask, however close their width is to a branched row's: they
    neither pad to its width nor take its mask (issue 73). The values stay exact."""
    rng = np.random.default_rng(4)

    def ids(n):
        return tuple(rng.integers(5, 50, size=n).tolist())

    context, mid = ids(6), (3, 4)
    requests = []
    for branched in (True, False, False):
        stem, action = ids(12), ids(2)
        requests += [ScoreRequest(context, stem, 1), ScoreRequest(context, stem + mid + action,
                                                                  14, 12)]  # fmt: skip
        if branched:  # another action after the same stem: a branch appended to its row
            requests.append(ScoreRequest(context, stem + mid + ids(2), 14, 12))
    scores, expected, shapes = scored_in_passes(random_checkpoint, requests)
    assert np.abs(scores - expected).max() < TOLERANCE
    # the prefill; the two plain rows (15 of their 16 tokens run: the last predicts nothing);
    # the branched row: its 15 and the other action's first token (in one batch before this)
    assert shapes == [(1, 6), (2, 15), (1, 16)]


def cut_reasoning_requests():
    """SPEC "Early answering": under each context, a trace's whole reasoning (its X->Z
    request and its action after it) and its action after the reasoning cut at every
    length, 0 included, each naming the whole reasoning as its host."""
    rng = np.random.default_rng(3)

    def ids(n):
        return tuple(rng.integers(5, 50, size=n).tolist())

    requests = []
    for context in (ids(5), ids(8)):
        pre, reasoning, mid, action = ids(2), ids(9), (3, 4), ids(3)
        stem = pre + reasoning
        requests.append(ScoreRequest(context, stem, len(pre)))
        requests.append(ScoreRequest(context, stem + mid + action, len(stem) + 2, len(stem)))
        for cut in range(len(reasoning)):
            early = pre + reasoning[:cut]
            continuation = early + mid + action
            requests.append(
                ScoreRequest(context, continuation, len(early) + 2, len(early), host=stem)
            )
    return requests


def test_reasoning_cut_short_branches_from_the_whole_reasonings_pass(random_checkpoint):
    """An action after a cut reasoning leaves the whole reasoning's row where the cut is:
    no pass of its own, and each value equals a plain forward pass of the cut context."""
    scores, expected, shapes = scored_in_passes(random_checkpoint, cut_reasoning_requests())
    assert np.abs(scores - expected).max() < TOLERANCE
    # beside the contexts' prefills (at most 8 tokens), one pass per context: the row (pre +
    # reasoning + mid + action less its last token, 15) and nine branches of mid + action
    # less their last token (4 each)
    assert [shape for shape in shapes if shape[1] > 8] == [(1, 15 + 9 * 4)] * 2
