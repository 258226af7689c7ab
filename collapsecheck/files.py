"""Files written safely: atomically (a temporary name renamed into place, so a killed run
never leaves a half-written file) and by one writer at a time (a lock per output directory).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from collapsecheck.errors import CollapsecheckError

LOCK_FILE = ".collapsecheck.lock"


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the directory for one writer: a second scan writing there gets a clear error."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CollapsecheckError(
                f"{directory}: another collapsecheck scan is writing here; wait for it to end "
                "or give another output directory"
            ) from None
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(path: Path, mode: str, write: Callable[[IO[Any]], None]) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(handle, mode) as stream:
                write(stream)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise CollapsecheckError(f"{path}: cannot write ({err.strerror or err})") from None
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    return write_atomic(path, "w", lambda stream: stream.write(text))


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return write_text_atomic(path, text)
