"""The OpenAI wire format the endpoint speaks (SPEC "Agents behind an OpenAI client"): a
request's body read into a `WireRequest` (chat messages or a text prompt, tools, the sampling
it asks for) or refused with the reason an OpenAI-style error carries, and a `WireReply` written
back as a chat completion, a text completion, or the server-sent events vLLM's server streams.
Plain Python: no model, no server."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHAT, TEXT = "chat", "text"  # /v1/chat/completions, /v1/completions


class Unservable(Exception):
    """A request the endpoint cannot serve: answered with an OpenAI-style error (HTTP 400)
    whose message is this exception's, and named by the scan."""


@dataclass(frozen=True)
class WireRequest:
    """One request as the endpoint serves it. `messages` (chat: each message's content as
    text, an assistant's tool calls with their arguments as objects, as chat templates read
    them) or `prompt` (text); `tools`: the request's, as the template is given them;
    `temperature`, `top_p`, `max_tokens`: None where the request leaves them to the server;
    `calls`: whether tool calls are read out of the reply (False: `tool_choice` "none");
    `stop`: the strings the reply ends before (`runs.serving.at_stop`); `constrained`: the
    JSON schema the reply is sampled under, where `response_format` or a forced `tool_choice`
    asks one."""

    kind: str
    model: str
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    calls: bool = True
    stop: tuple[str, ...] = ()
    constrained: Constrained | None = None


@dataclass(frozen=True)
class Constrained:
    """What a request constrains its reply to (SPEC "Agents behind an OpenAI client",
    "Constrained replies"): the JSON schema it is sampled under (as text), what asked it (such
    as "response_format json_schema"), and for a forced tool choice which call the reply is
    read as: `forced` with `function` the function named (None: "required", a list of calls
    to any of the tools)."""

    schema: str
    asked: str
    forced: bool = False
    function: str | None = None


@dataclass(frozen=True)
class ToolCall:
    """A tool call parsed from a reply: its function's name and arguments (an object)."""

    name: str
    arguments: Mapping[str, Any]
    id: str  # `call_id`: derived from the request's seed, so a rerun records the same

    def wire(self) -> dict[str, Any]:
        arguments = json.dumps(dict(self.arguments))
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": arguments}}  # fmt: skip


@dataclass(frozen=True)
class WireReply:
    """What the model answered: the reply's text as sampled, its content (the text without
    the tool calls parsed out of it), the tool calls, whether the token limit cut it, the
    prompt's and the reply's lengths in tokens, and (for a stream) the reply's text token by
    token."""

    text: str
    content: str
    tool_calls: tuple[ToolCall, ...]
    truncated: bool
    prompt_tokens: int
    completion_tokens: int
    seed: int  # the request's: its ids are made from it (`seeded_id`)
    pieces: tuple[str, ...] = ()
    named: bool = False  # its call was forced by name: finished "stop", as vLLM's server says

    @property
    def finish_reason(self) -> str:
        if self.truncated:
            return "length"
        return "tool_calls" if self.tool_calls and not self.named else "stop"

    def message(self) -> dict[str, Any]:
        """The reply as an assistant message of the chat completion."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.wire() for call in self.tool_calls]
        return message

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}  # fmt: skip


def read_request(kind: str, body: Any) -> WireRequest:
    """A request's JSON body as the endpoint serves it, or `Unservable` saying why not."""
    if not isinstance(body, dict):
        raise Unservable("the request body is not a JSON object")
    choices = body.get("n", 1)
    if choices not in (1, None):
        raise Unservable(f"n={choices}: the endpoint answers one choice a request (n=1)")
    refuse_unserved(body)
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    options = stream_options(body)
    common = {
        "model": str(body.get("model") or ""),
        "temperature": number(body, "temperature"),
        "top_p": number(body, "top_p"),
        "max_tokens": None if limit is None else positive(limit, "max_tokens"),
        "stream": bool(body.get("stream")),
        "include_usage": bool(options.get("include_usage")),
        "stop": stop_strings(body.get("stop")),
    }
    if kind == TEXT:
        formatted = response_format(body.get("response_format"))
        return WireRequest(TEXT, prompt=text_prompt(body.get("prompt")), constrained=formatted,
                           **common)  # fmt: skip
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Unservable("'messages' must be a non-empty list of messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(is_function_tool(t) for t in tools):
        raise Unservable("'tools' must be a list of {'type': 'function', 'function': {...}}")
    choice = body.get("tool_choice") or "auto"
    forced = forced_call(choice, tools, body.get("parallel_tool_calls"))
    formatted = response_format(body.get("response_format"))
    if forced and formatted:
        raise Unservable(f"response_format with tool_choice {json.dumps(choice)}: a reply is "
                         "either the forced call or the format, not both")  # fmt: skip
    read = tuple(read_message(m, i) for i, m in enumerate(messages))
    return WireRequest(CHAT, messages=read, tools=tuple(tools), calls=choice != "none",
                       constrained=forced or formatted, **common)  # fmt: skip


JSON_OBJECT = "response_format json_object"  # what asked a reply that is any JSON object


def response_format(value: Any) -> Constrained | None:
    """`response_format` as vLLM's server reads it: `text` (or none) leaves the reply free;
    `json_object` samples it under the schema {"type": "object"}; `json_schema` under its
    `json_schema.schema`."""
    kind = value.get("type") if isinstance(value, dict) else value
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return Constrained(canonical({"type": "object"}), JSON_OBJECT)
    if kind == "json_schema":
        given = value.get("json_schema")
        schema = given.get("schema") if isinstance(given, dict) else None
        if not isinstance(schema, dict):
            raise Unservable("response_format json_schema: 'json_schema.schema' must be a "
                             "JSON schema (an object)")  # fmt: skip
        return Constrained(canonical(schema), "response_format json_schema")
    raise Unservable(f"response_format {json.dumps(kind)}: the endpoint serves 'text', "
                     "'json_object' and 'json_schema'")  # fmt: skip


def forced_call(choice: Any, tools: list[Any], parallel: Any) -> Constrained | None:
    """A `tool_choice` that forces a call, as vLLM's server serves it with JSON (its
    `get_json_schema_from_tools`): "required" samples the reply as a JSON list of at least one
    `{"name", "parameters"}` object, one of the tools each (at most one where
    `parallel_tool_calls` is false); a named function samples the reply as that function's
    arguments (an object, under its `parameters`). "auto" and "none" force nothing."""
    if choice in ("auto", "none"):
        return None
    named = choice.get("function") if isinstance(choice, dict) else None
    if choice == "required" or isinstance(named, dict):
        if not tools:
            raise Unservable(f"tool_choice {json.dumps(choice)} without 'tools'")
        if choice == "required":
            return Constrained(canonical(calls_schema(tools, parallel is False)),
                               "tool_choice required", forced=True)  # fmt: skip
        functions = {t["function"]["name"]: t["function"] for t in tools}
        name = named.get("name")
        if name not in functions:
            raise Unservable(f"tool_choice names {name!r}, which is not one of 'tools'")
        return Constrained(canonical(parameters_schema(functions[name])),
                           "tool_choice function", forced=True, function=name)  # fmt: skip
    raise Unservable(f"tool_choice {json.dumps(choice)}: the endpoint serves 'auto', 'none', "
                     "'required' and {'type': 'function', 'function': {'name': ...}}")  # fmt: skip


def parameters_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """A function's `parameters`; an object with no properties where it has none."""
    return function.get("parameters") or {"type": "object", "properties": {}}


def calls_schema(tools: Sequence[Mapping[str, Any]], single: bool) -> dict[str, Any]:
    """The JSON schema of a forced list of calls: vLLM's, with each tool's `$defs` gathered
    at the top."""
    functions = [t["function"] for t in tools]
    defs: dict[str, Any] = {}
    options = []
    for function in functions:
        parameters = dict(parameters_schema(function))
        for name, schema in (parameters.pop("$defs", None) or {}).items():
            if defs.setdefault(name, schema) != schema:
                raise Unservable(f"tool_choice required: the tools define '$defs' {name!r} "
                                 "twice, differently")  # fmt: skip
        options.append({"properties": {"name": {"type": "string", "enum": [function["name"]]},
                                       "parameters": parameters},
                        "required": ["name", "parameters"]})  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": options}}  # fmt: skip
    if single:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def canonical(value: Any) -> str:
    """JSON text with its keys sorted: a schema's one spelling (the sampler groups by it)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


UNSERVED = {
    "logprobs": "log-probabilities are not returned (the scan scores the replies itself)",
    "top_logprobs": "log-probabilities are not returned (the scan scores the replies itself)",
    "echo": "the prompt is not echoed",
    "best_of": "one sample a request",
}


def refuse_unserved(body: Mapping[str, Any]) -> None:
    """A request asking what the endpoint does not do, refused rather than answered otherwise
    than it asked (a falsy value asks nothing)."""
    for key, why in UNSERVED.items():
        value = body.get(key)
        if value and not (key == "best_of" and value == 1):
            raise Unservable(f"'{key}': {why}")


def stop_strings(value: Any) -> tuple[str, ...]:
    """`stop`: a string or a list of strings (empty ones ask nothing)."""
    if value is None:
        return ()
    given = [value] if isinstance(value, str) else value
    if not isinstance(given, list) or not all(isinstance(v, str) for v in given):
        raise Unservable("'stop' must be a string or a list of strings")
    return tuple(v for v in given if v)


def stream_options(body: Mapping[str, Any]) -> Mapping[str, Any]:
    options = body.get("stream_options") or {}
    return options if isinstance(options, dict) else {}


def number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Unservable(f"'{key}' must be a number of at least 0, got {value!r}")
    return float(value)


def positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Unservable(f"'{key}' must be a whole number of at least 1, got {value!r}")
    return value


def text_prompt(prompt: Any) -> str:
    """A text completion's prompt: a string, or a list holding one."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise Unservable("'prompt' must be one non-empty string (one prompt a request)")
    return prompt


def is_function_tool(tool: Any) -> bool:
    return (
        isinstance(tool, dict) and tool.get("type", "function") == "function"
        and isinstance(tool.get("function"), dict) and isinstance(tool["function"].get("name"), str)
    )  # fmt: skip


def read_message(message: Any, index: int) -> dict[str, Any]:
    """One message as a chat template reads it: its content as text (text parts joined), an
    assistant's tool calls with their arguments parsed, a tool message's call id kept."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise Unservable(f"{where} is not a message with a 'role'")
    read: dict[str, Any] = {"role": message["role"],
                            "content": content_text(message.get("content"), where)}  # fmt: skip
    calls = message.get("tool_calls")
    if calls:
        read["tool_calls"] = [read_tool_call(c, f"{where}.tool_calls[{i}]")
                              for i, c in enumerate(calls)]  # fmt: skip
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            read[key] = message[key]
    return read


def content_text(content: Any, where: str, parts: Sequence[str] = ("text",)) -> str:
    """A message's content as text: a string, or text parts (of the types `parts` names)
    joined (no images)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in parts):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Unservable(f"{where}: a {kind!r} content part (text parts only)")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise Unservable(f"{where}: content must be text or a list of text parts")


def read_tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise Unservable(f"{where} is not a function call")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise Unservable(f"{where}: its arguments are not JSON") from None
    read = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        read["id"] = call["id"]
    return read


def error_body(message: str) -> dict[str, Any]:
    """An OpenAI-style error."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": None}}  # fmt: skip


def completion_body(request: WireRequest, reply: WireReply) -> dict[str, Any]:
    """The whole answer: a chat completion, or a text completion."""
    head = answer_head(request, reply)
    if request.kind == TEXT:
        choice: dict[str, Any] = {"index": 0, "text": reply.text, "logprobs": None,
                                  "finish_reason": reply.finish_reason}  # fmt: skip
    else:
        choice = {"index": 0, "message": reply.message(), "logprobs": None,
                  "finish_reason": reply.finish_reason}  # fmt: skip
    return {**head, "choices": [choice], "usage": reply.usage()}


def seeded_id(seed: int, *parts: object, length: int = 32) -> str:
    """An id made from a request's seed (and what else tells its objects apart): the same
    request of the same scan gets the same ids, so a rerun's recording is the same."""
    return hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).hexdigest()[:length]


def call_id(seed: int, index: int) -> str:
    """The id of the `index`-th tool call of the reply to a request seeded by `seed`."""
    return f"call_{seeded_id(seed, 'call', index, length=24)}"


def answer_head(request: WireRequest, reply: WireReply, chunk: bool = False) -> dict[str, Any]:
    chat = request.kind == CHAT
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    prefix = "chatcmpl" if chat else "cmpl"
    return {"id": f"{prefix}-{seeded_id(reply.seed)}", "object": kind,
            "created": int(time.time()), "model": request.model}  # fmt: skip


def stream_events(request: WireRequest, reply: WireReply) -> Iterator[str]:
    """The answer as server-sent events, as vLLM's server sends them: (chat) the role first,
    then a delta per token, the tool calls, the finish reason, the usage where asked, [DONE]."""
    head = answer_head(request, reply, chunk=True)
    for choice in streamed_choices(request, reply):
        yield event({**head, "choices": [choice]})
    if request.include_usage:
        yield event({**head, "choices": [], "usage": reply.usage()})
    yield "data: [DONE]\n\n"


def streamed_choices(request: WireRequest, reply: WireReply) -> Iterator[dict[str, Any]]:
    if request.kind == TEXT:
        for piece in reply.pieces or (reply.text,):
            yield {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
        yield {"index": 0, "text": "", "logprobs": None, "finish_reason": reply.finish_reason}
        return
    yield {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    for piece in content_pieces(reply):
        yield {"index": 0, "delta": {"content": piece}, "finish_reason": None}
    for index, call in enumerate(reply.tool_calls):
        yield {"index": 0, "delta": {"tool_calls": [{"index": index, **call.wire()}]},
               "finish_reason": None}  # fmt: skip
    yield {"index": 0, "delta": {}, "finish_reason": reply.finish_reason}


def content_pieces(reply: WireReply) -> Sequence[str]:
    """The content a token at a time where it is the reply's whole text; in one piece where
    tool calls were parsed out of it."""
    if reply.content == reply.text and reply.pieces:
        return [piece for piece in reply.pieces if piece]
    return [reply.content] if reply.content else []


def event(payload: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                        "owned_by": "collapsecheck"}]}  # fmt: skip
