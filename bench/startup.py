"""Start-up (issue 72, docs/decisions.md "Start-up"): the wall time of the command line where it
should cost nothing, each a fresh process as a user or a CI gate starts it:

- `--help`, `--version`, an argument error (`-n -3`) and an output-path error (`--json` under a
  file), against `python -c "import typer, rich"` (the floor of any typer command line);
- a run directory of three demo checkpoints scanned at the README's demo size (N 16, K 8, 64 new
  tokens, rewards) into a fresh results cache, then the same command again, every answer in
  the cache: the rerun's share of the first scan.

Each command runs once to warm the file cache and write its bytecode (a user's installed
package has it; PYTHONDONTWRITEBYTECODE is dropped), then REPEATS times; the median is kept.
`--before DIR` times a checkout of an earlier commit the same way, in the same run, each of its
commands right after this tree's, so the two are compared on the same machine at the same time.
Targets: --help within 0.6 s, an argument or output-path error within 0.8 s, a cached rerun at
most a third of the first scan. Writes its section of docs/benchmarks.md with --write.

    python bench/startup.py [--before DIR] [--repeats 7] [--write]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-run"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
REWARDS = ROOT / "examples" / "rewards" / "gridworld.py"
CHECKPOINT = DEMO / "global_step_100"
DEMO_SIZE = ["-n", "16", "-k", "8", "--max-new-tokens", "64", "--reward-fn", str(REWARDS)]
MARKER = "## Start-up: a mistake, --help and a cached answer"
TARGETS = {"--help": 0.6, "argument error": 0.8, "output-path error": 0.8}
CACHED_SHARE = 1 / 3


def environment(source: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(source), "HF_HUB_OFFLINE": "1"}


def timed(command: list[str], env: dict[str, str], expect: int) -> float:
    """One run, in the source tree it times (`python -c` imports the working directory's
    package before PYTHONPATH's)."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=env["PYTHONPATH"], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-500:]}")
    return elapsed


def collapsecheck(*args: str) -> list[str]:
    """The command line as its console script starts it."""
    return [sys.executable, "-c", "from collapsecheck.cli import main; main()", *args]


def quick_commands(scratch: Path) -> dict[str, tuple[list[str], int]]:
    """name -> (command, expected exit code)."""
    a_file = scratch / "a-file"
    a_file.write_text("x")
    unwritable = ["--json", str(a_file / "r.json")]
    return {
        "import typer, rich": ([sys.executable, "-c", "import typer, rich"], 0),
        "--help": (collapsecheck("--help"), 0),
        "--version": (collapsecheck("--version"), 0),
        "argument error": (collapsecheck("scan", str(CHECKPOINT), "-n", "-3"), 2),
        "output-path error": (
            collapsecheck("scan", str(CHECKPOINT), "-p", str(PROMPTS), *unwritable),
            2,
        ),
    }


def median_time(command: list[str], env: dict[str, str], expect: int, repeats: int) -> float:
    timed(command, env, expect)  # warm: file cache and bytecode
    return statistics.median(timed(command, env, expect) for _ in range(repeats))


def three_checkpoint_run(folder: Path) -> Path:
    run = folder / "run"
    for step in (100, 300, 500):
        shutil.copytree(DEMO / f"global_step_{step}", run / f"global_step_{step}")
    return run


def cached_rerun(source: Path, folder: Path, repeats: int) -> tuple[float, float]:
    """The first scan of a three-checkpoint run (nothing cached), and the median rerun."""
    run, cache = three_checkpoint_run(folder), folder / "cache"
    command = collapsecheck("scan", str(run), "-p", str(PROMPTS), *DEMO_SIZE, "--out",
                            str(cache), "--fail-on", "none")  # fmt: skip
    env = environment(source)
    first = timed(command, env, 0)
    return first, median_time(command, env, 0, repeats)


def measure(sources: dict[str, Path], repeats: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {name: {} for name in sources}
    with tempfile.TemporaryDirectory() as scratch:
        commands = quick_commands(Path(scratch))
        for label, (command, expect) in commands.items():
            for name, source in sources.items():
                figures[name][label] = median_time(command, environment(source), expect, repeats)
                print(f"{name}: {label}: {figures[name][label]:.2f} s", flush=True)
        for name, source in sources.items():
            folder = Path(scratch) / name
            first, rerun = cached_rerun(source, folder, max(3, repeats // 2))
            figures[name].update({"first scan": first, "cached rerun": rerun})
            print(f"{name}: first scan {first:.1f} s, cached rerun {rerun:.2f} s", flush=True)
    return figures


def verdict(label: str, value: float, first: float) -> str:
    if label in TARGETS:
        met = value <= TARGETS[label]
        return f"target {TARGETS[label]} s: {'met' if met else 'not met'}"
    if label == "cached rerun":
        met = value <= CACHED_SHARE * first
        return f"{value / first:.2f} of the first scan; target 0.33: {'met' if met else 'not met'}"
    return ""


def section(figures: dict[str, dict[str, float]], repeats: int, machine: str) -> str:
    names = list(figures)
    header = "| | " + " | ".join(f"{n} (s)" for n in names) + " | |"
    lines = [
        MARKER,
        "",
        f"`python bench/startup.py` on {machine} ({os.cpu_count()} cores), Python "
        f"{platform.python_version()}, {date.today()}: each "
        f"command a fresh process, bytecode written, the median of {repeats} runs after a warm "
        "one (the reruns: of at least 3). The run: three demo checkpoints at the README's demo "
        "size (N 16, K 8, 64 new tokens, rewards), first into an empty results cache.",
        "",
        header,
        "|---|" + "---|" * len(names) + "---|",
    ]
    now = figures[names[0]]
    for label in now:
        cells = " | ".join(f"{figures[n][label]:.2f}" for n in names)
        lines.append(f"| {label} | {cells} | {verdict(label, now[label], now['first scan'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit to compare")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    sources = {"this tree": ROOT}
    if args.before is not None:
        commit = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        sources[f"before ({commit or args.before.name})"] = args.before.resolve()
    figures = measure(sources, args.repeats)
    from bench_scoring import machine, write_section  # imports torch: after the timings

    text = section(figures, args.repeats, machine("cpu"))
    print(text)
    if args.write:
        write_section(MARKER, [text])


if __name__ == "__main__":
    main()
