"""Train the demo agents of SPEC "Agents across turns" (`make agents`). Tests never run this.

Both play `examples/environments/gridworld.py` (the agent's and the goal's cells on a 6 x 6
grid, a move per turn) and are fine-tuned from the grounded demo checkpoint
(`examples/demo-run/global_step_100`) on the turns of a scripted policy's episodes, each in
the context `scan --env --context-window 1` renders (the current observation alone: a model
of 300k parameters reads one state far more reliably than a chat of several):

- `examples/agents/walker`: restates the state and moves towards the goal (along the rows
  first: one move per state, so a model this small learns it sharply);
- `examples/agents/undoer`: restates the state just as well, then moves right from an even
  column and left from an odd one: every second move undoes the one before (valid actions
  keep coming while the episode goes in circles).

Everything is seeded; about fifteen minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (
    EXAMPLES,
    build_tokenizer,
    grounded_reasoning,
    save,
    train_on,
    useful_moves,
)

GRID = EXAMPLES / "environments" / "gridworld.py"
MAX_TURNS = 8
AGENTS = [("agents/walker", "walker", 1200), ("agents/undoer", "undoer", 800)]


def load_gridworld():
    spec = importlib.util.spec_from_file_location("gridworld", GRID)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def choose(style: str, agent: tuple[int, int], goal: tuple[int, int], rng: random.Random) -> str:
    if style == "walker":
        return useful_moves(agent, goal)[0]
    return "right" if agent[1] % 2 == 0 else "left"


def episode(gridworld, style: str, rng: random.Random) -> list[tuple[str, str]]:
    """(observation, response) of each turn of one scripted episode."""
    env = gridworld.make()
    observation = env.reset(seed=rng.randrange(10**9))
    turns = []
    for _ in range(MAX_TURNS):
        agent, goal = env.agent, env.goal
        move = choose(style, agent, goal, rng)
        reasoning = grounded_reasoning(agent, goal, move, rng)
        turns.append((observation, f"<think>{reasoning}</think><answer>{move}</answer>"))
        observation, _, done, _ = env.step(move)
        if done:
            break
    return turns


def example(tokenizer, gridworld, style: str, rng: random.Random) -> tuple[list[int], int]:
    """One turn of an episode in its context (the observation alone): ids and where the
    learned response starts."""
    turns = episode(gridworld, style, rng)
    last = rng.randrange(len(turns))
    chat = [{"role": "user", "content": turns[last][0]}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(turns[last][1] + "<|end|>", add_special_tokens=False)["input_ids"]
    return prompt_ids + response_ids, len(prompt_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=[name for name, *_ in AGENTS])
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizer = build_tokenizer()
    gridworld = load_gridworld()
    for index, (name, style, steps) in enumerate(AGENTS):
        if args.only and name not in args.only:
            continue
        print(f"{name}: {style}", flush=True)
        model = LlamaForCausalLM.from_pretrained(EXAMPLES / "demo-run" / "global_step_100")
        train_on(
            model,
            tokenizer,
            lambda rng, style=style: example(tokenizer, gridworld, style, rng),
            steps,
            seed=300 + index,
            batch=24,
            lr=1e-3,
        )
        save(model, tokenizer, EXAMPLES / name)


if __name__ == "__main__":
    main()
