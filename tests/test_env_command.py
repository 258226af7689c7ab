"""`--env 'command:COMMAND'` (SPEC "Agents behind an OpenAI client"): a team's own agent loop
(examples/harnesses/gridworld_agent.py, the real `openai` client in threads) run against
collapsecheck's endpoint; its requests become the episodes; its faults are one line."""

from __future__ import annotations

import json
import sys

import pytest

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import load_environment
from collapsecheck.settings import EnvSettings, SamplingSettings
from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

WALKER = EXAMPLES / "agents" / "walker"
UNDOER = EXAMPLES / "agents" / "undoer"
TOOL_CALLER = EXAMPLES / "agents" / "tool-caller"  # scripts/make_tool_agent.py
HARNESS = ROOT / "examples" / "harnesses" / "gridworld_agent.py"


def harness(*args: str) -> str:
    return f"command:{sys.executable} {HARNESS} --starts 3 --episodes 2 --turns 3 " + " ".join(args)


def episodes(dump) -> list[dict]:
    return [json.loads(line) for line in (dump / "episodes.jsonl").read_text().splitlines()]


def test_a_harness_in_threads_records_the_same_episodes_in_any_order(tmp_path):
    """Eight threads and one: the same episodes, each the chat the harness kept (its states the
    gridworld's observations, each turn's `returned` the next user message), start states the
    distinct first requests."""
    runs = []
    for threads in ("8", "1"):
        dump = tmp_path / threads
        done = collapsecheck(
            "scan", WALKER, "--env", harness("--threads", threads), "--dump", dump,
            "--max-new-tokens", "48", "--fail-on", "none",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "6 episodes from 3 start states" in done.stdout
        runs.append(episodes(dump))
    assert runs[0] == runs[1]
    first = runs[0][0]
    assert first["turns"][0]["state"].startswith("agent ")
    for before, after in zip(first["turns"], first["turns"][1:], strict=False):
        assert before["returned"] == [{"role": "user", "content": after["state"]}]
        assert before["given"] == before["response"]
    assert [e["start"] for e in runs[0]] == [0, 0, 1, 1, 2, 2]
    assert len({e["seed"] for e in runs[0]}) == 3


def test_model_is_the_checkpoint_folders_plain_name(tmp_path):
    """`{model}` is the name /v1/models lists, the checkpoint folder's, never a path an SDK
    would split into a provider prefix; the harness's requests name it and are answered (the
    other tests' requests name "policy", and are answered too)."""
    said = tmp_path / "model.txt"
    run = harness("--model", "{model}").removeprefix("command:")
    done = collapsecheck("scan", WALKER, "--env", f"command:echo {{model}} > {said} && {run}",
                         "--max-new-tokens", "24", "--fail-on", "none")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert said.read_text() == "walker\n"
    assert "6 episodes from 3 start states" in done.stdout


def test_a_harness_that_sends_no_reply_back_is_said_to(tmp_path):
    """--last-only: each context the newest observation alone, so no request continues
    another: each is its own episode, said once."""
    done = collapsecheck("scan", WALKER, "--env", harness("--last-only", "--turns", "2"),
                         "--max-new-tokens", "24", "--fail-on", "none")  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines
    assert said.count("each request is its own episode: the harness sends no earlier reply") == 1


def test_the_openai_agents_sdks_default_model_plays_with_its_tool(tmp_path):
    """SPEC "Agents behind an OpenAI client": an OpenAI Agents SDK agent as its users run it
    (its default model speaks the Responses API; only OPENAI_BASE_URL set), the tool-calling
    agent calling the SDK's `add` tool: each episode is threaded across its requests (the
    SDK sends the whole input back as items), its tool output carries the reply's seeded call
    id, and a rerun records the same bytes."""
    pytest.importorskip("agents", reason="the OpenAI Agents SDK comes with the verifiers extra")
    agent = EXAMPLES / "harnesses" / "agents_sdk_adder.py"
    command = f"command:{sys.executable} {agent} --starts 2 --episodes 2 --model {{model}}"
    recorded = []
    for run in ("first", "again"):
        done = collapsecheck("scan", TOOL_CALLER, "--env", command, "--max-new-tokens", "96",
                             "--dump", tmp_path / run, "--fail-on", "none")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "4 episodes from 2 start states" in done.stdout
        recorded.append((tmp_path / run / "episodes.jsonl").read_bytes())
    assert recorded[0] == recorded[1]
    called = [e for e in episodes(tmp_path / "first") if len(e["turns"]) > 1]
    assert called, "no episode called the tool"
    for episode in called:
        first = episode["turns"][0]
        (tool,) = first["returned"]
        assert tool["role"] == "tool" and tool["content"].startswith("total ")
        assert tool["tool_call_id"].startswith("call_") and first["given"].startswith("[{")


def test_the_agents_sdks_output_type_is_served_as_structured_output(tmp_path):
    """SPEC "Constrained replies": `output_type=` makes the SDK ask its answer as a JSON
    schema (`text.format`); every reply is sampled under it, so each answer that ends is the
    object the SDK validates, and the scan counts the constrained replies."""
    pytest.importorskip("agents", reason="the OpenAI Agents SDK comes with the verifiers extra")
    pytest.importorskip("xgrammar", reason="structured output needs the grammar extra")
    agent = EXAMPLES / "harnesses" / "agents_sdk_adder.py"
    command = f"command:{sys.executable} {agent} --structured --model {{model}}"
    done = collapsecheck("scan", TOOL_CALLER, "--env", command, "--max-new-tokens", "96",
                         "--whole-response", "--dump", tmp_path, "--fail-on", "none")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "8 of 8 replies were constrained (8 by response_format json_schema)" in " ".join(
        done.stdout.split())  # fmt: skip
    answers = [e["turns"][-1]["given"] for e in episodes(tmp_path)]
    assert any(a.rstrip().endswith("}") for a in answers)
    for answer in answers:
        if answer.rstrip().endswith("}"):
            assert set(json.loads(answer)) == {"total"}


def test_two_checkpoints_under_one_harness_pair_by_start_state():
    done = collapsecheck("compare", WALKER, UNDOER, "--env", harness(), "--max-new-tokens", "48")
    assert done.returncode in (0, 1), done.stderr
    assert "paired over start states" in done.stdout


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("sh -c 'echo starting; echo boom >&2; exit 3'", "the harness exited with status 3: boom"),
        ("true", "the harness made no request (nothing reached OPENAI_BASE_URL)"),
        ("sleep 30", "the harness sent no request within 1 s of the endpoint's last answer"),
    ],
)
def test_a_harness_that_fails_is_one_line(tmp_path, command, said):
    done = collapsecheck("scan", WALKER, "--env", f"command:{command}", "--env-timeout", "1",
                         "--dump", tmp_path / "dump")  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0]
    assert "Traceback" not in done.stderr
    dump = tmp_path / "dump"
    assert not dump.exists() or not any(dump.iterdir())  # nothing half-written


def test_a_harness_refused_by_the_endpoint_says_so():
    asks_two = (
        f'{sys.executable} -c "import openai; openai.OpenAI().chat.completions.create('
        "model='m', messages=[{'role': 'user', 'content': 'hi'}], n=2)\""
    )
    done = collapsecheck("scan", WALKER, "--env", f"command:{asks_two}")
    assert done.returncode == 2
    assert "the harness exited with status 1: openai.BadRequestError" in done.stderr
    assert "the endpoint refused 1 request (first: request 0 (/v1/chat/completions): n=2" in (
        done.stderr
    )


def test_what_the_harness_decides_is_refused_as_a_flag():
    spec = load_environment("command:true")
    with pytest.raises(CollapsecheckError, match="-n, -k, --max-turns do not apply"):
        spec.resolved(EnvSettings(env="command:true", max_turns=3),
                      SamplingSettings(num_prompts=4, k=2))  # fmt: skip
    with pytest.raises(CollapsecheckError, match="no program 'no-such-harness'"):
        load_environment("command:no-such-harness --flag")
    with pytest.raises(CollapsecheckError, match="--env-arg does not go with it"):
        load_environment("command:true", {"a": 1})
    loaded = load_environment(f"command:FOO=1 {sys.executable} {HARNESS}")
    assert loaded.files[1] == HARNESS  # the script's content keys the cache
