"""What early answering (SPEC "Early answering") adds to a scan, measured in one run:

1. a whole scan at the demo shape (`make demo`'s N = 16, K = 8, 64 new tokens) of the
   decided-late demo policy, with early answering and with `--no-early-answer`, alternating,
   three rounds each (the medians are compared);
2. scoring alone (the stage early answering changes) at reasoning of 64 and 256 tokens, on
   the 21.7M-parameter bench shape of bench_scoring.py (random tokens, as bench_flow.py),
   with the flow and with the flow plus early answering.

    python bench/early_answer.py            # print the figures
    python bench/early_answer.py --write    # and write the section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
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

from collapsecheck import scan
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.cross_scoring import cross_score
from collapsecheck.progress import silent
from collapsecheck.settings import DEFAULT_NEGATIVES, EARLY_FRACTIONS, parse_fractions

DEFAULT_FRACTIONS = parse_fractions(EARLY_FRACTIONS)

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "checkpoints" / "early-answer" / "decided-late"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
DEMO_SHAPE = {"num_prompts": 16, "k": 8, "max_new_tokens": 64, "device": "cpu"}
HEADING = "## Early answering: what it adds to a scan"
ROUNDS = 3


def timed_scan(early: bool) -> tuple[float, float, int]:
    """Seconds of a whole scan, of its scoring, and the tokens it scored."""
    start = time.perf_counter()
    report = scan(DEMO, PROMPTS, no_early_answer=not early, **DEMO_SHAPE)
    whole = time.perf_counter() - start
    return whole, report.timing["scoring_s"], report.timing["tokens_scored"]


def demo_rows() -> list[tuple[str, float, float]]:
    """(what, median without, median with) for the whole scan and its scoring."""
    runs = alternating(timed_scan, ROUNDS)
    rows = []
    for index, what in ((0, "whole scan"), (1, "its scoring")):
        off, on = (statistics.median(r[index] for r in runs[e]) for e in (False, True))
        rows.append((what, off, on))
    tokens = (runs[False][0][2], runs[True][0][2])
    rows.append(("tokens scored", *tokens))
    return rows


def scoring_seconds(backend: TransformersBackend, args: argparse.Namespace, early: bool) -> float:
    prompts, traces = build_traces(args, None)
    fractions = DEFAULT_FRACTIONS if early else ()
    start = time.perf_counter()
    cross_score(backend, traces, prompts, silent, negatives=DEFAULT_NEGATIVES, flow=True,
                early_fractions=fractions)  # fmt: skip
    return time.perf_counter() - start


def long_rows(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    backend = TransformersBackend(build_model(args), Tokenizer(), scorer="cached")
    rows = []
    for reasoning in (64, 256):
        args.reasoning_tokens = reasoning
        off = statistics.median(scoring_seconds(backend, args, False) for _ in range(2))
        on = statistics.median(scoring_seconds(backend, args, True) for _ in range(2))
        rows.append((f"scoring, reasoning {reasoning} tokens", off, on))
    return rows


def section(demo: list, long: list, args: argparse.Namespace) -> str:
    def row(what: str, off: float, on: float) -> str:
        number = "{:.0f}" if what == "tokens scored" else "{:.2f}"
        return (f"| {what} | {number.format(off)} | {number.format(on)} | "
                f"{100 * (on / off - 1):+.0f}% |")  # fmt: skip

    return "\n".join([
        HEADING,
        "",
        f"`make bench` ({datetime.date.today().isoformat()}, {machine('cpu')}, float32; "
        "`bench/early_answer.py`). Goal: at most +15%. Early answering scores each flow-valid "
        f"action after its reasoning cut at {len(DEFAULT_FRACTIONS) - 1} fractions (the fifth, "
        "the whole reasoning, is the flow's own), each cut branched from the pass that scores "
        "the whole reasoning under its own prompt.",
        "",
        f"The demo shape: `scan` of examples/checkpoints/early-answer/decided-late, N = 16, "
        f"K = 8, 64 new tokens (reasoning about 45 tokens), medians of {ROUNDS} alternating "
        "rounds:",
        "",
        "| | `--no-early-answer` | early answering | adds |",
        "|---|---|---|---|",
        *(row(*r) for r in demo),
        "",
        f"Longer reasoning: scoring alone (the only stage that changes), the 21.7M-parameter "
        f"bench shape, N = {args.n}, K = {args.k}, prompt {args.prompt_tokens} / action "
        f"{args.action_tokens} tokens, every action different, `--negatives auto`, the flow "
        "on in both columns; medians of 2:",
        "",
        "| | flow | flow + early answering | adds |",
        "|---|---|---|---|",
        *(row(*r) for r in long),
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser)
    parser.set_defaults(n=8, k=4, prompt_tokens=256)
    parser.add_argument("--action-tokens", type=int, default=8)
    parser.add_argument("--write", action="store_true", help=f"write the section of {DOCS}")
    args = parser.parse_args()
    demo = demo_rows()
    long = long_rows(args)
    publish(HEADING, section(demo, long, args), args.write)


if __name__ == "__main__":
    main()
