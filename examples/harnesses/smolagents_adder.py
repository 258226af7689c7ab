"""smolagents' agents as their users run them (docs/agents.md, "smolagents"): a
`ToolCallingAgent` (every step a forced tool call, `tool_choice: "required"`, with stop
sequences) or a `CodeAgent` (every step Python in a code block, stop sequences, its reply
rewritten before it is sent back), each on `OpenAIServerModel`, which reaches its model through
nothing but OPENAI_BASE_URL and OPENAI_API_KEY (collapsecheck sets both). Each episode asks the
agent to add a number to a running total with the `add` tool; smolagents runs the tool and
sends its observation back, as it does.

    collapsecheck scan CHECKPOINT --env \\
        'command:python examples/harnesses/smolagents_adder.py --agent tool-calling --model {model}'

The checkpoint needs a window for smolagents' system prompt (about 3,300 characters for the
tool-calling agent, 8,600 for the code agent, before the steps).
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

from smolagents import CodeAgent, OpenAIServerModel, ToolCallingAgent, tool

AGENTS = {"tool-calling": ToolCallingAgent, "code": CodeAgent}


def episode(args: argparse.Namespace, start: int) -> str:
    """One episode from start state `start` (the total begins at 3 + start, the user asks to
    add start + 1): the agent's final answer, as smolagents gives it."""
    total = 3 + start

    @tool
    def add(n: int) -> str:
        """Add n to the running total.

        Args:
            n: The number to add.
        """
        nonlocal total
        total += n
        return f"total {total}"

    model = OpenAIServerModel(model_id=args.model)  # OPENAI_BASE_URL and OPENAI_API_KEY
    agent = AGENTS[args.agent](tools=[add], model=model, max_steps=args.max_steps,
                               verbosity_level=0)  # fmt: skip
    return str(agent.run(f"add {start + 1}"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=sorted(AGENTS), default="tool-calling")
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--model", default="policy")
    args = parser.parse_args()
    starts = [s for s in range(args.starts) for _ in range(args.episodes)]
    with ThreadPoolExecutor(len(starts)) as pool:  # every episode at once, as an evaluation runs
        answers = list(pool.map(lambda s: episode(args, s), starts))
    print(f"{len(answers)} episodes answered")


if __name__ == "__main__":
    main()
