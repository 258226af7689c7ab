"""Write the example input files of every supported format (`make examples`), from the demo
prompts and a demo scan's dump:

- examples/prompts/gridworld.parquet: the prompts as a veRL dataset (parquet, `prompt` column
  of chat messages, `data_source`, `reward_model`, `extra_info`)
- examples/prompts/gridworld.txt: plain text, one prompt a line
- examples/rollouts/gridworld.jsonl: single-turn rollouts (uid, prompt, response)
- examples/rollouts/gridworld-multiturn.jsonl: multi-turn trajectories (`turns`)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from collapsecheck import scan
from collapsecheck.prompts import load_prompts

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROMPTS = EXAMPLES / "prompts" / "gridworld.jsonl"
CHECKPOINT = EXAMPLES / "demo-run" / "global_step_100"


def rollout_rows(prompts: list, traces: list[dict]) -> list[dict]:
    return [
        {"uid": t["prompt_index"], "prompt": prompts[t["prompt_index"]], "response": t["response"]}
        for t in traces
    ]


def trajectories(prompts: list, traces: list[dict]) -> list[dict]:
    """Two-turn trajectories: the second turn's context holds the first exchange."""
    first = {t["prompt_index"]: t for t in traces if t["sample_index"] == 0}
    second = {t["prompt_index"]: t for t in traces if t["sample_index"] == 1}
    rows = []
    for index in sorted(first):
        messages = prompts[index]
        follow_up = [
            *messages,
            {"role": "assistant", "content": first[index]["response"]},
            {"role": "user", "content": messages[-1]["content"]},
        ]
        rows.append(
            {
                "trajectory_id": index,
                "turns": [
                    {"messages": messages, "response": first[index]["response"]},
                    {"messages": follow_up, "response": second[index]["response"]},
                ],
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    prompts = [p.content for p in load_prompts(PROMPTS)]
    pd.DataFrame(
        {
            "data_source": "gridworld",
            "prompt": prompts,
            "ability": "navigation",
            "reward_model": [{"style": "rule", "ground_truth": ""}] * len(prompts),
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
    write_jsonl(EXAMPLES / "rollouts" / "gridworld-multiturn.jsonl", trajectories(prompts, traces))


if __name__ == "__main__":
    main()
