"""verifiers' classic environments (`--env verifiers:ENV_ID`, verifiers 0.1.9 to 0.3.1; SPEC
"Agents behind an OpenAI client"), played in the scan's own process exactly as verifiers plays
them: `vf.load_environment(ENV_ID, **--env-arg)`, each row of its eval dataset (else its
dataset) a start state, K `env.rollout(row, client, model, sampling_args)` from each, all at
once, scored by the rubric a start state's group at a time (`score_group`). The client is an
`openai.AsyncOpenAI` over httpx's ASGI transport to collapsecheck's endpoint (no socket),
wrapped as the version's own `OpenAIChatCompletionsClient` where it has one (0.1.11 on)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import said
from collapsecheck.inputs.environments.endpoint import Endpoint, InProcess
from collapsecheck.inputs.environments.framework import (
    files_sha256,
    import_framework,
    package_version,
    rows_resolved,
)
from collapsecheck.inputs.environments.protocol import (
    Adapter,
    Driven,
    EpisodeEnd,
    Loading,
    Resolved,
    refuse_unused,
)

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, SamplingSettings

LOWEST, HIGHEST = (0, 1, 9), (0, 3, 1)  # the classic classes' versions, tested at both ends
TESTED = "0.1.9 to 0.3.1"
EMPTY_REPLY = "EmptyModelResponseError"  # 0.3's own stop where a reply is empty


def version_of(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@dataclass(frozen=True, eq=False)
class VerifiersSpec:
    """A loaded `verifiers:ENV_ID`: the environment verifiers loaded, its start rows, the file
    of its module (which keys the cache with verifiers' version and the arguments)."""

    spec: str
    env_id: str
    kwargs: Mapping[str, Any]
    environment: Any
    rows: tuple[dict[str, Any], ...]
    files: tuple[Path, ...]
    version: str
    own_turns: int  # the environment's own turn limit as loaded (0: none)
    notes: tuple[str, ...] = ()

    @property
    def origin(self) -> Path:
        return self.files[0]

    @property
    def code_sha256(self) -> str:
        return files_sha256(self.files)

    def key(self) -> dict[str, Any]:
        return {"env": self.spec, "framework": f"verifiers {self.version}",
                "env_args": dict(self.kwargs)}  # fmt: skip

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved:
        """Rows from --env-seed (default 0), -n of them (default the rows, at most 16); turns
        the environment's own limit unless --max-turns caps it."""
        if env.context_window != -1:
            raise CollapsecheckError(
                f"--context-window goes with FILE.py:FACTORY environments: --env {self.spec} "
                "builds each turn's messages itself"
            )
        return rows_resolved(self.spec, len(self.rows), env, sampling, self.own_turns or None)

    def drive(self, endpoint: Endpoint, env: EnvSettings, sampling: SamplingSettings) -> Driven:
        """Every rollout played at once through the in-process client, then scored."""
        return asyncio.run(Rollouts(self, endpoint, env, sampling).played())

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """Pickled as how it was loaded (a Ray task loads it again)."""
        return load_verifiers, (self.env_id, Loading(dict(self.kwargs)))


class Rollouts:
    """One scan's rollouts: K from each start row, watched for a harness gone quiet."""

    def __init__(
        self, spec: VerifiersSpec, endpoint: Endpoint, env: EnvSettings, sampling: SamplingSettings
    ) -> None:
        self.spec, self.endpoint, self.env = spec, endpoint, env
        self.k, self.max_tokens = sampling.samples, sampling.max_new_tokens
        self.starts = sampling.num_prompts or len(spec.rows)
        self.vf = import_framework("verifiers", "verifiers", spec.spec)
        self.modern = version_of(spec.version) >= (0, 1, 11)
        self.where = f"--env {spec.spec} (verifiers"

    def client(self, episode: str) -> Any:
        raw = InProcess(self.endpoint.app).async_client(episode)
        wrapper = getattr(self.vf, "OpenAIChatCompletionsClient", None)
        return wrapper(raw) if self.modern and wrapper is not None else raw

    async def played(self) -> Driven:
        first, turns = self.env.env_seed or 0, self.env.max_turns
        environment = self.spec.environment
        environment.max_turns = turns if turns is not None else (self.spec.own_turns or -1)
        starts = self.starts
        tasks = {
            (start, k): asyncio.ensure_future(self.rollout(first + start, f"{start}/{k}"))
            for start in range(starts) for k in range(self.k)
        }  # fmt: skip
        await self.watched(list(tasks.values()))
        states = {key: task.result() for key, task in tasks.items()}
        # the turns' own rewards, before the rubric copies the episode's onto the others
        own = {key: [reward_of(step) for step in s.get("trajectory") or ()]
               for key, s in states.items()}  # fmt: skip
        notes = []
        for start in range(starts):
            group = [states[(start, k)] for k in range(self.k)]
            await self.scored(group, first + start)
        cut = sum(s.get("stop_condition") == "max_turns_reached" for s in states.values())
        if turns is not None and cut and (not self.spec.own_turns or turns < self.spec.own_turns):
            limit = self.spec.own_turns or "none"
            notes.append(
                f"--env {self.spec.spec}: --max-turns {turns} cut {cut} of {len(states)} episodes "
                f"shorter than the environment would (its max_turns {limit})"
            )
        empty = sum(error_name(s) == EMPTY_REPLY for s in states.values())
        if empty:
            notes.append(f"--env {self.spec.spec}: {empty} episodes ended on an empty reply, "
                         "as verifiers ends them")  # fmt: skip
        ends = {
            f"{start}/{k}": episode_end(states[(start, k)], own[(start, k)], start, first + start)
            for start, k in states
        }
        return Driven(ends, tuple(notes))

    async def rollout(self, row: int, episode: str) -> dict[str, Any]:
        """One episode from `row`, as verifiers plays it; what verifiers caught of the model's
        or the environment's faults (but an empty reply) is one line."""
        data = copy.deepcopy(self.spec.rows[row])
        sampling = {"max_tokens": self.max_tokens}
        try:
            state = await self.spec.environment.rollout(
                data, self.client(episode), self.endpoint.model, sampling
            )
        except Exception as err:  # the environment's code can fail in any way
            why = f"the environment raised {type(err).__name__}: {said(err)}"
            raise self.fault(row, why) from None
        error = state.get("error")
        if error is not None and error_name(state) != EMPTY_REPLY:
            refused = self.endpoint.recorder.refused()
            raise self.fault(row, f"the rollout stopped on {type(error).__name__}: {said(error)}"
                             + (f"; {refused}" if refused else ""))  # fmt: skip
        return state

    async def scored(self, group: list[dict[str, Any]], row: int) -> None:
        rubric = self.spec.environment.rubric
        try:
            if self.modern or "score_sem" not in inspect.signature(rubric.score_group).parameters:
                await rubric.score_group(group)
            else:
                from verifiers.utils.async_utils import NullAsyncContext

                await rubric.score_group(group, score_sem=NullAsyncContext())
        except Exception as err:  # the rubric's code can fail in any way
            raise self.fault(row, f"the rubric raised {type(err).__name__}: {said(err)}") from None

    async def watched(self, tasks: list[asyncio.Future[Any]]) -> None:
        """Waits for every rollout; one that faults, or all of them quiet past --env-timeout
        seconds since the endpoint's last answer, stops the others and the scan."""
        timeout, pending = self.env.env_timeout, set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=0.05, return_when=asyncio.FIRST_EXCEPTION
                )
                for task in done:
                    task.result()
                quiet = self.endpoint.recorder.quiet_for()
                if pending and timeout and quiet > timeout:
                    raise CollapsecheckError(
                        f"{self.where}): no rollout asked the model anything within "
                        f"{timeout:g} s of the endpoint's last answer (--env-timeout)"
                    )
        finally:
            for task in pending:
                task.cancel()

    def fault(self, row: int, why: str) -> CollapsecheckError:
        return CollapsecheckError(f"{self.where}, seed {row}): {why}")


def error_name(state: Mapping[str, Any]) -> str:
    error = state.get("error")
    return "" if error is None else type(error).__name__


def episode_end(
    state: Mapping[str, Any], own: list[float | None], start: int, seed: int
) -> EpisodeEnd:
    """What verifiers' state says of an episode: each turn's reward where the environment set
    one (`own`, read before scoring), the rubric's reward on the last turn (added to it), the
    final environment response."""
    rewards = list(own)
    total = state.get("reward")
    if total is not None:
        if not rewards:
            rewards = [None]
        rewards[-1] = (rewards[-1] or 0.0) + float(total)
    final = state.get("final_env_response")
    final_state = text_of(final[-1]) if isinstance(final, list) and final else None
    return EpisodeEnd(start, seed, tuple(rewards), final_state, True, None)


def reward_of(step: Any) -> float | None:
    value = step.get("reward") if isinstance(step, Mapping) else None
    return None if value is None else float(value)


def text_of(message: Any) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    content = getattr(message, "content", content)
    return content if isinstance(content, str) else ""


def load_verifiers(env_id: str, loading: Loading) -> VerifiersSpec:
    """`verifiers:ENV_ID`: verifiers' version checked, the environment loaded and its rows read
    before any model loads (in the main thread: verifiers' environments install signal
    handlers when they are made)."""
    spec = f"verifiers:{env_id}"
    refuse_unused(spec, loading, ("--env-arg",), "--env-arg goes to load_environment")
    if not env_id:
        raise CollapsecheckError("--env verifiers: needs an environment: verifiers:ENV_ID")
    vf = import_framework("verifiers", "verifiers", spec)
    version = package_version("verifiers")
    if not LOWEST <= version_of(version) <= HIGHEST:
        raise CollapsecheckError(
            f"--env {spec}: verifiers {version} is installed; its classic environments are "
            f"played from {TESTED} (pip install 'collapsecheck[verifiers]'; 0.4's harness "
            "environments: --env 'command:...', docs/agents.md)"
        )
    module = env_id.replace("-", "_").split("/")[-1]
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise CollapsecheckError(
            f"--env {spec}: no environment module {module!r} is installed (vf-install "
            f"{env_id}, or pip install the environment's package)"
        )
    with quiet_datasets():
        environment = loaded(vf, spec, env_id, dict(loading.kwargs))
        rows = start_rows(spec, environment)
    files = (Path(found.origin).resolve(), Path(inspect.getfile(type(environment))).resolve())
    own_turns = max(int(getattr(environment, "max_turns", -1) or -1), 0)
    return VerifiersSpec(spec, env_id, dict(loading.kwargs), environment, rows,
                         tuple(dict.fromkeys(files)), version, own_turns)  # fmt: skip


def loaded(vf: Any, spec: str, env_id: str, kwargs: dict[str, Any]) -> Any:
    try:
        environment = vf.load_environment(env_id, **kwargs)
    except Exception as err:  # verifiers wraps the module's own failure
        cause = err.__cause__ or err
        raise CollapsecheckError(
            f"--env {spec}: loading the environment raised {type(cause).__name__}: {said(cause)}"
        ) from None
    if not (hasattr(environment, "rollout") and hasattr(environment, "rubric")):
        raise CollapsecheckError(
            f"--env {spec}: load_environment returned a {type(environment).__name__}, not a "
            "verifiers environment with rollout and rubric"
        )
    return environment


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """`datasets`' own progress bars (verifiers maps its rows when an environment is made)
    kept off the scan's display."""
    from datasets.utils import logging as datasets_logging

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            datasets_logging.enable_progress_bar()


def start_rows(spec: str, environment: Any) -> tuple[dict[str, Any], ...]:
    """The eval dataset's rows (verifiers falls back to the dataset where there is none)."""
    try:
        dataset = environment.get_eval_dataset()
    except Exception as err:  # no dataset at all, or the environment's own failure
        raise CollapsecheckError(
            f"--env {spec}: the environment has no rows to start from ({type(err).__name__}: "
            f"{said(err)})"
        ) from None
    rows = tuple(dict(row) for row in dataset)
    if not rows:
        raise CollapsecheckError(f"--env {spec}: the environment's dataset has no rows")
    return rows


VERIFIERS = Adapter(load_verifiers)
