"""Log-probabilities without the vocabulary-wide logits (engines/backends/logit_head.py): the
decoder's hidden states at the scored positions, the LM head in tiles with a running
log-sum-exp, each model's own logit transform kept. Every value against a plain forward pass
of the whole model (its logits as its forward returns them, / the temperature), within 1e-5
nats a token in float32, for Llama-, Qwen2-, Gemma 2- (soft-capped), Granite- (scaled) and
Cohere-style (scaled) random models, and Qwen3.5- and Granite 4.0 hybrid-style ones (linear
attention or state-space layers beside full attention: the naive scorer), tiles far smaller
than the vocabulary."""

import numpy as np
import pytest
import torch

from collapsecheck.engines.backends import logit_head
from collapsecheck.engines.backends.base import ScoreRequest
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.settings import LoadSettings
from tests.conftest import QWEN3_5_LINEAR, ROOT
from tests.tolerances import LOGPROB_ATOL


def no_progress(n):
    pass


def small(config_class, vocab_size, **extra):
    return config_class(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        head_dim=8, **extra,
    )  # fmt: skip


def families():
    from transformers import (
        CohereConfig,
        Gemma2Config,
        GraniteConfig,
        GraniteMoeHybridConfig,
        LlamaConfig,
        Qwen2Config,
        Qwen3_5TextConfig,
    )

    hybrid = {"layer_types": ["linear_attention", "full_attention"]}
    return {
        "llama": (LlamaConfig, {}),
        "qwen2": (Qwen2Config, {}),
        "gemma2": (Gemma2Config, {"final_logit_softcapping": 2.0}),
        "granite": (GraniteConfig, {"logits_scaling": 3.0}),
        "cohere": (CohereConfig, {"logit_scale": 0.4}),
        # layers that carry a state (`layer_kinds`): scored by the naive scorer
        "qwen3_5": (Qwen3_5TextConfig, QWEN3_5_LINEAR),
        "granitemoehybrid": (GraniteMoeHybridConfig, {
            **hybrid, "logits_scaling": 3.0, "mamba_n_heads": 4, "mamba_d_head": 16,
            "mamba_d_state": 8, "mamba_chunk_size": 8, "num_local_experts": 2,
            "shared_intermediate_size": 64,
        }),
    }  # fmt: skip


STATEFUL = ("qwen3_5", "granitemoehybrid")


@pytest.fixture(scope="module", params=sorted(families()))
def family_checkpoint(request, tmp_path_factory, demo_tokenizer):
    from transformers import AutoModelForCausalLM

    config_class, extra = families()[request.param]
    torch.manual_seed(0)
    special = {"bos_token_id": 0, "pad_token_id": 0, "eos_token_id": demo_tokenizer.eos_token_id}
    config = small(config_class, len(demo_tokenizer), **special, **extra)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # logits large enough that the transform changes them
        model.get_output_embeddings().weight.mul_(8.0)
    path = tmp_path_factory.mktemp(f"head-{request.param}")
    model.save_pretrained(path)
    demo_tokenizer.save_pretrained(path)
    return request.param, path


def branched_requests(rng):
    """Contexts shared by several continuations; stems with branches after them (an action
    after a reasoning, and the reasoning cut short), as the flow's requests are."""
    requests = []
    for _ in range(3):
        context = tuple(rng.integers(3, 50, size=int(rng.integers(3, 9))).tolist())
        for _ in range(3):
            stem = tuple(rng.integers(3, 50, size=int(rng.integers(2, 12))).tolist())
            action = tuple(rng.integers(3, 50, size=3).tolist())
            requests.append(ScoreRequest(context, stem, 0))
            requests.append(ScoreRequest(context, stem + action, len(stem), stem=len(stem)))
            cut = len(stem) // 2
            requests.append(ScoreRequest(context, stem[:cut] + action, cut, stem=cut, host=stem))
    return requests


def plain_per_token(model, request, temperature):
    ids = torch.tensor([list(request.context + request.continuation)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(request.context) + request.scored_from
    return np.array([logprobs[t - 1, ids[0, t]].item() for t in range(start, ids.shape[1])])


@pytest.mark.parametrize("scorer", ["cached", "naive"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_every_token_equals_a_plain_forward_pass(
    family_checkpoint, scorer, temperature, monkeypatch
):
    monkeypatch.setattr(logit_head, "TILES", {"cpu": (7, 16), "other": (7, 16)})
    name, path = family_checkpoint
    backend = TransformersBackend.from_checkpoint(
        path, LoadSettings(device="cpu", dtype="float32"), scorer=scorer
    )
    assert backend.describe()["logits"].startswith("tiled LM head"), name
    if name in STATEFUL:  # whichever scorer was asked for, and the report says so
        assert backend.scorer == "naive", name
        assert (scorer == "naive") == (backend.describe()["scorer"] == "naive"), name
    requests = branched_requests(np.random.default_rng(1))
    scored = backend.loglikelihood_per_token(requests, no_progress, temperature)
    worst = 0.0
    for index, request in enumerate(requests):
        expected = plain_per_token(backend.model, request, temperature)
        got = scored.of_request(index)
        worst = max(worst, float(np.abs(got - expected).max()))
        assert scored.sums[index] == pytest.approx(got.sum(), abs=1e-9)
    assert worst < LOGPROB_ATOL, (name, worst)


def test_the_transform_is_the_models_own(family_checkpoint):
    """The head's logits of a hidden state are the model's own logits of it (soft-capped,
    scaled), before the temperature."""
    from transformers import AutoModelForCausalLM

    name, path = family_checkpoint
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    head = logit_head.LogitHead.of(model)
    ids = torch.tensor([[5, 9, 17, 33, 2, 40]])
    with torch.no_grad():
        hidden = model.base_model(input_ids=ids).last_hidden_state[0]
        own = model(input_ids=ids).logits[0]
        mine = head.transformed(torch.nn.functional.linear(hidden, head.weight), 1.0)
    assert torch.allclose(own, mine, atol=1e-5), name
    if name not in ("llama", "qwen2", "qwen3_5"):  # the transform matters: without it, other logits
        plain = torch.nn.functional.linear(hidden, head.weight)
        assert not torch.allclose(own, plain, atol=1e-3), name


def test_an_unknown_head_keeps_the_full_logits_and_says_so(random_checkpoint):
    backend = TransformersBackend.from_checkpoint(
        random_checkpoint, LoadSettings(device="cpu", dtype="float32")
    )
    said = backend.describe()["logits"]
    if backend.model.config.model_type == "gpt2":
        assert backend.head is None
        assert said == "full logits (model type gpt2: its head is not known)"
    else:
        assert backend.head is not None and said.startswith("tiled LM head")


def test_in_bfloat16_the_tiles_agree_with_the_full_logits_within_its_rounding(family_checkpoint):
    """A bfloat16 model: each target's logit rounded once to bfloat16, as the head's matmul
    rounds it, so no log-probability passes 0 and the two paths agree to bfloat16's rounding."""
    name, path = family_checkpoint
    backend = TransformersBackend.from_checkpoint(
        path, LoadSettings(device="cpu", dtype="bfloat16")
    )
    requests = branched_requests(np.random.default_rng(2))
    tiled = backend.loglikelihood_per_token(requests, no_progress).values
    head, backend.head = backend.head, None
    full = backend.loglikelihood_per_token(requests, no_progress).values
    backend.head = head
    assert (tiled <= 1e-6).all(), name
    # a logit rounded to bfloat16 (8 bits of mantissa) moves by up to 2^-8 of its size
    assert np.abs(tiled - full).max() < 0.05, (name, np.abs(tiled - full).max())


@pytest.mark.parametrize("fixture", ["qwen2-vl-tiny", "qwen3-vl-tiny"])
def test_a_vision_language_policys_tiles_equal_its_full_logits(fixture):
    """Both vision scorers through the tiled head, each per-token value against the same
    scorer reading the model's full logits (Qwen3-VL: its deepstack features too), images in
    the contexts, branches after the stems, at temperature 0.7."""
    from collapsecheck.engines.backends.registry import load_backend
    from collapsecheck.inputs.checkpoint import require_checkpoint
    from collapsecheck.inputs.prompts import load_prompts, render_prompts
    from collapsecheck.settings import PromptSettings
    from tests.test_vision import PROMPTS, requests_for

    checkpoint = require_checkpoint(ROOT / "tests" / "fixtures" / fixture, None)
    backend = load_backend(checkpoint, LoadSettings(device="cpu", dtype="float32"))
    prompts = load_prompts(PROMPTS, num_prompts=3)
    rendered = render_prompts(prompts, backend.tokenizer, PromptSettings(), backend.vision)
    requests = requests_for(rendered, len(backend.tokenizer))
    assert backend.describe()["logits"].startswith("tiled LM head")
    for scorer in ("cached", "naive"):
        backend.scorer = scorer
        tiled = backend.loglikelihood_per_token(requests, no_progress, 0.7).values
        head, backend.head = backend.head, None
        full = backend.loglikelihood_per_token(requests, no_progress, 0.7).values
        backend.head = head
        assert np.abs(tiled - full).max() < LOGPROB_ATOL, (fixture, scorer)


def test_the_in_place_logsumexp_is_torchs():
    """`logsumexp_` overwrites its tile and gives torch.logsumexp's values, a row of -inf
    and a row holding -inf entries included."""
    torch.manual_seed(3)
    tile = torch.randn(5, 300) * 30
    tile[1] = -torch.inf
    tile[2, :100] = -torch.inf
    expected = torch.logsumexp(tile, dim=-1)
    got = logit_head.logsumexp_(tile.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], atol=1e-5, rtol=0)


def test_the_tiles_are_the_devices():
    """A CPU's tiles are the ones measured there; the head says which it uses."""
    model = torch.nn.Linear(4, 4)
    assert logit_head.tiles_on(torch.device("cpu")) == logit_head.TILES["cpu"]
    assert logit_head.tiles_on(torch.device("meta")) == logit_head.TILES["other"]
    tokens, vocabulary = logit_head.TILES["cpu"]
    head = logit_head.LogitHead(model.weight, logit_head.tiles_on(model.weight.device))
    assert head.describe() == f"tiled LM head ({tokens} tokens x {vocabulary} vocabulary, float32)"
    assert logit_head.tile_bytes(torch.device("cpu")) == 2 * tokens * vocabulary * 4
