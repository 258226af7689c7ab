"""The typer application every command registers on: its consoles, the one-line error
handling every command runs under (exit codes: 0 ok; 1 a gate rule failed; 2 usage or input
error, one line on stderr naming the file, line or option at fault; 3 a bug; 130
interrupted), the root options (--debug, --version) and the entry point's argument fixes."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape

from collapsecheck.errors import CollapsecheckError
from collapsecheck.progress import request_stop

EXIT_FAIL, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130

DEBUG_ENV = "COLLAPSECHECK_DEBUG"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Detect template collapse in RL-trained LLM agents. Every metric and the verdict are "
    "defined in the SPEC: `collapsecheck spec` prints it.",
)


def console(to_stderr: bool = False) -> Console:
    """A terminal keeps its width; a pipe or a CI log, which rich would cut to 80 columns,
    gets room for a run's table (COLUMNS, where set, still wins)."""
    stream = sys.stderr if to_stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=to_stderr, width=PIPED_WIDTH if piped else None)


PIPED_WIDTH = 180

stdout = console()

stderr = console(to_stderr=True)

state = {"debug": False}


def debug_from_environment() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _print_traceback(error: BaseException) -> None:
    stderr.print("".join(traceback.format_exception(error)), markup=False, end="")


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input: one line on stderr, exit code 2. Ctrl-C: exit code 130. A bug in
    collapsecheck: one line, exit code 3 (never 1, which a CI gate reads as a failed rule).
    With --debug (or COLLAPSECHECK_DEBUG=1) the traceback of the error's cause comes too."""
    try:
        yield
    except CollapsecheckError as error:
        if state["debug"]:
            _print_traceback(error.__context__ or error)
        stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        stderr.print(
            "[bold red]interrupted:[/] finished work is kept; the same command resumes a run "
            "directory or a scan with --out from where it stopped"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        raise
    except Exception as error:
        if state["debug"]:
            _print_traceback(error)
        message = " ".join(str(error).split()) or type(error).__name__
        stderr.print(
            f"[bold red]internal error:[/] {escape(message)} ({type(error).__name__}); please "
            "report it with the output of the same command run with --debug",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERNAL) from None


def say(line: str) -> None:
    """A line for the user beside the results (the plan, a note), on stderr."""
    stderr.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        from collapsecheck.version import __version__

        print(f"collapsecheck {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help=f"On an error, print its traceback too (or set {DEBUG_ENV}=1)."
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """collapsecheck: is the reasoning of an RL-trained policy still grounded in its input?"""
    state["debug"] = debug or debug_from_environment()  # per invocation, never left over


def _unraisable(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """Python's hook for exceptions it cannot raise (one in a `__del__`), quiet about the
    KeyboardInterrupt of a stop, which the work raises again (`_terminated`)."""

    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)

    return quiet


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM ends a scan as Ctrl-C does, finished work kept: raised here, and again at the
    work's next progress where this raise is lost (`progress.request_stop`)."""
    request_stop()
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    raise KeyboardInterrupt


def bare_options(argv: Sequence[str]) -> list[str]:
    """`--ray` given with no value (last, or before another option) becomes `--ray=default`:
    typer's options either always or never take a value."""
    from collapsecheck.settings import RAY_DEFAULT

    return [
        f"--ray={RAY_DEFAULT}"
        if arg == "--ray" and (at + 1 == len(argv) or argv[at + 1].startswith("-"))
        else arg
        for at, arg in enumerate(argv)
    ]


def flags_given(**values: object) -> dict[str, bool]:
    """Each option's flag (its name with dashes) and whether the command line gave it."""
    return {f"--{name.replace('_', '-')}": value not in (None, False)
            for name, value in values.items()}  # fmt: skip
