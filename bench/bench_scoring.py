"""Cross-scoring benchmark: the naive reference against the default (cached) scorer on
identical inputs, with the FLOP floor and the machine's measured matmul peak, in one run.

    python bench/bench_scoring.py                       # CPU defaults (`make bench`)
    python bench/bench_scoring.py --device cuda --dtype bfloat16 --hidden 896 --layers 24 \
        --heads 14 --kv-heads 2 --intermediate 4864 --vocab 151936   # a 0.5B Qwen2 shape

The model is a random-initialised Qwen2-style causal LM of the size given (nothing is
downloaded). Prompts are random tokens behind a shared system prompt; every trace has a
1-token prefix (a `<think>` tag) and a reasoning segment of the given length.

The naive scorer costs the same for every (trace, prompt) pair, so it can be timed on a
subset of the traces (`--naive-traces`) and scaled to the whole matrix; the numbers of the
two scorers are compared on that subset.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from collapsecheck.engines.backends.base import ScoreRequest, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
TABLE_HEADER = (
    "| date | machine | device | dtype | params | N x K | prompt / reasoning tokens | "
    "matmul peak TFLOP/s | naive s | cached s | speed-up | floor s at peak | cached vs floor | "
    "cached % of peak | cached tokens/s | max diff (nats) |"
)


class Tokenizer:
    """The little a backend needs of a tokenizer when it only scores token ids."""

    eos_token_id = 0
    chat_template = None

    def __len__(self) -> int:
        return 0  # knows no tokens: the benchmark hands the model ids directly


def build_model(args: argparse.Namespace) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt_tokens + args.reasoning_tokens + 16,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    return Qwen2ForCausalLM(config).to(device=args.device, dtype=dtype).eval()


def matmul_peak(device: str, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Best dense matmul throughput (FLOP/s) in the benchmark's dtype."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def random_prompts(args: argparse.Namespace, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """N prompts of random tokens behind one shared system prompt."""
    system = rng.integers(1, args.vocab, size=args.system_tokens).tolist()
    rest = args.prompt_tokens - args.system_tokens
    return [tuple(system + rng.integers(1, args.vocab, size=rest).tolist()) for _ in range(args.n)]


def build_requests(args: argparse.Namespace) -> tuple[list[ScoreRequest], int]:
    rng = np.random.default_rng(0)
    vocab = args.vocab
    prompts = random_prompts(args, rng)
    traces = [
        (1, *rng.integers(1, vocab, size=args.reasoning_tokens).tolist())
        for _ in range(args.n * args.k)
    ]
    requests = [ScoreRequest(p, t, 1) for t in traces for p in prompts]
    return requests, len(traces)


def timed(backend: TransformersBackend, requests: list[ScoreRequest]) -> tuple[np.ndarray, float]:
    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    scores = backend.loglikelihood(requests, no_progress)
    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    return scores, time.perf_counter() - start


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    name = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown CPU",
    )  # fmt: skip
    return f"{name}, {torch.get_num_threads()} threads"


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and batch shape of the benchmarks (the defaults: 21.7M parameters, N 16 x K 8,
    prompt 512 / reasoning 128 tokens)."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--system-tokens", type=int, default=64)
    parser.add_argument("--reasoning-tokens", type=int, default=128)
    parser.add_argument("-n", type=int, default=16)
    parser.add_argument("-k", type=int, default=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser)
    parser.add_argument("--naive-traces", type=int, default=8, help="traces the naive scorer times")
    parser.add_argument("--peak-size", type=int, default=None, help="matmul size for the peak")
    parser.add_argument("--write", action="store_true", help=f"append the row to {DOCS}")
    args = parser.parse_args()

    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    dtype = getattr(torch, args.dtype)
    peak = matmul_peak(
        args.device, dtype, args.peak_size or (8192 if "cuda" in args.device else 2048)
    )
    requests, traces = build_requests(args)
    subset = requests[: args.naive_traces * args.n]

    cached = TransformersBackend(model, Tokenizer(), scorer="cached")
    naive = TransformersBackend(model, Tokenizer(), scorer="naive")
    timed(cached, requests[: args.n])  # warm-up
    cached_scores, cached_s = timed(cached, requests)
    naive_scores, naive_subset_s = timed(naive, subset)
    naive_s = naive_subset_s * traces / args.naive_traces
    difference = float(np.abs(naive_scores - cached_scores[: len(subset)]).max())

    floor_tokens = args.n * args.prompt_tokens + traces * args.n * args.reasoning_tokens
    floor_flop = 2 * params * floor_tokens
    floor_s = floor_flop / peak
    row = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(args.device),
        "device": args.device,
        "dtype": args.dtype,
        "params": f"{params / 1e6:.1f}M",
        "shape": f"{args.n} x {args.k}",
        "lengths": f"{args.prompt_tokens} / {args.reasoning_tokens}",
        "peak": f"{peak / 1e12:.3f}",
        "naive": f"{naive_s:.1f} (timed on {args.naive_traces} of {traces} traces)",
        "cached": f"{cached_s:.1f}",
        "speedup": f"{naive_s / cached_s:.2f}x",
        "floor": f"{floor_s:.1f}",
        "vs_floor": f"{cached_s / floor_s:.2f}x",
        "fraction": f"{100 * floor_flop / cached_s / peak:.0f}%",
        "tokens": f"{floor_tokens / cached_s:,.0f}",
        "diff": f"{difference:.1e}",
    }
    print(f"model {row['params']} parameters, {args.dtype} on {row['machine']}")
    print(f"matmul peak          {peak / 1e12:.3f} TFLOP/s")
    print(f"floor                {floor_flop / 1e12:.2f} TFLOP = {floor_s:.1f} s at peak")
    print(f"naive                {row['naive']} s")
    print(f"cached               {cached_s:.1f} s  ({row['tokens']} tokens/s, {row['fraction']} "
          f"of peak, {row['vs_floor']} the floor's time)")  # fmt: skip
    print(f"speed-up             {row['speedup']}")
    print(f"max |naive - cached| {difference:.2e} nats per trace")
    if args.write:
        DOCS.write_text(add_row(DOCS.read_text(), "| " + " | ".join(row.values()) + " |"))
        print(f"added the row to {DOCS}")


def alternating(run, rounds: int, arms: Sequence = (False, True)) -> dict:
    """`run(arm)` for each arm in turn (by default on = False, True), `rounds` times each (what
    a feature adds, measured in one run with the machine's drift shared by all)."""
    runs: dict = {arm: [] for arm in arms}
    for _ in range(rounds):
        for arm in arms:
            runs[arm].append(run(arm))
    return runs


def write_section(heading: str, lines: list[str]) -> None:
    """docs/benchmarks.md with the section under `heading` replaced by `lines` (made, with the
    file, where missing)."""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    DOCS.write_text(replace_section(text, heading, "\n".join(lines)))


def publish(heading: str, text: str, write: bool) -> None:
    """Print a benchmark's section; with --write, put it in docs/benchmarks.md too."""
    print(text)
    if write:
        write_section(heading, [text])
        print(f"wrote the section of {DOCS}")


def replace_section(text: str, heading: str, section: str) -> str:
    """The document with the section under `heading` (up to the next `## ` heading) replaced
    by `section`, or `section` appended where there is none."""
    if heading not in text:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    before, rest = text.split(heading, 1)
    following = rest.find("\n## ")
    after = rest[following + 1 :] if following >= 0 else ""
    return before + section.rstrip("\n") + "\n" + ("\n" + after if after else "")


def add_row(text: str, row: str) -> str:
    """The document with `row` at the end of the scoring table (made if missing), before
    any section that follows it."""
    lines = text.rstrip("\n").split("\n")
    if TABLE_HEADER not in lines:
        lines += ["", TABLE_HEADER, "|" + "---|" * 16]
    end = lines.index(TABLE_HEADER) + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:end], row, *lines[end:]]) + "\n"


if __name__ == "__main__":
    main()
