"""Constrained replies (SPEC "Agents behind an OpenAI client", "Constrained replies"): a
`response_format` or a forced `tool_choice` read into the JSON schema vLLM's server samples
under; the transformers backend drawing under it with xgrammar; the real `openai` client
answered through the endpoint, the forced calls read as vLLM reads them; the scan's note; the
missing extra in one line."""

from __future__ import annotations

import json
import sys

import openai
import pytest

from collapsecheck.engines.backends.base import SamplingParams
from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.endpoint import Serving
from collapsecheck.inputs.environments.openai_wire import (
    CHAT,
    TEXT,
    Constrained,
    Unservable,
    call_id,
    read_request,
)
from collapsecheck.inputs.environments.responses_wire import ResponsesAPI
from collapsecheck.inputs.environments.tool_calls import forced_calls
from collapsecheck.settings import LoadSettings
from tests.conftest import EXAMPLES
from tests.conftest import run_collapsecheck as collapsecheck
from tests.test_endpoint import served

xgrammar = pytest.importorskip("xgrammar", reason="constrained decoding is the grammar extra")

TOOL_CALLER = EXAMPLES / "agents" / "tool-caller"  # scripts/make_tool_agent.py: Qwen's template
ADD = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
    {"type": "function", "function": {"name": "reset"}},
]
ASK = [{"role": "user", "content": "add 3"}]
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x", "y"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def tool_caller():
    return TransformersBackend.from_checkpoint(TOOL_CALLER, LoadSettings(device="cpu"), None)


def schema_of(body: dict) -> dict:
    constrained = read_request(CHAT, {"messages": ASK, **body}).constrained
    assert constrained is not None
    return json.loads(constrained.schema)


def test_a_forced_tool_choice_is_the_schema_vllm_samples_under():
    """vLLM's `get_json_schema_from_tools`: "required" a list of at least one
    {name, parameters} of the tools (a tool without parameters: an empty object; at most one
    call where parallel_tool_calls is false; `$defs` gathered at the top); a named function
    its parameters."""
    required = schema_of({"tools": TOOLS, "tool_choice": "required"})
    assert required == {
        "type": "array", "minItems": 1,
        "items": {"type": "object", "anyOf": [
            {"properties": {"name": {"type": "string", "enum": ["add"]}, "parameters": ADD},
             "required": ["name", "parameters"]},
            {"properties": {"name": {"type": "string", "enum": ["reset"]},
                            "parameters": {"type": "object", "properties": {}}},
             "required": ["name", "parameters"]},
        ]},
    }  # fmt: skip
    single = schema_of({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    assert single == {**required, "maxItems": 1}
    named = {"type": "function", "function": {"name": "add"}}
    assert schema_of({"tools": TOOLS, "tool_choice": named}) == ADD
    nested = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
              "$defs": {"P": {"type": "integer"}}}  # fmt: skip
    tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
    gathered = schema_of({"tools": [tool], "tool_choice": "required"})
    assert gathered["$defs"] == {"P": {"type": "integer"}}
    assert "$defs" not in gathered["items"]["anyOf"][0]["properties"]["parameters"]
    assert read_request(CHAT, {"messages": ASK, "tools": TOOLS}).constrained is None


def test_a_response_format_is_its_schema_and_what_cannot_be_served_is_refused():
    assert schema_of({"response_format": {"type": "json_object"}}) == {"type": "object"}
    asked = {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT}}
    assert schema_of({"response_format": asked}) == POINT
    assert read_request(CHAT, {"messages": ASK, "response_format": {"type": "text"}}) \
        .constrained is None  # fmt: skip
    text = read_request(TEXT, {"prompt": "p", "response_format": {"type": "json_object"}})
    assert text.constrained.asked == "response_format json_object"
    named = {"type": "function", "function": {"name": "sub"}}
    refused = [
        ({"tools": TOOLS, "tool_choice": named}, "names 'sub', which is not one of 'tools'"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": asked}, "not both"),
    ]
    for body, said in refused:
        with pytest.raises(Unservable, match=said):
            read_request(CHAT, {"messages": ASK, **body})


def test_the_responses_api_asks_the_same_constraints():
    """`text.format` (its schema at the format's top) and a function named at the
    tool_choice's top are the chat's `response_format` and named tool choice."""
    api = ResponsesAPI()
    tools = [{"type": "function", "name": "add", "parameters": ADD}]
    form = {"format": {"type": "json_schema", "name": "point", "schema": POINT, "strict": True}}
    assert json.loads(api.read({"input": "x", "text": form}).constrained.schema) == POINT
    forced = api.read({"input": "x", "tools": tools,
                       "tool_choice": {"type": "function", "name": "add"}})  # fmt: skip
    assert (forced.constrained.function, json.loads(forced.constrained.schema)) == ("add", ADD)
    assert api.read({"input": "x", "tools": tools, "tool_choice": "required"}).constrained.forced


def test_a_forced_reply_is_read_as_vllm_reads_it():
    """A named function's call carries the reply's object; "required" a call per list item;
    the content is then empty. JSON the token limit cut is the reply's text, with no call."""
    named = Constrained("{}", "tool_choice function", forced=True, function="add")
    (call,) = forced_calls('{"n": 3}', named, 5)[1]
    assert (call.name, dict(call.arguments), call.id) == ("add", {"n": 3}, call_id(5, 0))
    assert forced_calls('{"n": 3}', named, 5)[0] == ""
    required = Constrained("{}", "tool_choice required", forced=True)
    listed = '[{"name": "add", "parameters": {"n": 1}}, {"name": "reset", "parameters": {}}]'
    content, calls = forced_calls(listed, required, 5)
    assert content == "" and [(c.name, dict(c.arguments)) for c in calls] == [
        ("add", {"n": 1}), ("reset", {})]  # fmt: skip
    assert [c.id for c in calls] == [call_id(5, 0), call_id(5, 1)]
    assert forced_calls('[{"name": "add", "param', required, 5) == ('[{"name": "add", "param', ())


def prompt_ids(backend, tools=None) -> list[int]:
    text = backend.tokenizer.apply_chat_template(ASK, tools=tools, add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
    return backend.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_backend_draws_every_sample_under_its_schema(tool_caller):
    """Unconstrained, the tool-calling agent writes prose and <tool_call> blocks; under the
    schema, every sample that ends is JSON the schema accepts (an integer `n`, nothing else),
    and those the limit cut are a prefix of such JSON. Each is its seed's: the same alone or
    beside other prompts, and beside unconstrained ones the samples are unchanged."""
    ids = prompt_ids(tool_caller, TOOLS)
    free = tool_caller.generate([ids], SamplingParams(6, 1.0, 1.0, 48, 0), lambda n: None)[0]
    assert not any(_is_json(tool_caller.decode(s.ids)) for s in free)
    params = SamplingParams(6, 1.0, 1.0, 48, 0, json_schema=json.dumps(ADD))
    alone = tool_caller.generate([ids], params, lambda n: None)[0]
    ended = [json.loads(tool_caller.decode(s.ids)) for s in alone if not s.truncated]
    assert ended, "no constrained sample ended within 48 tokens"
    assert all(set(v) == {"n"} and isinstance(v["n"], int) for v in ended)
    for sample in alone:
        assert tool_caller.decode(sample.ids).lstrip().startswith("{")
    other = prompt_ids(tool_caller)
    together = tool_caller.generate([other, ids], params, lambda n: None, seeds=[9, 0])
    assert together[1] == tool_caller.generate([ids], params, lambda n: None, seeds=[0])[0]
    assert tool_caller.generate([ids], params, lambda n: None)[0] == alone


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_the_openai_client_gets_forced_calls_and_structured_output(tool_caller):
    """Through the endpoint, as vLLM's server answers: "required" is a list of calls
    (finish "tool_calls"), a named function one call of it (finish "stop"), each with no
    content; response_format json_schema is content the schema accepts; the recording keeps
    what constrained each reply."""
    chat, recorder, endpoint = served(tool_caller, max_new_tokens=64)
    with Serving(endpoint.app) as serving:
        client = openai.OpenAI(base_url=serving.base_url, api_key="x", max_retries=0)
        ask = {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": 64}
        required = [client.chat.completions.create(**ask, tool_choice="required")
                    for _ in range(3)]  # fmt: skip
        named = client.chat.completions.create(
            **ask, tool_choice={"type": "function", "function": {"name": "add"}}
        )
        point = client.chat.completions.create(
            model="m", messages=ASK, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": POINT}},
        )  # fmt: skip
    chat.close()
    answered = [r.choices[0] for r in required if r.choices[0].finish_reason != "length"]
    assert answered, "no forced reply ended within 64 tokens"
    for choice in answered:
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert {c.function.name for c in choice.message.tool_calls} <= {"add", "reset"}
        assert choice.message.tool_calls
    if named.choices[0].finish_reason != "length":
        (call,) = named.choices[0].message.tool_calls
        assert named.choices[0].finish_reason == "stop"
        assert call.function.name == "add" and "n" in json.loads(call.function.arguments)
    if point.choices[0].finish_reason != "length":
        assert set(json.loads(point.choices[0].message.content)) == {"x", "y"}
    kinds = sorted(e.kept.constrained for e in recorder.exchanges)
    assert kinds == ["response_format json_schema", "tool_choice function",
                     *["tool_choice required"] * 3]  # fmt: skip


def test_the_responses_api_answers_a_forced_call_and_a_format(tool_caller):
    chat, _, endpoint = served(tool_caller, max_new_tokens=64)
    tools = [{"type": "function", "name": "add", "parameters": ADD}]
    with Serving(endpoint.app) as serving:
        client = openai.OpenAI(base_url=serving.base_url, api_key="x", max_retries=0)
        named = {"type": "function", "name": "add"}
        forced = client.responses.create(model="m", input="add 3", tools=tools, tool_choice=named)
        form = {"format": {"type": "json_schema", "name": "p", "schema": POINT, "strict": True}}
        point = client.responses.create(model="m", input="where", text=form)
    chat.close()
    assert forced.tool_choice.name == "add" and point.text.format.type == "json_schema"
    if forced.status == "completed":
        (call,) = [item for item in forced.output if item.type == "function_call"]
        assert call.name == "add" and "n" in json.loads(call.arguments)
    if point.status == "completed":
        assert set(json.loads(point.output_text)) == {"x", "y"}


HARNESS = """
import openai, sys
client = openai.OpenAI()
client.chat.completions.create(model=sys.argv[1], messages=[{"role": "user", "content": "x"}],
                               response_format={"type": "json_object"})
"""


def test_without_the_grammar_library_a_constrained_request_is_one_line(tmp_path):
    """On a machine without xgrammar, the scan stops in one line naming the extra (exit 2),
    nothing written."""
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    command = f"command:{sys.executable} {harness} {{model}}"
    done = collapsecheck("scan", TOOL_CALLER, "--env", command, "--dump", tmp_path / "dump",
                         code="import sys; sys.modules['xgrammar'] = None; ")  # fmt: skip
    assert done.returncode == 2, done.stderr
    (said,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "pip install 'collapsecheck[grammar]'" in said and "Traceback" not in done.stderr
    assert not (tmp_path / "dump").exists()


def test_a_schema_the_vocabulary_cannot_write_is_one_line():
    """The walker's vocabulary (letters, digits, a few marks) has no '{': no reply can match,
    and sampling stops with that said rather than drawing a token the grammar forbids."""
    walker = TransformersBackend.from_checkpoint(
        EXAMPLES / "agents" / "walker", LoadSettings(device="cpu"), None
    )
    ids = walker.tokenizer("agent 1,2 goal 4,4", add_special_tokens=False)["input_ids"]
    params = SamplingParams(2, 1.0, 1.0, 8, 0, json_schema=json.dumps({"type": "object"}))
    with pytest.raises(CollapsecheckError, match="cannot be written in the checkpoint's vocab"):
        walker.generate([ids], params, lambda n: None)
