"""How far `--negatives M` moves the numbers from the full matrix's, on the demo checkpoints.

Each checkpoint is scanned once with the full matrix; the sampled-negatives estimate for each
M then masks that matrix exactly as `--negatives M` chooses its prompts (the entries a
sampled scan computes are the full matrix's entries: tests/test_cli.py checks that). Writes
the table into docs/benchmarks.md.

    python bench/negatives.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from bench_scoring import replace_section

from collapsecheck import scan
from collapsecheck.cross_scoring import scored_groups
from collapsecheck.dump import read_dump
from collapsecheck.metrics import CrossLogProbs, compute_metrics
from collapsecheck.verdict import decide

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROMPTS = EXAMPLES / "prompts" / "gridworld.jsonl"
DOCS = ROOT / "docs" / "benchmarks.md"
CHECKPOINTS = [
    "demo-run/global_step_100",
    "demo-run/global_step_200",
    "demo-run/global_step_300",
    "demo-run/global_step_400",
    "demo-run/global_step_500",
    "checkpoints/grounded-compressed",
    "checkpoints/low-entropy-collapse",
]
NEGATIVES = (None, 16, 8, 4, 2, 1)
MARKER = "## Sampled negatives"


def with_negatives(full: CrossLogProbs, negatives: int | None, seed: int = 0) -> CrossLogProbs:
    groups = full.column_group
    chosen = scored_groups(groups[full.row_prompt], groups, negatives, seed)
    scored_group = np.zeros(full.sum.shape, dtype=bool)
    for row, wanted in enumerate(chosen):
        scored_group[row, wanted] = True
    scored = scored_group[:, groups]
    return CrossLogProbs(
        np.where(scored, full.sum, np.nan), np.where(scored, full.mean, np.nan),
        full.row_prompt, groups, scored,
    )  # fmt: skip


def main() -> None:
    lines = [
        MARKER,
        "",
        "Demo checkpoints, all 32 prompts x 8 samples (64 new tokens), CPU. `M` = negatives per "
        "trace (full = all 31 other prompts). Retrieval is then among M + 1 candidates, so its "
        "chance level is 1 / (M + 1); the skill and normalized MI are comparable with the full "
        "matrix's. Made by `python bench/negatives.py`.",
        "",
        "| checkpoint | M | normalized MI | retrieval skill | retrieval (chance) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for name in CHECKPOINTS:
            dump = Path(scratch) / name.replace("/", "-")
            scan(EXAMPLES / name, PROMPTS, k=8, max_new_tokens=64, device="cpu", dump=dump)
            full, counts = read_dump(dump)
            for negatives in NEGATIVES:
                metrics = compute_metrics(with_negatives(full, negatives), counts)
                verdict = decide(metrics)
                label = "full" if negatives is None else str(negatives)
                lines.append(
                    f"| {name} | {label} | {metrics['normalized_mi'].value:.3f} | "
                    f"{metrics['retrieval_skill'].value:.3f} | "
                    f"{metrics['retrieval_accuracy'].value:.3f} "
                    f"({metrics['retrieval_chance_level']:.3f}) | {verdict.regime}"
                    f"{' (partial)' if verdict.partial else ''} |"
                )
                print(lines[-1], flush=True)
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    DOCS.write_text(replace_section(text, MARKER, "\n".join(lines)))


if __name__ == "__main__":
    main()
