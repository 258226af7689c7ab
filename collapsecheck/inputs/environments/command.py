"""`--env 'command:COMMAND'` (SPEC "Agents behind an OpenAI client"): any agent harness that
reaches its model through an OpenAI-compatible URL, run through the shell against
collapsecheck's endpoint served on 127.0.0.1 (`OPENAI_BASE_URL`, ending in /v1, and
`OPENAI_API_KEY` set; `{base_url}` and `{model}` in COMMAND replaced). The harness decides its
episodes; the endpoint records them. Its faults are one line: a non-zero exit (with its last
line on stderr), no request at all, or no request within --env-timeout seconds of the last
reply."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.endpoint import Endpoint, Serving
from collapsecheck.inputs.environments.framework import files_sha256
from collapsecheck.inputs.environments.protocol import (
    Adapter,
    Driven,
    Loading,
    Resolved,
    refuse_unused,
)

if TYPE_CHECKING:
    from collapsecheck.settings import EnvSettings, SamplingSettings

API_KEY = "collapsecheck"
OPENAI_URL = "OPENAI_BASE_URL"
SHELL_WORDS = {"cd", "exec", "export", "source", ".", "set", "time", "env", "nohup", "(", "{"}
POLL_S = 0.05
# flags whose values the harness decides instead; said if given
HARNESS_DECIDES = (("-n", "num_prompts"), ("-k", "k"))
EPISODE_FLAGS = (("--env-seed", "env_seed"), ("--max-turns", "max_turns"))


@dataclass(frozen=True)
class CommandSpec:
    """A loaded `command:COMMAND`: the command, and the files its words name (the program,
    found on PATH, and every argument that is a file), whose contents key the results cache
    with the command itself."""

    spec: str
    command: str
    files: tuple[Path, ...]
    notes: tuple[str, ...] = ()

    @property
    def origin(self) -> Path:
        return self.files[0]

    @property
    def code_sha256(self) -> str:
        return files_sha256(self.files, self.command)

    def key(self) -> dict[str, Any]:
        return {"env": self.spec, "framework": "command",
                "env_files": [str(p) for p in self.files[1:]]}  # fmt: skip

    def resolved(self, env: EnvSettings, sampling: SamplingSettings) -> Resolved:
        """The harness decides its start states, episodes and turns: -n, -k, --env-seed,
        --max-turns and --context-window given are one line."""
        given = [flag for flag, name in HARNESS_DECIDES if getattr(sampling, name) is not None]
        given += [flag for flag, name in EPISODE_FLAGS if getattr(env, name) is not None]
        given += ["--context-window"] if env.context_window != -1 else []
        if given:
            verb = "does" if len(given) == 1 else "do"
            raise CollapsecheckError(
                f"--env {self.spec}: {', '.join(given)} {verb} not apply: the harness decides "
                "its episodes (start states are the first requests it sends, each with the "
                "episodes it played from it)"
            )
        return Resolved(env, sampling, {})

    def drive(self, endpoint: Endpoint, env: EnvSettings, sampling: SamplingSettings) -> Driven:
        """The command run to its end against the endpoint, served on a free port."""
        with Serving(endpoint.app) as served, tempfile.TemporaryDirectory() as folder:
            command = self.command.replace("{base_url}", served.base_url)
            command = command.replace("{model}", endpoint.model)
            variables = {**os.environ, OPENAI_URL: served.base_url,
                         "OPENAI_API_KEY": API_KEY}  # fmt: skip
            errors = Path(folder) / "stderr"
            with errors.open("w+") as stderr:
                status = self.run(command, variables, stderr, endpoint, env.env_timeout)
                last = last_line(errors)
        self.check_ended(status, last, endpoint)
        return Driven()

    def run(
        self, command: str, variables: dict[str, str], stderr: IO[str], endpoint: Endpoint,
        timeout: float,
    ) -> int:  # fmt: skip
        """The harness's exit status; stopped (its whole process group) where a request
        faulted or it went quiet past `timeout` seconds (0: no limit)."""
        harness = subprocess.Popen(
            command, shell=True, env=variables, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
        )  # fmt: skip
        try:
            while (status := harness.poll()) is None:
                recorder = endpoint.recorder
                if recorder.fault is not None:
                    raise recorder.fault
                if timeout and recorder.quiet_for() > timeout:
                    raise CollapsecheckError(
                        f"--env {self.spec}: the harness sent no request within {timeout:g} s "
                        "of the endpoint's last answer (--env-timeout)"
                    )
                time.sleep(POLL_S)
        finally:
            stop(harness)
        return status

    def check_ended(self, status: int, last: str, endpoint: Endpoint) -> None:
        """One line where the harness failed, or made no request."""
        recorder = endpoint.recorder
        if recorder.fault is not None:
            raise recorder.fault
        refused = recorder.refused()
        if status != 0:
            said = f": {last}" if last else " (nothing on stderr)"
            raise CollapsecheckError(
                f"--env {self.spec}: the harness exited with status {status}{said}"
                + (f"; {refused}" if refused else "")
            )
        if not recorder.exchanges:
            why = refused or f"nothing reached {OPENAI_URL}"
            raise CollapsecheckError(f"--env {self.spec}: the harness made no request ({why})")


def stop(harness: subprocess.Popen[Any]) -> None:
    """The harness's process group ended: asked, then made to."""
    if harness.poll() is not None:
        return
    for sent, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(harness.pid, sent)
        try:
            harness.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def last_line(path: Path) -> str:
    """The last non-empty line the harness wrote to stderr."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    said = [line for line in lines if line]
    return said[-1][:300] if said else ""


def load_command(command: str, loading: Loading) -> CommandSpec:
    """`command:COMMAND`, its program found before any model loads."""
    spec = f"command:{command}"
    refuse_unused(spec, loading, (), "the harness gives its own messages and rewards")
    try:
        words = shlex.split(command)
    except ValueError as err:
        raise CollapsecheckError(f"--env {spec}: the command does not parse ({err})") from None
    if not words:
        raise CollapsecheckError("--env command: needs a command to run (command:COMMAND)")
    program = program_file(spec, [w for w in words if not ASSIGNMENT.match(w)])
    named = [Path(w).resolve() for w in words if Path(w).is_file()]
    return CommandSpec(spec, command, tuple(dict.fromkeys((program, *named))))


ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def program_file(spec: str, words: list[str]) -> Path:
    """The program the command runs, found on PATH (a typo is one line now, not a harness
    failing later); the shell itself where the command opens with a shell word."""
    first = words[0] if words else "sh"
    found = shutil.which("sh" if first in SHELL_WORDS else first)
    if found is None:
        raise CollapsecheckError(f"--env {spec}: no program {first!r} (not on PATH)")
    return Path(found).resolve()


COMMAND = Adapter(load_command)
