"""Shared fixtures: the shipped demo checkpoints and random-initialised tiny models."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROMPTS = EXAMPLES / "prompts" / "gridworld.jsonl"
RUN = EXAMPLES / "demo-run"
HEALTHY = RUN / "global_step_100"
COLLAPSED = RUN / "global_step_500"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tiny_model(kind: str, vocab_size: int, seed: int = 0):
    """A random-initialised causal LM: Llama-, GPT-2- or Gemma 2-style (the last with a
    sliding window of 6 positions in its first layer, full attention in its second, and
    weights drawn wide enough that its logits depend on what it attends to), or one whose
    layers carry a state (`tiny_stateful_model`)."""
    import torch
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    torch.manual_seed(seed)
    if kind in STATEFUL_KINDS:
        return tiny_stateful_model(kind, vocab_size)
    if kind == "gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=512)
        return GPT2LMHeadModel(config).eval()
    if kind == "gemma2":
        config = Gemma2Config(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
            max_position_embeddings=512, initializer_range=0.2,
        )  # fmt: skip
        return Gemma2ForCausalLM(config).eval()
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


STATEFUL_KINDS = ("qwen3_5", "mamba", "minimax")


def tiny_stateful_model(kind: str, vocab_size: int):
    """A random causal LM with layers that carry a state (`layer_kinds`): Qwen3.5-style (a
    gated DeltaNet linear-attention layer, then full attention), Mamba-style (two
    state-space layers, no attention) or MiniMax-style (full attention, then lightning
    linear attention, its states in a cache class of its own). Weights drawn wide enough that
    the logits depend on the state."""
    from transformers import (
        MambaConfig,
        MambaForCausalLM,
        MiniMaxConfig,
        MiniMaxForCausalLM,
        Qwen3_5ForCausalLM,
        Qwen3_5TextConfig,
    )

    if kind == "mamba":
        config = MambaConfig(
            vocab_size=vocab_size, hidden_size=32, state_size=8, num_hidden_layers=2,
            initializer_range=0.1,
        )  # fmt: skip
        return MambaForCausalLM(config).eval()
    shape = tiny_shape(vocab_size)
    if kind == "minimax":
        config = MiniMaxConfig(
            **shape, layer_types=["full_attention", "linear_attention"], num_local_experts=2,
            block_size=4,
        )  # fmt: skip
        return MiniMaxForCausalLM(config).eval()
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape, **QWEN3_5_LINEAR)).eval()


# Qwen3.5's gated DeltaNet made small: one linear-attention layer, then one of full attention
QWEN3_5_LINEAR = {
    "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
}  # fmt: skip


def tiny_shape(vocab_size: int) -> dict:
    """The sizes of a two-layer random decoder, weights drawn wide (`tiny_stateful_model`)."""
    return {
        "vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "max_position_embeddings": 512, "initializer_range": 0.2,
    }  # fmt: skip


@pytest.fixture(scope="session")
def demo_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(HEALTHY, local_files_only=True)


@pytest.fixture(scope="session", params=["llama", "gpt2"])
def random_checkpoint(request, tmp_path_factory, demo_tokenizer):
    """A random-initialised checkpoint directory (weights, config, the demo tokenizer)."""
    path = tmp_path_factory.mktemp(f"random-{request.param}")
    return tiny_checkpoint(request.param, path, demo_tokenizer)


def tiny_checkpoint(kind: str, path: Path, tokenizer) -> Path:
    """`tiny_model(kind)` saved in `path` with `tokenizer`, its stop token the tokenizer's."""
    model = tiny_model(kind, len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Scans through the results cache write under a temporary directory, never to ~/.cache."""
    monkeypatch.setenv("COLLAPSECHECK_CACHE", str(tmp_path_factory.mktemp("cache")))


def run_collapsecheck(
    *args, code: str = "", python: tuple[str, ...] = (), cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """The command line run in a fresh process, offline, from the repository's root (`code`:
    Python run before it, e.g. to hide a package as a machine without it would; `python`:
    the interpreter's own options, e.g. `-X importtime`; `cwd`: where it runs)."""
    run = f"{code}from collapsecheck.cli import main; main()"
    return subprocess.run(
        [sys.executable, *python, "-c", run, *map(str, args)], capture_output=True, text=True,
        timeout=600, cwd=cwd,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )  # fmt: skip
