"""Files written safely: atomically (a temporary name renamed into place, so a killed run
never leaves a half-written file) and by one writer at a time (a lock per output directory).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from collapsecheck.errors import CollapsecheckError, DirectoryBusy

LOCK_FILE = ".collapsecheck.lock"


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Files are created as the user's umask says (a teammate may read them), not mkstemp's 0600.
FILE_MODE = 0o666 & ~_current_umask()


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the directory for one writer: a second scan writing there gets a clear error."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryBusy(
                f"{directory}: another collapsecheck scan is writing here; wait for it to end "
                "or give another output directory"
            ) from None
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


STAGING = ".collapsecheck.staging"  # a scan's files until it finishes (`staged`)


@contextmanager
def staged(directory: Path) -> Iterator[Path]:
    """A folder to write a scan's files in, inside `directory` (held by `locked`): they
    replace `directory`'s own only once the scan finishes, so a scan that stops (exit 2, an
    error, a kill) leaves `directory` as it was, and one it made itself not at all."""
    existed, finished = directory.exists(), False
    try:
        with locked(directory):
            staging = directory / STAGING
            shutil.rmtree(staging, ignore_errors=True)  # left by a killed scan
            staging.mkdir()
            try:
                yield staging
                for path in sorted(staging.iterdir()):
                    target = directory / path.name
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target)  # an earlier dump's images/, replaced whole
                    os.replace(path, target)
                finished = True
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    finally:
        if not existed and not finished:
            with suppress(OSError):
                directory.rmdir()  # empty: nothing of this scan's is left


def published(staging: Path) -> Path:
    """Where the files written in `staging` (`staged`) lie once the scan has finished."""
    return staging.parent


def write_atomic(path: Path, mode: str, write: Callable[[IO[Any]], None]) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            os.fchmod(handle, FILE_MODE)
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


PROBES = 5  # tries where another process (a shard beside this one) removed its own probe's folder


def _probe(directory: Path, what: str) -> None:
    """Create `directory` (and its parents) and a file in it, then remove both: a scan that
    stops before writing there leaves nothing behind. Processes probing the same new folder
    at once (a run's shards sharing --out) may each remove it under the others: a folder that
    vanished is made again, and one another process still uses is left to it."""
    made = [path for path in (directory, *directory.parents) if not path.exists()]
    for attempt in range(PROBES):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(dir=directory, prefix=".collapsecheck-probe.")
        except OSError as err:
            blocking = next((p for p in (directory, *directory.parents) if p.is_file()), None)
            # a folder on its path that came and went (another process's probe): try again
            vanished = isinstance(err, FileNotFoundError | FileExistsError) and blocking is None
            if vanished and attempt + 1 < PROBES:
                continue
            reason = f"{blocking} is a file" if blocking is not None else err.strerror or err
            raise CollapsecheckError(f"{what}: cannot write there ({reason})") from None
        break
    os.close(handle)
    os.unlink(probe)
    for path in made:  # the deepest first
        with suppress(OSError):  # another process's probe is in it, or it is gone
            path.rmdir()


def writable(directory: Path) -> bool:
    """Whether files can be written in `directory` (made if missing)."""
    try:
        _probe(directory, str(directory))
    except CollapsecheckError:
        return False
    return True


def check_output_file(path: Path | None, option: str) -> None:
    """Refuse an output file that cannot be written, before any work is done for it."""
    if path is None:
        return
    if path.is_dir():
        raise CollapsecheckError(f"{option} {path}: is a directory, not a file")
    _probe(path.parent, f"{option} {path}")


def check_output_dir(path: Path | None, option: str) -> None:
    """Refuse an output directory that is a file or cannot be written, before any work."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise CollapsecheckError(f"{option} {path}: is a file, not a directory")
    _probe(path, f"{option} {path}")
