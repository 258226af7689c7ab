"""The HTML page of a long run: its size and the time to write it (docs/benchmarks.md, "The
HTML page"). The GRPO demo run's reports (from the results the repository ships) stand for
300 steps, each given a cross-scoring matrix of N prompts x K traces whose diagonal fades
along the run, and the latest step a per-prompt table of N rows and traces of 60 words.

    python bench/html_page.py [--steps 300] [--shapes 64x8,256x8]
"""

from __future__ import annotations

import argparse
import copy
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.measures.metrics import CrossLogProbs
from collapsecheck.reports.evidence import Evidence
from collapsecheck.reports.html import run_page
from collapsecheck.reports.run_report import RunReport, RunStep
from collapsecheck.runs import scan_run
from collapsecheck.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
WORDS = [
    "let",
    "me",
    "think",
    "about",
    "the",
    "goal",
    "first",
    "then",
    "move",
    "up",
    "down",
    "left",
    "right",
    "carefully",
]


def grpo_run() -> RunReport:
    settings = Settings.build(
        num_prompts=16, k=8, max_new_tokens=64, reward_fn=str(EXAMPLES / "rewards" / "gridworld.py")
    )
    return scan_run(
        EXAMPLES / "grpo-run", EXAMPLES / "prompts" / "gridworld.jsonl", settings,
        baseline=EXAMPLES / "demo-run" / "global_step_200",
        cache_root=EXAMPLES / "grpo-run-scans",
    )  # fmt: skip


def synthetic_evidence(n: int, k: int, strength: float, rng: np.random.Generator) -> Evidence:
    """A matrix whose own-prompt cells lead by `strength` nats per token, with noise."""
    row_prompt = np.repeat(np.arange(n), k)
    mean = rng.normal(-2.0, 0.1, size=(n * k, n))
    mean[np.arange(n * k), row_prompt] += strength
    matrix = CrossLogProbs(mean * 60, mean, row_prompt)
    reasoning = [" ".join(rng.choice(WORDS, size=60)) for _ in range(n * k)]
    return Evidence(matrix, reasoning, [f"prompt {j}" for j in range(n)])


def per_prompt_rows(n: int, rng: np.random.Generator) -> list[dict]:
    return [
        {"index": j, "text": f"prompt {j}", "responses": 8, "valid_traces": 8,
         "own_mi": float(rng.uniform()), "retrieval_hit_rate": float(rng.uniform()),
         "distinct_reasoning_rate": 1.0, "reward_mean": 0.5, "reward_std": 0.3}
        for j in range(n)
    ]  # fmt: skip


def long_run(base: RunReport, steps: int, n: int, k: int) -> RunReport:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(steps):
        source = base.steps[min(i * len(base.steps) // steps, len(base.steps) - 1)]
        report = copy.copy(source.report)
        report.evidence = synthetic_evidence(n, k, 1.5 * (1 - i / steps), rng)
        report.per_prompt = per_prompt_rows(n, rng) if i == steps - 1 else []
        checkpoint = RunCheckpoint(f"global_step_{i}", i, source.checkpoint.checkpoint)
        rows.append(RunStep(checkpoint, report, source.training_log))
    onset = replace(base.onset, index=steps // 3) if base.onset else None
    return replace(base, steps=rows, onset=onset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--shapes", default="64x8,256x8")
    args = parser.parse_args()
    base = grpo_run()
    print(f"machine: {platform.processor() or platform.machine()}, {platform.node()}")
    print("| steps | N x K | matrix rows drawn | page MB | seconds to write |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        run = long_run(base, args.steps, n, k)
        started = time.perf_counter()
        text = run_page(run, "bench")
        seconds = time.perf_counter() - started
        drawn = n * k if n * k <= 512 else n
        size = len(text.encode("utf-8")) / 1e6
        print(f"| {args.steps} | {n} x {k} | {drawn} | {size:.2f} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
