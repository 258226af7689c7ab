"""What a framework's adapter loads (SPEC "Every framework's environment"): a `FrameworkSpec`,
which opens one `chat.Session` per episode at its seed and keys the results cache by the files
its code and data came from; the framework imported (or one line naming its extra), a factory
of the user's claimed for it, and the note said where its episodes do not follow the seed."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.calls import call_within
from collapsecheck.inputs.environments.chat import ChatGame, Session
from collapsecheck.inputs.environments.factories import (
    DEFAULT_TURNS,
    EnvironmentSpec,
    load_factory,
)
from collapsecheck.inputs.environments.protocol import Resolved
from collapsecheck.settings import DEFAULT_STARTS

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, PromptSettings, SamplingSettings


def package_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def import_framework(module: str, extra: str, spec: str) -> Any:
    """The framework's package, or one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] != module.split(".")[0]:
            raise CollapsecheckError(
                f"--env {spec}: {module} needs {err.name!r}, which is not installed "
                f"(pip install 'collapsecheck[{extra}]')"
            ) from None
        raise CollapsecheckError(
            f"--env {spec}: {module} is not installed (pip install 'collapsecheck[{extra}]')"
        ) from None


def module_file(name: str) -> Path:
    """The file of the module an environment's code is in, which keys the cache."""
    return Path(inspect.getfile(importlib.import_module(name))).resolve()


def named_factory(
    spec: str, name: str, kwargs: Mapping[str, Any], timeout: float
) -> tuple[EnvironmentSpec, Any]:
    """`PREFIX:FILE.py:FACTORY`'s factory (`name`: the part after the prefix), loaded as a bare
    one is and named by the whole spec (what it cannot load said of it too), with an object it
    made."""
    try:
        factory, made = load_factory(name, kwargs, timeout)
    except CollapsecheckError as err:
        raise CollapsecheckError(str(err).replace(f"--env {name}", f"--env {spec}", 1)) from None
    return dataclasses.replace(factory, spec=spec), made


def claimed_factory(
    spec: str, name: str, kwargs: Mapping[str, Any], timeout: float,
    recognises: Callable[[Any], bool], what: str,
) -> EnvironmentSpec | None:  # fmt: skip
    """`PREFIX:FILE.py:FACTORY`'s factory, whose object must be the framework's (`what`: the
    kind it must be, as the refusal says it); None where `name` names no file."""
    if not name.rpartition(":")[0].endswith(".py"):
        return None
    factory, made = named_factory(spec, name, kwargs, timeout)
    if not recognises(made):
        raise CollapsecheckError(
            f"--env {spec}: the factory makes a {type(made).__name__}, not {what}"
        )
    return factory


def files_sha256(files: Sequence[Path], text: str = "") -> str:
    """The digest of `text`, then of each file's bytes in order: what an environment's code and
    data key its results with."""
    digest = hashlib.sha256(text.encode())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def made_by(environment: Any, package: str) -> bool:
    """Whether an object's class is one of `package`'s or derives from one: read from its
    classes' modules, so the package need not be imported to ask."""
    return any(str(c.__module__).startswith(f"{package}.") for c in type(environment).__mro__)


@dataclass(frozen=True, eq=False)
class FrameworkSpec:
    """A loaded `FRAMEWORK:ID` (or a factory whose object a framework recognises): how an
    episode's session is opened at a seed, the files its code and data came from (their
    digests key the results cache with the framework's version), what loading noticed, and
    how it is loaded again in another process (`reload`: a function and its arguments)."""

    spec: str
    framework: str
    open_session: Callable[[int, EnvSettings], Session]
    files: tuple[Path, ...]
    version: str
    reload: tuple[Callable[..., Any], tuple[Any, ...]]
    notes: tuple[str, ...] = ()
    turns: int = DEFAULT_TURNS
    starts: int | None = None  # a dataset's rows: the start states there are

    @property
    def origin(self) -> Path:
        return self.files[0]

    @property
    def code_sha256(self) -> str:
        return files_sha256(self.files)

    def key(self) -> dict[str, Any]:
        return {"env": self.spec, "framework": f"{self.framework} {self.version}",
                "env_files": [str(p) for p in self.files[1:]]}  # fmt: skip

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved:
        """The flags where given, else seeds from 0 and the adapter's turns; a dataset's start
        states are its rows (SPEC "Every framework's environment")."""
        if env.context_window != -1:
            raise CollapsecheckError(
                f"--context-window goes with FILE.py:FACTORY environments: --env {self.spec} "
                f"is played as {self.framework}'s trainer plays it, the whole chat each turn"
            )
        return rows_resolved(self.spec, self.starts, env, sampling, self.turns)

    def game(self, seed: int, env: EnvSettings, prompts: PromptSettings) -> ChatGame:
        where = f"--env {self.spec} ({self.framework}"
        session = call_within(env.env_timeout, f"{where}, seed {seed}, reset)",
                              lambda: self.open_session(seed, env))  # fmt: skip
        return ChatGame(where, seed, session, env.env_timeout)

    def noting(self, notes: tuple[str, ...]) -> FrameworkSpec:
        return dataclasses.replace(self, notes=self.notes + notes)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """Pickled as how it was loaded, loaded again where it is unpickled (a Ray task)."""
        return self.reload


def rows_resolved(
    spec: str, starts: int | None, env: EnvSettings, sampling: SamplingSettings,
    turns: int | None,
) -> Resolved:  # fmt: skip
    """Seeds from --env-seed (default 0), `turns` unless --max-turns is given (None: the
    environment's own limit); where the start states are a dataset's `starts` rows, -n of them
    (default the rows there are, at most 16), and rows past the end are one line."""
    first = 0 if env.env_seed is None else env.env_seed
    played = dataclasses.replace(
        env, env_seed=first, max_turns=turns if env.max_turns is None else env.max_turns
    )
    if starts is None:
        return Resolved(played, sampling, {})
    wanted = sampling.num_prompts or min(starts - first, DEFAULT_STARTS)
    if first + wanted > starts or first < 0:
        raise CollapsecheckError(
            f"--env {spec}: --env-seed {first} and -n {wanted} ask for rows "
            f"{first}..{first + wanted - 1} of a dataset of {starts}"
        )
    sources = {} if sampling.num_prompts else {"num_prompts": f"{wanted} (the dataset's rows)"}
    return Resolved(played, dataclasses.replace(sampling, num_prompts=wanted), sources)


def seed_note(spec: FrameworkSpec, env: EnvSettings) -> tuple[str, ...]:
    """Said once where two sessions opened at one seed start differently: the framework's
    reset does not follow the seed (SPEC "Every framework's environment")."""
    openings = []
    for _ in range(2):
        game = spec.game(env.env_seed or 0, env, None)
        openings.append((game.chat, game.observation))
        game.close()
    if openings[0] == openings[1]:
        return ()
    return (
        f"--env {spec.spec}: two {spec.framework} environments reset at seed {env.env_seed or 0} "
        "start differently: its episodes are not reproducible by seed (a second scan plays "
        "other start states)",
    )
