"""Policies whose layers carry a state instead of keys and values alone (`layer_kinds`):
Qwen3.5's gated DeltaNet beside full attention, Mamba's state-space layers with no attention
at all, MiniMax's lightning attention in a cache class of its own. A scan runs end to end
(their sampling is checked token for token in test_sampling.py, their scoring value for value
in test_logit_head.py), scores with the naive scorer, and its report says why."""

import json

import pytest
import torch
from typer.testing import CliRunner

from collapsecheck.cli import app
from collapsecheck.engines.backends import hf
from collapsecheck.engines.backends.hf import kv_bytes_per_token, scorer_for
from collapsecheck.engines.backends.layer_kinds import attending_layers, stateful_kinds
from tests.conftest import (
    PROMPTS,
    QWEN3_5_LINEAR,
    STATEFUL_KINDS,
    tiny_checkpoint,
    tiny_model,
    tiny_shape,
)
from tests.tolerances import LOGPROB_ATOL

runner = CliRunner()


@pytest.fixture(scope="module", params=STATEFUL_KINDS)
def stateful_checkpoint(request, tmp_path_factory, demo_tokenizer):
    path = tmp_path_factory.mktemp(f"stateful-{request.param}")
    return request.param, tiny_checkpoint(request.param, path, demo_tokenizer)


def scan_report(path, tmp_path, *extra):
    report_path = tmp_path / f"report{len(extra)}.json"
    result = runner.invoke(app, [
        "scan", str(path), "-p", str(PROMPTS), "-n", "4", "-k", "3", "--max-new-tokens", "12",
        "--whole-response", "--device", "cpu", "--fail-on", "none", "--json", str(report_path),
        *extra,
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "verdict:" in result.output
    return json.loads(report_path.read_text()), result.output


def test_a_scan_runs_end_to_end_scored_by_the_naive_scorer(stateful_checkpoint, tmp_path):
    """The default scan (`--scorer auto`: cached) is scored by the naive scorer, says why,
    and measures what a scan asking for the naive scorer measures."""
    kind, path = stateful_checkpoint
    report, _ = scan_report(path, tmp_path)
    said = report["settings"]["scorer"]
    assert said.startswith("naive (not cached: "), said
    assert "linear_attention layers carry a state" in said, said
    asked, _ = scan_report(path, tmp_path, "--scorer", "naive")
    assert asked["settings"]["scorer"] == "naive"
    for name in ("mi_estimate", "retrieval_accuracy", "conditional_entropy_est"):
        assert report["metrics"][name] == asked["metrics"][name], (kind, name)


def test_what_the_config_says_of_each_kind_of_layer():
    """Qwen3.5's layer kinds as its config names them; Mamba keeps no keys or values (its
    memory estimate has no per-token cache); a plain decoder attends in every layer."""
    qwen = tiny_model("qwen3_5", 57)
    assert stateful_kinds(qwen) == ("linear_attention",)
    assert attending_layers(qwen) == 1
    mamba = tiny_model("mamba", 57)
    assert attending_layers(mamba) == 0 and kv_bytes_per_token(mamba) == 0
    llama = tiny_model("llama", 57)
    assert stateful_kinds(llama) == () and attending_layers(llama) == 2
    assert scorer_for(llama, "cached") == ("cached", None)
    assert scorer_for(qwen, "naive") == ("naive", None)  # asked for: nothing to say
    assert scorer_for(qwen, "cached")[0] == "naive"
    per_token = 2 * 1 * 2 * 8 * torch.float32.itemsize  # K and V, 1 layer, 2 heads of 8
    assert kv_bytes_per_token(qwen) == per_token


def test_the_state_a_sequence_keeps_sizes_the_sampling_batch(monkeypatch):
    """Mamba's state per sequence (each layer's convolution window and its state-space state,
    of every inner channel) is measured whole, and the sampling batch makes room for it."""
    mamba = tiny_model("mamba", 57)
    config = mamba.config
    inner = config.expand * config.hidden_size
    per_layer = inner * (config.conv_kernel + config.state_size) * torch.float32.itemsize
    state = hf.state_bytes_per_sequence(mamba)
    assert state == config.num_hidden_layers * per_layer
    assert hf.state_bytes_per_sequence(tiny_model("llama", 57)) == 0
    work = 6 * config.vocab_size * 4  # the sampler's work space over the vocabulary
    monkeypatch.setattr(hf, "CPU_SCORING_BUDGET", 10 * (state + work))
    assert hf.auto_sample_batch(mamba, 100, state) == 10
    assert hf.auto_sample_batch(mamba, 100) > 10  # without it, more than the memory holds


MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
       "shared_expert_intermediate_size": 32}  # fmt: skip


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def qwen3_5_as_shipped(request, tmp_path_factory, demo_tokenizer):
    """A tiny Qwen3.5 (or Qwen3.5-MoE) checkpoint in the class Qwen ships it in, vision tower
    and all (`Qwen3_5ForConditionalGeneration`)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    text = tiny_shape(len(demo_tokenizer)) | QWEN3_5_LINEAR
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": 32}  # fmt: skip
    kind = request.param
    text |= MOE if kind == "qwen3_5_moe" else {}
    config = AutoConfig.for_model(kind, text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    model.generation_config.eos_token_id = demo_tokenizer.eos_token_id
    path = tmp_path_factory.mktemp(f"{kind}-as-shipped")
    model.save_pretrained(path)
    demo_tokenizer.save_pretrained(path)
    return kind, path, model


def test_qwen3_5_as_shipped_is_read_as_a_text_policy_and_says_so(qwen3_5_as_shipped, tmp_path):
    """Its language model alone (`Qwen3_5ForCausalLM`), whose logits are the shipped class's
    on text (to float32's rounding: tests/tolerances.py); the scan says what it read, in the
    report and on the console."""
    from collapsecheck.engines.backends.hf import TransformersBackend
    from collapsecheck.settings import LoadSettings

    kind, path, shipped = qwen3_5_as_shipped
    backend = TransformersBackend.from_checkpoint(path, LoadSettings(device="cpu"))
    reader = {"qwen3_5": "Qwen3_5ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}[kind]
    assert type(backend.model).__name__ == reader
    ids = torch.tensor([[5, 9, 17, 33, 2, 40, 7]])
    with torch.no_grad():  # another class over the same weights: its own order of sums
        got, expected = backend.model(input_ids=ids).logits, shipped(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0.0, atol=LOGPROB_ATOL)
    report, printed = scan_report(path, tmp_path)
    note = report["settings"]["checkpoint_note"]
    assert "read as a text policy" in " ".join(printed.split())
    assert f"a {kind} vision-language checkpoint, read as a text policy" in note, note
    assert reader in note
    assert report["settings"]["scorer"].startswith(f"naive (not cached: {kind}_text's")


def test_qwen3_5_as_shipped_with_images_in_the_prompts_is_one_clear_line(qwen3_5_as_shipped):
    _, path, _ = qwen3_5_as_shipped
    images = PROMPTS.parent / "visual-gridworld.jsonl"
    result = runner.invoke(app, ["scan", str(path), "-p", str(images), "-n", "3", "-k", "2",
                                 "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "holds images but the checkpoint is a text-only model" in result.output
    assert "Traceback" not in result.output


def test_an_encoder_is_refused_in_one_line(tmp_path, demo_tokenizer):
    """BERT's LM head sees the whole input and keeps no cache: not a policy to sample from."""
    from transformers import BertConfig, BertLMHeadModel

    config = BertConfig(
        vocab_size=len(demo_tokenizer), hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64,
    )  # fmt: skip
    BertLMHeadModel(config).save_pretrained(tmp_path)
    demo_tokenizer.save_pretrained(tmp_path)
    result = runner.invoke(app, ["scan", str(tmp_path), "-p", str(PROMPTS), "-n", "3", "-k", "2",
                                 "--max-new-tokens", "8", "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "(bert) returns no cache" in " ".join(result.output.split())
    assert "Traceback" not in result.output
