"""What the information flow (X->Z->A) and early answering add to cross-scoring, with every
default reading a scan prints (each reasoning token's log-probability too), measured in one run
at two shapes, and where the time goes (issue 73).

    python bench/bench_flow.py            # both shapes, on CPU
    python bench/bench_flow.py --write    # and write the section of docs/benchmarks.md

Shapes (random weights, random tokens; nothing downloaded):
- `bench`: bench_scoring.py's 21.7M-parameter Qwen2 shape, N 16 x K 8, prompts of 512 tokens,
  reasoning of 128, a 2-token mid (`</think> <answer>`) and an 8-token action; every action
  different (nothing shared), and 4 distinct actions (a small action space: identical branches
  of a stem are scored once).
- `grid`: a tiny GPT-2-shaped policy (3 layers of 96) on a 5x5 grid task's shape: N 64 x K 8,
  chat prompts of 72 tokens (a 12-token system prompt shared), reasoning of 110 tokens, the mid
  and a one-letter answer with its closing tag (2 tokens), 4 distinct answers.

Each is scored three ways, alternating, `--rounds` times (the median kept): X->Z alone (what
`--no-flow` scores), X->Z with the flow's three action matrices, and with early answering's cut
reasoning too (the defaults); the last against the first is what the flow adds (target: at most
35%). Where the time goes: the requests of each matrix and the tokens they score; the rows run
(a stem with its branches) in plain batches (causal on the context, no mask) and in branched
ones (a mask of their own), the tokens those rows run padded, and the seconds each kind took;
the rest of a call is its contexts' prefill.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from bench_scoring import DOCS, Tokenizer, build_model, machine, replace_section
from transformers import GPT2Config, GPT2LMHeadModel

from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.engines.cross_scoring import cross_score
from collapsecheck.engines.reasoning import ReasoningSpan, Trace
from collapsecheck.progress import silent
from collapsecheck.settings import DEFAULT_NEGATIVES, EARLY_FRACTIONS, parse_fractions

HEADING = "## Information flow: the cost of the action matrices"
GOAL = 0.35
VARIANTS = {  # name: (flow, early answering)
    "X->Z alone": (False, False),
    "X->Z + flow": (True, False),
    "X->Z + flow + early (defaults)": (True, True),
}


@dataclass(frozen=True)
class Shape:
    name: str
    n: int
    k: int
    prompt: int
    system: int
    reasoning: int
    mid: int
    action: int
    distinct: tuple[int | None, ...]  # distinct actions (None: every action different)
    model: dict = field(default_factory=dict)


QWEN2_21M = {"hidden": 384, "layers": 6, "heads": 6, "kv_heads": 2, "intermediate": 1024,
             "vocab": 32000}  # fmt: skip
TINY_GPT2 = {"hidden": 96, "layers": 3, "heads": 3, "vocab": 64}
SHAPES = {
    "bench": Shape(
        "bench",
        n=16,
        k=8,
        prompt=512,
        system=64,
        reasoning=128,
        mid=2,
        action=8,
        distinct=(None, 4),
        model=QWEN2_21M,
    ),
    "grid": Shape(
        "grid",
        n=64,
        k=8,
        prompt=72,
        system=12,
        reasoning=110,
        mid=2,
        action=2,
        distinct=(4,),
        model=TINY_GPT2,
    ),
}


class TimedBackend(TransformersBackend):
    """The transformers backend, its cached scorer's passes timed by kind: plain batches of
    rows (no branch appended) and branched ones."""

    passes: Counter

    def _score_stems(self, group, batch):  # type: ignore[no-untyped-def]
        rows = [group.sequences[b] for b in batch]
        kind = "branched" if any(b >= 0 for row in rows for b in row.branch) else "plain"
        start = time.perf_counter()
        done = super()._score_stems(group, batch)
        self.passes[f"{kind} s"] += time.perf_counter() - start
        self.passes[f"{kind} rows"] += len(rows)
        self.passes[f"{kind} tokens"] += len(rows) * max(len(row.ids) for row in rows)
        return done


def build_backend(shape: Shape) -> TimedBackend:
    torch.manual_seed(0)
    m = shape.model
    if shape.name == "grid":
        config = GPT2Config(vocab_size=m["vocab"], n_embd=m["hidden"], n_layer=m["layers"],
                            n_head=m["heads"], n_positions=1024, bos_token_id=1,
                            eos_token_id=1)  # fmt: skip
        model = GPT2LMHeadModel(config).eval()
    else:
        lengths = {"prompt_tokens": shape.prompt, "reasoning_tokens": shape.reasoning}
        args = argparse.Namespace(**m, **lengths, device="cpu", dtype="float32")
        model = build_model(args)
    backend = TimedBackend(model, Tokenizer(), scorer="cached")
    backend.passes = Counter()
    return backend


def build_traces(shape: Shape, distinct: int | None) -> tuple[list, list]:
    """Prompts behind a shared system prompt; traces of a 1-token prefix (`<think>`), the
    reasoning, the mid and the action."""
    rng = np.random.default_rng(0)
    vocab = shape.model["vocab"]
    system = rng.integers(2, vocab, size=shape.system).tolist()
    prompts = [tuple(system + rng.integers(2, vocab, size=shape.prompt - shape.system).tolist())
               for _ in range(shape.n)]  # fmt: skip
    count = distinct or shape.n * shape.k
    actions = [tuple(rng.integers(2, vocab, size=shape.action).tolist()) for _ in range(count)]
    mid = tuple(rng.integers(2, vocab, size=shape.mid).tolist())
    traces = []
    for index in range(shape.n * shape.k):
        reasoning = rng.integers(2, vocab, size=shape.reasoning).tolist()
        ids = (1, *reasoning, *mid, *actions[index % count])
        z_end = 1 + shape.reasoning
        traces.append(Trace(
            index // shape.k, index % shape.k, ids, "", False, ReasoningSpan(1, z_end), "z",
            ReasoningSpan(z_end + shape.mid, len(ids)), str(actions[index % count]),
        ))  # fmt: skip
    return prompts, traces


def scored(backend: TimedBackend, prompts: list, traces: list, flow: bool, early: bool) -> dict:
    """One scoring call as a scan makes it; its time, and where it went."""
    fractions = parse_fractions(EARLY_FRACTIONS) if early else ()
    backend.passes = Counter()
    start = time.perf_counter()
    scores = cross_score(
        backend, traces, prompts, silent, negatives=DEFAULT_NEGATIVES, flow=flow,
        early_fractions=fractions, token_information=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    passes = dict(backend.passes)
    prefill = seconds - passes.get("plain s", 0.0) - passes.get("branched s", 0.0)
    return {"s": seconds, "tokens": scores.tokens_scored, "prefill s": prefill, **passes}


def matrix_requests(prompts: list, traces: list, flow: bool, early: bool) -> dict[str, int]:
    """The requests of each matrix one scoring call plans (its Plan, without a model)."""
    from collapsecheck.engines.cross_scoring import (
        Plan,
        negative_groups,
        plan_actions,
        plan_reasoning,
    )

    plan, groups = Plan(), np.arange(len(prompts))
    own = np.array([t.prompt_index for t in traces], dtype=np.int64)
    under = negative_groups(groups, DEFAULT_NEGATIVES, 0)
    plan_reasoning(plan, traces, prompts, own, under)
    if flow:
        fractions = parse_fractions(EARLY_FRACTIONS) if early else ()
        plan_actions(plan, traces, prompts, under, DEFAULT_NEGATIVES, 0, fractions)
    return {name: len(cells) for name, cells in plan.cells.items()}


def measure(shape: Shape, rounds: int) -> list[dict]:
    """Each variant's median run of `rounds`, the variants alternating within each round (the
    machine's drift shared by all)."""
    backend = build_backend(shape)
    rows = []
    for distinct in shape.distinct:
        prompts, traces = build_traces(shape, distinct)
        scored(backend, prompts[:2], [t for t in traces if t.prompt_index < 2], True, True)  # warm
        runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
        for _ in range(rounds):
            for variant, (flow, early) in VARIANTS.items():
                runs[variant].append(scored(backend, prompts, traces, flow, early))
                print(f"{shape.name}, {describe_actions(distinct)}: {variant}: "
                      f"{runs[variant][-1]['s']:.1f} s", flush=True)  # fmt: skip
        for variant, (flow, early) in VARIANTS.items():
            row = sorted(runs[variant], key=lambda r: r["s"])[len(runs[variant]) // 2]
            row |= {"variant": variant, "distinct": distinct,
                    "requests": matrix_requests(prompts, traces, flow, early)}  # fmt: skip
            rows.append(row)
    return rows


def describe_actions(distinct: int | None) -> str:
    return "every action different" if distinct is None else f"{distinct} distinct actions"


def runs_phrase(rounds: int) -> str:
    return "one run of each" if rounds == 1 else f"the median of {rounds} runs of each"


def section(results: dict[str, list[dict]], rounds: int) -> str:
    lines = [
        HEADING,
        "",
        f"`python bench/bench_flow.py` ({datetime.date.today().isoformat()}, {machine('cpu')}, "
        "float32, `--negatives auto`, each reasoning token's log-probability read, as a scan "
        f"does; {runs_phrase(rounds)}, the three alternating). Target: the flow, "
        "early answering included, adds at most 35% to the scoring of X->Z alone. Shapes: "
        "`bench` (21.7M-parameter Qwen2 shape, N 16 x K 8, prompt 512 / reasoning 128 / mid 2 "
        "/ action 8 tokens) and `grid` (a tiny GPT-2 shape, N 64 x K 8, prompt 72 / reasoning "
        "110 / mid 2 / a one-letter answer and its tag, 2 tokens).",
        "",
        "| shape | actions | scoring | s | adds | requests per matrix | tokens scored | plain "
        "rows: tokens run, s | branched rows: tokens run, s | prefill s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        alone = {r["distinct"]: r["s"] for r in rows if r["variant"] == "X->Z alone"}
        for r in rows:
            adds = r["s"] / alone[r["distinct"]] - 1
            met = "" if r["variant"] == "X->Z alone" else f"{100 * adds:+.0f}%"
            if r["variant"].endswith("(defaults)"):
                met += " (met)" if adds <= GOAL else " (not met)"
            requests = ", ".join(f"{k} {v:,}" for k, v in r["requests"].items())
            lines.append(
                f"| {name} | {describe_actions(r['distinct'])} | {r['variant']} | {r['s']:.1f} | "
                f"{met} | {requests} | {r['tokens']:,} | {r.get('plain tokens', 0):,}, "
                f"{r.get('plain s', 0):.1f} | {r.get('branched tokens', 0):,}, "
                f"{r.get('branched s', 0):.1f} | {r['prefill s']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant (median)")
    parser.add_argument("--write", action="store_true", help=f"write the section of {DOCS}")
    args = parser.parse_args()
    names = list(SHAPES) if args.shape == "all" else [args.shape]
    results = {name: measure(SHAPES[name], args.rounds) for name in names}
    text = section(results, args.rounds)
    print(text)
    if args.write:
        DOCS.write_text(replace_section(DOCS.read_text(), HEADING, text))
        print(f"wrote the section of {DOCS}")


if __name__ == "__main__":
    main()
