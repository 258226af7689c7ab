"""A langchain agent loop as its users write it (docs/agents.md, "langchain"): `ChatOpenAI`,
which reaches its model through nothing but OPENAI_BASE_URL and OPENAI_API_KEY (collapsecheck
sets both), with the `add` tool bound by `bind_tools(tool_choice="any")` (sent as "required":
every turn must call it), the tool run and its result sent back as a `ToolMessage`, and the
episode closed by `with_structured_output(method="json_schema")` asking the final total.

    collapsecheck scan CHECKPOINT \\
        --env 'command:python examples/harnesses/langchain_adder.py --model {model}'
"""

from __future__ import annotations

import argparse
import asyncio

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError


class Total(BaseModel):
    """The running total after the additions."""

    total: int


async def episode(args: argparse.Namespace, start: int) -> Total | None:
    """One episode from start state `start` (the total begins at 3 + start, the user asks to
    add start + 1): `--turns` forced calls of `add`, then the total as structured output
    (None where the reply was not one)."""
    total = 3 + start

    @tool
    def add(n: int) -> str:
        """Add n to the running total."""
        nonlocal total
        total += n
        return f"total {total}"

    model = ChatOpenAI(model=args.model, max_tokens=args.max_tokens, max_retries=0)
    calling = model.bind_tools([add], tool_choice="any")
    messages: list[BaseMessage] = [HumanMessage(f"add {start + 1}")]
    for _ in range(args.turns):
        reply = await calling.ainvoke(messages)
        messages.append(reply)
        for call in reply.tool_calls:
            try:
                result = add.invoke(call["args"])
            except ValidationError as err:  # as langgraph's ToolNode sends a bad call back
                result = f"Error: {err.errors()[0]['msg']}"
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    answer = model.with_structured_output(Total, method="json_schema", include_raw=True)
    return (await answer.ainvoke(messages))["parsed"]


async def play(args: argparse.Namespace) -> list[Total | None]:
    """Every episode at once, as a team's evaluation runs them."""
    starts = [s for s in range(args.starts) for _ in range(args.episodes)]
    return await asyncio.gather(*(episode(args, s) for s in starts))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--model", default="policy")
    args = parser.parse_args()
    answers = asyncio.run(play(args))
    print(f"{sum(a is not None for a in answers)} of {len(answers)} episodes gave a total")


if __name__ == "__main__":
    main()
