"""Python files the user names (`--reward-fn FILE.py`, `--env FILE.py:FACTORY`): the only
code collapsecheck runs that it does not ship."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from collapsecheck.errors import CollapsecheckError


def file_module(path: Path, module_name: str, where: str) -> ModuleType:
    """The module of the file at `path`, named `module_name` and not yet run: the caller
    runs it (`run_file_module`) inside its own error handling. A missing file or one that is
    not Python is one line naming `where`."""
    if not path.is_file():
        raise CollapsecheckError(f"{where}: file not found: {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CollapsecheckError(f"{where}: {path} is not a Python file")
    return importlib.util.module_from_spec(spec)


def run_file_module(module: ModuleType) -> None:
    """Run a module `file_module` made (the user's code: it may fail in any way)."""
    module.__spec__.loader.exec_module(module)
