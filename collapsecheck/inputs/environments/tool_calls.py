"""Tool calls read out of a reply in the format the checkpoint's chat template writes them
(SPEC "Agents behind an OpenAI client"): the tokenizer's own `response_schema` where it has one
(transformers' `parse_response`), else the `<tool_call>{"name": ..., "arguments": ...}
</tool_call>` blocks of Hermes-style templates (Qwen2.5, Qwen3, Hermes), which is what vLLM's
`hermes` parser reads. A request with tools to a template that writes neither is refused."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from collapsecheck.inputs.environments.openai_wire import (
    Constrained,
    ToolCall,
    Unservable,
    call_id,
)

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
HERMES_OPEN = "<tool_call>"


def tool_format(tokenizer: Any) -> str | None:
    """How the checkpoint's template writes a tool call: "schema" (its tokenizer's
    `response_schema`), "hermes", or None (no format the endpoint reads)."""
    if getattr(tokenizer, "response_schema", None):
        return "schema"
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    return "hermes" if HERMES_OPEN in template else None


def template_takes_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in (template if isinstance(template, str) else " ".join(template.values()))


def require_tool_format(tokenizer: Any, tools: Sequence[dict[str, Any]]) -> str | None:
    """The format replies to a request with `tools` are read in (None: the request has none),
    or `Unservable` where the template cannot render tools or writes calls no way known."""
    if not tools:
        return None
    if not template_takes_tools(tokenizer):
        raise Unservable("the request has tools, but the checkpoint's chat template renders none")
    found = tool_format(tokenizer)
    if found is None:
        raise Unservable(
            "the request has tools, but the checkpoint's chat template writes tool calls in an "
            "unknown format (the endpoint reads a tokenizer's response_schema, or Hermes "
            "<tool_call> blocks)"
        )
    return found


def parsed_reply(
    text: str, found: str | None, tokenizer: Any, seed: int
) -> tuple[str, tuple[ToolCall, ...]]:
    """A reply's content (its text without the calls) and the tool calls in it, their ids
    made from the request's `seed` (`call_id`); none where the request has no tools (`found`
    None) or a block does not parse (left in the content)."""
    if found is None:
        return text, ()
    if found == "schema":
        return schema_parsed(text, tokenizer, seed)
    calls, kept = [], []
    last = 0
    for match in HERMES_CALL.finditer(text):
        call = hermes_call(match.group(1), call_id(seed, len(calls)))
        if call is None:
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    return ("".join(kept).strip() if calls else text), tuple(calls)


def forced_calls(text: str, forced: Constrained, seed: int) -> tuple[str, tuple[ToolCall, ...]]:
    """A reply sampled under a forced `tool_choice` read as vLLM's server reads it (SPEC
    "Constrained replies"): a named function's call whose arguments are the reply's JSON
    object; for "required", each `{"name", "parameters"}` of the reply's JSON list a call. The
    content is then empty. A reply whose JSON the token limit cut is its text, with no call."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text, ()
    if forced.function is not None:
        return ("", (ToolCall(forced.function, value, call_id(seed, 0)),)) if isinstance(
            value, dict) else (text, ())  # fmt: skip
    listed = value if isinstance(value, list) else []
    calls = tuple(
        ToolCall(item["name"], item.get("parameters") or {}, call_id(seed, index))
        for index, item in enumerate(listed)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    )
    return ("", calls) if calls else (text, ())


def hermes_call(block: str, id: str) -> ToolCall | None:
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ToolCall(value["name"], arguments, id) if isinstance(arguments, dict) else None


def schema_parsed(text: str, tokenizer: Any, seed: int) -> tuple[str, tuple[ToolCall, ...]]:
    """transformers' `parse_response` with the tokenizer's schema; a reply it cannot parse
    is content without calls, as a server's parser leaves it."""
    try:
        parsed = tokenizer.parse_response(text)
    except Exception:  # the schema's own regexes and JSON: any failure means no calls
        return text, ()
    calls = []
    for call in parsed.get("tool_calls") or ():
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments") or {}
        if isinstance(function.get("name"), str) and isinstance(arguments, dict):
            calls.append(ToolCall(function["name"], arguments, call_id(seed, len(calls))))
    content = parsed.get("content")
    return (content if isinstance(content, str) else "") if calls else text, tuple(calls)


def calls_given(calls: list[Any]) -> str:
    """The parsed tool calls as JSON text (what the environment was given)."""
    return json.dumps([call.get("function", call) for call in calls], ensure_ascii=False)


def calls_action(calls: list[Any]) -> str:
    """The tool calls as `name(arguments)`, joined by "; " (the action)."""
    functions = [call.get("function", call) for call in calls]
    return "; ".join(
        f"{f.get('name')}({json.dumps(f.get('arguments', {}), ensure_ascii=False)})"
        for f in functions
    )
