"""What `--baseline` (SPEC "Scored under the start") adds to a run scan, measured in one run:
`scan_run` of four checkpoints of the README's GRPO run (steps 20, 100, 180, 200) at the demo
shape (N = 16, K = 8, 64 new tokens), into a fresh results cache each time, without and with
`--baseline examples/demo-run/global_step_200`, alternating, three rounds each (medians).
With it the run also scans the start itself (step 0, what typicality is read against) and
scores each step's reasoning under it, its model loaded once for the run.

    python bench/prior.py            # print the figures
    python bench/prior.py --write    # and write the section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time
from pathlib import Path

from bench_scoring import DOCS, alternating, machine, publish

from collapsecheck import scan_run
from collapsecheck.inputs.discovery import require_run

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "examples" / "grpo-run"
START = ROOT / "examples" / "demo-run" / "global_step_200"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
STEPS = (20, 100, 180, 200)
DEMO_SHAPE = {"num_prompts": 16, "k": 8, "max_new_tokens": 64, "device": "cpu"}
HEADING = "## Scored under the start: what --baseline adds to a run scan"
ROUNDS = 3


def timed_run(baseline: Path | None) -> tuple[float, float]:
    """Seconds of the whole run scan, and of its scoring under the start (0 without)."""
    checkpoints = [c for c in require_run(RUN, None, []) if c.step in STEPS]
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        run = scan_run(RUN, PROMPTS, checkpoints=checkpoints, baseline=baseline,
                       training_log=False, cache_root=cache, **DEMO_SHAPE)  # fmt: skip
        whole = time.perf_counter() - start
    under = sum(s.report.timing.get("prior_s", 0.0) for s in run.steps)
    return whole, under


def rows() -> list[tuple[str, float, float]]:
    runs = alternating(lambda with_start: timed_run(START if with_start else None), ROUNDS)
    off, on = (statistics.median(r[0] for r in runs[w]) for w in (False, True))
    under = statistics.median(r[1] for r in runs[True])
    return [("whole run scan", off, on), ("of which scoring under the start", 0.0, under)]


def section(measured: list[tuple[str, float, float]]) -> str:
    (_, off, on), (_, _, under) = measured
    return "\n".join([
        HEADING,
        "",
        f"`make bench` ({datetime.date.today().isoformat()}, {machine('cpu')}, float32; "
        f"`bench/prior.py`). `scan RUN` of {len(STEPS)} checkpoints of examples/grpo-run "
        f"(steps {', '.join(map(str, STEPS))}), N = 16, K = 8, 64 new tokens, a fresh results "
        f"cache each time, medians of {ROUNDS} alternating rounds. With `--baseline` the run "
        "also scans the start as step 0 (one checkpoint more) and scores each step's reasoning "
        "under it.",
        "",
        "| | without `--baseline` | with it | adds |",
        "|---|---|---|---|",
        f"| whole run scan, s | {off:.2f} | {on:.2f} | {100 * (on / off - 1):+.0f}% |",
        f"| scoring under the start, s (all steps) | - | {under:.2f} | "
        f"{100 * under / off:+.0f}% of the run without |",
        "",
        "Most of the difference is the start's own scan (one more checkpoint of "
        f"{len(STEPS)}); the scoring under the start is one context pass per prompt and one "
        "continuation per trace, beside the cross-scoring's M x (1 + negatives).",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the section of {DOCS}")
    args = parser.parse_args()
    publish(HEADING, section(rows()), args.write)


if __name__ == "__main__":
    main()
