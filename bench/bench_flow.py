"""What the information flow (X->Z->A) adds to cross-scoring, measured in one run: the cached
scorer on X->Z alone, then on X->Z with the three action matrices branched off the same pass,
both with the default sampled negatives and swaps (`--negatives auto`).

    python bench/bench_flow.py            # the bench shape of bench_scoring.py, on CPU
    python bench/bench_flow.py --write    # and write the section of docs/benchmarks.md

Traces are random tokens: a 1-token prefix, R reasoning tokens, a 2-token mid (`</think>
<answer>`) and an A-token action. Two action vocabularies: every action different (the worst
case: nothing is shared) and 4 distinct actions (a small action space, as in many agent
tasks: identical branches of a stem are scored once).
"""

from __future__ import annotations

import argparse
import datetime
import time

import numpy as np
import torch
from bench_scoring import (
    DOCS,
    Tokenizer,
    add_shape_arguments,
    build_model,
    machine,
    random_prompts,
    replace_section,
)

from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.cross_scoring import cross_score
from collapsecheck.engines.reasoning import ReasoningSpan, Trace
from collapsecheck.progress import silent
from collapsecheck.settings import DEFAULT_NEGATIVES

HEADING = "## Information flow: the cost of the action matrices"


def build_traces(args: argparse.Namespace, distinct_actions: int | None) -> tuple[list, list]:
    rng = np.random.default_rng(0)
    vocab = args.vocab
    prompts = random_prompts(args, rng)
    actions = [tuple(rng.integers(1, vocab, size=args.action_tokens).tolist())
               for _ in range(distinct_actions or args.n * args.k)]  # fmt: skip
    traces = []
    for index in range(args.n * args.k):
        reasoning = rng.integers(1, vocab, size=args.reasoning_tokens).tolist()
        action = actions[index % len(actions)] if distinct_actions else actions[index]
        ids = (1, *reasoning, 2, 3, *action)
        z_end = 1 + args.reasoning_tokens
        traces.append(
            Trace(index // args.k, index % args.k, ids, "", False,
                  ReasoningSpan(1, z_end), "z", ReasoningSpan(z_end + 2, len(ids)), str(action))
        )  # fmt: skip
    return prompts, traces


def timed(backend: TransformersBackend, traces: list, prompts: list, flow: bool) -> float:
    start = time.perf_counter()
    cross_score(backend, traces, prompts, silent, negatives=DEFAULT_NEGATIVES, flow=flow)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser)
    parser.add_argument("--action-tokens", type=int, default=8)
    parser.add_argument("--write", action="store_true", help=f"write the section of {DOCS}")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args)
    backend = TransformersBackend(model, Tokenizer(), scorer="cached")
    rows = []
    for label, distinct in (("every action different", None), ("4 distinct actions", 4)):
        prompts, traces = build_traces(args, distinct)
        alone = timed(backend, traces, prompts, flow=False)
        both = timed(backend, traces, prompts, flow=True)
        rows.append((label, alone, both))
        added = 100 * (both / alone - 1)
        print(f"{label}: X->Z {alone:.1f} s, with the flow {both:.1f} s (+{added:.0f}%)")
    if args.write:
        params = sum(p.numel() for p in model.parameters())
        lines = [
            HEADING,
            "",
            f"`make bench` ({datetime.date.today().isoformat()}, {machine('cpu')}, float32, "
            f"{params / 1e6:.1f}M-parameter Qwen2 shape, N = {args.n}, K = {args.k}, prompt "
            f"{args.prompt_tokens} / reasoning {args.reasoning_tokens} / action "
            f"{args.action_tokens} tokens, `--negatives auto`; `bench/bench_flow.py`). Target: "
            "the flow adds at most 35% to scoring time.",
            "",
            "| actions | X->Z alone s | X->Z + flow s | flow adds |",
            "|---|---|---|---|",
            *(
                f"| {label} | {alone:.1f} | {both:.1f} | {100 * (both / alone - 1):.0f}% |"
                for label, alone, both in rows
            ),
        ]
        DOCS.write_text(replace_section(DOCS.read_text(), HEADING, "\n".join(lines)))
        print(f"wrote the section of {DOCS}")


if __name__ == "__main__":
    main()
