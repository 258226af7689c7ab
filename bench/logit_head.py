"""Log-probabilities without the vocabulary-wide logits (issue 57, item 2), on CPU at the
Qwen2.5-0.5B shape (random weights: hidden 896, 24 layers, 14 heads with 2 key/value heads,
intermediate 4864, vocabulary 151,936), measured in one run:

1. the same batch scored by the cached scorer through the tiled LM head and through the full
   logits (the path models of an unknown head keep), alternating: the peak resident memory
   above the loaded model, the seconds, and the largest per-token difference;
2. `--batch-tokens auto` as each path plans it, and the tiled path at its own auto batch;
3. each path's share of this machine's fp32 matmul rate (2 FLOPs per parameter and scored
   token; issue 57's CPU target at this shape is 0.85).

    python bench/logit_head.py            # print the figures
    python bench/logit_head.py --write    # and write the section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from bench_scoring import alternating, machine, publish
from memory import GIB, PeakMemory, qwen_shape
from real_model import matmul_gflops

from collapsecheck.engines.backends.base import ScoreRequest
from collapsecheck.engines.backends.hf import TransformersBackend, auto_batch_tokens
from collapsecheck.engines.backends.logit_head import LogitHead
from collapsecheck.settings import LoadSettings

HEADING = "## Log-probabilities without the vocabulary-wide logits"


def requests_of(prompts: int, samples: int, tokens: int) -> list[ScoreRequest]:
    """Every (prompt, trace) pair of `prompts` contexts and `prompts x samples` traces."""
    rng = np.random.default_rng(0)
    contexts = [tuple(rng.integers(10, 150000, size=tokens).tolist()) for _ in range(prompts)]
    traces = [
        tuple(rng.integers(10, 150000, size=tokens).tolist()) for _ in range(prompts * samples)
    ]
    return [ScoreRequest(c, z) for c in contexts for z in traces]


def measured(backend: TransformersBackend, requests: list[ScoreRequest]) -> tuple:
    """(peak GiB above the loaded model, seconds, per-token values) of one scoring call."""
    loaded = psutil.Process().memory_info().rss
    started = time.perf_counter()
    with PeakMemory() as memory:
        values = backend.loglikelihood_per_token(requests, lambda _: None)
    return (memory.peak - loaded) / GIB, time.perf_counter() - started, values.values


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = qwen_shape(Path(scratch))
        backend = TransformersBackend.from_checkpoint(
            path, LoadSettings(device="cpu", dtype="float32", batch_tokens=4096)
        )
        head = LogitHead.of(backend.model)
        requests = requests_of(args.prompts, args.samples, args.tokens)
        backend.loglikelihood(requests[:1], lambda _: None)  # every weight paged in
        parameters = sum(p.numel() for p in backend.model.parameters())
        matmul = matmul_gflops()

        def run(tiled: bool) -> tuple:
            backend.head = head if tiled else None
            return measured(backend, requests)

        runs = alternating(run, args.rounds)
        tiled_auto = auto_batch_tokens(backend.model)
        full_auto = auto_batch_tokens(backend.model, tiled=False)
        backend.head, backend.batch_tokens = head, tiled_auto
        at_auto = measured(backend, requests)
    full, tiled = runs[False], runs[True]
    gap = max(float(np.abs(f[2] - t[2]).max()) for f, t in zip(full, tiled, strict=True))
    peak_full = statistics.median(r[0] for r in full)
    peak_tiled = statistics.median(r[0] for r in tiled)
    time_full = statistics.median(r[1] for r in full)
    time_tiled = statistics.median(r[1] for r in tiled)
    pairs = len(requests)
    tokens = sum(len(r.continuation) for r in requests)

    def of_matmul(seconds: float) -> str:
        return f"{2 * parameters * tokens / seconds / 1e9 / matmul:.0%}"

    text = "\n".join([
        HEADING,
        "",
        f"`python bench/logit_head.py` ({datetime.date.today()}, {machine('cpu')}). The "
        f"Qwen2.5-0.5B shape in float32, random weights; {args.prompts} contexts x "
        f"{args.prompts * args.samples} traces ({pairs} pairs), {args.tokens}-token prompts and "
        f"reasoning; the cached scorer at --batch-tokens 4096, the two paths alternating, "
        f"{args.rounds} rounds each (medians). Peak: resident memory above the loaded model. "
        f"This machine's fp32 matmul rate in the same run: {matmul:.0f} GFLOP/s.",
        "",
        "| path | peak above the model (GiB) | seconds | of matmul | auto batch (tokens) |",
        "|---|---|---|---|---|",
        f"| full logits (before; unknown heads) | {peak_full:.2f} | {time_full:.1f} | "
        f"{of_matmul(time_full)} | {full_auto:,} |",
        f"| tiled LM head | {peak_tiled:.2f} | {time_tiled:.1f} | {of_matmul(time_tiled)} | "
        f"{tiled_auto:,} |",
        f"| tiled LM head at its auto batch | {at_auto[0]:.2f} | {at_auto[1]:.1f} | "
        f"{of_matmul(at_auto[1])} | |",
        "",
        f"Peak memory cut {peak_full / peak_tiled:.1f}x at the same batch; time ratio "
        f"(tiled / full) {time_tiled / time_full:.2f}; largest per-token difference "
        f"{gap:.1e} nats.",
    ])  # fmt: skip
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
