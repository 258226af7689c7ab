"""Write RAGEN's evaluation trajectories for tests/fixtures/trainer-dumps/ragen/ with RAGEN's
own `_save_as_jsonl`.

`python -m ragen.llm_agent.agent_proxy` with `output.format=jsonl` saves its validation
rollouts (`LLMAgentProxy.rollout(..., val=True)`, a veRL `DataProto`) to
`{output.dir}/val_rollouts_{timestamp}.jsonl` with `ragen/llm_agent/agent_proxy.py`
`_save_as_jsonl` (mll-lab-nu/RAGEN 20daedc). This script builds that DataProto the way RAGEN
has it at that point and calls `_save_as_jsonl` on it:

- each trajectory's `history` is built with RAGEN's own `EnvStateManager._update_cache_history`
  (`ragen/llm_agent/es_manager.py`), as `reset()` and `step()` call it: the first state, then per
  turn the turn's `actions`, `reward`, `info`, `llm_response`, `llm_raw_response` added to the
  current entry and the next state appended. So a state's entry holds the reward of the action
  taken from it, and `_save_as_jsonl` writes " (reward: r)" after every state but the first,
  when r is not 0;
- `non_tensor_batch` as `ContextManager.formulate_rollouts` makes it in val mode: `env_ids`,
  `group_ids`, and `history` and `metrics` as numpy object arrays; `batch` a TensorDict with
  `rm_scores` (the trajectory's reward on its last position, `use_turn_scores=false`; only its
  sum is read). RAGEN reads it as `float(np.sum(item.batch["rm_scores"]))`, which raises
  TypeError on a torch tensor (numpy passes `axis=`/`out=` to `Tensor.sum`; seen with torch
  2.13, numpy 2.4.6) and is caught, so every line's `metadata.total_reward` is 0.0.

The batch is tests/fixtures/trainer-dumps/batch.json (6 prompts x 4 responses sampled from
examples/demo-run/global_step_100), with the first 6 rows of examples/prompts/gridworld.jsonl
and the gridworld reward (examples/rewards/gridworld.py), laid out as
scripts/make_trainer_dumps.py's `write_ragen` did: two trajectories (environments) per prompt
(group), two turns each: responses 2j and 2j+1 of the group; the first state is the prompt's
user message, the second the next prompt's, the last the prompt's again. The responses are
decoded without special tokens (RAGEN's text has no stop token). `metrics`:
`GridWorld/success` (the second turn rewarded) and `GridWorld/num_actions` (2).

Neither RAGEN nor veRL is kept in this repository. RAGEN is not on PyPI: its `ragen/` folder is
extracted with `git archive` from a RAGEN clone (`--ragen-repo`, a bare repository is fine;
default the snapshot /work/.mirror/mll-lab-nu+RAGEN/repo) at commit 20daedc into a temporary
folder. veRL's `DataProto` is `verl==0.9.1` (RAGEN pins veRL as a git submodule, d62da49),
fetched with `pip download --no-deps` and unzipped there. Stubbed, because the modules imported
import them but the code run never touches them (placeholder modules from a meta-path finder,
see `stub_modules`): `ray`, `omegaconf`, `hydra`, `vllm`, `wandb`, `datasets`, `PIL`,
`pandas`, `matplotlib`, `gym`, `gymnasium`, `gym_sokoban`, `openai`, `anthropic`, `together`.

Run it with the venv of scripts/make_skyrl_batches.py plus tensordict (veRL's DataProto):

    /tmp/skyrl-venv/bin/pip install tensordict==0.15.3
    /tmp/skyrl-venv/bin/python scripts/make_ragen_trajectories.py [--out DIR]

`--out` defaults to tests/fixtures/trainer-dumps/ragen (the file is replaced).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from trainer_sources import (
    BATCH,
    DUMPS,
    POLICY,
    PROMPTS,
    fetch_wheel,
    git_archive,
    load_reward,
    stub_modules,
)
from transformers import AutoTokenizer

OUT = DUMPS / "ragen"

RAGEN_REPO = Path("/work/.mirror/mll-lab-nu+RAGEN/repo")
RAGEN_COMMIT = "20daedc47558e000f7de912b060646bf2e8026bd"
VERL_WHEEL = "verl==0.9.1"
STUBBED = [
    "ray", "omegaconf", "hydra", "vllm", "wandb", "datasets", "PIL", "pandas", "matplotlib",
    "gym", "gymnasium", "gym_sokoban", "openai", "anthropic", "together",
]  # fmt: skip
TIMESTAMP = "20261125_101500"  # time.strftime("%Y%m%d_%H%M%S") in agent_proxy.main
TAG = "GridWorld"
ENVS_PER_GROUP = 2
MAX_ACTIONS = 4  # custom_envs.GridWorld.max_actions_per_traj
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)


def trajectories(tokenizer) -> list[dict]:
    """Per environment: its group, its states and its two turns (text, reward)."""
    groups = json.loads(BATCH.read_text())
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    rows = rows[: len(groups)]
    compute_score = load_reward()
    out = []
    for g, (group, row) in enumerate(zip(groups, rows, strict=True)):
        state = row["messages"][-1]["content"]
        assert state in tokenizer.decode(group["ids"]), f"group {g} is not prompt {state!r}"
        after = rows[(g + 1) % len(rows)]["messages"][-1]["content"]
        for j in range(ENVS_PER_GROUP):
            turns = []
            for response in group["responses"][2 * j : 2 * j + 2]:
                kept = tokenizer.decode(response, skip_special_tokens=False)
                turns.append({
                    "text": tokenizer.decode(response, skip_special_tokens=True),
                    "reward": compute_score("gridworld", kept, row["ground_truth"]),
                })  # fmt: skip
            out.append({
                "env_id": ENVS_PER_GROUP * g + j,
                "group_id": g,
                "states": [state, after, state],
                "turns": turns,
            })  # fmt: skip
    return out


def history_of(trajectory: dict) -> list[dict]:
    """The rollout cache's history, built by `EnvStateManager._update_cache_history` as
    `reset()` (first state) and `step()` (each turn) call it."""
    from ragen.llm_agent.es_manager import EnvStateManager

    update = EnvStateManager._update_cache_history  # uses no instance state
    states = trajectory["states"]
    history = update(None, [], next_state=states[0], actions_left=MAX_ACTIONS)
    for n, (turn, state) in enumerate(zip(trajectory["turns"], states[1:], strict=True)):
        answer = ANSWER.search(turn["text"])
        actions = [answer.group(1)] if answer else []
        history = update(
            None, history, next_state=state, actions_left=MAX_ACTIONS - n - 1,
            num_actions_info={
                "actions": actions, "reward": turn["reward"], "info": {},
                "llm_response": turn["text"], "llm_raw_response": turn["text"],
            },
        )  # fmt: skip
    return history


def rollouts(trajectories: list[dict]):
    """The DataProto `LLMAgentProxy.rollout(..., val=True)` returns (the fields the JSONL
    writer reads)."""
    import numpy as np
    import torch
    from verl import DataProto

    width = max(len(t["turns"]) for t in trajectories)
    rm_scores = torch.zeros(len(trajectories), width)
    for i, t in enumerate(trajectories):
        rm_scores[i, -1] = sum(turn["reward"] for turn in t["turns"])
    metrics = [
        {f"{TAG}/success": float(t["turns"][-1]["reward"] > 0), f"{TAG}/num_actions": 2}
        for t in trajectories
    ]
    return DataProto.from_dict(
        tensors={"rm_scores": rm_scores},
        non_tensors={
            "env_ids": np.array([t["env_id"] for t in trajectories], dtype=int),
            "group_ids": np.array([t["group_id"] for t in trajectories], dtype=int),
            "history": np.array([history_of(t) for t in trajectories], dtype=object),
            "metrics": np.array(metrics, dtype=object),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--ragen-repo", type=Path, default=RAGEN_REPO)
    args = parser.parse_args()
    stub_modules(STUBBED)
    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    with tempfile.TemporaryDirectory() as tmp:
        git_archive(args.ragen_repo, RAGEN_COMMIT, "ragen", Path(tmp) / "ragen-src")
        sys.path.insert(0, str(Path(tmp) / "ragen-src"))
        fetch_wheel(VERL_WHEEL, Path(tmp) / "verl")
        from ragen.llm_agent.agent_proxy import _save_as_jsonl

        args.out.mkdir(parents=True, exist_ok=True)
        save_path = str(args.out / f"val_rollouts_{TIMESTAMP}.pkl")
        jsonl_path = save_path.replace(".pkl", ".jsonl")  # as agent_proxy.main does
        _save_as_jsonl(rollouts(trajectories(tokenizer)), jsonl_path)
        print("wrote", jsonl_path)


if __name__ == "__main__":
    main()
