"""A `command:` scan's time per scored pair against a plain scan's and a played one's (issue 71:
at most 1.3x a plain scan's, as for the other frameworks): the demo walker driven by a team's
own agent loop (examples/harnesses/gridworld_agent.py: the openai client, every episode in its
own thread) through collapsecheck's endpoint; the same walker played by collapsecheck in the
same gridworld (`FILE.py:FACTORY`, the whole chat each turn, as the harness keeps it); and the
plain scan of N prompts of the demo prompt set. The same N, K, turns and length limit. Each
timed in this process after a warm-up, its model already loaded, `repeats` times (the median);
a scored pair is one finite entry of the cross-scoring matrix the dump keeps. Writes its
section of docs/benchmarks.md with --write.

    python bench/harness_scan.py [--write] [--repeats 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import date

from bench_scoring import machine, publish
from played_scan import GRIDWORLD, PROMPTS, ROOT, WALKER, timed

from collapsecheck import load_environment, play, scan
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.settings import EnvSettings, LoadSettings, Settings

HARNESS = ROOT / "examples" / "harnesses" / "gridworld_agent.py"
HEADING = "## A harness's scan (command:) against a plain one"
N, K, TURNS, LENGTH = 8, 4, 4, 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    common = {"max_new_tokens": LENGTH, "device": "cpu", "bootstrap": 200}
    counted = Settings.build(num_prompts=N, k=K, **common)
    backend = TransformersBackend.from_checkpoint(WALKER, LoadSettings(device="cpu"))
    driven, played = {}, {}
    for window, flag in ((1, " --last-only"), (-1, "")):
        command = (f"command:{sys.executable} {HARNESS} --starts {N} --episodes {K} "
                   f"--turns {TURNS} --max-tokens {LENGTH} --threads {N * K}{flag}")  # fmt: skip
        harness = load_environment(command, {})
        driven[window] = timed(
            lambda dump, c=command, h=harness: play(
                WALKER, h, Settings.build(**common), env=EnvSettings(env=c), dump=dump,
                loaded=backend),
            args.repeats,
        )  # fmt: skip
        gridworld = load_environment(GRIDWORLD, {})
        env = EnvSettings(env=GRIDWORLD, max_turns=TURNS, context_window=window)
        played[window] = timed(
            lambda dump, g=gridworld, e=env: play(WALKER, g, counted, env=e, dump=dump,
                                                  loaded=backend),
            args.repeats,
        )  # fmt: skip
    plain_s, plain = timed(
        lambda dump: scan(WALKER, PROMPTS, counted, dump=dump, loaded=backend), args.repeats
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import openai"], check=True)
    startup = time.perf_counter() - started
    rows = (("plain", plain_s, plain),
            ("played, FILE.py:FACTORY, --context-window 1", *played[1]),
            ("command:, the harness with --last-only", *driven[1]),
            ("played, FILE.py:FACTORY, the whole chat", *played[-1]),
            ("command:, the harness keeping the whole chat", *driven[-1]))  # fmt: skip
    per = {name: seconds / facts["pairs"] for name, seconds, facts in rows}
    ratio, chat_ratio = per[rows[2][0]] / per["plain"], per[rows[4][0]] / per[rows[3][0]]
    lines = [
        HEADING,
        "",
        f"Measured {date.today()} on {machine('cpu')} by `python bench/harness_scan.py`: the demo "
        f"walker, N = {N} start states (prompts), K = {K}, {LENGTH} new tokens, up to {TURNS} "
        f"turns; the harness runs its {N * K} episodes in as many threads. Median of "
        f"{args.repeats} runs after a warm-up, the model loaded once.",
        "",
        "| scan | seconds | scored pairs | ms a pair | context tokens (mean) | tokens sampled | "
        "sampling s | scoring s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, seconds, facts in rows:
        timing = facts["timing"]
        lines.append(
            f"| {name} | {seconds:.2f} | {facts['pairs']} | {1000 * per[name]:.2f} | "
            f"{facts['context']:.0f} | {facts['sampled']} | {timing['sampling_s']:.2f} | "
            f"{timing['scoring_s']:.2f} |"
        )
    met = "met" if ratio <= 1.3 else "not met"
    lines += [
        "",
        f"A `command:` scan's time per scored pair is **{ratio:.2f}x** a plain scan's at the same "
        f"N, K and length (each turn's context the newest observation, "
        f"{driven[1][1]['context']:.0f} tokens against {plain['context']:.0f}; the target: at "
        f"most 1.3x): {met}; "
        f"{per[rows[2][0]] / per[rows[1][0]]:.2f}x the same episodes played by collapsecheck. "
        f"Keeping the whole chat, the harness's scan is {chat_ratio:.2f}x collapsecheck's own "
        "play of the same chats (both scan longer contexts than the plain scan). A harness's "
        "sampling includes the harness itself: its start-up (a Python process importing openai: "
        f"{startup:.2f} s, measured in the same run), its HTTP requests to the endpoint, and the "
        "endpoint's batching of the requests that arrive together.",
    ]
    publish(HEADING, "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
