"""A real TRL GRPOTrainer run on CPU, saving a checkpoint every 2 steps with TRL's own
`Trainer._save_checkpoint` (weights, optimizer, scheduler, RNG state, trainer_state.json last),
for `watch` to follow from another process (tests/test_watch.py).

    python -m tests.trl_training_run OUTPUT_DIR STEPS   (from the repository's root)
"""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "demo-run" / "global_step_100"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"


def answered(completions, **_):
    return [float("<answer>" in c[0]["content"]) for c in completions]


def main(out: Path, steps: int) -> None:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=1e-4, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=32, logging_steps=1, save_strategy="steps",
        save_steps=2, report_to="none", use_cpu=True, bf16=False, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=LlamaForCausalLM.from_pretrained(POLICY, dtype=torch.float32),
        reward_funcs=[answered],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": row["messages"]} for row in rows]),
        processing_class=AutoTokenizer.from_pretrained(POLICY),
    )
    trainer.train()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
