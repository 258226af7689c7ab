"""SkyRL-gym's environments (`--env skyrl:ID --prompts data.parquet`, SPEC "Every framework's
environment"), played as SkyRL's generator (`SkyRLGymGenerator.agent_loop`) plays them: each
dataset row a start state (seed s plays row s), read as SkyRL's `PromptDataset` reads it (the
`prompt` column the chat, `env_class` the environment, every other column the extras);
`skyrl_gym.make(env_class, env_config=..., extras=row extras with max_turns = --max-turns)`,
`env.init(prompt)` the first chat, each reply given whole to `env.step` (decoded without
special tokens, as SkyRL's engines decode), the reply (or the environment's
`postprocessed_action`) and the observations appended to the chat as new messages, each
step's reward, done where the environment says. A FILE.py:FACTORY whose object is a SkyRL
`BaseTextEnv` is played so too, the factory called as SkyRL's registry calls an entry point."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import EnvironmentFault
from collapsecheck.inputs.environments.chat import (
    Answer,
    Opening,
    PlainSession,
    is_text_chat,
)
from collapsecheck.inputs.environments.factories import DEFAULT_TURNS, EnvironmentSpec
from collapsecheck.inputs.environments.framework import (
    FrameworkSpec,
    claimed_factory,
    import_framework,
    module_file,
    package_version,
    seed_note,
)
from collapsecheck.inputs.environments.protocol import Adapter, Loading, refuse_unused
from collapsecheck.inputs.prompts import PARQUET_SUFFIXES, Messages
from collapsecheck.settings import EnvSettings

DEFAULT_CLASS = "gsm8k"  # SkyRL's environment.env_class, for a row whose env_class is null
# the environments SkyRL's config has a section of environment.skyrl_gym for: its class
CONFIGS = {
    "text2sql": ("skyrl_gym.envs.sql.env", "Text2SQLEnvConfig"),
    "search": ("skyrl_gym.envs.search.env", "SearchEnvConfig"),
}
TAKES = "--env-arg is SkyRL's environment.skyrl_gym.<env_class> config, --prompts its dataset"
ADOPTED = "the factory is called as SkyRL's registry calls an entry point, with env_config={}"

Make = Callable[[int, dict[str, Any]], Any]  # seed, extras -> a fresh environment


@dataclass(frozen=True)
class Row:
    """One dataset row as SkyRL's PromptDataset gives it: the chat, its env_class (None where
    null) and the extras (every other column)."""

    where: str
    prompt: Messages
    env_class: str | None
    extras: dict[str, Any]


def read_table(spec: str, path: Path) -> list[dict[str, Any]]:
    """A dataset file's rows through Arrow, as SkyRL's `datasets` loader reads parquet and
    JSON lines (structs as dictionaries, keys a row lacks as None)."""
    import pyarrow as pa
    import pyarrow.json as paj
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() in PARQUET_SUFFIXES:
            return pq.read_table(path).to_pylist()
        return paj.read_json(path).to_pylist()
    except (OSError, pa.ArrowException) as err:
        raise CollapsecheckError(
            f"--env {spec}: {path} is not a dataset SkyRL reads (parquet or JSON lines): {err}"
        ) from None


def dataset_rows(spec: str, loading: Loading) -> tuple[Path, tuple[Row, ...]]:
    """--prompts read as SkyRL's PromptDataset reads it; refused without one."""
    if loading.dataset is None:
        raise CollapsecheckError(
            f"--env {spec}: SkyRL's environments take their start state from a dataset row: "
            "give SkyRL's dataset with --prompts data.parquet"
        )
    path = Path(loading.dataset).resolve()
    if not path.is_file():
        raise CollapsecheckError(f"--env {spec}: --prompts {path}: no such file")
    rows = []
    for index, row in enumerate(read_table(spec, path)):
        where = f"{path}, row {index}"
        prompt = row.pop("prompt", None)
        if not (is_text_chat(prompt) and prompt):
            raise CollapsecheckError(
                f"--env {spec}: {where}: its 'prompt' is not a list of chat messages (a string "
                "'role' and 'content' each), as SkyRL's dataset rows hold"
            )
        rows.append(Row(where, prompt, row.pop("env_class", None), row))
    if not rows:
        raise CollapsecheckError(f"--env {spec}: {path} has no rows")
    return path, tuple(rows)


def played_classes(gym: Any, spec: str, name: str, rows: tuple[Row, ...]) -> tuple[str, ...]:
    """Each row's environment: ID's, where the row names ID or none; else (`skyrl:`) the
    row's env_class, or SkyRL's default where it is null. Each checked in the registry."""
    if name and name not in gym.registry:
        raise CollapsecheckError(
            f"--env {spec}: SkyRL-gym has no environment {name!r}; it has "
            + ", ".join(sorted(gym.registry))
        )
    classes = []
    for row in rows:
        if name and row.env_class not in (None, name):
            raise CollapsecheckError(
                f"--env {spec}: {row.where} names env_class {row.env_class!r}, not {name!r} "
                "(--env skyrl: plays each row in its own)"
            )
        env_class = name or row.env_class or DEFAULT_CLASS
        if env_class not in gym.registry:
            raise CollapsecheckError(
                f"--env {spec}: {row.where} names env_class {env_class!r}, which SkyRL-gym "
                "does not have; it has " + ", ".join(sorted(gym.registry))
            )
        classes.append(env_class)
    return tuple(classes)


def env_config(spec: str, env_class: str, kwargs: Mapping[str, Any]) -> Any:
    """SkyRL's `environment.skyrl_gym.<env_class>`: the config class SkyRL's config gives it,
    made with the --env-arg pairs; `{}` (SkyRL's fallback) for the others, which take none."""
    if env_class not in CONFIGS:
        if kwargs:
            raise CollapsecheckError(
                f"--env {spec}: --env-arg: SkyRL's config has no environment.skyrl_gym."
                f"{env_class} section ({env_class} is made with env_config={{}})"
            )
        return {}
    module, name = CONFIGS[env_class]
    config_class = getattr(importlib.import_module(module), name)
    try:
        return config_class(**kwargs)
    except TypeError:
        fields = ", ".join(f.name for f in dataclasses.fields(config_class))
        raise CollapsecheckError(
            f"--env {spec}: --env-arg {', '.join(kwargs)}: SkyRL's {name} has {fields}"
        ) from None


def special_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens, the longest first: what decoding with
    skip_special_tokens (SkyRL's engines) leaves out of a reply."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return tuple(sorted({t.content for t in added.values() if t.special}, key=len, reverse=True))


def newest_user(chat: Messages) -> str:
    """The state a chat shows: its last user message (its last message where none is)."""
    users = [m for m in chat if m["role"] == "user"]
    return str((users or chat)[-1]["content"])


def step_output(answer: Any) -> tuple[Messages, float, bool, dict[str, Any], str | None]:
    """A `BaseTextEnvStepOutput` checked: observations, reward, done, metadata and the
    postprocessed action."""
    if not isinstance(answer, Mapping):
        raise EnvironmentFault(
            f"step returned a {type(answer).__name__}; expected SkyRL's BaseTextEnvStepOutput "
            "(observations, reward, done, metadata)"
        )
    observations, reward = answer.get("observations"), answer.get("reward")
    if not is_text_chat(observations):
        raise EnvironmentFault("step's observations are not a list of chat messages")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise EnvironmentFault(f"step's reward {reward!r} is not a number")
    if not math.isfinite(reward) or answer.get("done") not in (True, False):
        raise EnvironmentFault(f"step's reward {reward!r} or done {answer.get('done')!r} is off")
    metadata = answer.get("metadata") or {}
    action = answer.get("postprocessed_action")
    if not isinstance(metadata, dict) or not isinstance(action, str | None):
        raise EnvironmentFault("step's metadata is not a dict or its postprocessed_action not text")
    return list(observations), float(reward), bool(answer["done"]), metadata, action


class SkyRLSession(PlainSession):
    """One episode's environment as SkyRL's agent loop drives it."""

    def __init__(self, env: Any, prompt: Messages) -> None:
        self.env, self.prompt = env, prompt
        self.skipped: tuple[str, ...] = ()
        self.state = ""

    def attach(self, tokenizer: Any) -> Mapping[str, Any]:
        self.skipped = special_texts(tokenizer)
        return {}

    def start(self) -> Opening:
        answer = self.env.init(copy.deepcopy(self.prompt))
        if not (isinstance(answer, tuple) and len(answer) == 2 and is_text_chat(answer[0])):
            raise EnvironmentFault("init did not return (chat messages, metadata)")
        if not answer[0]:
            raise EnvironmentFault("init returned no messages")
        self.state = newest_user(answer[0])
        return Opening(list(answer[0]), self.state)

    def step(self, reply: str, turn: int) -> Answer:
        given = reply
        for text in self.skipped:
            given = given.replace(text, "")
        observations, reward, done, metadata, action = step_output(self.env.step(given))
        if observations:
            self.state = observations[-1]["content"]
        elif done:  # the episode ended and showed nothing more
            self.state = ""
        kept = given if action is None else action
        return Answer(given, observations, reward, done, self.state, action=action,
                      info=metadata, assistant={"role": "assistant", "content": kept})  # fmt: skip

    def close(self) -> None:
        self.env.close()


def dataset_spec(
    spec: str, make: Make, dataset: tuple[Path, tuple[Row, ...]], sources: tuple[Path, ...],
    reload: tuple[Callable[..., Any], tuple[Any, ...]], timeout: float,
) -> FrameworkSpec:  # fmt: skip
    """The spec whose start states are the dataset's rows; one environment made at the
    first row now, so one that fails says so before the model."""
    path, rows = dataset

    def open_session(seed: int, env: EnvSettings) -> SkyRLSession:
        extras = copy.deepcopy(rows[seed].extras)
        extras["max_turns"] = env.max_turns  # SkyRL's generator.max_turns overrides the row's
        return SkyRLSession(make(seed, extras), rows[seed].prompt)

    loaded = FrameworkSpec(
        spec, "SkyRL", open_session, (*sources, path), package_version("skyrl-gym"), reload,
        starts=len(rows),
    )  # fmt: skip
    first = EnvSettings(env=spec, env_seed=0, max_turns=DEFAULT_TURNS, env_timeout=timeout)
    return loaded.noting(seed_note(loaded, first))


def entry_module(entry: Any) -> str:
    """The module a registered environment's class is in."""
    point = entry.entry_point
    return point.partition(":")[0] if isinstance(point, str) else point.__module__


def load_skyrl(name: str, loading: Loading) -> FrameworkSpec:
    """`--env skyrl:ID` (`skyrl:`: each row's env_class; `skyrl:FILE.py:FACTORY`: a factory's
    BaseTextEnv) over SkyRL's dataset (--prompts)."""
    spec = f"skyrl:{name}"
    refuse_unused(spec, loading, ("--env-arg", "--prompts"), TAKES)
    gym = import_framework("skyrl_gym", "skyrl", spec)
    factory = claimed_factory(
        spec, name, loading.kwargs, loading.timeout, is_text_env, "a SkyRL BaseTextEnv environment"
    )
    if factory is not None:
        return adopt_skyrl(factory, loading)
    dataset = dataset_rows(spec, loading)
    classes = played_classes(gym, spec, name, dataset[1])
    configs = {c: env_config(spec, c, loading.kwargs) for c in set(classes)}

    def make(seed: int, extras: dict[str, Any]) -> Any:
        return gym.make(classes[seed], env_config=configs[classes[seed]], extras=extras)

    sources = tuple(module_file(entry_module(gym.registry[c])) for c in sorted(configs))
    kept = Loading(dict(loading.kwargs), dataset=dataset[0], timeout=loading.timeout)
    loaded = dataset_spec(spec, make, dataset, sources, (load_skyrl, (name, kept)), loading.timeout)
    if name or all(row.env_class is not None for row in dataset[1]):
        return loaded
    said = f"rows without an env_class are played in {DEFAULT_CLASS} (SkyRL's default)"
    return loaded.noting((f"--env {spec}: {said}",))


def is_text_env(environment: Any) -> bool:
    """Whether a factory's object is a SkyRL `BaseTextEnv` (by its classes' names, so
    skyrl_gym need not be imported to ask)."""
    shaped = all(callable(getattr(environment, name, None)) for name in ("init", "step"))
    return shaped and any(
        c.__name__ == "BaseTextEnv" and c.__module__.startswith("skyrl_gym")
        for c in type(environment).__mro__
    )


def adopt_skyrl(factory: EnvironmentSpec, loading: Loading) -> FrameworkSpec:
    """A FILE.py:FACTORY that makes a SkyRL `BaseTextEnv`, over SkyRL's dataset (--prompts):
    each episode's environment `FACTORY(env_config={}, extras=...)`; rows' env_class unread."""
    refuse_unused(factory.spec, loading, ("--prompts",), ADOPTED)
    dataset = dataset_rows(factory.spec, loading)

    def make(seed: int, extras: dict[str, Any]) -> Any:
        return factory.factory(env_config={}, extras=extras)

    kept = Loading(dataset=dataset[0], timeout=loading.timeout)
    return dataset_spec(factory.spec, make, dataset, (factory.origin,),
                        (adopt_skyrl, (factory, kept)), loading.timeout)  # fmt: skip


SKYRL = Adapter(load_skyrl, is_text_env, adopt_skyrl)
