"""What CollapseCallback costs a training run: a real GRPOTrainer on CPU at the demo run's
shapes (scripts/make_grpo_run.py: 32 completions a step, 8 per prompt, up to 64 new tokens,
from examples/demo-run/global_step_200), run for STEPS steps without the callback and with it
at every=10, in one process: from the step's own completions (the default), and sampling the
demo probe set (16 prompts x 8 samples, 64 new tokens) with and without the flow.
Goal (issue 22): at most 10% of training step time at every=10. Writes its section of
docs/benchmarks.md.

    python bench/callback.py [--steps 20] [--no-flow]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from bench_scoring import machine, write_section
from datasets import Dataset
from transformers import AutoTokenizer, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from collapsecheck.integrations.trl import CollapseCallback

ROOT = Path(__file__).resolve().parent.parent
START = ROOT / "examples" / "demo-run" / "global_step_200"
TRAIN = ROOT / "examples" / "prompts" / "gridworld-256.jsonl"
PROBE = ROOT / "examples" / "prompts" / "gridworld.jsonl"
MARKER = "## The training-loop callback"
EVERY = 10


def answered(completions, **_):
    return [float("<answer>" in c[0]["content"]) for c in completions]


def trainer(out: Path, steps: int) -> GRPOTrainer:
    rows = [json.loads(line) for line in TRAIN.read_text().splitlines()]
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=5e-4, lr_scheduler_type="constant",
        per_device_train_batch_size=32, num_generations=8, max_completion_length=64,
        temperature=0.8, logging_steps=5, save_strategy="no", report_to="none", use_cpu=True,
        seed=7, data_seed=7,
    )  # fmt: skip
    return GRPOTrainer(
        model=LlamaForCausalLM.from_pretrained(START, dtype=torch.float32),
        reward_funcs=[answered],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": row["messages"]} for row in rows]),
        processing_class=AutoTokenizer.from_pretrained(START),
    )


# the callbacks measured: (row name, CollapseCallback's arguments after the trainer)
SOURCES = [
    ("the step's own completions (default)", {}),
    ("the step's own completions, X->Z alone (no_flow=True)", {"no_flow": True}),
    ("probe, X->Z alone (no_flow=True)",
     {"probe_prompts": PROBE, "num_prompts": 16, "k": 8, "max_new_tokens": 64, "no_flow": True}),
    ("probe, X->Z and flow",
     {"probe_prompts": PROBE, "num_prompts": 16, "k": 8, "max_new_tokens": 64}),
]  # fmt: skip


def timed_run(steps: int, callback: dict | None) -> tuple[float, list[float]]:
    """Wall time of `steps` training steps, and the callback's time per diagnosis (None: no
    callback)."""
    with TemporaryDirectory() as out:
        run = trainer(Path(out), steps)
        if callback is not None:
            run.add_callback(CollapseCallback(run, every=EVERY, **callback))
        started = time.perf_counter()
        run.train()
        total = time.perf_counter() - started
        spent = [e["collapse/diagnosis_s"] for e in run.state.log_history
                 if "collapse/diagnosis_s" in e]  # fmt: skip
    return total, spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    timed_run(2, None)  # warm-up: imports, first allocations
    bare, _ = timed_run(args.steps, None)
    rows = []
    for name, callback in SOURCES:
        total, spent = timed_run(args.steps, callback)
        share = sum(spent) / (total - sum(spent))
        rows.append(
            f"| {name} | "
            f"{bare / args.steps:.2f} | {total / args.steps:.2f} | "
            f"{sum(spent) / len(spent):.1f} | {100 * share:.0f}% | "
            f"{100 * (total / bare - 1):.0f}% |"
        )
        print(rows[-1], flush=True)
    lines = [
        MARKER,
        "",
        f"`make bench` ({date.today()}, {machine('cpu')}, float32): a real `GRPOTrainer` at the "
        "demo run's shapes (32 completions a step, 8 per prompt, 64 new tokens, from "
        f"`examples/demo-run/global_step_200`), {args.steps} steps without the callback and "
        f"with `CollapseCallback(every={EVERY})` reading the step's own completions (4 prompts "
        "x 8) or sampling the demo probe set (16 prompts x 8 samples, 64 new tokens), in one "
        "process. Made by `python bench/callback.py`. Goal: at most 10% of training step time "
        "at every=10. Diagnosis / training time: the callback's own time over the rest.",
        "",
        "| callback | s per step without | s per step with | s per diagnosis | diagnosis / "
        "training time | wall time added |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    write_section(MARKER, lines)


if __name__ == "__main__":
    main()
