"""Played scans with one prefill per distinct context (issue 79): turn 1 of a played scan in
RAGEN's format (tests/fixtures/ragen-shaped's `ragen:GridWorld`, 500-token contexts) against a
plain scan of the same turn-1 contexts (the played dump's rendered first turns as a prompt file:
the same ids, checked), the same N, K and length; the same for a harness that sends a long
system prompt (`command:` with examples/harnesses/gridworld_agent.py --system
examples/harnesses/gridworld_rules.txt); the whole played scan's time per scored pair against a
plain scan of the demo prompts (bench/played_scan.py's ratio, 8.21x before); and the peak
memory of turn 1's sampling. Each played arm twice in the same run: as the backend samples now,
and with every row prefilled on its own (the sampler before issue 79), so each ratio is
measured on one machine in one run. Timings are medians of `repeats` runs after a warm-up, the
model loaded once; a scored pair is one finite entry of the dump's matrix. Writes its section
of docs/benchmarks.md with --write.

    python bench/shared_prefill.py [--write] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

import torch
from bench_scoring import machine, publish
from played_scan import PROMPTS, ROOT, SHAPED, WALKER, scored_pairs
from torch.profiler import ProfilerActivity, profile

from collapsecheck import load_environment, play, scan
from collapsecheck.engines.backends import hf
from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.settings import EnvSettings, LoadSettings, Settings

HEADING = "## Played scans share a prefill"
HARNESS = ROOT / "examples" / "harnesses" / "gridworld_agent.py"
RULES = ROOT / "examples" / "harnesses" / "gridworld_rules.txt"
N, K, LENGTH, RAGEN_TURNS = 8, 4, 48, 2
ARMS = ("shared", "each row its own prefill")


@contextlib.contextmanager
def sampler(arm: str) -> Iterator[None]:
    """The transformers sampler as `arm` says: as it runs now, or every row prefilled on its
    own (each prompt its own distinct context), as before issue 79."""
    shared = hf.shared_contexts
    if arm == ARMS[1]:
        hf.shared_contexts = lambda prompts: (list(prompts), list(range(len(prompts))))
    try:
        yield
    finally:
        hf.shared_contexts = shared


def settings(counted: bool = True, **given) -> Settings:
    """The benchmark's settings; not `counted`: no -n or -k (a harness decides them)."""
    common = {"max_new_tokens": LENGTH, "device": "cpu", "bootstrap": 200}
    counts = {"num_prompts": N, "k": K} if counted else {}
    return Settings.build(**{**counts, **common, **given})


@contextlib.contextmanager
def generate_clock(backend) -> Iterator[list[float]]:
    """The seconds each of the backend's `generate` calls takes while inside."""
    spent: list[float] = []
    generate = backend.generate

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    backend.generate = timed
    try:
        yield spent
    finally:
        del backend.generate


def medians(backend, run: Callable[[Path], object], repeats: int) -> dict:
    """Median seconds, sampling seconds and seconds in the backend's `generate` of
    `run(dump)`, and the last dump's pairs and contexts (the first run warms up)."""
    seconds, sampling, generating, last = [], [], [], {}
    for _ in range(repeats + 1):
        with tempfile.TemporaryDirectory() as folder, generate_clock(backend) as spent:
            started = time.perf_counter()
            report = run(Path(folder))
            seconds.append(time.perf_counter() - started)
            sampling.append(report.timing["sampling_s"])
            generating.append(sum(spent))
            rows = (Path(folder) / "prompts.jsonl").read_text().splitlines()
            last = {"pairs": scored_pairs(Path(folder)),
                    "contexts": [json.loads(row) for row in rows]}  # fmt: skip
    return {"s": statistics.median(seconds[1:]), "sampling_s": statistics.median(sampling[1:]),
            "generate_s": statistics.median(generating[1:]), **last}  # fmt: skip


def ragen_play(backend, turns: int) -> Callable[[Path], object]:
    sys.path.insert(0, str(SHAPED))  # its `ragen` package, loaded as RAGEN's is
    environment = load_environment("ragen:GridWorld", {}, config=SHAPED / "config.yaml")
    env = EnvSettings(env="ragen:GridWorld", env_config=SHAPED / "config.yaml", max_turns=turns)
    return lambda dump: play(WALKER, environment, settings(), env=env, dump=dump, loaded=backend)


def harness_play(backend) -> Callable[[Path], object]:
    command = (f"command:{sys.executable} {HARNESS} --starts {N} --episodes {K} --turns 1 "
               f"--max-tokens {LENGTH} --threads {N * K} --last-only --system {RULES}")  # fmt: skip
    environment = load_environment(command, {})
    common = settings(counted=False)
    return lambda dump: play(WALKER, environment, common, env=EnvSettings(env=command),
                             dump=dump, loaded=backend)  # fmt: skip


def plain_of(backend, contexts: list[dict], folder: Path) -> Callable[[Path], object]:
    """A plain scan of the played dump's contexts as a prompt file (plain strings: no
    template, so each renders to the ids it was played with)."""
    prompts = folder / "turn-one.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": c["text"]}) + "\n" for c in contexts))
    return lambda dump: scan(WALKER, prompts, settings(num_prompts=len(contexts)), dump=dump,
                             loaded=backend)  # fmt: skip


def plain_demo(backend) -> Callable[[Path], object]:
    """A plain scan of the demo prompts (36-token contexts)."""
    return lambda dump: scan(WALKER, PROMPTS, settings(), dump=dump, loaded=backend)


def same_ids(played: dict, plain: dict) -> None:
    got = sorted(tuple(c["ids"]) for c in plain["contexts"])
    assert got == sorted(tuple(c["ids"]) for c in played["contexts"]), "not the same contexts"


def turn_one_rows(contexts: list[dict]) -> list[list[int]]:
    """Turn 1's rows as `play` samples them: each start state's context K times."""
    return [c["ids"] for c in contexts for _ in range(K)]


def peak_memory(backend, contexts: list[dict], arm: str) -> float:
    """MiB of tensors live at once, beyond those alive before, while turn 1's rows are
    sampled (the torch profiler's allocation events summed in time order)."""
    params = SamplingParams(k=1, max_new_tokens=LENGTH)
    with sampler(arm), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        backend.generate(turn_one_rows(contexts), params, no_progress)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak / 2**20


def prefill_share(backend, contexts: list[dict], repeats: int) -> tuple[float, float, int]:
    """Seconds of turn 1's sampling and of its prefill alone (the distinct contexts, as the
    sampler prefills them), medians after a warm-up; and the tokens every context begins
    with."""
    ids = [c["ids"] for c in contexts]
    params = SamplingParams(k=1, max_new_tokens=LENGTH)
    rows = turn_one_rows(contexts)
    whole = [seconds_of(lambda: backend.generate(rows, params, no_progress))
             for _ in range(repeats + 1)]  # fmt: skip
    with torch.inference_mode():
        prefill = [seconds_of(lambda: backend.prefill_together(ids)) for _ in range(repeats + 1)]
    columns = zip(*ids, strict=False)
    common = next((i for i, column in enumerate(columns) if len(set(column)) > 1),
                  min(map(len, ids)))  # fmt: skip
    return statistics.median(whole[1:]), statistics.median(prefill[1:]), common


def seconds_of(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def table(rows: list[tuple[str, dict, dict | None]]) -> list[str]:
    lines = ["| scan | sampling s | of the plain scan's | in generate s | of the plain scan's | "
             "seconds | scored pairs | ms a pair |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, facts, plain in rows:
        ratios = [
            f"{facts[s] / plain[s]:.2f}x" if plain else "" for s in ("sampling_s", "generate_s")
        ]
        lines.append(f"| {name} | {facts['sampling_s']:.2f} | {ratios[0]} | "
                     f"{facts['generate_s']:.2f} | {ratios[1]} | {facts['s']:.2f} | "
                     f"{facts['pairs']} | {1000 * facts['s'] / facts['pairs']:.2f} |")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    backend = TransformersBackend.from_checkpoint(WALKER, LoadSettings(device="cpu"))
    first, harness, whole = {}, {}, {}
    for arm in ARMS:
        with sampler(arm):
            first[arm] = medians(backend, ragen_play(backend, 1), args.repeats)
            harness[arm] = medians(backend, harness_play(backend), args.repeats)
            whole[arm] = medians(backend, ragen_play(backend, RAGEN_TURNS), args.repeats)
    with tempfile.TemporaryDirectory() as folder:
        plain = medians(backend, plain_of(backend, first[ARMS[0]]["contexts"], Path(folder)),
                        args.repeats)  # fmt: skip
        same_ids(first[ARMS[0]], plain)
        recorded = harness[ARMS[0]]["contexts"]
        plain_harness = medians(backend, plain_of(backend, recorded, Path(folder)), args.repeats)
        same_ids(harness[ARMS[0]], plain_harness)
    demo = medians(backend, plain_demo(backend), args.repeats)
    memory = {arm: peak_memory(backend, first[ARMS[0]]["contexts"], arm) for arm in ARMS}
    sampled_s, prefill_s, common = prefill_share(backend, first[ARMS[0]]["contexts"], args.repeats)
    per_pair = {arm: whole[arm]["s"] / whole[arm]["pairs"] for arm in ARMS}
    demo_pair = demo["s"] / demo["pairs"]
    contexts = statistics.mean(len(c["ids"]) for c in first[ARMS[0]]["contexts"])
    harness_context = statistics.mean(len(c["ids"]) for c in harness[ARMS[0]]["contexts"])
    ratio = {arm: first[arm]["sampling_s"] / plain["sampling_s"] for arm in ARMS}
    harness_ratio = {arm: harness[arm]["sampling_s"] / plain_harness["sampling_s"] for arm in ARMS}
    lines = [
        HEADING,
        "",
        f"Measured {date.today()} on {machine('cpu')} by `python bench/shared_prefill.py`: the "
        f"demo walker, N = {N} start states, K = {K} episodes each, {LENGTH} new tokens. Median "
        f"of {args.repeats} runs after a warm-up, the model loaded once; each played arm as the "
        "backend samples now (one prefill per distinct context) and with every row prefilled on "
        "its own (before issue 79), in the same run.",
        "",
        f"Turn 1 in RAGEN's format (ragen:GridWorld of tests/fixtures/ragen-shaped, contexts of "
        f"{contexts:.0f} tokens) against a plain scan of the same {len(plain['contexts'])} "
        "contexts (the played dump's rendered first turns as a prompt file; the same ids):",
        "",
        *table(
            [
                ("plain, the turn-1 contexts", plain, None),
                *((f"played, turn 1, {arm}", first[arm], plain) for arm in ARMS),
            ]
        ),
        "",
        f"Turn 1's sampling time is **{ratio[ARMS[0]]:.2f}x** the plain scan's (target: within "
        f"1.3x), against {ratio[ARMS[1]]:.2f}x with every row prefilled on its own.",
        "",
        f"A harness that sends a long system prompt (`command:` with gridworld_agent.py --system "
        f"examples/harnesses/gridworld_rules.txt, 1 turn, {N * K} threads; contexts of "
        f"{harness_context:.0f} tokens) against a plain scan of its recorded contexts:",
        "",
        *table(
            [
                ("plain, the harness's contexts", plain_harness, None),
                *((f"command:, {arm}", harness[arm], plain_harness) for arm in ARMS),
            ]
        ),
        "",
        f"Its sampling time is **{harness_ratio[ARMS[0]]:.2f}x** the plain scan's, against "
        f"{harness_ratio[ARMS[1]]:.2f}x with every row prefilled on its own; it includes the "
        "harness's own start (a Python process importing openai), its threads' requests and "
        "replies over HTTP and the endpoint's wait for requests still being rendered. The "
        "backend's `generate` call alone takes "
        f"{harness[ARMS[0]]['generate_s'] / plain_harness['generate_s']:.2f}x the plain "
        f"scan's (against {harness[ARMS[1]]['generate_s'] / plain_harness['generate_s']:.2f}x).",
        "",
        f"The whole played scan ({RAGEN_TURNS} turns) against a plain scan of the demo prompts "
        f"(36-token contexts, bench/played_scan.py's comparison, 8.21x before):",
        "",
        *table(
            [
                ("plain, the demo prompts", demo, None),
                *(
                    (f"played, ragen:GridWorld, {RAGEN_TURNS} turns, {arm}", whole[arm], None)
                    for arm in ARMS
                ),
            ]
        ),
        "",
        f"Its time per scored pair is **{per_pair[ARMS[0]] / demo_pair:.2f}x** the plain scan's, "
        f"against {per_pair[ARMS[1]] / demo_pair:.2f}x with every row prefilled on its own. "
        "What is left is the contexts' length, not the playing: a plain scan of the turn-1 "
        f"contexts above costs {1000 * plain['s'] / plain['pairs']:.2f} ms a pair, "
        f"{plain['s'] / plain['pairs'] / demo_pair:.2f}x the demo prompts'.",
        "",
        "Peak memory of turn 1's sampling in RAGEN's format (the tensors live at once beyond "
        "those before, by the torch profiler's allocation events): "
        + ", ".join(f"{arm} {memory[arm]:.1f} MiB" for arm in ARMS)
        + ". One prefill's cache is copied into the rows that read it where they begin to "
        "diverge, at their first decoded token (decode_cache.py): what is saved is the work "
        "space of the prefills no longer run.",
        "",
        f"Where a shared prefix would pay: turn 1's {len(first[ARMS[0]]['contexts'])} distinct "
        f"contexts all begin with the same {common} of their {contexts:.0f} tokens (the system "
        f"prompt and rules); their prefill takes {prefill_s:.3f} s of turn 1's {sampled_s:.3f} s "
        f"of sampling ({prefill_s / sampled_s:.0%}). Prefilling that prefix once would save at "
        f"most about {common / contexts:.0%} of the prefill, "
        f"{prefill_s * common / contexts / sampled_s:.0%} of turn 1's sampling and "
        f"{prefill_s * common / contexts / whole[ARMS[0]]['s']:.1%} of the {RAGEN_TURNS}-turn "
        "scan's time: not built on the transformers backend (docs/decisions.md); vLLM shares "
        "it through its prefix cache.",
    ]
    publish(HEADING, "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
