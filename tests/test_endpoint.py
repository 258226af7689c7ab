"""collapsecheck's own OpenAI-compatible endpoint (SPEC "Agents behind an OpenAI client"): the
real `openai` client (sync, async, streaming) against the app served by uvicorn and in process,
answered by the walker checkpoint through the transformers backend; refusals as OpenAI errors;
tool calls read in the template's format; the recording threaded into episodes."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from collapsecheck.engines.backends.hf import TransformersBackend
from collapsecheck.inputs.environments.conversations import assemble
from collapsecheck.inputs.environments.endpoint import (
    Endpoint,
    Exchange,
    InProcess,
    Recorder,
    Serving,
    endpoint_app,
)
from collapsecheck.inputs.environments.openai_wire import (
    CHAT,
    TEXT,
    ToolCall,
    Unservable,
    WireReply,
    WireRequest,
    call_id,
    read_request,
)
from collapsecheck.inputs.environments.responses_wire import ResponsesAPI, response_id
from collapsecheck.inputs.environments.tool_calls import parsed_reply, require_tool_format
from collapsecheck.runs.serving import BackendChat, request_seed
from collapsecheck.settings import LoadSettings, SamplingSettings, Settings
from tests.conftest import EXAMPLES
from tests.test_env_trl_tools import call, qwen3_tokenizer

WALKER = EXAMPLES / "agents" / "walker"
ASK = [{"role": "user", "content": "agent 1,2 goal 4,4"}]


@pytest.fixture(scope="module")
def walker():
    return TransformersBackend.from_checkpoint(WALKER, LoadSettings(device="cpu"), None)


def served(walker, **sampling) -> tuple[BackendChat, Recorder, Endpoint]:
    settings = Settings(sampling=SamplingSettings(**{"max_new_tokens": 40, **sampling}))
    chat = BackendChat(walker, settings, "walker", "--env test")
    recorder = Recorder()
    return chat, recorder, Endpoint(endpoint_app(chat, recorder), recorder, "walker")


def test_the_openai_client_is_answered_by_the_seeded_backend(walker):
    """Sync and async clients, whole and streamed: a reply is the backend's sample at the seed
    of its context and repeat count, the stream's pieces join to the whole reply, the usage
    counts its tokens; a second identical request is the context's next repeat."""
    chat, recorder, endpoint = served(walker)
    with Serving(endpoint.app) as serving:
        client = openai.OpenAI(base_url=serving.base_url, api_key="x")
        assert [m.id for m in client.models.list().data] == ["walker"]
        first = client.chat.completions.create(model="walker", messages=ASK, max_tokens=40)
        stream = client.chat.completions.create(
            model="walker", messages=ASK, max_tokens=40, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert first.choices[0].finish_reason in ("stop", "length")
    exchanges = sorted(recorder.exchanges, key=lambda e: e.number)
    assert [e.reply.text for e in exchanges] == [first.choices[0].message.content, text]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == len(exchanges[1].kept.sample.ids)
    ids = exchanges[0].kept.rendered.ids
    seeds = [request_seed(0, ids, 0), request_seed(0, ids, 1)]
    direct = walker.generate([ids, ids], chat.params(exchanges[0].request, len(ids)),
                             lambda n: None, seeds=seeds)  # fmt: skip
    assert [walker.decode(s[0].ids) for s in direct] == [e.reply.text for e in exchanges]
    chat.close()


def test_the_async_client_in_process_and_text_completions(walker):
    """The same app reached with no socket (httpx's ASGI transport), as verifiers' adapter
    reaches it; /v1/completions reads its prompt as text."""
    chat, recorder, endpoint = served(walker)
    client = InProcess(endpoint.app).async_client("episode-1")

    async def ask():
        whole = await client.chat.completions.create(model="m", messages=ASK, max_tokens=40)
        text = await client.completions.create(model="m", prompt="agent 1,2", max_tokens=5)
        return whole, text

    whole, text = asyncio.run(ask())
    chat.close()
    assert [e.episode for e in recorder.exchanges] == ["episode-1", "episode-1"]
    assert whole.choices[0].message.content == recorder.exchanges[0].reply.text
    assert text.choices[0].text == recorder.exchanges[1].reply.text
    assert recorder.exchanges[1].kept.rendered.text == "agent 1,2"
    assert len(recorder.exchanges[1].kept.sample.ids) <= 5


def test_a_request_it_cannot_serve_is_an_openai_error_and_recorded(walker):
    chat, recorder, endpoint = served(walker)
    with Serving(endpoint.app) as serving:
        client = openai.OpenAI(base_url=serving.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="one choice a request"):
            client.chat.completions.create(model="m", messages=ASK, n=2)
        tool = {"type": "function", "function": {"name": "move", "parameters": {}}}
        with pytest.raises(openai.BadRequestError, match="renders none"):
            client.chat.completions.create(model="m", messages=ASK, tools=[tool])
    chat.close()
    assert not recorder.exchanges
    assert "request 0 (/v1/chat/completions): n=2" in recorder.refused()
    assert recorder.refused().startswith("the endpoint refused 2 requests")


def test_the_token_limit_and_temperature_stay_within_the_scans(walker):
    chat, _, _ = served(walker)
    asked = WireRequest(CHAT, "m", tuple(ASK), temperature=0.5, max_tokens=500)
    params = chat.params(asked, 10)
    assert (params.max_new_tokens, params.temperature) == (40, 0.5)
    fixed, _, _ = served(walker, temperature=1.0)
    assert fixed.params(asked, 10).temperature == 1.0  # --temperature given samples every reply
    with pytest.raises(Unservable, match="the context has 2040 tokens"):
        chat.params(asked, 2040)


def test_requests_are_read_as_chat_templates_read_them():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    called = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": parts},
            {"role": "assistant", "content": None, "tool_calls": [called]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        ],
        "max_completion_tokens": 7, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    request = read_request(CHAT, body)
    assert request.messages[0]["content"] == "ab"
    assert request.messages[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert request.messages[2]["tool_call_id"] == "c1"
    assert (request.max_tokens, request.stream, request.include_usage) == (7, True, True)
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    refused = [
        ({"messages": []}, "non-empty list"),
        ({"messages": [image]}, "'image_url'"),
        ({"messages": ASK, "max_tokens": 0}, "at least 1"),
        ({"messages": ASK, "stop": [1]}, "'stop' must be a string or a list of strings"),
        ({"messages": ASK, "logprobs": True}, "'logprobs'"),
        ({"messages": ASK, "tool_choice": "required"}, "without 'tools'"),
        ({"messages": ASK, "tool_choice": "any"}, "serves 'auto', 'none', 'required'"),
        ({"messages": ASK, "response_format": {"type": "json_schema"}}, "json_schema.schema"),
        ({"messages": ASK, "response_format": {"type": "yaml"}}, "serves 'text', 'json_object'"),
    ]
    for bad, why in refused:
        with pytest.raises(Unservable, match=why):
            read_request(CHAT, bad)
    assert read_request(TEXT, {"prompt": ["one"]}).prompt == "one"
    assert read_request(CHAT, {"messages": ASK, "stop": None, "logprobs": False}).calls
    assert not read_request(CHAT, {"messages": ASK, "tool_choice": "none"}).calls


def test_tool_calls_are_read_in_the_templates_format():
    """Hermes <tool_call> blocks (Qwen's template) become OpenAI tool calls, the rest of the
    reply the content; a block that is not JSON stays in the content; a template that renders
    no tools refuses a request with tools."""
    tokenizer = qwen3_tokenizer()
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    found = require_tool_format(tokenizer, tools)
    assert found == "hermes"
    text = "<think>add two</think>\n" + call("add", n=2) + "\n" + call("add", n=3)
    content, calls = parsed_reply(text, found, tokenizer, 7)
    assert content == "<think>add two</think>"
    assert [(c.name, dict(c.arguments)) for c in calls] == [("add", {"n": 2}), ("add", {"n": 3})]
    # ids made from the request's seed: a rerun's replies carry the same, each call its own
    assert [c.id for c in calls] == [call_id(7, 0), call_id(7, 1)]
    assert len({c.id for c in calls}) == 2 and calls[0].id != call_id(8, 0)
    assert parsed_reply(text, found, tokenizer, 7) == (content, calls)
    broken = "<tool_call>\nnot json\n</tool_call>"
    assert parsed_reply(broken, found, tokenizer, 7) == (broken, ())
    assert parsed_reply(text, None, tokenizer, 7) == (text, ())
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(Unservable, match="renders none"):
        require_tool_format(tokenizer, tools)


def exchange(number, messages, reply, episode=None, calls=()):
    request = WireRequest(CHAT, "m", tuple(messages))
    answer = WireReply(reply, reply if not calls else "", tuple(calls), False, 1, 1, 0)
    return Exchange(number, request, answer, episode, None)


def user(text):
    return {"role": "user", "content": text}


def test_requests_continue_the_episode_whose_reply_they_carry():
    """A request with an earlier request's messages, its reply and more continues that episode
    (whitespace and tool-call ids as the harness wrote them back); others start episodes; two
    identical episodes each keep their own continuation; a request continuing a turn already
    continued branches off it with the turns before it; named requests go by their names."""
    call_reply = ToolCall("add", {"n": 1}, id="call_a")
    written_back = {"id": "other", "type": "function",
                    "function": {"name": "add", "arguments": {"n": 1}}}  # fmt: skip
    recorded = [
        exchange(0, [user("s1")], "r1"),
        exchange(1, [user("s1")], "r1"),  # the same start, the same reply
        exchange(2, [user("s1"), {"role": "assistant", "content": " r1 "}, user("o1")], "r2"),
        exchange(3, [user("s1"), {"role": "assistant", "content": "r1"}, user("o1b")], "r2b"),
        exchange(4, [user("s2")], "", calls=[call_reply]),
        exchange(5, [user("s2"), {"role": "assistant", "content": None,
                                  "tool_calls": [written_back]},
                     {"role": "tool", "tool_call_id": "other", "content": "1"}], "done"),
        exchange(6, [user("s1"), {"role": "assistant", "content": "r1"}, user("o1c")], "r2c"),
        exchange(7, [user("s3")], "x", episode="e"),
        exchange(8, [user("unrelated")], "y", episode="e"),
    ]  # fmt: skip
    conversations = assemble(list(reversed(recorded)))
    numbers = sorted([e.number for e in c.exchanges] for c in conversations)
    assert numbers == [[0, 2], [0, 6], [1, 3], [4, 5], [7, 8]]
    forked = [c for c in conversations if c.forked]
    assert [[e.number for e in c.exchanges] for c in forked] == [[0, 6]]
    tool_episode = next(c for c in conversations if c.exchanges[0].number == 4)
    (_, state1, returned1), (_, state2, returned2) = tool_episode.turns()
    assert (state1, state2) == ("s2", "1")
    assert returned1 == ({"role": "tool", "tool_call_id": "other", "content": "1"},)
    assert returned2 == ()


def test_text_completions_continue_by_their_prompts():
    def text(number, prompt, reply):
        return Exchange(number, WireRequest(TEXT, "m", prompt=prompt),
                        WireReply(reply, reply, (), False, 1, 1, 0), None, None)  # fmt: skip

    conversations = assemble([text(0, "A:", " b"), text(1, "A: b\nC:", " d"), text(2, "E:", "f")])
    assert sorted(len(c.exchanges) for c in conversations) == [1, 2]
    two = next(c for c in conversations if len(c.exchanges) == 2)
    assert [state for _, state, _ in two.turns()] == ["A:", "\nC:"]
    assert two.turns()[0][2] == ({"role": "user", "content": "\nC:"},)


def test_a_seed_depends_on_the_context_and_its_repeat_alone():
    assert request_seed(0, (1, 2, 3), 0) == request_seed(0, [1, 2, 3], 0)
    assert len({request_seed(0, (1, 2, 3), 0), request_seed(0, (1, 2, 3), 1),
                request_seed(1, (1, 2, 3), 0), request_seed(0, (1, 2), 0)}) == 4  # fmt: skip


def test_a_streamed_tool_call_arrives_as_openai_deltas():
    from collapsecheck.inputs.environments.openai_wire import stream_events

    reply = WireReply("x <tool_call>", "x", (ToolCall("f", {"a": 1}, id="c"),), False, 3, 2, 0)
    request = WireRequest(CHAT, "m", tuple(ASK), stream=True)
    payloads = [json.loads(e[6:]) for e in stream_events(request, reply) if "[DONE]" not in e]
    deltas = [p["choices"][0]["delta"] for p in payloads]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"content": "x"}
    assert deltas[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert payloads[-1]["choices"][0]["finish_reason"] == "tool_calls"


def assistant(text):
    return {"role": "assistant", "content": text}


def test_a_harness_that_rewrites_its_history_still_threads_its_episodes():
    """SPEC "Agents behind an OpenAI client": a request continues the earlier one whose
    messages it begins with, followed by an assistant message, even where the harness
    rewrote the reply (smolagents' CodeAgent appends "</code>"; its ToolCallingAgent sends
    its calls back as text and the results as user messages); among twins of one start, the
    episode whose reply is closest to what was sent back; the turn keeps the model's own
    reply, and what the harness sent back is the next turn's context."""
    call_reply = ToolCall("add", {"n": 1}, id="call_a")
    recorded = [
        exchange(0, [user("task")], "Thought: add one\nCode:\n```py\nadd(1)\n```"),
        exchange(1, [user("task")], "Thought: add two\nCode:\n```py\nadd(2)\n```"),
        exchange(2, [user("task")], "", calls=[call_reply]),
        exchange(3, [user("task"), assistant("Thought: add two\nCode:\n```py\nadd(2)\n```</code>"),
                     user("Observation: 5")], "Final 5"),
        exchange(4, [user("task"), assistant("Thought: add one\nCode:\n```py\nadd(1)\n```</code>"),
                     user("Observation: 4")], "Final 4"),
        exchange(5, [user("task"), assistant("Calling tools:\n[{'name': 'add', 'arguments': "
                                             "{'n': 1}}]"), user("Observation: 4")], "Final"),
    ]  # fmt: skip
    conversations = assemble(recorded)
    numbers = sorted([e.number for e in c.exchanges] for c in conversations)
    assert numbers == [[0, 4], [1, 3], [2, 5]]
    assert not any(c.forked for c in conversations)
    first = next(c for c in conversations if c.exchanges[0].number == 0)
    (turn, state, returned), (_, next_state, _) = first.turns()
    assert turn.reply.text.endswith("```")  # the model's own reply, not the rewritten one
    assert (state, next_state) == ("task", "Observation: 4")
    assert returned == (user("Observation: 4"),)


def test_the_responses_api_is_answered_whole_streamed_and_continued(walker):
    """SPEC "Agents behind an OpenAI client": the openai client's `responses.create` (the
    OpenAI Agents SDK's default model speaks it), whole and streamed: `instructions` and
    `input` are the chat a chat completion would send (the same context, so the same seed
    rule), the reply is the response's text and its stream's deltas, and
    `previous_response_id` continues a stored response: one episode with the chat's rule."""
    chat, recorder, endpoint = served(walker)
    with Serving(endpoint.app) as serving:
        client = openai.OpenAI(base_url=serving.base_url, api_key="x", max_retries=0)
        asked = {"model": "walker", "instructions": "Walk to the goal.",
                 "input": "agent 1,2 goal 4,4", "max_output_tokens": 40}  # fmt: skip
        first = client.responses.create(**asked)
        events = list(client.responses.create(
            model="walker", previous_response_id=first.id, max_output_tokens=40, stream=True,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "agent 2,2"}]}],
        ))  # fmt: skip
        again = client.responses.create(**asked)
    chat.close()
    exchanges = sorted(recorder.exchanges, key=lambda e: e.number)
    assert exchanges[0].request.messages == (
        {"role": "system", "content": "Walk to the goal."},
        {"role": "user", "content": "agent 1,2 goal 4,4"},
    )
    assert first.output_text == exchanges[0].reply.text and first.status in (
        "completed",
        "incomplete",
    )
    assert first.usage.output_tokens == len(exchanges[0].kept.sample.ids)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == exchanges[1].reply.text == events[-1].response.output_text
    assert exchanges[1].request.messages == (
        *exchanges[0].request.messages,
        {"role": "assistant", "content": exchanges[0].reply.text},
        {"role": "user", "content": "agent 2,2"},
    )
    assert [len(c.exchanges) for c in assemble(exchanges)] == [2, 1]
    # the same context again is its next repeat: another seed, another id
    assert again.id != first.id
    ids = exchanges[0].kept.rendered.ids
    assert exchanges[2].kept.rendered.ids == ids


def test_responses_function_calls_and_their_outputs_are_the_chats_tool_calls():
    """A function_call item is an assistant's tool call (calls in a row one message), its
    output a tool message; a reply's calls are function_call items with their seeded ids."""
    api = ResponsesAPI()
    request = api.read({
        "model": "m", "input": [
            {"role": "user", "content": "add"},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"n": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"n": 2}'},
            {"type": "function_call_output", "call_id": "c1", "output": "total 1"},
            {"type": "function_call_output", "call_id": "c2", "output": "total 3"},
        ],
        "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}],
    })  # fmt: skip
    assert [m["role"] for m in request.messages] == ["user", "assistant", "tool", "tool"]
    calls = request.messages[1]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [
        ("c1", {"n": 1}),
        ("c2", {"n": 2}),
    ]
    assert request.tools == ({"type": "function", "function": {
        "name": "add", "parameters": {"type": "object"}}},)  # fmt: skip
    reply = WireReply("x", "", (ToolCall("add", {"n": 4}, call_id(3, 0)),), False, 5, 2, 3)
    (item,) = api.body(request, reply)["output"]
    assert (item["type"], item["call_id"], item["name"]) == ("function_call", call_id(3, 0), "add")
    assert json.loads(item["arguments"]) == {"n": 4}
    api.keep(request, reply)
    continued = api.read(
        {
            "model": "m",
            "previous_response_id": response_id(reply),
            "input": [
                {"type": "function_call_output", "call_id": call_id(3, 0), "output": "total 7"}
            ],
        }
    )
    assert continued.messages[:4] == request.messages
    assert continued.messages[4]["tool_calls"][0]["function"]["arguments"] == {"n": 4}
    assert continued.messages[5] == {"role": "tool", "tool_call_id": call_id(3, 0),
                                     "content": "total 7"}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "json_schema.schema"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "function tools only"),
        ({"input": "x", "tool_choice": "required"}, "without 'tools'"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "a 'reasoning' item"),
        ({"input": "x", "previous_response_id": "resp_nope"}, "no such response"),
        ({"input": "x", "top_logprobs": 2}, "log-probabilities are not returned"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "log-probabilities"),
    ],
)
def test_what_the_responses_api_cannot_serve_is_refused(body, said):
    with pytest.raises(Unservable, match=said):
        ResponsesAPI().read({"model": "m", **body})


def test_a_route_it_does_not_serve_is_a_404_naming_it(walker):
    chat, recorder, endpoint = served(walker)
    with Serving(endpoint.app) as serving:
        answer = httpx.post(f"{serving.base_url}/embeddings", json={"input": "x"})
    chat.close()
    assert answer.status_code == 404
    assert "POST /v1/embeddings: the endpoint serves" in answer.json()["error"]["message"]
    assert "/v1/responses" in recorder.refused()


def test_stop_strings_end_the_reply_as_vllm_ends_it(walker):
    """SPEC "Agents behind an OpenAI client": a request's `stop` strings end its reply before
    the first one the sampled text completes (left out), finish "stop"; the recorded sample is
    the tokens before it: the reply the same request draws without them, cut (sampling past
    the stop changes none of the tokens before it)."""
    replies, recorded = [], []
    for stop in (None, "x"):  # two scans' endpoints: the same request, the same seed
        chat, recorder, endpoint = served(walker)
        with Serving(endpoint.app) as serving:
            client = openai.OpenAI(base_url=serving.base_url, api_key="x", max_retries=0)
            if stop is not None:  # three characters from the middle of the whole reply
                full = replies[0].choices[0].message.content
                stop = [full[len(full) // 2 : len(full) // 2 + 3], "never written"]
            replies.append(client.chat.completions.create(model="m", messages=ASK,
                                                          max_tokens=40, stop=stop))  # fmt: skip
        chat.close()
        recorded.append(recorder.exchanges[0])
    full, text = (r.choices[0].message.content for r in replies)
    assert replies[1].choices[0].finish_reason == "stop"
    assert full.startswith(text) and stop[0] not in text and full.index(stop[0]) == len(text)
    drawn = walker.decode(recorded[1].kept.sample.ids)
    assert recorded[1].reply.text == text and not recorded[1].kept.sample.truncated
    assert recorded[0].kept.sample.ids[: len(recorded[1].kept.sample.ids)] == (
        recorded[1].kept.sample.ids
    )
    assert text.startswith(drawn) and len(text) - len(drawn) <= 3  # short of a token at most


def test_the_stop_string_completed_first_ends_the_reply():
    from collapsecheck.inputs.samples import Sample
    from collapsecheck.runs.serving import at_stop

    def decode(ids):
        return "".join(chr(96 + i) for i in ids)  # 1 -> "a", 2 -> "b", ...

    sample = Sample((1, 2, 3, 4, 5, 6), truncated=True)  # "abcdef"
    assert at_stop(sample, ("abcdef", "cd"), decode) == (Sample((1, 2), False), "ab")
    assert at_stop(sample, ("e",), decode) == (Sample((1, 2, 3, 4), False), "abcd")
    assert at_stop(sample, ("zz",), decode) == (sample, "abcdef")
    assert at_stop(sample, (), decode) == (sample, "abcdef")
