"""Write veRL rollout dumps (`trainer.rollout_data_dir`) with veRL's own code, for
tests/fixtures/verl-rollouts/ (`make verl-fixtures`, in veRL's environment).

veRL's full trainer needs GPUs, so its dumping method is called directly, as the trainer calls
it after computing rewards: `RayPPOTrainer._log_rollout_data` on a real `DataProto` batch. The
batch is what veRL's rollout makes of the gridworld prompts: each prompt rendered with the
chat template (add_generation_prompt) and left-padded, 8 responses per prompt sampled from the
demo policy (examples/demo-run/global_step_100) and right-padded, the gridworld reward on the
last response token, the ground truth under `reward_model`. Steps 1 and 2 are written.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, LlamaForCausalLM
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "rewards"))
from gridworld import compute_score  # noqa: E402

POLICY = ROOT / "examples" / "demo-run" / "global_step_100"
PROMPTS = ROOT / "examples" / "prompts" / "gridworld.jsonl"
OUT = ROOT / "tests" / "fixtures" / "verl-rollouts"
N, K, NEW_TOKENS = 8, 8, 64


def left_pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([[pad] * (width - len(r)) + r for r in rows])


def right_pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


def batch_for_step(model, tokenizer, rows: list[dict], seed: int) -> DataProto:
    torch.manual_seed(seed)
    prompts, responses, scores, truths = [], [], [], []
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out = model.generate(
            torch.tensor([ids] * K), do_sample=True, temperature=1.0, top_p=1.0,
            max_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        for sequence in out[:, len(ids) :].tolist():
            if tokenizer.eos_token_id in sequence:
                sequence = sequence[: sequence.index(tokenizer.eos_token_id) + 1]
            prompts.append(ids)
            responses.append(sequence)
            decoded = tokenizer.decode(sequence, skip_special_tokens=True)
            scores.append(compute_score("gridworld", decoded, row["ground_truth"]))
            truths.append({"ground_truth": row["ground_truth"], "style": "rule"})
    pad = tokenizer.pad_token_id
    response_ids = right_pad(responses, pad)
    token_scores = torch.zeros(response_ids.shape, dtype=torch.float32)
    for i, (sequence, value) in enumerate(zip(responses, scores, strict=True)):
        token_scores[i, len(sequence) - 1] = value
    return DataProto.from_dict(
        tensors={"prompts": left_pad(prompts, pad), "responses": response_ids,
                 "token_level_scores": token_scores},
        non_tensors={"reward_model": np.array(truths, dtype=object)},
    )  # fmt: skip


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    model = LlamaForCausalLM.from_pretrained(POLICY, dtype=torch.float32).eval()
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()][:N]
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # the dumping methods need only these
    trainer.tokenizer = tokenizer
    trainer._init_dump_executor()
    for step in (1, 2):
        trainer.global_steps = step
        batch = batch_for_step(model, tokenizer, rows, seed=step)
        trainer._log_rollout_data(batch, {"acc": batch.batch["token_level_scores"].sum(-1)},
                                  {}, str(OUT))  # fmt: skip
    trainer._shutdown_dump_executor()


if __name__ == "__main__":
    main()
