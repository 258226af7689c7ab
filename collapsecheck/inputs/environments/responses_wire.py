"""The OpenAI Responses API (`POST /v1/responses`) as vLLM's server serves it (SPEC "Agents
behind an OpenAI client"): a body read into the chat request the endpoint answers (so a turn is
recorded and threaded into episodes by the same rule whichever API asked), and the reply written
back as a response object or as the Responses event stream. A response is stored for the scan,
so a later request may continue it by `previous_response_id`. Plain Python: no model, no
server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from collapsecheck.inputs.environments.openai_wire import (
    CHAT,
    JSON_OBJECT,
    UNSERVED,
    Unservable,
    WireReply,
    WireRequest,
    content_pieces,
    content_text,
    read_message,
    read_request,
    seeded_id,
)

TEXT_PARTS = ("input_text", "output_text", "text")  # the content parts read as text


class ResponsesAPI:
    """The Responses API over the endpoint's chat requests, with the responses of this scan
    kept by id (what `previous_response_id` continues)."""

    def __init__(self) -> None:
        self.stored: dict[str, tuple[dict[str, Any], ...]] = {}

    def read(self, body: Any) -> WireRequest:
        """A Responses body as the chat request it asks for, or `Unservable` saying why not."""
        if not isinstance(body, dict):
            raise Unservable("the request body is not a JSON object")
        refuse_unserved(body)
        earlier = self.earlier(body.get("previous_response_id"))
        items = input_messages(body.get("input"), body.get("instructions"))
        chat = {
            "model": body.get("model"),
            "messages": [*earlier, *items],
            "tools": [chat_tool(t, i) for i, t in enumerate(body.get("tools") or [])],
            "tool_choice": chat_tool_choice(body.get("tool_choice")),
            "parallel_tool_calls": body.get("parallel_tool_calls"),
            "response_format": text_format(body.get("text")),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "max_tokens": body.get("max_output_tokens"),
            "stream": body.get("stream"),
        }
        return read_request(CHAT, {k: v for k, v in chat.items() if v is not None})

    def earlier(self, response_id: Any) -> tuple[dict[str, Any], ...]:
        """The messages a stored response's request held, then its reply."""
        if response_id is None:
            return ()
        if response_id not in self.stored:
            raise Unservable(f"previous_response_id {response_id!r}: no such response in this scan")
        return self.stored[response_id]

    def keep(self, request: WireRequest, reply: WireReply) -> None:
        """The response stored for `previous_response_id`: its messages and its reply."""
        answered = read_message(reply.message(), len(request.messages))
        self.stored[response_id(reply)] = (*request.messages, answered)

    def body(self, request: WireRequest, reply: WireReply) -> dict[str, Any]:
        return response_body(request, reply, "completed")

    def events(self, request: WireRequest, reply: WireReply) -> Iterator[str]:
        return response_events(request, reply)


def refuse_unserved(body: Mapping[str, Any]) -> None:
    """What a Responses body asks that the endpoint cannot serve: refused, never answered
    otherwise than asked."""
    if body.get("background"):
        raise Unservable("background: responses are answered while the request waits")
    if body.get("top_logprobs") or "message.output_text.logprobs" in (body.get("include") or []):
        raise Unservable(UNSERVED["logprobs"])
    if body.get("conversation") is not None:
        raise Unservable("conversation: the endpoint keeps responses, not conversations "
                         "(continue one by previous_response_id)")  # fmt: skip


def text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the chat's `response_format`: a `json_schema` format's `name`,
    `schema` and `strict` (at the format's top) under `json_schema`; `text` and `json_object`
    as they are."""
    form = text.get("format") if isinstance(text, dict) else None
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        return form
    return {"type": "json_schema",
            "json_schema": {k: v for k, v in form.items() if k != "type"}}  # fmt: skip


def chat_tool_choice(choice: Any) -> Any:
    """A Responses `tool_choice` as the chat's: a function named at the top
    (`{"type": "function", "name": ...}`) under `function`; the rest as it is."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def input_messages(given: Any, instructions: Any) -> list[dict[str, Any]]:
    """`instructions` and `input` (a string, or items) as chat messages: message items by
    their role (`developer` as `system`), function calls as an assistant's tool calls (calls in
    a row, and a message before them, one assistant message), their outputs as tool messages."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": str(instructions)})
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list):
        raise Unservable("'input' must be a string or a list of items")
    for index, item in enumerate(given):
        messages = with_item(messages, item, f"input item {index}")
    return messages


def with_item(messages: list[dict[str, Any]], item: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(item, dict):
        raise Unservable(f"{where} is not an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = {"developer": "system"}.get(item.get("role"), item.get("role"))
        return [
            *messages,
            {"role": role, "content": content_text(item.get("content"), where, TEXT_PARTS)},
        ]
    if kind == "function_call":
        function = {"name": item.get("name"), "arguments": item.get("arguments")}
        call = {"id": item.get("call_id"), "type": "function", "function": function}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            return [*messages[:-1], {**last, "tool_calls": [*last.get("tool_calls", []), call]}]
        return [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else content_text(output, where, TEXT_PARTS)
        return [*messages, {"role": "tool", "tool_call_id": item.get("call_id"), "content": text}]
    raise Unservable(f"{where}: a {kind!r} item (messages, function calls and their outputs)")


def chat_tool(tool: Any, index: int) -> dict[str, Any]:
    """A Responses function tool (`name`, `parameters` at its top) as a chat tool."""
    if not (isinstance(tool, dict) and tool.get("type") == "function" and tool.get("name")):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise Unservable(f"tools[{index}]: a {kind!r} tool (function tools only)")
    function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
    return {"type": "function", "function": function}


def response_id(reply: WireReply) -> str:
    return f"resp_{seeded_id(reply.seed, 'response')}"


def output_items(reply: WireReply) -> list[dict[str, Any]]:
    """The reply as output items: its text as one assistant message (where it has any), then
    each tool call as a function call."""
    items: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        items.append(message_item(reply, reply.content))
    for call in reply.tool_calls:
        items.append(call_item(reply, call.id, call.name, call.wire()["function"]["arguments"]))
    return items


def message_item(reply: WireReply, text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"id": f"msg_{seeded_id(reply.seed, 'message')}", "type": "message",
            "status": "completed", "role": "assistant", "content": content}  # fmt: skip


def call_item(reply: WireReply, call: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"fc_{seeded_id(reply.seed, 'item', call)}", "type": "function_call",
            "status": "completed", "call_id": call, "name": name,
            "arguments": arguments}  # fmt: skip


def response_body(request: WireRequest, reply: WireReply, status: str) -> dict[str, Any]:
    """The response object: `completed`, or `incomplete` where the token limit cut the reply;
    `in_progress` with no output (the stream's first event)."""
    done = status != "in_progress"
    cut = done and reply.truncated
    return {
        "id": response_id(reply), "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if cut else status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": request.model, "output": output_items(reply) if done else [],
        "parallel_tool_calls": True, "tool_choice": answered_tool_choice(request),
        "tools": [{"type": "function", **t["function"]} for t in request.tools],
        "temperature": request.temperature, "top_p": request.top_p,
        "max_output_tokens": request.max_tokens, "text": {"format": answered_format(request)},
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}} if done else None,
    }  # fmt: skip


def answered_tool_choice(request: WireRequest) -> Any:
    """The request's `tool_choice` as a response object states it."""
    constrained = request.constrained
    if constrained is not None and constrained.forced:
        named = constrained.function
        return "required" if named is None else {"type": "function", "name": named}
    return "auto" if request.calls else "none"


def answered_format(request: WireRequest) -> dict[str, Any]:
    """The request's `text.format` as a response object states it."""
    constrained = request.constrained
    if constrained is None or constrained.forced:
        return {"type": "text"}
    if constrained.asked == JSON_OBJECT:
        return {"type": "json_object"}
    return {"type": "json_schema", "schema": json.loads(constrained.schema)}


def response_events(request: WireRequest, reply: WireReply) -> Iterator[str]:
    """The Responses event stream: the response created, each output item added, its text a
    delta a token at a time (or its call's arguments), done, then the response completed."""
    events = [("response.created", {"response": response_body(request, reply, "in_progress")})]
    for index, item in enumerate(output_items(reply)):
        events += item_events(reply, item, index)
    events.append(("response.completed", {"response": response_body(request, reply, "completed")}))
    for number, (kind, payload) in enumerate(events):
        data = json.dumps({"type": kind, "sequence_number": number, **payload})
        yield f"event: {kind}\ndata: {data}\n\n"


def item_events(
    reply: WireReply, item: dict[str, Any], index: int
) -> list[tuple[str, dict[str, Any]]]:
    """One output item's events, as OpenAI's stream orders them."""
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        added = {**item, "arguments": "", "status": "in_progress"}
        return [
            ("response.output_item.added", {"output_index": index, "item": added}),
            ("response.function_call_arguments.delta", {**at, "delta": item["arguments"]}),
            ("response.function_call_arguments.done", {**at, "arguments": item["arguments"]}),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]  # fmt: skip
    text = item["content"][0]["text"]
    part = {"type": "output_text", "text": "", "annotations": []}
    pieces = content_pieces(reply) if text else []
    return [
        ("response.output_item.added", {"output_index": index,
                                        "item": {**item, "status": "in_progress", "content": []}}),
        ("response.content_part.added", {**at, "content_index": 0, "part": part}),
        *(("response.output_text.delta", {**at, "content_index": 0, "delta": piece})
          for piece in pieces),
        ("response.output_text.done", {**at, "content_index": 0, "text": text}),
        ("response.content_part.done", {**at, "content_index": 0, "part": {**part, "text": text}}),
        ("response.output_item.done", {"output_index": index, "item": item}),
    ]  # fmt: skip
