"""Agent frameworks nobody on this project wrote, run as their users run them behind
`--env 'command:...'` (docs/agents.md; SPEC "Agents behind an OpenAI client"): smolagents'
`ToolCallingAgent` (forced tool calls and stop sequences on every request) and `CodeAgent` (stop
sequences, its replies rewritten before they are sent back), and a langchain loop
(`tool_choice="any"`, then `with_structured_output(method="json_schema")`). Each is threaded
into episodes of more than one turn, says how many replies were constrained, and a rerun
records the same bytes. The frameworks are the `test-agents` extra, skipped where missing."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys

import pytest

from tests.conftest import EXAMPLES
from tests.conftest import run_collapsecheck as collapsecheck

pytest.importorskip("xgrammar", reason="forced calls and structured output need the grammar extra")
TOOL_CALLER = EXAMPLES / "agents" / "tool-caller"  # scripts/make_tool_agent.py: Qwen's template
HARNESSES = EXAMPLES / "harnesses"


@pytest.fixture(scope="module")
def wide_tool_caller(tmp_path_factory):
    """The tool-calling agent with its window widened to 16,384 positions (its config's
    `max_position_embeddings`; RoPE reads any position): room for smolagents' system prompt,
    about 3,300 bytes for the tool-calling agent and 8,600 for the code agent, each a token in
    its byte-level vocabulary. What the harness does is under test, not how well the model
    reads positions past its training."""
    wide = tmp_path_factory.mktemp("checkpoints") / "tool-caller-wide"
    shutil.copytree(TOOL_CALLER, wide)
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    return wide


def scanned_twice(tmp_path, checkpoint, command: str) -> tuple[list[dict], str]:
    """The harness scanned twice: the first scan's episodes and console (both scans record
    the same bytes)."""
    recorded, said = [], ""
    for run in ("first", "again"):
        done = collapsecheck("scan", checkpoint, "--env", command, "--max-new-tokens", "96",
                             "--whole-response", "--dump", tmp_path / run,
                             "--fail-on", "none")  # fmt: skip
        assert done.returncode == 0, done.stderr
        recorded.append((tmp_path / run / "episodes.jsonl").read_bytes())
        said = said or done.stdout + done.stderr
    assert recorded[0] == recorded[1]
    return [json.loads(line) for line in recorded[0].decode().splitlines()], " ".join(said.split())


def smolagents_steps(tmp_path, checkpoint, agent: str) -> tuple[list[dict], str]:
    """smolagents' `agent` scanned twice: the episodes of its steps (each agent's two steps
    one episode: 4 of them) and the console."""
    pytest.importorskip("smolagents", reason="smolagents comes with the test-agents extra")
    harness = HARNESSES / "smolagents_adder.py"
    command = f"command:{sys.executable} {harness} --agent {agent} --model {{model}}"
    episodes, said = scanned_twice(tmp_path, checkpoint, command)
    stepped = [e for e in episodes if len(e["turns"]) == 2]
    assert len(stepped) == 4, "each of the 4 agents' two steps are not one episode"
    return stepped, said


def test_smolagents_tool_calling_agent_as_it_comes(tmp_path, wide_tool_caller):
    """Every step a forced call ("required") with stop sequences; its calls sent back as the
    assistant's "Calling tools: ..." text and results as a user "Observation"/"Error"
    message, and still threaded."""
    stepped, said = smolagents_steps(tmp_path, wide_tool_caller, "tool-calling")
    for episode in stepped:
        first = episode["turns"][0]
        assert first["given"].lstrip().startswith("[")  # a forced reply: a JSON list of calls
        assert first["returned"][0]["role"] == "user"  # the observation, as smolagents sends it
    assert "were constrained (8 by tool_choice required)" in said


def test_smolagents_code_agent_as_it_comes(tmp_path, wide_tool_caller):
    """Stop sequences on every request, and its reply rewritten before it is sent back: its
    steps are one episode still."""
    stepped, said = smolagents_steps(tmp_path, wide_tool_caller, "code")
    assert all(e["turns"][0]["returned"][0]["content"].startswith("Error") for e in stepped)
    assert "constrained" not in said and "each request is its own episode" not in said


def test_langchain_tool_choice_any_and_structured_output(tmp_path):
    """`bind_tools(tool_choice="any")` sends "required": each turn a forced list of calls;
    `with_structured_output(method="json_schema")` is answered with JSON its schema accepts
    where the reply ends; the loop's three requests one episode."""
    pytest.importorskip("langchain_openai", reason="langchain comes with the test-agents extra")
    agent = HARNESSES / "langchain_adder.py"
    command = f"command:{sys.executable} {agent} --model {{model}}"
    episodes, said = scanned_twice(tmp_path, TOOL_CALLER, command)
    assert len(episodes) == 4 and all(len(e["turns"]) == 3 for e in episodes)
    totals = []
    for episode in episodes:
        forced, _, answer = episode["turns"]
        assert forced["given"].lstrip().startswith("[")
        with contextlib.suppress(json.JSONDecodeError):  # where the token limit cut it
            totals.append(json.loads(answer["given"]))
    assert totals and all(set(total) == {"total"} for total in totals)
    assert "12 of 12 replies were constrained (4 by response_format json_schema, " \
           "8 by tool_choice required)" in said  # fmt: skip
