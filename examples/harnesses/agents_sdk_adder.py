"""An OpenAI Agents SDK agent as its users run it (docs/agents.md, "The OpenAI Agents SDK"):
the SDK's default model, which speaks the Responses API, with a function tool, reaching its
model through nothing but OPENAI_BASE_URL and OPENAI_API_KEY (collapsecheck sets both). Each
episode asks the agent to add a number to a running total (the game the tool-calling demo
agent was trained on); the SDK runs the `add` tool the agent calls and sends its output back.

    collapsecheck scan examples/agents/tool-caller \
        --env 'command:python examples/harnesses/agents_sdk_adder.py --model {model}'

With `--structured`, the agent has `output_type=Total`: the SDK asks its answer as a JSON
schema (`text.format`), which the endpoint serves by constrained decoding.
"""

from __future__ import annotations

import argparse
import asyncio

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from pydantic import BaseModel


class Total(BaseModel):
    """The running total after the additions: the final output of an agent given
    `output_type=Total` (`--structured`), which the SDK asks as a JSON schema."""

    total: int


async def episode(model: str, start: int, max_turns: int, structured: bool) -> str | None:
    """One episode from start state `start` (the total begins at 3 + start, the user asks to
    add start + 1): the agent's final answer, None where it ran past `max_turns` (or, with
    `structured`, where its answer was not the JSON asked)."""
    total = 3 + start

    @function_tool
    def add(n: int) -> str:
        """Add n to the running total.

        Args:
            n: The number to add.
        """
        nonlocal total
        total += n
        return f"total {total}"

    agent = Agent(name="adder", model=model, tools=[add], output_type=Total if structured else None)
    try:
        result = await Runner.run(agent, f"add {start + 1}", max_turns=max_turns)
    except (MaxTurnsExceeded, ModelBehaviorError):
        return None
    return str(result.final_output)


async def play(args: argparse.Namespace) -> list[str | None]:
    """Every episode at once, as a team's evaluation runs them."""
    starts = [s for s in range(args.starts) for _ in range(args.episodes)]
    return await asyncio.gather(
        *(episode(args.model, s, args.max_turns, args.structured) for s in starts)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--model", default="policy")
    parser.add_argument("--structured", action="store_true", help="output_type=Total")
    args = parser.parse_args()
    set_tracing_disabled(True)  # the SDK's traces would go to OpenAI's servers
    answers = asyncio.run(play(args))
    finished = sum(answer is not None for answer in answers)
    print(f"{finished} of {len(answers)} episodes answered")


if __name__ == "__main__":
    main()
