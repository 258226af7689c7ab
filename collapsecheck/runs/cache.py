"""The results cache: each scan's dump stored under a key made of the checkpoint's content, the
prompt file's content and every setting that changes the numbers. A rerun, or a run
interrupted part-way, finds the finished checkpoints here and never rescans them. Beside
them, under samples/, each checkpoint's sampled traces, keyed by what changes sampling
alone: a scan that scores them otherwise samples nothing again.

An entry is complete once its report.json exists; the dump writer writes that file last and
atomically, so a killed scan leaves an incomplete entry that is simply redone.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from collapsecheck.inputs.checkpoint import Checkpoint, checkpoint_files

FULL_HASH_LIMIT = 64 * 2**20  # files up to this size are hashed whole
SAMPLE_BYTES = 2**20  # larger ones: their size and three 1 MiB samples (start, middle, end)
KEY_LENGTH = 20


def default_cache_root() -> Path:
    """$COLLAPSECHECK_CACHE, else $XDG_CACHE_HOME/collapsecheck, else ~/.cache/collapsecheck."""
    if os.environ.get("COLLAPSECHECK_CACHE"):
        return Path(os.environ["COLLAPSECHECK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "collapsecheck"


def _file_digest(path: Path, digest: Any) -> None:
    """A file's name, size and bytes (sampled where large) into `digest`; a folder (a
    trainer's step of rollouts): every file in it, in order of their paths."""
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(path)}\0".encode())
            _file_digest(file, digest)
        return
    size = path.stat().st_size
    digest.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as stream:
        if size <= FULL_HASH_LIMIT:
            for block in iter(lambda: stream.read(2**20), b""):
                digest.update(block)
            return
        for offset in (0, size // 2, size - SAMPLE_BYTES):
            stream.seek(offset)
            digest.update(stream.read(SAMPLE_BYTES))


def checkpoint_fingerprint(checkpoint: Checkpoint) -> str:
    """A digest of the files that define a checkpoint (weights, config, tokenizer), read once
    per process while their sizes and modification times stay the same (a run's plan and its
    scans, and every rollout step a checkpoint scores, ask for it again)."""
    files = tuple(
        (path, stat.st_size, stat.st_mtime_ns)
        for path in checkpoint_files(checkpoint)
        for stat in (path.stat(),)
    )
    return _files_fingerprint(checkpoint.kind, files)


@functools.lru_cache(maxsize=256)
def _files_fingerprint(kind: str, files: tuple[tuple[Path, int, int], ...]) -> str:
    digest = hashlib.sha256()
    digest.update(kind.encode())
    for path, _, _ in files:
        _file_digest(path, digest)
    return digest.hexdigest()


def cache_entry(
    root: Path, checkpoint: Checkpoint, prompts: Path, settings: dict[str, Any]
) -> Path:
    """The directory of one scan in the results cache (complete once it holds report.json)."""
    return root / scan_key(checkpoint, prompts, settings)


SAMPLES_DIR = "samples"  # under the cache root: sampled traces, keyed by the sampling alone


def samples_entry(
    root: Path, checkpoint: Checkpoint, prompts: Path, settings: dict[str, Any]
) -> Path:
    """The directory of one checkpoint's traces of a prompt set in the results cache, keyed
    by what changes sampling alone (`Settings.sampling_key`): scans that differ in what they
    score share it (`runs.sampling`)."""
    return root / SAMPLES_DIR / scan_key(checkpoint, prompts, settings)


def scan_key(checkpoint: Checkpoint, prompts: Path, settings: dict[str, Any]) -> str:
    """The cache key of one scan."""
    digest = hashlib.sha256()
    digest.update(checkpoint_fingerprint(checkpoint).encode())
    _file_digest(prompts, digest)
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    reward_fn = settings.get("rewards", {}).get("reward_fn")
    if reward_fn:  # the function's code changes the numbers as much as its name does
        _file_digest(Path(reward_fn.partition(":")[0]), digest)
    return digest.hexdigest()[:KEY_LENGTH]
