"""`--env verifiers:ENV_ID` (SPEC "Agents behind an OpenAI client"): verifiers' classic
environments played in process with verifiers' own classes, at the highest supported version
(0.3.1, the dev extra's) in this process and at the lowest (0.1.9, installed by `make install`
under .venv/verifiers-0.1.9) in a fresh one: a MultiTurnEnv and a StatefulToolEnv of our own
(tests/fixtures/environments/verifiers/) and verifiers' own ReasoningGymEnv."""

from __future__ import annotations

import itertools
import json
import pickle
import re
import sys

import pytest
import verifiers as vf

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments import load_environment
from tests.conftest import EXAMPLES, ROOT
from tests.conftest import run_collapsecheck as collapsecheck

WALKER = EXAMPLES / "agents" / "walker"
TOOL_CALLER = EXAMPLES / "agents" / "tool-caller"  # scripts/make_tool_agent.py
MODULES = ROOT / "tests" / "fixtures" / "environments" / "verifiers"
LOWEST = ROOT / ".venv" / "verifiers-0.1.9"
SCAN = ("--max-new-tokens", "48", "--fail-on", "none")


@pytest.fixture(autouse=True)
def environment_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(MODULES))


def played(
    tmp_path,
    spec: str,
    *args: str,
    lowest: bool = False,
    checkpoint=WALKER,
    said: list | None = None,
) -> list[dict]:
    """The scan's episodes, run in a fresh process (at verifiers 0.1.9 where `lowest`; what it
    printed appended to `said`)."""
    paths = [str(LOWEST)] if lowest else []
    code = f"import sys; sys.path[:0] = {[*paths, str(MODULES)]!r}; "
    if lowest:
        code += "import verifiers; assert verifiers.__file__.startswith(sys.path[0]); "
    dump = tmp_path / ("lowest" if lowest else "highest")
    done = collapsecheck("scan", checkpoint, "--env", spec, "--dump", dump, *SCAN, *args, code=code)
    assert done.returncode == 0, done.stderr
    if said is not None:
        said.append(done.stdout + done.stderr)
    return [json.loads(line) for line in (dump / "episodes.jsonl").read_text().splitlines()]


def test_the_lowest_version_is_installed_beside_the_highest():
    assert vf.__version__ == "0.3.1"
    assert (LOWEST / "verifiers-0.1.9.dist-info").is_dir(), "make install puts 0.1.9 there"


def test_a_multiturn_env_is_played_as_verifiers_plays_it_at_both_ends(tmp_path):
    """Each row a start state (seed s plays row s), K rollouts from each; each turn's state
    the environment's newest message, `returned` its env_response; the rubric's reward on the
    last turn; an episode that reaches the goal ends with its final_env_response; the same
    episodes at 0.1.9 and 0.3.1."""
    highest = played(tmp_path, "verifiers:cc-gridwalk", "-n", "3", "-k", "2")
    lowest = played(tmp_path, "verifiers:cc-gridwalk", "-n", "3", "-k", "2", lowest=True)
    assert highest == lowest
    assert [(e["start"], e["seed"]) for e in highest] == [(0, 0), (0, 0), (1, 1), (1, 1),
                                                           (2, 2), (2, 2)]  # fmt: skip
    module = __import__("cc_gridwalk")
    for episode in highest:
        start = module.observation(*module.cells(episode["seed"]))
        turns = episode["turns"]
        assert turns[0]["state"] == start
        for before, after in itertools.pairwise(turns):
            assert before["returned"] == [{"role": "user", "content": after["state"]}]
        assert len(turns) <= 4  # the environment's max_turns
        reached = episode["final_state"] is not None
        assert turns[-1]["reward"] == (1.0 if reached else 0.0)
        assert all(t["reward"] is None for t in turns[:-1])


def test_a_stateful_tool_env_gets_tool_calls_and_injects_its_hidden_argument(tmp_path):
    """The tool-calling agent (no reasoning tags) under our StatefulToolEnv at both ends: its
    `<tool_call>` is an OpenAI tool call verifiers runs, with the running total (hidden from
    the schema the template renders) injected by `update_tool_args`; the tool's message comes
    back with its call id; the reasoning is the text before the call, said once."""
    said: list[str] = []
    for lowest in (False, True):
        args = ("-n", "4", "-k", "2", "--max-new-tokens", "96")  # a call: about 60 tokens
        episodes = played(tmp_path, "verifiers:cc-adder", *args, lowest=lowest,
                          checkpoint=TOOL_CALLER, said=said)  # fmt: skip
        called = [e for e in episodes if e["turns"][0]["given"].startswith("[{")]
        assert len(called) >= 4, episodes
        for episode in called:
            first = episode["turns"][0]
            (call,) = json.loads(first["given"])
            start = 3 + episode["seed"]  # cc_adder's rows: start totals 3, 4, 5, 6
            (tool,) = first["returned"]
            assert tool["role"] == "tool" and tool["tool_call_id"].startswith("call_")
            assert tool["content"] == f"total {start + call['arguments']['n']}"
            assert len(episode["turns"]) == 2  # the reply after the tool has no call: the end
    note = "the reasoning is each reply's text before its action (--reasoning-regex"
    assert all(note in " ".join(s.split()) for s in said)  # rich wraps long lines
    # a rerun records the same bytes, tool-call ids included (made from each request's seed)
    again = tmp_path / "again"
    played(again, "verifiers:cc-adder", *args, checkpoint=TOOL_CALLER)
    recorded = [(run / "highest" / "episodes.jsonl").read_bytes() for run in (tmp_path, again)]
    assert recorded[0] == recorded[1]
    rendered = (tmp_path / "highest" / "prompts.jsonl").read_text()
    assert '\\"name\\": \\"add\\"' in rendered and "running total so far" not in rendered


def test_max_turns_cuts_and_says_so(tmp_path):
    done = collapsecheck("scan", WALKER, "--env", "verifiers:cc-gridwalk", "-n", "2", "-k", "1",
                         "--max-turns", "2", *SCAN,
                         code=f"import sys; sys.path[:0] = [{str(MODULES)!r}]; ")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--max-turns 2 cut 2 of 2 episodes shorter than the environment would" in (
        done.stdout + done.stderr
    )


def test_reasoning_gyms_env_runs_offline_at_both_ends(tmp_path):
    """verifiers' own ReasoningGymEnv: its system prompt opens each context, the row's
    question is the state, the rubric's reward is on the (only) turn."""
    args = ("-n", "2", "-k", "2", "--whole-response")  # the walker never learnt arithmetic
    highest = played(tmp_path, "verifiers:cc-arithmetic", *args)
    lowest = played(tmp_path, "verifiers:cc-arithmetic", *args, lowest=True)
    assert [e["turns"][0]["state"] for e in highest] == [e["turns"][0]["state"] for e in lowest]
    assert highest[0]["turns"][0]["state"].startswith("Calculate")
    assert all(len(e["turns"]) == 1 and e["turns"][0]["reward"] == 0.0 for e in highest)


def test_what_cannot_be_played_is_one_line_before_the_model():
    with pytest.raises(CollapsecheckError, match="no environment module 'no_such_env'"):
        load_environment("verifiers:no-such-env")
    with pytest.raises(CollapsecheckError, match="--env-config does not go with it"):
        load_environment("verifiers:cc-gridwalk", config=ROOT / "pyproject.toml")
    with pytest.raises(CollapsecheckError, match="loading the environment raised TypeError"):
        load_environment("verifiers:cc-gridwalk", {"no_such_argument": 1})
    loaded = load_environment("verifiers:cc-gridwalk", {"rows": 3})
    assert len(loaded.rows) == 3 and loaded.origin.name == "cc_gridwalk.py"


def test_an_environment_that_raises_is_one_line(tmp_path):
    path = f"import sys; sys.path[:0] = [{str(MODULES)!r}]; "
    done = collapsecheck("scan", WALKER, "--env", "verifiers:cc-raises", "-n", "2", "-k", "1",
                         *SCAN, code=path)  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert re.search(r"--env verifiers:cc-raises \(verifiers, seed [01]\): the environment raised "
                     "RuntimeError", errors[0])  # fmt: skip
    assert "the board fell over" in errors[0]


def test_a_missing_verifiers_is_one_line_naming_the_extra():
    hide = "import sys; sys.modules['verifiers'] = None; "
    done = collapsecheck("scan", WALKER, "--env", "verifiers:cc-gridwalk", code=hide)
    assert done.returncode == 2
    assert "pip install 'collapsecheck[verifiers]'" in done.stderr


def test_the_spec_pickles_as_how_it_was_loaded():
    loaded = load_environment("verifiers:cc-gridwalk", {"rows": 2})
    again = pickle.loads(pickle.dumps(loaded))
    assert again.rows == loaded.rows and again.spec == loaded.spec
    assert sys.modules["cc_gridwalk"]


def replayed(env, row: dict, responses: list[str]) -> dict:
    """A fresh rollout of `env` at `row` whose model says `responses` in turn (httpx's own
    mock transport: no model), scored as the scan scores it."""
    import asyncio

    import httpx
    from openai import AsyncOpenAI

    said = iter(responses)

    def answer(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": next(said)}
        return httpx.Response(200, json={
            "id": "r", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        })  # fmt: skip

    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(
        base_url="http://replay/v1", api_key="k",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(answer)),
    ))  # fmt: skip

    async def run():
        state = await env.rollout(dict(row), client, "m", {"max_tokens": 48})
        await env.rubric.score_group([state])
        return state

    return asyncio.run(run())


def test_an_episode_replays_in_a_fresh_environment_at_its_row(tmp_path):
    """Each recorded episode's responses, replayed in a fresh environment at its seed's row,
    give back the recorded `returned` messages and the reward."""
    episodes = played(tmp_path, "verifiers:cc-gridwalk", "-n", "2", "-k", "2")
    for episode in episodes:
        fresh = vf.load_environment("cc-gridwalk")
        row = fresh.get_eval_dataset()[episode["seed"]]
        state = replayed(fresh, row, [t["response"] for t in episode["turns"]])
        completion = [m if isinstance(m, dict) else m.model_dump() for m in state["completion"]]
        users = [{"role": "user", "content": m["content"]} for m in completion
                 if m["role"] == "user"]  # fmt: skip
        recorded = [m for t in episode["turns"] for m in t["returned"]]
        assert users[: len(recorded)] == recorded
        assert state["reward"] == episode["turns"][-1]["reward"]
