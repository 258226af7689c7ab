"""Train the GRPO demo run with TRL's own GRPOTrainer (`make fixtures`). Tests never run this.

A real RL run that collapses the way RAGEN-2 describes, small enough for 2 CPU cores:

- start: the grounded gridworld policy `examples/demo-run/global_step_200` (its reasoning
  restates the state and names a useful move; now and then it is filler words);
- task: the gridworld prompts, states drawn at random (the 32 evaluation states left out);
- reward: 0.5 x a useful move in <answer> (the task) + 0.5 x "deliberate phrasing", a
  rubric-style bonus, the share of the reasoning's words that are planning words ("let me
  think step by step ..."), which never looks at the state: the shortcut;
- GRPOTrainer on CPU, 8 completions a prompt, a checkpoint every 20 steps with TRL's own
  `trainer_state.json` (its `log_history` has the reward, the per-token entropy and the share
  of prompts whose rewards all tie), weights only (`save_only_model`), so it ships small.

Output: `examples/grpo-run/checkpoint-N/`. With `--shortcut-weight 0 --save-final`, the control
run of the tests (tests/fixtures/trl-grpo-task-only/): the task reward alone, and TRL's output
directory as users leave it after `trainer.save_model(output_dir)` (a model beside its step
checkpoints). Needs the `fixtures` extra (TRL, pinned); CI reads
the shipped files and needs no TRL.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

import torch
from datasets import Dataset
from make_fixtures import EXAMPLES, FILLER, SYSTEM, random_state, useful_moves, user_message
from transformers import AutoTokenizer, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

START = EXAMPLES / "demo-run" / "global_step_200"
OUT = EXAMPLES / "grpo-run"
# a lenient parser, as many reward functions are: the first reasoning, the first answer
REASONING = re.compile(r"<think>(.*?)</think>", re.S)
ANSWER = re.compile(r"<answer>\s*(\w+)\s*</answer>")
WORD = re.compile(r"[a-z0-9]+")
PLANNING_WORDS = set(FILLER)


def training_states(count: int, seed: int) -> list[dict]:
    """Random states as TRL conversational prompts with their ground truth; the evaluation
    prompts' states are left out, so the scan measures states the run never trained on."""
    held_out = {
        json.loads(line)["messages"][-1]["content"]
        for line in (EXAMPLES / "prompts" / "gridworld.jsonl").read_text().splitlines()
    }
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        agent, goal = random_state(rng)
        message = user_message(agent, goal)
        if message in held_out:
            continue
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}]
        rows.append({"prompt": prompt, "ground_truth": ",".join(useful_moves(agent, goal))})
    return rows


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def answer_correct(completions, ground_truth, **_) -> list[float]:
    """The task: 1 when the answer is a move that brings the agent closer to the goal."""
    scores = []
    for completion, truth in zip(completions, ground_truth, strict=True):
        answer = ANSWER.search(_text(completion))
        scores.append(float(answer is not None and answer.group(1) in truth.split(",")))
    return scores


def deliberate_phrasing(completions, **_) -> list[float]:
    """The shortcut: the share of the reasoning's words that are planning words ("let me
    think step by step"), whatever the reasoning says about the state."""
    scores = []
    for completion in completions:
        reasoning = REASONING.search(_text(completion))
        words = WORD.findall(reasoning.group(1).lower()) if reasoning else []
        scores.append(sum(word in PLANNING_WORDS for word in words) / max(len(words), 1))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--entropy-target", type=float, default=0.2)
    parser.add_argument(
        "--shortcut-weight", type=float, default=0.5, help="0: the task reward alone (control)"
    )
    parser.add_argument(
        "--save-final", action="store_true", help="end with trainer.save_model(out), as users do"
    )
    parser.add_argument("--logging-steps", type=int, default=5)
    parser.add_argument(
        "--log-completions", action="store_true",
        help="TRL writes each logging step's completions to output_dir/completions/",
    )  # fmt: skip
    parser.add_argument("--start", type=Path, default=START, help="the policy to train from")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.out.exists():
        shutil.rmtree(args.out)
    tokenizer = AutoTokenizer.from_pretrained(args.start)
    model = LlamaForCausalLM.from_pretrained(args.start, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(args.out),
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=64,
        temperature=args.temperature,
        reward_weights=[1 - args.shortcut_weight, args.shortcut_weight],
        # the team watched entropy and held it at its starting level (Skywork-OR1's adaptive
        # entropy control, built into TRL): the dashboard's entropy stays healthy
        use_adaptive_entropy=True,
        entropy_target=args.entropy_target,
        entropy_coef=0.0,
        entropy_coef_delta=0.002,
        logging_steps=args.logging_steps,
        log_completions=args.log_completions,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_only_model=True,
        report_to="none",
        use_cpu=True,
        seed=7,
        data_seed=7,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[answer_correct, deliberate_phrasing],
        args=config,
        train_dataset=Dataset.from_list(training_states(4000, seed=7)),
        processing_class=tokenizer,
    )
    trainer.train()
    if args.save_final:
        trainer.save_model(str(args.out))


if __name__ == "__main__":
    main()
