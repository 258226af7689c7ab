"""The watcher's lag behind a trainer: a trainer (a thread here) saves a demo checkpoint every
INTERVAL seconds as TRL does (the files, then trainer_state.json last); `watch` (in this
process, --every-step, polling every 0.5 s) diagnoses each at the demo shapes (N = 16, K = 8,
64 new tokens). Per interval: the lag from "written" to "diagnosed" of the first and the last
step, and whether steps piled up. Writes its section of docs/benchmarks.md with --write.

    python bench/watch_lag.py [--write]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

from bench_scoring import machine, write_section

from collapsecheck.config import GateSettings
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.runs.watch import SampledFrom, Watch
from collapsecheck.settings import Settings, WatchSettings

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-run"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
SOURCES = [DEMO / f"global_step_{step}" for step in (100, 200, 300, 400, 500)]
INTERVALS = (10.0, 5.0, 2.0, 1.0)
MARKER = "## The watcher's lag behind a trainer"
LAG = re.compile(r"^step (\d+): .*diagnosed (\d+) s later\)$")


def trainer(run: Path, interval: float) -> None:
    for number, source in enumerate(SOURCES, start=1):
        time.sleep(interval)
        target = run / f"checkpoint-{number * 10}"
        shutil.copytree(source, target)
        (target / "trainer_state.json").write_text(json.dumps({"global_step": number * 10,
                                                               "log_history": []}))  # fmt: skip


def measure(interval: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        run, lines = Path(folder) / "run", []
        writing = threading.Thread(target=trainer, args=(run, interval))
        writing.start()
        settings = Settings.build(num_prompts=16, k=8, max_new_tokens=64, device="cpu",
                                  bootstrap=200)  # fmt: skip
        follow = WatchSettings(idle=interval + 15, poll=0.5, every_step=True)
        watch = Watch(run, SampledFrom(PROMPTS), settings, follow,
                      GateSettings(fail_on="none").load(), VerdictThresholds(),
                      Path(folder) / "cache", lines.append)  # fmt: skip
        watch.follow()
        writing.join()
    lags = [int(m.group(2)) for line in lines if (m := LAG.match(line))]
    behind = sum("falling behind" in line for line in lines)
    return {"interval": interval, "lags": lags, "behind": behind}


def seconds(intervals: list[float]) -> str:
    return ", ".join(f"{i:g} s" for i in intervals)


def verdict(kept_up: list[float], behind: list[float]) -> str:
    """What the table says, and only that."""
    if not behind:
        return (
            f"It kept up at every interval measured, down to a checkpoint every "
            f"{min(kept_up):g} s: no step waited for another. The demo policy is tiny; a real "
            'policy\'s diagnosis takes longer (docs/benchmarks.md, "A real pretrained model"), '
            "and where steps wait the newest is diagnosed first (--every-step keeps the order)."
        )
    return (
        f"Kept up (no step waited for another) at a checkpoint every {seconds(kept_up) or '-'}; "
        f"steps piled up at a checkpoint every {seconds(behind)} (by default the newest is "
        "then diagnosed first; --every-step, as here, keeps the order)."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    rows = [measure(interval) for interval in INTERVALS]
    kept_up = [r["interval"] for r in rows if r["behind"] == 0]
    behind = [r["interval"] for r in rows if r["behind"]]
    lines = [
        MARKER,
        "",
        f"`python bench/watch_lag.py --write` on {date.today()}, {machine('cpu')}: a trainer "
        f"thread saves the {len(SOURCES)} demo checkpoints one every INTERVAL seconds as TRL "
        "does (trainer_state.json last); `watch --every-step --poll 0.5` diagnoses each at "
        "N = 16, K = 8, 64 new tokens (model load included, one load per step).",
        "",
        "| checkpoint every | lag of each step (s, written to diagnosed) | steps piled up |",
        "|---|---|---|",
        *(
            f"| {r['interval']:g} s | {', '.join(map(str, r['lags']))} | "
            f"{'yes' if r['behind'] else 'no'} |"
            for r in rows
        ),
        "",
        verdict(kept_up, behind),
    ]
    print("\n".join(lines))
    if args.write:
        write_section(MARKER, lines)


if __name__ == "__main__":
    main()
