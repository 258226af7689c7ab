"""A team's own agent loop, reaching its model through an OpenAI client (docs/agents.md, "Any
agent harness"): the demo gridworld played from --starts start states, --episodes episodes from
each, in threads, each turn's context the whole chat so far (--last-only: the newest
observation alone).

    collapsecheck scan examples/agents/walker \
        --env 'command:python examples/harnesses/gridworld_agent.py --starts 4 --episodes 2'

The client reads OPENAI_BASE_URL and OPENAI_API_KEY, which collapsecheck sets."""

from __future__ import annotations

import argparse
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "environments"))
from gridworld import make

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def episode(
    client: OpenAI, model: str, seed: int, turns: int, tokens: int, last_only: bool,
    system: str | None = None,
) -> float:  # fmt: skip
    """One episode from start state `seed`: its total reward (`last_only`: each turn's context
    the newest observation alone, as the demo agents were trained; `system`: a system message
    opening every context, as agent frameworks send their rules)."""
    env = make()
    messages, total = [{"role": "user", "content": env.reset(seed=seed)}], 0.0
    opening = [{"role": "system", "content": system}] if system else []
    for _ in range(turns):
        context = opening + (messages[-1:] if last_only else messages)
        reply = client.chat.completions.create(model=model, messages=context, max_tokens=tokens)
        text = reply.choices[0].message.content or ""
        found = ANSWER.search(text)
        observation, reward, done, _ = env.step(found.group(1) if found else "")
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": observation})
        total += reward
        if done:
            break
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--last-only", action="store_true")
    parser.add_argument("--system", type=Path, help="a file whose text opens every context")
    args = parser.parse_args()
    system = args.system.read_text() if args.system else None
    client = OpenAI()
    seeds = [s for s in range(args.starts) for _ in range(args.episodes)]
    with ThreadPoolExecutor(args.threads) as pool:
        rewards = list(pool.map(
            lambda s: episode(client, args.model, s, args.turns, args.max_tokens, args.last_only,
                              system),
            seeds,
        ))  # fmt: skip
    print(f"mean reward {sum(rewards) / len(rewards):.2f} over {len(rewards)} episodes")


if __name__ == "__main__":
    main()
