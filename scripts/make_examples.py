"""Write the example input files of every supported format (`make examples`), from the demo
prompts and a demo scan's dump:

- examples/prompts/gridworld.parquet: the prompts as a veRL dataset (parquet, `prompt` column
  of chat messages, `data_source`, `reward_model`, `extra_info`)
- examples/prompts/gridworld.txt: plain text, one prompt a line
- examples/rollouts/gridworld.jsonl: single-turn rollouts (uid, prompt, response)
- examples/rollouts/gridworld-multiturn.jsonl: multi-turn trajectories (`turns`), sampled turn
  by turn from the healthy demo policy in the gridworld: each move changes the agent's cell,
  and each turn's context is the environment's current observation (a history window of 0
  turns: the demo policy was trained on single observations, and a history it never saw
  would make its later turns noise).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import pandas as pd

from collapsecheck import scan
from collapsecheck.engines.backends.base import SamplingParams, no_progress
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.inputs.prompts import Prompt, load_prompts, render_prompt
from collapsecheck.settings import LoadSettings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "rewards"))
from gridworld import compute_score

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROMPTS = EXAMPLES / "prompts" / "gridworld.jsonl"
CHECKPOINT = EXAMPLES / "demo-run" / "global_step_100"


def rollout_rows(prompts: list, traces: list[dict]) -> list[dict]:
    """veRL-style rollout rows: uid, prompt, response and its reward (the gridworld reward)."""
    return [
        {
            "uid": t["prompt_index"],
            "prompt": prompts[t["prompt_index"]],
            "response": t["response"],
            "reward": compute_score(
                "gridworld", t["response"], ground_truth(prompts[t["prompt_index"]])
            ),
        }
        for t in traces
    ]


GRID = 6
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
STATE = re.compile(r"agent (\d),(\d) goal (\d),(\d)")
ANSWER = re.compile(r"<answer>(\w+)</answer>")
TURNS = 3


def step(state: str, response: str) -> str | None:
    """The gridworld's next state after the response's move, None when the episode ends
    (goal reached, or no valid move)."""
    ar, ac, gr, gc = map(int, STATE.fullmatch(state).groups())
    answer = ANSWER.search(response)
    if answer is None or answer.group(1) not in MOVES:
        return None
    dr, dc = MOVES[answer.group(1)]
    ar, ac = min(max(ar + dr, 0), GRID - 1), min(max(ac + dc, 0), GRID - 1)
    return None if (ar, ac) == (gr, gc) else f"agent {ar},{ac} goal {gr},{gc}"


def trajectories(prompts: list, count: int) -> list[dict]:
    """Episodes of up to TURNS turns, every response sampled by the policy under exactly the
    context stored with it: the system prompt and the current state."""
    backend = TransformersBackend.from_checkpoint(CHECKPOINT, LoadSettings(device="cpu"))
    rows = []
    for episode, start in enumerate(prompts[:count]):
        system, state, turns = start[0], start[-1]["content"], []
        for turn in range(TURNS):
            messages = [system, {"role": "user", "content": state}]
            ids = render_prompt(Prompt(messages, "episode"), backend.tokenizer).ids
            params = SamplingParams(k=1, max_new_tokens=64, seed=1000 * episode + turn)
            sample = backend.generate([ids], params, no_progress)[0][0]
            response = backend.decode(sample.ids)
            reward = compute_score("gridworld", response, ground_truth(messages))
            turns.append({"messages": messages, "response": response, "reward": reward})
            state = step(state, response)
            if state is None:
                break
        rows.append({"trajectory_id": episode, "turns": turns})
    backend.close()
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def ground_truth(messages: list) -> str:
    """The moves that bring the agent closer to the goal, as the reward function reads them."""
    ar, ac, gr, gc = map(int, STATE.fullmatch(messages[-1]["content"]).groups())
    moves = [("up", gr < ar), ("down", gr > ar), ("left", gc < ac), ("right", gc > ac)]
    return ",".join(name for name, useful in moves if useful)


def main() -> None:
    prompts = [p.content for p in load_prompts(PROMPTS)]
    truths = [ground_truth(p) for p in prompts]
    rows = [{"messages": p, "ground_truth": t} for p, t in zip(prompts, truths, strict=True)]
    write_jsonl(PROMPTS, rows)
    pd.DataFrame(
        {
            "data_source": "gridworld",
            "prompt": prompts,
            "ability": "navigation",
            "reward_model": [{"style": "rule", "ground_truth": t} for t in truths],
            "extra_info": [{"split": "test", "index": i} for i in range(len(prompts))],
        }
    ).to_parquet(EXAMPLES / "prompts" / "gridworld.parquet")
    (EXAMPLES / "prompts" / "gridworld.txt").write_text(
        "".join(p[-1]["content"] + "\n" for p in prompts)
    )
    with tempfile.TemporaryDirectory() as dump:
        scan(CHECKPOINT, PROMPTS, k=4, num_prompts=16, max_new_tokens=64, device="cpu", dump=dump)
        traces = [json.loads(line) for line in (Path(dump) / "traces.jsonl").open()]
    write_jsonl(EXAMPLES / "rollouts" / "gridworld.jsonl", rollout_rows(prompts, traces))
    write_jsonl(EXAMPLES / "rollouts" / "gridworld-multiturn.jsonl", trajectories(prompts, 16))


if __name__ == "__main__":
    main()
