"""Record what RAGEN's own managers and environments do, for tests/fixtures/ragen/: the
prompts RAGEN renders, the replies as it parses them, the action ids it executes, the render after
each action, the rewards, penalties and success, for scripted replies.

RAGEN (mll-lab-nu/RAGEN, commit 20daedc) is not on any package registry, so CI cannot run it;
`tests/test_ragen_env.py` checks collapsecheck's RAGEN adapter against these records, and against
the live classes where RAGEN's source is present. This script runs RAGEN's own code:

- the config: RAGEN's `config/` composed by Hydra (`hydra.compose`, as `agent_proxy.py`'s main
  composes it) with each case's overrides, veRL's `ppo_trainer.yaml` from the `verl==0.9.1` wheel
  on Hydra's search path (RAGEN's experiment configs name `pkg://verl.trainer.config`), and saved
  as a Hydra run saves it (`OmegaConf.save`, unresolved) to CASE/.hydra/config.yaml;
- `EnvStateManager(config, mode="val")` (`ragen/llm_agent/es_manager.py`): its own environments,
  seeds, `reset`, `step` (lookup, budget, penalty) and `get_rollout_states` (success);
- `ContextManager(config, tokenizer, mode="val")` (`ragen/llm_agent/ctx_manager.py`): the prompt
  text of every turn (`get_lm_inputs(..., prepare_for_update=False)`, the texts it tokenizes) and
  `get_env_inputs` (the `<think>` prefix and `_parse_response`);
- the tokenizer: examples/demo-run/global_step_100's (its own chat template).

`ragen/__init__.py` (veRL's OmegaConf patch) is not run: `ragen` is registered bare, as
collapsecheck's loader does. Stubbed, because the modules imported import them but the code run
never touches them: verl, ray, vllm, wandb, datasets, matplotlib, kimina_client, rllm, tensordict.
Real: gym 0.26.2, gym_sokoban 0.0.6 (with pillow for its sprites), gymnasium (>= 1.2.1), numpy
1.26.4, omegaconf, hydra-core, torch, transformers. Run it in a venv of its own:

    python3 -m venv /tmp/ragen-venv
    /tmp/ragen-venv/bin/pip install torch==2.13.0 numpy==1.26.4 gym==0.26.2 gym_sokoban==0.0.6 \
        'gymnasium>=1.2.1' omegaconf hydra-core 'setuptools<70' imageio pillow pyyaml transformers
    /tmp/ragen-venv/bin/python scripts/make_ragen_record.py [--ragen-repo DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer_sources import POLICY, ROOT, fetch_wheel, git_archive, stub_modules

RAGEN_REPO = Path("/work/.mirror/mll-lab-nu+RAGEN/repo")
RAGEN_COMMIT = "20daedc47558e000f7de912b060646bf2e8026bd"
VERL_WHEEL = "verl==0.9.1"
OUT = ROOT / "tests" / "fixtures" / "ragen"
STUBBED = ["verl", "ray", "vllm", "wandb", "datasets", "matplotlib", "kimina_client",
           "rllm", "tensordict"]  # fmt: skip
ANSWER_NAMES = re.compile(r"named (\S+) and (\S+)\n")

Reply = Callable[[str, int, int], str]  # (the state seen, the turn, the episode) -> the reply


def sokoban_reply(state: str, turn: int, episode: int) -> str:
    """Every rule of the manager on one board: a cap, a bad name, no answer, mixed case."""
    return [
        " Go left, then up.</think> <answer>Left || Up || Down</answer>",
        "hmm</think><answer>Jump</answer>",
        "x</think><answer>down||LEFT</answer> trailing",
        "no answer at all",
        "</think>\n<answer>Right || Teleport</answer>",
    ][(turn + episode) % 5]


def frozen_lake_reply(state: str, turn: int, episode: int) -> str:
    moves = ["Down || Right", "Right", "down", "Up || Left", "Right || Down"]
    return f"I should go on.</think><answer>{moves[(turn + 2 * episode) % 5]}</answer>"


def bandit_reply(state: str, turn: int, episode: int) -> str:
    """The arm the render names first (or second), in another case; one reply names none."""
    names = ANSWER_NAMES.search(state)
    if episode % 4 == 3 or names is None:
        return "Both look alike.</think><answer>the third arm</answer>"
    name = names.group(1 + episode % 2)
    return f"{name} sounds safer.</think><answer> {name.upper() if episode % 3 else name} </answer>"


def game_2048_reply(state: str, turn: int, episode: int) -> str:
    return f"Merge.</think><answer>{['Up', 'Left', 'Down', 'right'][(turn + episode) % 4]}</answer>"


def rubiks_reply(state: str, turn: int, episode: int) -> str:
    moves = ["U' || D", "R", "F' || B || L", "D'", "U"]
    return f"Turn it.</think><answer>{moves[(turn + episode) % 5]}</answer>"


# each case: the config it composes (an experiment config and Hydra overrides), its replies
CASES: dict[str, tuple[str, list[str], Reply]] = {
    "sokoban": (
        "_2_sokoban",
        [
            "es_manager.val.env_groups=3",
            "es_manager.val.group_size=2",
            "es_manager.val.env_configs.tags=[CoordSokoban,SimpleSokoban]",
            "es_manager.val.env_configs.n_groups=[2,1]",
            "agent_proxy.max_turn=5",
            "custom_envs.CoordSokoban.max_actions_per_traj=6",
        ],
        sokoban_reply,
    ),
    "frozen_lake": (
        "_3_frozen_lake",
        [
            "es_manager.val.env_groups=2",
            "es_manager.val.env_configs.n_groups=[2]",
            "custom_envs.CoordFrozenLake.env_config.success_rate=0.8",
            "agent_proxy.max_turn=4",
        ],
        frozen_lake_reply,
    ),
    "bandit": (
        "_1_bandit",
        [
            "es_manager.val.env_groups=4",
            "es_manager.val.env_configs.n_groups=[2,2]",
            "es_manager.val.group_size=2",
            "es_manager.train.env_groups=2",
            "es_manager.train.env_configs.n_groups=[2]",
            "es_manager.train.group_size=3",
        ],
        bandit_reply,
    ),
    "game_2048": (
        "_9_2048",
        [
            "es_manager.val.env_groups=2",
            "es_manager.val.env_configs.n_groups=[2]",
            "agent_proxy.max_turn=4",
        ],
        game_2048_reply,
    ),
    "rubikscube": (
        "_10_rubikscube",
        [
            "es_manager.val.env_groups=2",
            "es_manager.val.env_configs.n_groups=[2]",
            "agent_proxy.max_turn=4",
        ],
        rubiks_reply,
    ),
}


def plain(value: Any) -> Any:
    """A value as JSON keeps it (numpy's numbers as Python's; arrays left out)."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return None


PROMPT_KEYS = ("observation_format", "grid_vocab", "action_lookup", "env_instruction")


def prompt_keys(defaults: Any) -> dict[str, Any]:
    """The keys of a config class's defaults that `_init_prefix_lookup` reads, as JSON keeps
    them (mappings' keys as text, their order kept)."""
    seen = dataclasses.asdict(defaults)
    return {
        key: {str(k): v for k, v in seen[key].items()} if isinstance(seen[key], dict) else seen[key]
        for key in PROMPT_KEYS
        if key in seen
    }


def composed(config_dir: Path, verl_config: Path, name: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(
            config_name=name, overrides=[*overrides, f"hydra.searchpath=[file://{verl_config}]"]
        )


def watch_steps(es: Any) -> dict[int, list[dict[str, Any]]]:
    """Every environment's steps as they run: the action id, its reward, done, the info's plain
    values and the render after it (es_manager keeps only the turn's last render)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for entry in es.envs:
        env, env_id = entry["env"], entry["env_id"]
        steps[env_id] = []

        def step(action, env=env, original=env.step, into=steps[env_id]):
            obs, reward, done, info = original(action)
            kept = {k: plain(v) for k, v in info.items() if plain(v) is not None}
            into.append({
                "action": plain(action), "reward": plain(reward),
                "reward_type": type(reward).__name__, "done": bool(done), "info": kept,
                "render": env.render(),
            })  # fmt: skip
            return obs, reward, done, info

        env.step = step
    return steps


def lookup_of(env: Any) -> dict[str, str] | None:
    """The environment's `config.action_lookup` after its reset (Bandit sets it there)."""
    lookup = getattr(env.config, "action_lookup", None)
    return {str(k): v for k, v in lookup.items()} if lookup else None


def record_case(config: Any, tokenizer: Any, reply: Reply) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from ragen.env import REGISTERED_ENV_CONFIGS
    from ragen.llm_agent.ctx_manager import ContextManager
    from ragen.llm_agent.es_manager import EnvStateManager

    EnvStateManager(config, mode="train")  # built first, as LLMAgentProxy builds them
    es = EnvStateManager(config, mode="val")
    cm = ContextManager(config, tokenizer, mode="val")
    texts: list[str] = []

    own = cm._tokenize_and_build_tensors

    def tokenized(batch: list[str]) -> Any:
        texts.extend(batch)  # what RAGEN tokenizes: the whole prompt text of each episode
        return own(batch)

    cm._tokenize_and_build_tensors = tokenized
    steps = watch_steps(es)
    outputs = es.reset()
    episodes = {
        entry["env_id"]: {
            "env_id": entry["env_id"], "tag": entry["tag"], "group_id": entry["group_id"],
            "seed": entry["status"].seed, "reset_render": entry["env"].render(),
            "action_lookup": lookup_of(entry["env"]),
            "turns": [],
        }
        for entry in es.envs
    }  # fmt: skip
    for turn in range(config.agent_proxy.max_turn):
        if not outputs:
            break
        texts.clear()
        cm.get_lm_inputs(outputs, prepare_for_update=False)
        ids = [o["env_id"] for o in outputs]
        replies = [
            reply(o["history"][-1]["state"], turn, i) for i, o in zip(ids, outputs, strict=True)
        ]
        lm_outputs = types.SimpleNamespace(
            batch=None, non_tensor_batch={"response_texts": replies, "env_ids": ids}
        )
        inputs = cm.get_env_inputs(lm_outputs)
        before = {i: len(steps[i]) for i in ids}
        penalties = {i: es.rollout_cache[i]["penalty"] for i in ids}
        outputs = es.step(inputs)
        for i, text, given, parsed in zip(ids, texts, replies, inputs, strict=True):
            history = es.rollout_cache[i]["history"]
            episodes[i]["turns"].append({
                "prompt_text": text, "reply": given, "llm_response": parsed["llm_response"],
                "actions": parsed["actions"], "steps": steps[i][before[i]:],
                "reward": plain(history[-2]["reward"]),
                "penalty": round(es.rollout_cache[i]["penalty"] - penalties[i], 12),
                "state_after": history[-1]["state"],
            })  # fmt: skip
    for state in es.get_rollout_states():
        tag = episodes[state["env_id"]]["tag"]
        episodes[state["env_id"]]["success"] = bool(state["metrics"][f"{tag}/success"])
    tags = list(config.es_manager.val.env_configs.tags)
    return {
        "ragen_commit": RAGEN_COMMIT,
        "tags": tags,
        # the config class's defaults RAGEN's system message reads (dataclasses.asdict)
        "config_class_defaults": {
            tag: prompt_keys(REGISTERED_ENV_CONFIGS[config.custom_envs[tag].env_type]())
            for tag in tags
        },
        "val_temperature": OmegaConf.select(
            config, "actor_rollout_ref.rollout.val_kwargs.temperature"
        ),
        "episodes": list(episodes.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--ragen-repo", type=Path, default=RAGEN_REPO)
    args = parser.parse_args()
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    stub_modules(STUBBED)
    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "ragen-src"
        git_archive(args.ragen_repo, RAGEN_COMMIT, "ragen", source)
        git_archive(args.ragen_repo, RAGEN_COMMIT, "config", source)
        site = fetch_wheel(VERL_WHEEL, Path(tmp) / "verl")
        sys.path.remove(str(site))  # its config files only: verl itself stays stubbed
        sys.path.insert(0, str(source))
        bare = types.ModuleType("ragen")
        bare.__path__ = [str(source / "ragen")]
        sys.modules["ragen"] = bare
        for case, (name, overrides, reply) in CASES.items():
            config = composed(source / "config", site / "verl" / "trainer" / "config", name,
                              overrides)  # fmt: skip
            folder = args.out / case
            shutil.rmtree(folder, ignore_errors=True)
            (folder / ".hydra").mkdir(parents=True)
            OmegaConf.save(config, folder / ".hydra" / "config.yaml", resolve=False)
            record = record_case(config, tokenizer, reply)
            (folder / "record.json").write_text(
                json.dumps(record, indent=1, ensure_ascii=False) + "\n"
            )
            print("wrote", folder)


if __name__ == "__main__":
    main()
