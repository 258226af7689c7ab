"""Time per trace as the batch grows, with the default sampled negatives and swaps
(`--negatives auto`): N = 16, 64 and 256 prompts at K = 8 on a demo checkpoint, X->Z alone and
with the flow, in one run. Goals (issue 23): time per trace within 1.5x from N = 16 to 256,
and a flow that adds at most 35% to the X->Z time. Each time is the best of REPEATS scans, the
two kinds alternating (the machines are shared: the least disturbed run is the cost). Writes
its section of docs/benchmarks.md.

    python bench/scaling.py [--checkpoint examples/demo-run/global_step_300]
"""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from bench_scoring import machine, write_section

from collapsecheck import scan
from collapsecheck.runs.cost import unit_cost
from collapsecheck.settings import DEFAULT_NEGATIVES

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "examples" / "prompts" / "gridworld-256.jsonl"
SIZES, K, NEW_TOKENS, REPEATS = (16, 64, 256), 8, 64, 3
MARKER = "## Scaling with the batch"


def measure(checkpoint: Path, n: int, flow: bool) -> dict:
    report = scan(checkpoint, PROMPTS, num_prompts=n, k=K, max_new_tokens=NEW_TOKENS,
                  device="cpu", no_flow=not flow, bootstrap=200)  # fmt: skip
    plan = unit_cost(n, K, NEW_TOKENS, DEFAULT_NEGATIVES, flow)
    return {"scoring_s": report.timing["scoring_s"], "pairs": plan.xz_pairs + plan.flow_pairs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path,
                        default=ROOT / "examples" / "demo-run" / "global_step_300")  # fmt: skip
    args = parser.parse_args()
    rows = []
    for n in SIZES:
        runs = [(measure(args.checkpoint, n, False), measure(args.checkpoint, n, True))
                for _ in range(REPEATS)]  # fmt: skip
        alone, both = (min((run[flow] for run in runs), key=lambda r: r["scoring_s"])
                       for flow in (0, 1))  # fmt: skip
        traces = n * K
        rows.append(
            f"| {n} x {K} | {alone['pairs']:,} | {alone['scoring_s']:.1f} | "
            f"{1000 * alone['scoring_s'] / traces:.2f} | {both['pairs']:,} | "
            f"{both['scoring_s']:.1f} | {1000 * both['scoring_s'] / traces:.2f} | "
            f"{100 * (both['scoring_s'] / alone['scoring_s'] - 1):.0f}% |"
        )
        print(rows[-1], flush=True)
    checkpoint = args.checkpoint.resolve().relative_to(ROOT)
    lines = [
        MARKER,
        "",
        f"`make bench` ({date.today()}, {machine('cpu')}, float32): `{checkpoint}` on "
        "`examples/prompts/"
        f"gridworld-256.jsonl`, {NEW_TOKENS} new tokens, `--negatives auto` (M = "
        f"{DEFAULT_NEGATIVES}: full X->Z up to 16 prompts). Scoring time only "
        f"(`timing.scoring_s`), best of {REPEATS}; pairs are the plan's (every response at its "
        "length limit). Made by `python bench/scaling.py`. Shape: the demo's, prompts of "
        "36 tokens, reasoning of about 21, a mid of 2 and actions of about 4 tokens: far "
        "shorter reasoning than the 64 tokens or more the flow's 35% goal is "
        'measured at ("Information flow" above: reasoning 128, actions 8).',
        "",
        "| N x K | X->Z pairs | X->Z s | ms per trace | with flow: pairs | s | ms per trace "
        "| flow adds |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    write_section(MARKER, lines)


if __name__ == "__main__":
    main()
