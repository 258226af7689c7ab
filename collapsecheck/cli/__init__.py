"""The command line: a thin typer layer over the Python API (`scan`, `score`, `scan_run`,
`compare_reports`), one module per command (`scan`, `watch`, `score`, `compare`, `spec`), each
registered on the application of `app` (its consoles, error handling and exit codes). The
settings dataclasses become the commands' options in `settings_options`, the commands' own
options are `options`, and what every command does after its results (the gate, the page, the
dashboards) is `finishing`.

Exit codes: 0 ok; 1 a gate rule failed (the verdict is in `--fail-on`, a `--min-*` metric is
too low, or `compare` found that B lost input dependence); 2 usage or input error (one line on
stderr naming the file, line or option at fault).
"""

from __future__ import annotations

import importlib
import signal
import sys

from collapsecheck.cli.app import _terminated, app, bare_options

# the commands, one module each, registered on `app` in the order --help lists them
COMMANDS = ("scan", "watch", "score", "compare", "spec")
for command in COMMANDS:
    importlib.import_module(f"collapsecheck.cli.{command}")


def main() -> None:
    """Console entry point; usage errors from typer exit with code 2 as well."""
    signal.signal(signal.SIGTERM, _terminated)
    app(args=bare_options(sys.argv[1:]), prog_name="collapsecheck")


__all__ = ["app", "main"]
