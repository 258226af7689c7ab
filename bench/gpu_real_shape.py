"""A real shape on a GPU (../shared/GPU.md, step 2): a run of 4 checkpoints of a
Qwen2.5-1.5B-shaped model (random weights built from its config, bfloat16), N = 32 prompts of
512 tokens, K = 8, up to 512 reasoning tokens, scanned as `scan RUN` scans them. Measured in
one run: the bfloat16 matmul peak, each checkpoint's sampling and scoring time, the cached
scorer's share of that peak (2 FLOPs per parameter and scored token), its time over the FLOP
floor, the peak GPU memory, and the time per checkpoint. The flow's added cost at this shape
is `bench/bench_flow.py` (run beside it by the same script on the device).

The blocks are Qwen2's (grouped-query attention with biased q/k/v, SwiGLU, RMSNorm, RoPE)
in transformers' Granite class, whose multipliers default to 1: the same weights and FLOPs.
Granite, because transformers 5 rebuilds any tokenizer beside a `qwen2` config as Qwen2's
byte-level BPE, which the bench's tokenizer is not. The tokenizer is a word-level one of the
model's whole vocabulary (token i is the word `w{i}`), so random-weight samples decode and
re-encode to the same ids; nothing is downloaded. A random-weight model draws near-uniform
tokens and rarely stops: every trace runs its whole length, the worst case for time.

    python bench/gpu_real_shape.py [--checkpoints 4] [--out DIR]    # needs a CUDA device

`--token-information-cost` scans the run again without SPEC "Where the input shows": the
samples cache answers, so only scoring runs again, and the last step's two scoring times
give its cost at this shape.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_scoring import machine, matmul_peak
from transformers import GraniteConfig, GraniteForCausalLM, PreTrainedTokenizerFast

from collapsecheck import scan_run

QWEN25_15B = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096,
    tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=True,
)  # fmt: skip


SMOKE = dict(
    QWEN25_15B,
    vocab_size=2000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
)  # --smoke: the script's own check on CPU


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """Token i is the word `w{i}`; 0 is the end of text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<eos>": 0, **{f"w{i}": i for i in range(1, vocab)}}
    core = Tokenizer(models.WordLevel(words, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<eos>", unk_token="<eos>"
    )


def write_run(root: Path, checkpoints: int, shape: dict, device: str) -> tuple[Path, int]:
    """`checkpoints` random-weight checkpoints of `shape`, each its own seed."""
    tokenizer = word_tokenizer(shape["vocab_size"])
    params = 0
    for step in range(1, checkpoints + 1):
        torch.manual_seed(step)
        with torch.device(device):
            model = GraniteForCausalLM(GraniteConfig(**shape)).to(torch.bfloat16)
        model.generation_config.eos_token_id = 0
        target = root / "run" / f"checkpoint-{step}"
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
        params = sum(p.numel() for p in model.parameters())
        del model
    return root / "run", params


def write_prompts(path: Path, n: int, length: int, vocab: int, system: int = 64) -> None:
    """n prompts of `length` words behind one shared `system`-word opening."""
    rng = np.random.default_rng(0)
    shared = [f"w{t}" for t in rng.integers(1, vocab, size=system)]
    rows = []
    for _ in range(n):
        own = [f"w{t}" for t in rng.integers(1, vocab, size=length - system)]
        rows.append({"prompt": " ".join(shared + own)})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def add_real_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the benchmarks at the real shape: K, the lengths, and --smoke."""
    parser.add_argument("-k", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--reasoning-tokens", type=int, default=512)
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU")


def real_shape(smoke: bool) -> tuple[dict, str, float]:
    """The model's shape, the device, and the device's measured bfloat16 matmul peak:
    Qwen2.5-1.5B's shape on the GPU, or with --smoke a tiny one on the CPU."""
    shape, device = (SMOKE, "cpu") if smoke else (QWEN25_15B, "cuda")
    return shape, device, matmul_peak(device, torch.bfloat16, 1024 if smoke else 8192, repeats=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_real_shape_arguments(parser)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("-n", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    parser.add_argument(
        "--token-information-cost", action="store_true",
        help="score the last checkpoint's samples again without where the input shows",
    )  # fmt: skip
    args = parser.parse_args()
    shape, device, peak = real_shape(args.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run, params = write_run(root, args.checkpoints, shape, device)
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, args.n, args.prompt_tokens, shape["vocab_size"])
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        flags = dict(
            device=device, dtype="bfloat16", num_prompts=args.n, k=args.k,
            max_new_tokens=args.reasoning_tokens, whole_response=True, training_log=False,
            cache_root=root / "cache",
        )  # fmt: skip
        report = scan_run(run, prompts, **flags)
        wall = time.perf_counter() - started
        without = None
        if args.token_information_cost:  # the samples cache answers: scoring alone runs again
            again = scan_run(run, prompts, no_token_information=True, **flags).steps[-1].report
            without = checkpoint_figures(again, params, peak)
    steps = [checkpoint_figures(step.report, params, peak) for step in report.steps]
    figures = {
        "machine": machine(device),
        "torch": torch.__version__,
        "params": params,
        "matmul_peak_tflops": peak / 1e12,
        "checkpoints": args.checkpoints,
        "shape": {k: getattr(args, k) for k in ("n", "k", "prompt_tokens", "reasoning_tokens")},
        "run_wall_s": wall,
        "per_checkpoint_s": wall / args.checkpoints,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        "steps": steps,
        "last_step_without_token_information": without,
    }
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


def checkpoint_figures(report, params: int, peak: float) -> dict:
    """One checkpoint's timing, and its scoring against the FLOP floor at the matmul peak."""
    timing = report.timing
    floor_s = 2 * params * timing["tokens_scored"] / peak
    return {
        "regime": report.verdict.regime,
        **{key: timing.get(key) for key in ("load_s", "sampling_s", "scoring_s")},
        "sampled_tokens": timing.get("sampled_tokens"),
        "tokens_scored": timing["tokens_scored"],
        "scoring_floor_s": floor_s,
        "scoring_over_floor": timing["scoring_s"] / floor_s,
        "scoring_share_of_peak": floor_s / timing["scoring_s"],
    }


if __name__ == "__main__":
    main()
