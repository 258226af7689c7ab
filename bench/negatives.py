"""How far the default sampled negatives and swaps (`--negatives auto`, M = 15) move the
numbers and verdicts from the full matrices' (`--negatives all`), at N = 64, K = 8, on every
demo checkpoint and every demo flow.

Each checkpoint is scanned once with the full matrices. The sampled estimate then masks those
matrices exactly as a sampled scan chooses its entries (`negative_groups`, `chosen_swaps`;
the entries a sampled scan computes are the full matrices' entries: tests/test_negatives.py
checks that), for several seeds, so the table also shows how much the choice of negatives
moves the numbers. Writes its section of docs/benchmarks.md.

    python bench/negatives.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
from bench_scoring import write_section

from collapsecheck import scan
from collapsecheck.engines.cross_scoring import chosen_swaps, negative_groups
from collapsecheck.measures.flow import FlowLogProbs, compute_flow_metrics, decide_flow
from collapsecheck.measures.metrics import CrossLogProbs, compute_metrics
from collapsecheck.measures.verdict import decide
from collapsecheck.reports.dump import read_dump, read_flow
from collapsecheck.settings import DEFAULT_NEGATIVES, swap_count

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROMPTS = EXAMPLES / "prompts" / "gridworld-256.jsonl"
N, K = 64, 8
CHECKPOINTS = [
    "demo-run/global_step_100",
    "demo-run/global_step_200",
    "demo-run/global_step_300",
    "demo-run/global_step_400",
    "demo-run/global_step_500",
    "checkpoints/grounded-compressed",
    "checkpoints/low-entropy-collapse",
    "checkpoints/flow/faithful",
    "checkpoints/flow/decorative",
    "checkpoints/flow/action-collapse",
]
KEYS = ("normalized_mi", "retrieval_skill", "action_state_share", "action_reasoning_share",
        "action_input_share")  # fmt: skip
MARKER = "## Sampled negatives and swaps"


def sampled_matrix(full: CrossLogProbs, negatives: int, seed: int) -> CrossLogProbs:
    under = negative_groups(full.prompt_groups, negatives, seed)
    scored = np.zeros(full.sum.shape, dtype=bool)
    for row, prompt in enumerate(full.row_prompt):
        scored[row, under[int(prompt)]] = True
    return dataclasses.replace(
        full, sum=np.where(scored, full.sum, np.nan), mean=np.where(scored, full.mean, np.nan),
        scored=scored,
    )  # fmt: skip


def sampled_flow(full: FlowLogProbs, negatives: int, seed: int) -> FlowLogProbs:
    groups = full.prompt_groups
    under = negative_groups(groups, negatives, seed)
    own = full.row_prompt
    inputs = np.zeros(full.input.shape, dtype=bool)
    swapped = np.zeros(full.reasoning.shape, dtype=bool)
    for row, chosen in enumerate(chosen_swaps(own, under, swap_count(negatives), seed)):
        inputs[row] = np.isin(groups, under[int(own[row])])
        swapped[row, chosen] = True
    return dataclasses.replace(
        full,
        input=np.where(inputs, full.input, np.nan),
        reasoning=np.where(swapped, full.reasoning, np.nan),
        natural=np.where(swapped, full.natural, np.nan),
    )


def numbers(matrix: CrossLogProbs, counts, flow: FlowLogProbs | None) -> tuple[dict, str, str]:
    metrics = dict(compute_metrics(matrix, counts))
    verdict = decide(metrics)
    regime = verdict.regime + (" (partial)" if verdict.partial else "")
    flow_regime = "-"
    if flow is not None:
        flow_metrics = compute_flow_metrics(flow)
        metrics.update(flow_metrics)
        flow_regime = decide_flow(flow_metrics).regime
    return {key: _value(metrics.get(key)) for key in KEYS}, regime, flow_regime


def _value(metric) -> float:
    return float("nan") if metric is None else float(getattr(metric, "value", metric))


def row(name: str, dump: Path, seeds: int) -> str:
    full, counts = read_dump(dump)
    flow = read_flow(dump)
    exact, regime, flow_regime = numbers(full, counts, flow)
    diffs, regimes, flow_regimes = [], set(), set()
    for seed in range(seeds):
        sampled, r, f = numbers(
            sampled_matrix(full, DEFAULT_NEGATIVES, seed), counts,
            None if flow is None else sampled_flow(flow, DEFAULT_NEGATIVES, seed),
        )  # fmt: skip
        diffs.append([sampled[k] - exact[k] for k in KEYS])
        regimes.add(r)
        flow_regimes.add(f)
    worst = np.nanmax(np.abs(np.array(diffs)), axis=0)
    cells = [
        f"{exact[k]:.3f} / {w:+.3f}".replace("+", "") for k, w in zip(KEYS, worst, strict=True)
    ]
    same = "yes" if regimes == {regime} and flow_regimes == {flow_regime} else "**no**"
    return (
        f"| {name} | " + " | ".join(cells) + f" | {regime} / {', '.join(sorted(regimes))} | "
        f"{flow_regime} / {', '.join(sorted(flow_regimes))} | {same} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--dumps", type=Path, help="keep the full scans here (reused if there)")
    args = parser.parse_args()
    lines = [
        MARKER,
        "",
        f"N = {N} prompts of `examples/prompts/gridworld-256.jsonl` x K = {K} samples (64 new "
        f"tokens), CPU, float32. Full matrices (`--negatives all`) against the default "
        f"(`--negatives auto`: M = {DEFAULT_NEGATIVES} other prompts per trace and "
        f"{swap_count(DEFAULT_NEGATIVES)} swapped traces per action beside its own prompt's; SPEC "
        f'"Sampled negatives and swaps"), over {args.seeds} seeds of the sampling. Each cell: '
        "the full matrices' value / the largest difference of a sampled estimate from it. "
        "Verdicts: full / every verdict the sampled estimates gave. Made by "
        "`python bench/negatives.py` (part of `make bench`).",
        "",
        "| checkpoint | " + " | ".join(KEYS) + " | verdict | flow verdict | unchanged |",
        "|---|" + "---|" * (len(KEYS) + 3),
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for name in CHECKPOINTS:
            dump = (args.dumps or Path(scratch)) / name.replace("/", "-")
            if not (dump / "report.json").is_file():
                scan(EXAMPLES / name, PROMPTS, num_prompts=N, k=K, max_new_tokens=64,
                     device="cpu", dump=dump, negatives="all")  # fmt: skip
            lines.append(row(name, dump, args.seeds))
            print(lines[-1], flush=True)
    write_section("## Sampled negatives", lines)


if __name__ == "__main__":
    main()
