"""TRL's tool environments (`--env trl:FILE.py:CLASS` or `trl:package.module:CLASS`, with the
TRL dataset whose rows are the start states in `--prompts`; SPEC "Every framework's
environment"), played as TRL 1.16's `GRPOTrainer(environment_factory=CLASS)` plays them:
`CLASS()` with no arguments per episode, `reset(**row)` with every column of the episode's row
(its seed is the row's number), a string it returns appended to the row's last prompt message;
the class's public methods (all but `reset` and `get_reward`) the tools the chat template is
given, described as TRL describes them; each reply parsed by TRL's `parse_response`, its tool
calls run in order, each result a tool message; a reply without tool calls ends the episode.
Each turn's reward is what `get_reward()` gained over the turn, so an episode's rewards add up
to the reward TRL reads when its rollout ends. The turns render the whole chat with the
template TRL renders with (its training template where it swaps the checkpoint's)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import EnvironmentFault
from collapsecheck.inputs.environments.chat import (
    Answer,
    Opening,
    OwnRandom,
    PlainSession,
    is_text_chat,
)
from collapsecheck.inputs.environments.factories import EnvironmentSpec
from collapsecheck.inputs.environments.framework import (
    FrameworkSpec,
    import_framework,
    named_factory,
    package_version,
    seed_note,
)
from collapsecheck.inputs.environments.protocol import Adapter, Loading, refuse_unused
from collapsecheck.inputs.environments.tool_calls import calls_action, calls_given
from collapsecheck.inputs.prompts import Messages, numbered_rows, template_source
from collapsecheck.settings import EnvSettings

if TYPE_CHECKING:
    from collapsecheck.inputs.prompts import RenderedPrompt

NOT_TOOLS = ("reset", "get_reward")


def class_functions(env: Any) -> dict[str, Any]:
    """The functions of the environment's class by name, as TRL lists them (properties are
    not; static methods are)."""
    return dict(inspect.getmembers(type(env), predicate=inspect.isfunction))


def tool_methods(env: Any) -> list[Callable[..., Any]]:
    """The environment's tools as TRL gives them: its public methods but reset and get_reward,
    bound, in name order."""
    return [
        getattr(env, name)
        for name in class_functions(env)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def described(spec: str, env: Any) -> tuple[dict[str, Any], ...]:
    """Each tool's JSON schema, made by transformers' `get_json_schema` as the chat template
    makes it from the method TRL passes; a method it cannot describe is one line."""
    from transformers.utils import get_json_schema

    schemas = []
    for method in tool_methods(env):
        try:
            schemas.append(get_json_schema(method))
        except Exception as err:  # DocstringParsingException, TypeHintParsingException
            raise CollapsecheckError(
                f"--env {spec}: TRL cannot give the tool {type(env).__name__}.{method.__name__} "
                f"to the chat template ({type(err).__name__}: {err}); a tool needs a docstring "
                "with an Args: line and a type hint for each argument"
            ) from None
    return tuple(schemas)


def dataset_rows(spec: str, path: Path) -> tuple[dict[str, Any], ...]:
    """The dataset's rows with every column (None where a JSONL row lacks one, as `datasets`
    reads it), each row's prompt checked."""
    if not path.is_file():
        raise CollapsecheckError(f"--env {spec}: --prompts {path}: file not found")
    numbered = numbered_rows(path)
    if not numbered:
        raise CollapsecheckError(f"--env {spec}: --prompts {path} has no rows")
    columns = list(dict.fromkeys(column for _, row, _ in numbered for column in row))
    rows = tuple({column: row.get(column) for column in columns} for _, row, _ in numbered)
    for (where, _, _), row in zip(numbered, rows, strict=True):
        prompt_messages(row, where)
    return rows


def prompt_messages(row: dict[str, Any], where: str) -> Messages:
    """The row's prompt as chat messages: its messages, a string as one user message, or (no
    prompt column) TRL's one empty user message."""
    if "prompt" not in row:
        return [{"role": "user", "content": ""}]
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if prompt and is_text_chat(prompt):
        return [dict(message) for message in prompt]
    raise CollapsecheckError(
        f"{where}: the 'prompt' column must be a string or a non-empty list of chat messages, "
        "each a string 'role' and a string 'content'"
    )


def tool_template(spec: str, tokenizer: Any) -> dict[str, Any]:
    """What TRL's trainer does to a checkpoint before it plays tools: the template must render
    tool calls and tool results, TRL must know how to parse its replies (`add_response_schema`,
    unless the tokenizer has a parser), and where it is not prefix-preserving TRL renders with
    its own training template (given back as the `chat_template` to render with)."""
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    where = f"--env {spec}: the checkpoint's chat template ({template_source(tokenizer)})"
    if not supports_tool_calling(tokenizer):
        raise CollapsecheckError(f"{where} cannot render tool calls and tool results (TRL "
                                 "refuses it for tool environments)")  # fmt: skip
    parsers = (
        getattr(tokenizer, "response_template", None),
        getattr(tokenizer, "response_schema", None),
    )
    try:
        if parsers == (None, None):  # else TRL parses with the tokenizer's own
            add_response_schema(tokenizer)
        if is_chat_template_prefix_preserving(tokenizer):
            return {}
        return {"chat_template": get_training_chat_template(tokenizer)}
    except ValueError as err:
        raise CollapsecheckError(f"{where} is not one TRL parses tool calls from ({err})") from None


def run_tool_calls(tools: dict[str, Callable[..., Any]], calls: list[Any]) -> list[tuple[str, Any]]:
    """Each tool call run as TRL runs it: in order, a coroutine tool's results after the others
    (gathered), an exception (an unknown tool, wrong arguments) as TRL's `{"error": ...}`."""
    results: list[tuple[str, Any]] = []
    pending: list[tuple[str, Any]] = []
    for call in calls:
        if call.get("type") != "function":
            name = call.get("name", "unknown")
            results.append((name, {"error": f"Unsupported tool call type: {call.get('type')}"}))
            continue
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        try:
            if name not in tools:
                raise ValueError(f"Tool {name} not found.")
            answer = tools[name](**arguments)
            if inspect.iscoroutinefunction(tools[name]):
                pending.append((name, answer))
            else:
                results.append((name, answer))
        except Exception as err:  # TRL gives the model every failure of a tool as its result
            results.append((name, {"error": str(err)}))
    if pending:
        gathered = asyncio.run(_gathered([coroutine for _, coroutine in pending]))
        for (name, _), answer in zip(pending, gathered, strict=True):
            results.append(
                (name, {"error": str(answer)} if isinstance(answer, Exception) else answer)
            )
    return results


async def _gathered(coroutines: list[Any]) -> list[Any]:
    return await asyncio.gather(*coroutines, return_exceptions=True)


def tool_message(name: str, result: Any) -> dict[str, Any]:
    """A tool's result as TRL appends it (its text; a list of content blocks is a VLM's, not
    played)."""
    if isinstance(result, list):
        raise EnvironmentFault(f"the tool {name} returned content blocks (a vision model's "
                               "tool result), which collapsecheck does not play")  # fmt: skip
    return {"role": "tool", "name": name, "content": str(result)}


@dataclass(frozen=True)
class TrlClass:
    """What every episode of one spec shares: the class (as a factory), the dataset's rows and
    the tools' schemas."""

    spec: str
    factory: EnvironmentSpec
    rows: tuple[dict[str, Any], ...]
    schemas: tuple[dict[str, Any], ...]


class TrlSession(PlainSession):
    """One rollout: a fresh instance reset with its row, its draws from the global generators
    its own (`OwnRandom`); the tokenizer, the template TRL renders with and each turn's context
    (`prefix`, which TRL's parser reads) given by the game (`chat.ChatGame`)."""

    def __init__(self, loaded: TrlClass, seed: int, limit: int | None) -> None:
        self.loaded, self.seed, self.limit = loaded, seed, limit
        self.random = OwnRandom(seed)
        with self.random.drawing():
            self.env = loaded.factory.make(seed)
        self.tools = {method.__name__: method for method in tool_methods(self.env)}
        self.tokenizer: Any = None
        self.prefix: list[int] = []
        self.total, self.state = 0.0, ""

    def attach(self, tokenizer: Any) -> Mapping[str, Any]:
        """The template TRL renders with (its training template where it swaps it in)."""
        self.tokenizer = tokenizer
        return tool_template(self.loaded.spec, tokenizer) if self.tools else {}

    def rendered(self, context: RenderedPrompt) -> None:
        self.prefix = list(context.ids)

    def start(self) -> Opening:
        row = self.loaded.rows[self.seed]
        messages = prompt_messages(row, f"--prompts row {self.seed + 1}")
        with self.random.drawing():
            observation = self.env.reset(**row)
        if observation is not None and not isinstance(observation, str):
            raise EnvironmentFault(
                f"reset returned {type(observation).__name__}, not a string or None"
            )
        last = messages[-1]
        messages[-1] = {**last, "content": last["content"] + (observation or "")}
        self.state = last["content"] if observation is None else observation
        return Opening(messages, self.state, self.loaded.schemas if self.tools else ())

    def step(self, reply: str, turn: int) -> Answer:
        parsed = self._parsed(reply)
        calls = parsed.get("tool_calls") or []
        if not calls:
            return Answer(reply, [], self._reward(), True, self.state, assistant=parsed)
        messages = []
        if self.limit is None or turn < self.limit:  # the last turn's calls are not run
            with self.random.drawing():
                messages = [tool_message(n, r) for n, r in run_tool_calls(self.tools, calls)]
            self.state = "\n".join(message["content"] for message in messages)
        return Answer(calls_given(calls), messages, self._reward(), False, self.state,
                      calls_action(calls), assistant=parsed)  # fmt: skip

    def _parsed(self, reply: str) -> dict[str, Any]:
        """The reply as TRL's trainer reads it: parsed where the environment has tools, else
        its text without special tokens."""
        assert self.tokenizer is not None, "a turn's context is rendered before its reply"
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        if not self.tools:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return {"role": "assistant", "content": text}
        from trl.chat_template_utils import parse_response

        return parse_response(
            self.tokenizer, ids, prefix=self.prefix, tools=list(self.tools.values())
        )

    def _reward(self) -> float:
        """What get_reward() gained since the last turn (0 without one)."""
        if "get_reward" not in class_functions(self.env):
            return 0.0
        with self.random.drawing():
            value = self.env.get_reward()
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        if not isinstance(value, numbers.Real):
            raise EnvironmentFault(f"get_reward returned {type(value).__name__}, not a number")
        gained, self.total = float(value) - self.total, float(value)
        return gained


async def _awaited(value: Any) -> Any:
    return await value


def load_trl(name: str, loading: Loading) -> FrameworkSpec:
    """`--env trl:FILE.py:CLASS` with `--prompts DATASET`: the class loaded and made once (its
    tools described as TRL describes them) and the first row's episode reset twice, before
    the model loads."""
    spec = f"trl:{name}"
    refuse_unused(spec, loading, ("--prompts",), "TRL makes the class with no arguments")
    if loading.dataset is None:
        raise CollapsecheckError(f"--env {spec}: give the TRL dataset whose rows are the start "
                                 "states: --prompts DATA.jsonl or DATA.parquet")  # fmt: skip
    import_framework("trl", "trl", spec)  # lazy: its parser is imported last (seconds)
    factory, probe = named_factory(spec, name, {}, loading.timeout)  # TRL's CLASS()
    if "reset" not in class_functions(probe):
        raise CollapsecheckError(f"--env {spec}: {type(probe).__name__} has no reset method "
                                 "(TRL needs one)")  # fmt: skip
    loaded = TrlClass(spec, factory, dataset_rows(spec, loading.dataset), described(spec, probe))

    def open_session(seed: int, env: EnvSettings) -> TrlSession:
        return TrlSession(loaded, seed, env.max_turns)

    found = dataclasses.replace(loading, dataset=loading.dataset.resolve())
    played = FrameworkSpec(
        spec, "TRL", open_session, (factory.origin, loading.dataset.resolve()),
        package_version("trl"), (_reloaded, (name, _absolute(name, factory), found)),
        starts=len(loaded.rows),
    )  # fmt: skip
    first = EnvSettings(env=spec, env_seed=0, env_timeout=loading.timeout)
    noted = played.noting(seed_note(played, first))
    import_framework("trl.chat_template_utils", "trl", spec)
    return noted


def _absolute(name: str, factory: EnvironmentSpec) -> str:
    where, _, cls = name.rpartition(":")
    return f"{factory.origin}:{cls}" if where.endswith(".py") else name


def _reloaded(name: str, found: str, loading: Loading) -> FrameworkSpec:
    """A pickled spec loaded again (in a Ray task) from its file's absolute path, named as
    given."""
    return dataclasses.replace(load_trl(found, loading), spec=f"trl:{name}")


TRL_TOOLS = Adapter(load_trl)  # a TRL class has no shape of its own: a bare FILE.py:CLASS is not
