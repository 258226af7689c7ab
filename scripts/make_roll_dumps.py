"""Write ROLL's rollout dumps for tests/fixtures/trainer-dumps/roll/ and roll-agentic/ with
ROLL's own writers (alibaba/ROLL, `rollout_dump_dir` an absolute path):

- roll/rollout_dump_data.step_7.jsonl: the RLVR pipeline's, by
  `roll.pipeline.rlvr.utils.dump_rollout_to_specific_path(path, global_step, batch, tokenizer)`
  (and its `write_to_json_process`), called as rlvr_pipeline.py calls it right after the
  generate schedulers return. The batch is a `DataProto` (roll/distributed/scheduler/protocol.py)
  of 24 rows, a prompt's 4 responses consecutive: `prompts` (left-padded), `responses`
  (right-padded with the pad token, the stop token kept when the response stopped),
  `input_ids`, `attention_mask`, `scores` (float16, as ROLL's rule reward workers make them);
  the dataset columns in `non_tensor_batch` (id, source, prompt, messages as JSON text,
  ground_truth, tag, domain); meta_info the generation config. ROLL decodes the responses
  itself (special tokens skipped) and keeps only its COLUMMNS_CONFIG columns.
- roll-agentic/rollout_dump_data.step_7.jsonl: the agentic pipeline's, by
  `roll.pipeline.agentic.utils.dump_rollout_trajectories(path, global_step, batch)`, called as
  agentic_pipeline.py calls it after `get_batch`. The batch is built as
  `AgentNativeStepEnvManager.formulate_rollouts`
  (roll/pipeline/agentic/env_manager/agent_native_env_manager.py) builds it: a row per step
  (2 steps per trajectory, 2 trajectories per prompt) whose trajectory_data / messages / tools
  are None but on the trajectory's last step (JSON text there), `COLUMMNS_CONFIG` in meta_info,
  the trajectories joined with `DataProto.concat`. ROLL's `remove_nan_items` drops the None rows.

The content is scripts/make_trainer_dumps.py's (`write_roll`, `write_roll_agentic`): the batch
tests/fixtures/trainer-dumps/batch.json (6 prompts x 4 responses sampled from
examples/demo-run/global_step_100), the first 6 rows of examples/prompts/gridworld.jsonl, the
gridworld reward of each response decoded with special tokens kept.

ROLL's code is never kept in this repository: its `roll/` package is extracted with
`git archive` from a ROLL git repository (--roll-repo, else $ROLL_REPO, else the mirror below)
into a temporary folder and imported from there. Only third-party modules that are missing and
heavy are stubbed in sys.modules before the import (`ray`, `transfer_queue`: imported at module
level by roll/distributed/scheduler/protocol.py and transfer_backend.py, never called on the
paths used here); everything else ROLL imports is real. ROLL writes in a
`multiprocessing.Process`: the script uses the "fork" start method (Linux's default before
Python 3.14, as ROLL runs) and joins the writer before going on. ROLL's logger writes to
$ROLL_LOG_DIR, set to the temporary folder.

Run it with a separate venv (ROLL's modules need tensordict, codetiming, omegaconf, imageio,
requests, which the project's .venv does not carry):

    python3 -m venv /tmp/roll-venv
    /tmp/roll-venv/bin/pip install torch==2.13.0 transformers==5.24.0 tensordict \\
        "numpy<2" codetiming requests omegaconf imageio
    /tmp/roll-venv/bin/python scripts/make_roll_dumps.py [--out DIR] [--roll-repo REPO]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from trainer_sources import BATCH, DUMPS, POLICY, PROMPTS, git_archive, load_reward
from transformers import AutoTokenizer

compute_score = load_reward()
OUT = DUMPS
ROLL_MIRROR = "/work/.mirror/alibaba+ROLL/repo"
STUBBED = ("ray", "transfer_queue")  # missing and heavy; only imported, never called here
STEP, K = 7, 4
FILE = f"rollout_dump_data.step_{STEP}.jsonl"


def stub_missing(names: tuple[str, ...]) -> list[str]:
    """Put a do-nothing module in sys.modules for each name that does not import."""
    stubbed = []
    for name in names:
        if importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name)
        module.__getattr__ = lambda attr, _n=name: stub_attribute(_n, attr)
        sys.modules[name] = module
        stubbed.append(name)
    return stubbed


def stub_attribute(module: str, attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return mock.MagicMock(name=f"{module}.{attr}")


def join_writers(path: Path) -> None:
    """ROLL starts its writer in a multiprocessing.Process and returns: wait for it."""
    for child in multiprocessing.active_children():
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"ROLL's writer exited with {child.exitcode}")
    if not (path / FILE).is_file():
        raise SystemExit(f"ROLL wrote no {path / FILE}")


def load_groups(tokenizer) -> list[dict]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    groups = []
    for row, sampled in zip(rows, json.loads(BATCH.read_text()), strict=False):
        responses = []
        for ids in sampled["responses"]:
            kept = tokenizer.decode(ids, skip_special_tokens=False)
            responses.append(
                {"ids": ids, "reward": compute_score("grid", kept, row["ground_truth"])}
            )
        groups.append({"messages": row["messages"], "ground_truth": row["ground_truth"],
                       "ids": sampled["ids"], "responses": responses})  # fmt: skip
    return groups


def padded(rows: list[list[int]], pad: int, left: bool = False) -> torch.Tensor:
    width = max(len(r) for r in rows)
    fill = [[pad] * (width - len(r)) for r in rows]
    return torch.tensor([f + r if left else r + f for r, f in zip(rows, fill, strict=True)])


def rlvr_batch(groups: list[dict], tokenizer, DataProto):
    """The generate schedulers' output as the RLVR pipeline has it at the dump."""
    rows = [(g, group, r) for g, group in enumerate(groups) for r in group["responses"]]
    pad = tokenizer.pad_token_id
    prompts = padded([group["ids"] for _, group, _ in rows], pad, left=True)
    responses = padded([r["ids"] for _, _, r in rows], pad)
    input_ids = torch.cat([prompts, responses], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": (input_ids != pad).long(),
        "scores": torch.tensor([r["reward"] for _, _, r in rows], dtype=torch.float16),
    }
    non_tensors = {
        "id": [f"grid-{g}" for g, _, _ in rows],
        "source": ["gridworld"] * len(rows),
        "prompt": [group["messages"][-1]["content"] for _, group, _ in rows],
        "messages": [json.dumps(group["messages"], ensure_ascii=False) for _, group, _ in rows],
        "ground_truth": [group["ground_truth"] for _, group, _ in rows],
        "tag": ["gridworld"] * len(rows),
        "domain": ["math_rule"] * len(rows),
    }
    meta_info = {"generation_config": {"temperature": 1.0, "num_return_sequences": K}}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)


def trajectory(groups, g, j, tokenizer, DataProto, TensorDict, pad_to_length):
    """One trajectory's rows, as AgentNativeStepEnvManager.formulate_rollouts makes them."""
    group = groups[g]
    first, second = group["responses"][2 * j], group["responses"][2 * j + 1]
    said = [tokenizer.decode(r["ids"], skip_special_tokens=True) for r in (first, second)]
    after = {"role": "user", "content": groups[(g + 1) % len(groups)]["messages"][-1]["content"]}
    context = [*group["messages"], {"role": "assistant", "content": said[0]}, after]
    second_prompt = tokenizer.apply_chat_template(
        context, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    history = [(group["ids"], first), (list(second_prompt), second)]
    steps = [first["reward"], second["reward"]]
    length = 256  # pipeline_config.sequence_length
    pad = tokenizer.pad_token_id
    samples = []
    for step, (prompt_ids, response) in enumerate(history):
        token_ids = prompt_ids + response["ids"]
        masks = [0] * len(prompt_ids) + [1] * len(response["ids"])
        input_ids = torch.tensor(token_ids, dtype=torch.long).unsqueeze(0)
        attention_mask = torch.ones_like(input_ids)
        position_ids = attention_mask.cumsum(dim=-1) - 1
        response_mask = torch.tensor(masks, dtype=torch.bool).unsqueeze(0)
        prompt_mask = ~response_mask
        scores = torch.zeros(1, len(token_ids), dtype=torch.float)
        scores[0][-1] = response["reward"]
        tensors = {
            "input_ids": pad_to_length(input_ids, length=length, pad_value=pad),
            "attention_mask": pad_to_length(attention_mask, length=length, pad_value=0),
            "position_ids": pad_to_length(position_ids, length=length, pad_value=0),
            "response_mask": pad_to_length(response_mask, length=length, pad_value=0),
            "prompt_mask": pad_to_length(prompt_mask, length=length, pad_value=0),
            "scores": pad_to_length(scores, length=length, pad_value=0),
        }
        samples.append(DataProto(
            batch=TensorDict(tensors, batch_size=1),
            non_tensor_batch={
                "env_ids": np.array([2 * g + j], dtype=object),
                "group_ids": np.array([g], dtype=object),
                "tags": np.array(["grid"], dtype=object),
                "step_scores": np.array([response["reward"]], dtype=object),
                "episode_scores": np.array([sum(steps)], dtype=object),
                "state_hash": np.array([f"{g}-{j}-{step}"], dtype=object),
                "step": np.array([step], dtype=object),
                "trajectory_data": np.array([None], dtype=object),
                "messages": np.array([None], dtype=object),
                "tools": np.array([None], dtype=object),
                "exp_name": np.array(["grid"], dtype=object),
            },
        ))  # fmt: skip
    conversation = [*context, {"role": "assistant", "content": said[1]}]
    batch = DataProto.concat(samples)
    batch.meta_info = {"metrics": {}}
    trajectory_data = {
        "trajectory_id": f"grid_0_1_{g}_{j}_0_7", "current_step": 7,
        "env_info": {"env_id": 2 * g + j, "group_id": g, "tag": "grid", "seed": g},
        "length_info": {"trajectory_length": 2, "num_actions": 2},
        "reward_info": {"episode_reward": sum(steps), "step_rewards": steps,
                        "first_round_reward": steps[0], "final_reward": steps[-1]},
        "failure_info": {"stop_reason": "MAX_STEPS"}, "metrics": {},
    }  # fmt: skip
    batch.non_tensor_batch["trajectory_data"][-1] = json.dumps(trajectory_data)
    batch.non_tensor_batch["messages"][-1] = json.dumps([conversation])
    batch.non_tensor_batch["tools"][-1] = json.dumps([])
    batch.meta_info["COLUMMNS_CONFIG"] = [
        ["trajectory_data", "string"],
        ["messages", "string"],
        ["tools", "string"],
        ["exp_name", "string"],
    ]
    traj_group_id = f"grid_{g}_0_{g}"
    batch.non_tensor_batch["traj_group_id"] = np.array([traj_group_id] * 2, dtype=object)
    batch.non_tensor_batch["traj_id"] = np.array([f"{traj_group_id}_{2 * g + j}"] * 2, dtype=object)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roll-repo", default=os.environ.get("ROLL_REPO", ROLL_MIRROR))
    parser.add_argument("--out", type=Path, default=OUT, help="writes OUT/roll, OUT/roll-agentic")
    args = parser.parse_args()
    multiprocessing.set_start_method("fork")
    with tempfile.TemporaryDirectory(prefix="roll-src-") as tmp:
        commit = git_archive(args.roll_repo, "HEAD", "roll", Path(tmp))
        os.environ["ROLL_LOG_DIR"] = str(Path(tmp) / "logs")
        stubbed = stub_missing(STUBBED)
        sys.path.insert(0, tmp)
        from roll.distributed.scheduler.protocol import DataProto
        from roll.pipeline.agentic.utils import dump_rollout_trajectories
        from roll.pipeline.rlvr.utils import dump_rollout_to_specific_path
        from roll.utils.functionals import pad_to_length
        from tensordict import TensorDict

        tokenizer = AutoTokenizer.from_pretrained(POLICY)
        groups = load_groups(tokenizer)

        rlvr = (args.out / "roll").resolve()
        shutil.rmtree(rlvr, ignore_errors=True)
        batch = rlvr_batch(groups, tokenizer, DataProto)
        dump_rollout_to_specific_path(str(rlvr), STEP, batch, tokenizer)
        join_writers(rlvr)

        agentic = (args.out / "roll-agentic").resolve()
        shutil.rmtree(agentic, ignore_errors=True)
        made = [
            trajectory(groups, g, j, tokenizer, DataProto, TensorDict, pad_to_length)
            for g in range(len(groups))
            for j in range(2)
        ]
        batch = DataProto.concat(made)  # the rollout scheduler's get_batch
        uuids = [f"{traj_id}_{i}" for i, traj_id in enumerate(batch.non_tensor_batch["traj_id"])]
        batch.non_tensor_batch["sample_uuid"] = np.array(uuids, dtype=object)
        dump_rollout_trajectories(str(agentic), STEP, batch)
        join_writers(agentic)
    print(f"wrote {rlvr / FILE} and {agentic / FILE} with ROLL {commit} (stubbed: {stubbed})")


if __name__ == "__main__":
    main()
