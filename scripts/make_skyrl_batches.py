"""Write SkyRL `trainer.dump_data_batch=true` pickles for
tests/fixtures/trainer-dumps/skyrl/dumped_data/ with SkyRL's own `TrainingInputBatch` class.

SkyRL's `RayPPOTrainer.dump_data` writes `{export_path}/dumped_data/
global_step_{N}_training_input.pkl` through `TrainingInputBatch.save(path)`, a plain
`pickle.dump(self, f)`, after `compute_advantages_and_returns` and before
`train_critic_and_policy`. This script builds that batch the way the trainer has it at that
point and saves it with SkyRL's own `save`:

- global_step_2_training_input.pkl: `skyrl-train==0.3.1`, class
  `skyrl_train.training_batch.TrainingInputBatch` (the dict-subclass pickle: the dict items as
  real tensors plus a `__getstate__` of torch.save bytes). Layout of
  `skyrl_train/dataset/preprocess.py::convert_prompts_responses_to_batch_tensors`: prompt
  left-padded to the longest prompt, response right-padded after it. No padding rows
  (pad_size 0).
- global_step_3_training_input.pkl: `skyrl==0.4.0`, class
  `skyrl.backends.skyrl_train.training_batch.TrainingInputBatch` (`__reduce__` ->
  `_rebuild_tensor_batch`, numpy bytes tagged with the `TensorFormat` StrEnum). Layout of
  `skyrl/train/dataset/preprocess.py`: whole row left-padded, response-level tensors
  right-aligned. Two padding rows (pad_size 2) appended by SkyRL's own
  `pad_training_input_batch` (copies of row 0, loss_mask 0), as a dp size of 13 would need.

The SkyRL code is never kept in this repository: both wheels are fetched with
`pip download --no-deps` into a temporary folder, unzipped (not installed), and imported from
there. Their full dependency sets do not install on a CPU machine, so the package
`__init__`s that pull in heavy dependencies are blanked in the temporary copy
(`skyrl/__init__.py`, `skyrl/backends/__init__.py`, and both `dataset/__init__.py`, which
import `datasets`); the modules used (`training_batch`, `dataset/preprocess`) need only
torch, numpy and jaxtyping.

The batch is tests/fixtures/trainer-dumps/batch.json (6 prompts x 4 responses sampled from
examples/demo-run/global_step_100), in its order, a prompt's 4 rows consecutive. Rewards are
the gridworld reward of each decoded response against examples/prompts/gridworld.jsonl's
ground truth; advantages are SkyRL's GRPO of those rewards. `action_log_probs` (and
`base_action_log_probs`, the same checkpoint standing in for the reference model, and 0.4.0's
`rollout_logprobs`) are a real forward pass of global_step_100 over each row.

Run it with a separate venv (SkyRL's modules need jaxtyping and loguru, which the project's
.venv does not carry):

    python3 -m venv /tmp/skyrl-venv
    /tmp/skyrl-venv/bin/pip install torch==2.13.0 numpy jaxtyping loguru transformers==5.24.0
    /tmp/skyrl-venv/bin/python scripts/make_skyrl_batches.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from trainer_sources import BATCH, DUMPS, POLICY, PROMPTS, fetch_wheel, load_reward
from transformers import AutoModelForCausalLM, AutoTokenizer

OUT = DUMPS / "skyrl" / "dumped_data"

OLD_WHEEL = "skyrl-train==0.3.1"
NEW_WHEEL = "skyrl==0.4.0"
# Blanked in the temporary copy only: each pulls in dependencies the modules used don't need.
STUBBED = {
    OLD_WHEEL: ["skyrl_train/dataset/__init__.py"],
    NEW_WHEEL: [
        "skyrl/__init__.py",
        "skyrl/backends/__init__.py",
        "skyrl/train/dataset/__init__.py",
    ],
}
POLICY_MINI_BATCH_SIZE = 3  # prompts per mini-batch (trainer.policy_mini_batch_size)
PAD_SIZE = 2  # step 3 only


def rollouts(tokenizer) -> tuple[list[list[int]], list[list[int]], list[float], list[str]]:
    """Flat prompts, responses, rewards and uids in batch.json's order (group-consecutive)."""
    groups = json.loads(BATCH.read_text())
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    compute_score = load_reward()
    prompts, responses, rewards, uids = [], [], [], []
    for g, (group, row) in enumerate(zip(groups, rows[: len(groups)], strict=True)):
        user = row["messages"][-1]["content"]
        assert user in tokenizer.decode(group["ids"]), f"group {g} is not prompt {user!r}"
        for response in group["responses"]:
            text = tokenizer.decode(response, skip_special_tokens=False)
            prompts.append(list(group["ids"]))
            responses.append(list(response))
            rewards.append(compute_score("gridworld", text, row["ground_truth"]))
            uids.append(str(g))
    return prompts, responses, rewards, uids


def per_token(rewards: list[float], responses: list[list[int]]) -> list[list[float]]:
    """`postprocess_generator_output` (skyrl_train/trainer.py 0.3.1 L699): the response-level
    reward on the last response token, zeros before it."""
    out = []
    for reward, response in zip(rewards, responses, strict=True):
        row = [0.0] * len(response)
        row[-1] = float(reward)
        out.append(row)
    return out


@torch.no_grad()
def token_logprobs(model, prompts, responses) -> list[list[float]]:
    """log p(token) of every response token, one unpadded forward per row."""
    out = []
    for prompt, response in zip(prompts, responses, strict=True):
        ids = torch.tensor([prompt + response])
        logits = model(ids).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append(logp[len(prompt) - 1 :].tolist())
    return out


def place(rows: list[list[float]], width: int, right_aligned: bool) -> torch.Tensor:
    """Put per-response-token values in the (batch, max_response) layout, zeros elsewhere."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        if right_aligned:
            out[i, width - len(row) :] = torch.tensor(row)
        else:
            out[i, : len(row)] = torch.tensor(row)
    return out


def grpo(token_level_rewards, response_mask, index, epsilon=1e-6):
    """`compute_grpo_outcome_advantage` (skyrl_train/utils/ppo_utils.py 0.3.1 L1030;
    skyrl/backends/skyrl_train/utils/ppo_utils.py 0.4.0 L1344; grpo_norm_by_std=True). Its
    module imports ray, so the few lines are followed here. Returns (advantages, returns),
    the same tensor twice, as SkyRL does."""
    scores = token_level_rewards.sum(dim=-1)
    groups: dict[str, list] = {}
    for i in range(scores.shape[0]):
        groups.setdefault(index[i], []).append(scores[i])
    stats = {}
    for idx, members in groups.items():
        if len(members) == 1:
            stats[idx] = (torch.tensor(0.0), torch.tensor(1.0))
        else:
            stats[idx] = (torch.mean(torch.tensor(members)), torch.std(torch.tensor([members])))
    for i in range(scores.shape[0]):
        mean, std = stats[index[i]]
        scores[i] = (scores[i] - mean) / (std + epsilon)
    scores = scores.unsqueeze(-1) * response_mask
    return scores, scores


def advantages_and_metrics(batch, index) -> None:
    """`compute_advantages_and_returns` (non-step-wise branch; skyrl_train/trainer.py 0.3.1
    L721, skyrl/train/trainer.py 0.4.0 L1151): returns, advantages, then the metrics with the
    padding rows left out."""
    token_level_rewards = batch["rewards"]
    advantages, returns = grpo(token_level_rewards, batch["response_mask"], index)
    batch["returns"] = returns
    batch["advantages"] = advantages
    pad_size = batch.metadata.get("pad_size", 0)
    n = len(token_level_rewards)
    avg_rewards = token_level_rewards.sum(dim=-1)[: n - pad_size].mean().item()
    valid = torch.masked_select(
        batch["advantages"][: n - pad_size, ...], batch["response_mask"][: n - pad_size].bool()
    )
    batch.metadata.setdefault("metrics", {})
    batch.metadata["metrics"].update(
        {
            "avg_final_rewards": avg_rewards,
            "avg_response_length": batch.metadata["avg_response_length"],
            "avg_advantages": valid.mean().item(),
            "avg_advantages_abs": valid.abs().mean().item(),
        }
    )


def step2_skyrl_train_031(tokenizer, prompts, responses, rewards, uids, logprobs) -> Path:
    """skyrl_train/trainer.py (skyrl-train 0.3.1): train() L190-270 with
    convert_to_training_input L558, pad_batch L833 (dp size 1 -> pad_size 0),
    fwd_logprobs_values_reward L876 (GRPO: ref model, no critic), then
    compute_advantages_and_returns; `rewards` and metadata `uids` popped before dump_data."""
    from skyrl_train.dataset.preprocess import convert_prompts_responses_to_batch_tensors
    from skyrl_train.training_batch import TrainingInputBatch

    sequences, attention_mask, response_mask, rewards_t, loss_mask, rollout_logprobs = (
        convert_prompts_responses_to_batch_tensors(
            tokenizer, prompts, responses, per_token(rewards, responses),
            [[1] * len(r) for r in responses],  # single-turn: every response token trained
            None,  # generator.sampling_params.logprobs defaults to null in 0.3.1
        )
    )  # fmt: skip
    batch = TrainingInputBatch(
        {
            "sequences": sequences,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "rewards": rewards_t,
            "loss_mask": loss_mask,
            "rollout_logprobs": rollout_logprobs,
            "is_last_step": None,  # step_wise_trajectories off
        }
    )
    batch.metadata = {"uids": uids}
    batch.metadata["response_length"] = response_mask.shape[1]
    batch.metadata["avg_response_length"] = sum(len(r) for r in responses) / len(responses)
    batch.metadata["pad_size"] = 0  # pad_batch with a dp size that divides 24

    width = response_mask.shape[1]
    action = place(logprobs, width, right_aligned=False)
    batch["base_action_log_probs"] = action.clone()  # ref model (use_kl_loss defaults to true)
    batch["action_log_probs"] = action
    batch["values"] = None  # no critic for GRPO

    advantages_and_metrics(batch, uids)
    batch.pop("rewards")
    batch.metadata.pop("uids")
    path = OUT / "global_step_2_training_input.pkl"
    batch.save(path)
    return path


def step3_skyrl_040(tokenizer, prompts, responses, rewards, uids, logprobs) -> Path:
    """skyrl/train/trainer.py (skyrl 0.4.0): train() L380-437 with convert_to_training_input
    L865 (pad_training_input_batch at L1004), fwd_logprobs_values_reward, then
    compute_advantages_and_returns; `rewards`, metadata `uids` and `is_last_step` popped
    before dump_data."""
    from skyrl.backends.skyrl_train.training_batch import (
        TrainingInputBatch,
        pad_training_input_batch,
    )
    from skyrl.train.dataset.preprocess import (
        compute_prompt_boundaries,
        compute_prompt_mini_batch_boundaries,
        convert_prompts_responses_to_batch_tensors,
    )

    # generator.sampling_params.logprobs defaults to 1 in 0.4.0, so rollout_logprobs is set.
    (sequences, attention_mask, response_mask, rewards_t, loss_mask, rollout_logprobs,
     rollout_expert_indices, rollout_sample_support) = convert_prompts_responses_to_batch_tensors(
        tokenizer.pad_token_id, prompts, responses, per_token(rewards, responses),
        [[1] * len(r) for r in responses], logprobs, None, None,
    )  # fmt: skip
    batch = TrainingInputBatch(
        {
            "sequences": sequences,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "rewards": rewards_t,
            "loss_mask": loss_mask,
            "rollout_logprobs": rollout_logprobs,
            "rollout_expert_indices": rollout_expert_indices,
            "router_padding_mask": None,
            "rollout_sample_support": rollout_sample_support,
            "pixel_values": None,
            "image_grid_thw": None,
        }
    )
    batch.metadata = {"uids": uids}
    n_prompts = len(set(uids))
    batch.metadata["policy_mini_batch_boundaries"] = compute_prompt_mini_batch_boundaries(
        uids, POLICY_MINI_BATCH_SIZE, n_prompts, False, len(uids) // n_prompts
    )
    batch.metadata["policy_prompt_boundaries"] = compute_prompt_boundaries(uids)
    batch.metadata["response_length"] = response_mask.shape[1]
    batch.metadata["avg_response_length"] = sum(len(r) for r in responses) / len(responses)
    batch = pad_training_input_batch(batch, PAD_SIZE)

    width = response_mask.shape[1]
    action = place(logprobs, width, right_aligned=True)
    action = torch.cat([action, action[[0] * PAD_SIZE]])  # the forward also sees the pad rows
    batch["base_action_log_probs"] = action.clone()
    batch["action_log_probs"] = action
    batch["values"] = None

    advantages_and_metrics(batch, batch.metadata["uids"])
    batch.pop("rewards")
    batch.metadata.pop("uids")
    batch.metadata.pop("is_last_step", None)
    path = OUT / "global_step_3_training_input.pkl"
    batch.save(path)
    return path


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    if tokenizer.pad_token is None:  # as SkyRL's get_tokenizer does
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(POLICY).eval()
    prompts, responses, rewards, uids = rollouts(tokenizer)
    logprobs = token_logprobs(model, prompts, responses)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for wheel in (OLD_WHEEL, NEW_WHEEL):
            fetch_wheel(wheel, Path(tmp) / wheel, STUBBED[wheel], python_version="3.12")
        for write in (step2_skyrl_train_031, step3_skyrl_040):
            print("wrote", write(tokenizer, prompts, responses, rewards, uids, logprobs))


if __name__ == "__main__":
    main()
