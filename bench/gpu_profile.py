"""The profile issue 57 asks for first (../shared/GPU.md, step 2), ready for the next GPU: at
the Qwen2.5-1.5B shape (bench/gpu_real_shape.py's model, random weights, bfloat16), measured
in one run and written as Markdown and JSON under --out:

1. scoring: CONTEXTS prompts of --prompt-tokens, each scored with --traces traces of
   --reasoning-tokens (the rows one context gives a scan at N = 32, K = 8) by the cached
   scorer; the call's seconds and share of the bfloat16 matmul peak (2 FLOPs per parameter
   and scored token) with the LM head's tiles at each of --tiles, alternating; then one
   `torch.profiler` trace of the call: its top kernels by device time, the device's busy
   time against the call's wall time (the rest: the device waiting on the host);
2. sampling: one stage of the transformers sampler (--sample-prompts x K traces of
   --sample-tokens), its seconds per decode step against the step's memory floor (the
   weights and the key/value cache read once at the copy bandwidth measured in the same
   run), and its top kernels.

    python bench/gpu_profile.py --out $OUT            # on the GPU (about 3 minutes)
    python bench/gpu_profile.py --smoke --out DIR     # a tiny shape on the CPU: the script's
                                                      # own check, figures meaningless
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_scoring import machine
from gpu_real_shape import add_real_shape_arguments, real_shape, write_run

from collapsecheck.engines.backends import logit_head
from collapsecheck.engines.backends.base import SamplingParams, ScoreRequest, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend, kv_bytes_per_token
from collapsecheck.settings import LoadSettings

TOP = 25  # kernels listed per profile


def random_requests(args: argparse.Namespace, vocab: int) -> list[ScoreRequest]:
    rng = np.random.default_rng(0)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(rng.integers(1, vocab, size=count).tolist())

    contexts = [tokens(args.prompt_tokens) for _ in range(args.contexts)]
    traces = [tokens(args.reasoning_tokens) for _ in range(args.traces)]
    return [ScoreRequest(context, trace) for context in contexts for trace in traces]


def synchronized_seconds(device: str, work) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    work()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def copy_bandwidth(device: str, gib: float) -> float:
    """Bytes a second the device reads and writes copying one tensor of `gib` GiB into
    another (the best of 5)."""
    source = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    target = torch.empty_like(source)
    best = min(synchronized_seconds(device, lambda: target.copy_(source)) for _ in range(5))
    return 2 * source.numel() * source.element_size() / best


def profiled(device: str, work) -> tuple[list[dict], dict]:
    """The top kernels (or CPU ops) of one run of `work` by self time on the device, and the
    device's busy time against the wall time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    started = time.perf_counter()
    with profile(activities=activities) as trace:
        work()
        if device == "cuda":
            torch.cuda.synchronize()
    wall = time.perf_counter() - started
    attribute = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = [e for e in trace.key_averages() if getattr(e, attribute) > 0]
    busy = sum(getattr(e, attribute) for e in events) / 1e6
    events.sort(key=lambda e: -getattr(e, attribute))
    top = [
        {
            "name": e.key[:90],
            "calls": e.count,
            "ms": getattr(e, attribute) / 1e3,
            "share": getattr(e, attribute) / 1e6 / busy,
        }
        for e in events[:TOP]
    ]
    return top, {"wall_s": wall, "busy_s": busy}


def scoring_figures(backend, requests, args, params: int, peak: float) -> dict:
    tokens = sum(len(r.continuation) for r in requests)
    floor = 2 * params * tokens / peak
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    seconds: dict[str, list[float]] = {}
    weight = backend.head.weight
    backend.loglikelihood(requests[: args.traces], no_progress)  # warm: kernels chosen
    for _ in range(args.rounds):
        for size in tiles:
            backend.head = logit_head.LogitHead(weight, size)
            seconds.setdefault(f"{size[0]}x{size[1]}", []).append(
                synchronized_seconds(
                    args.device, lambda: backend.loglikelihood(requests, no_progress)
                )
            )
    best = min(seconds, key=lambda key: statistics.median(seconds[key]))
    backend.head = logit_head.LogitHead(weight, tuple(int(v) for v in best.split("x")))
    top, busy = profiled(args.device, lambda: backend.loglikelihood(requests, no_progress))
    return {
        "tokens_scored": tokens,
        "floor_s": floor,
        "by_tiles": {
            key: {"s": statistics.median(v), "share_of_peak": floor / statistics.median(v)}
            for key, v in seconds.items()
        },
        "profiled_with_tiles": best,
        "batch_tokens": backend.batch_tokens,
        "profile": busy,
        "top": top,
    }


def sampling_figures(backend, args, vocab: int, bandwidth: float) -> dict:
    rng = np.random.default_rng(1)
    prompts = [
        rng.integers(1, vocab, size=args.prompt_tokens).tolist() for _ in range(args.sample_prompts)
    ]
    sampling = SamplingParams(k=args.k, max_new_tokens=args.sample_tokens, seed=0)
    backend.generate(prompts[:1], SamplingParams(k=1, max_new_tokens=4), no_progress)  # warm
    seconds = synchronized_seconds(
        args.device, lambda: backend.generate(prompts, sampling, no_progress)
    )
    rows = args.sample_prompts * args.k
    weights = sum(p.numel() * p.element_size() for p in backend.model.parameters())
    # each step reads the weights once and, per row, the cache of its prompt and half its reasoning
    cache = rows * kv_bytes_per_token(backend.model) * (args.prompt_tokens + args.sample_tokens / 2)
    step = seconds / args.sample_tokens
    floor = (weights + cache) / bandwidth
    top, busy = profiled(args.device, lambda: backend.generate(prompts, sampling, no_progress))
    return {
        "rows": rows,
        "steps": args.sample_tokens,
        "s": seconds,
        "step_ms": 1000 * step,
        "step_floor_ms": 1000 * floor,
        "over_floor": step / floor,
        "sample_batch": backend.sample_batch,
        "profile": busy,
        "top": top,
    }


def markdown(figures: dict) -> str:
    scoring, sampling = figures["scoring"], figures["sampling"]
    lines = [
        f"GPU profile ({figures['machine']}, torch {figures['torch']}): "
        f"{figures['params'] / 1e9:.2f}B parameters, bfloat16; matmul peak "
        f"{figures['matmul_peak_tflops']:.0f} TFLOP/s, copy bandwidth "
        f"{figures['bandwidth_gbs']:.0f} GB/s.",
        "",
        f"Scoring {scoring['tokens_scored']:,} tokens (batch {scoring['batch_tokens']:,} tokens); "
        f"FLOP floor {scoring['floor_s']:.2f} s:",
        "",
        "| LM head tiles | seconds | share of peak |",
        "|---|---|---|",
        *(
            f"| {k} | {v['s']:.2f} | {v['share_of_peak']:.0%} |"
            for k, v in scoring["by_tiles"].items()
        ),
        "",
        *kernel_table("scoring", scoring),
        f"Sampling {sampling['rows']} rows x {sampling['steps']} steps: "
        f"{sampling['step_ms']:.1f} ms a step against a memory floor of "
        f"{sampling['step_floor_ms']:.2f} ms "
        f"({sampling['over_floor']:.1f}x).",
        "",
        *kernel_table("sampling", sampling),
    ]
    return "\n".join(lines)


def kernel_table(what: str, figures: dict) -> list[str]:
    busy = figures["profile"]
    return [
        f"Top kernels of the {what} call (device busy {busy['busy_s']:.2f} s of "
        f"{busy['wall_s']:.2f} s wall):",
        "",
        "| kernel | calls | ms | share |",
        "|---|---|---|---|",
        *(
            f"| `{k['name']}` | {k['calls']} | {k['ms']:.1f} | {k['share']:.1%} |"
            for k in figures["top"]
        ),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_real_shape_arguments(parser)
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--traces", type=int, default=256)
    parser.add_argument("--tiles", default="1024x16384,4096x16384,512x8192,2048x32768")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sample-prompts", type=int, default=32)
    parser.add_argument("--sample-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True, help="folder for the figures")
    args = parser.parse_args()
    shape, args.device, peak = real_shape(args.smoke)
    if args.smoke:
        args.contexts, args.traces, args.prompt_tokens, args.reasoning_tokens = 2, 8, 32, 16
        args.sample_prompts, args.k, args.sample_tokens, args.rounds = 2, 2, 8, 1
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(args.device, 0.0625 if args.smoke else 4)
    with tempfile.TemporaryDirectory() as scratch:
        run, params = write_run(Path(scratch), 1, shape, args.device)
        settings = LoadSettings(device=args.device, dtype="bfloat16")
        backend = TransformersBackend.from_checkpoint(run / "checkpoint-1", settings)
        vocab = shape["vocab_size"]
        with torch.inference_mode():
            scoring = scoring_figures(backend, random_requests(args, vocab), args, params, peak)
            sampling = sampling_figures(backend, args, vocab, bandwidth)
    figures = {
        "machine": machine(args.device),
        "torch": torch.__version__,
        "params": params,
        "matmul_peak_tflops": peak / 1e12,
        "bandwidth_gbs": bandwidth / 1e9,
        "arguments": {k: v for k, v in vars(args).items() if k != "out"},
        "scoring": scoring,
        "sampling": sampling,
    }
    (args.out / "gpu_profile.json").write_text(json.dumps(figures, indent=1))
    (args.out / "gpu_profile.md").write_text(markdown(figures) + "\n")
    print(markdown(figures))


if __name__ == "__main__":
    main()
