"""The checkpoint a diagnosis reads and the backend loaded from it, and the versions of
what read it."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.engines.backends.base import Backend
from collapsecheck.engines.backends.registry import load_backend
from collapsecheck.inputs.checkpoint import Checkpoint, require_checkpoint
from collapsecheck.settings import (
    Settings,
)


def versions() -> dict[str, str]:
    import numpy
    import torch
    import transformers

    from collapsecheck.version import __version__

    return {
        "collapsecheck": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def checkpoint_name(checkpoint: str | Path | Checkpoint) -> str:
    return str(checkpoint.path if isinstance(checkpoint, Checkpoint) else checkpoint)


def resolve(
    checkpoint: str | Path | Checkpoint, loaded: Backend | None, settings: Settings
) -> str | Path | Checkpoint:
    """The recognised checkpoint (an error saying what the folder holds when there is none),
    unless the caller brought a loaded backend."""
    if loaded is not None or isinstance(checkpoint, Checkpoint):
        return checkpoint
    return require_checkpoint(checkpoint, settings.load.base_model)


def checkpoint_notes(
    checkpoint: str | Path | Checkpoint, model: Backend | None = None
) -> dict[str, str]:  # fmt: skip
    """The report's word on what was read, where it is not simply the folder named (a served
    policy: its backend's `policy_note`)."""
    note = checkpoint.note if isinstance(checkpoint, Checkpoint) else None
    note = note or getattr(model, "policy_note", None)
    return {"checkpoint_note": note} if note else {}


@dataclass(frozen=True)
class PriorBaseline:
    """The baseline a scan's reasoning is also scored under (SPEC "Scored under the start"):
    its checkpoint, and the backend when the caller already loaded it (once for a run)."""

    checkpoint: Checkpoint
    loaded: Backend | None = None


@contextmanager
def open_backend(
    checkpoint: str | Path | Checkpoint, given: Backend | None, settings: Settings
) -> Iterator[Backend]:
    """The caller's backend, or one loaded for this scan from the checkpoint `resolve`
    recognised, and closed after it (a vLLM engine stops its workers and returns their
    memory)."""
    if given is not None:
        yield given
        return
    backend = load_backend(checkpoint, settings.load)
    try:
        yield backend
    finally:
        backend.close()


def vision_of(backend: Backend) -> Any:
    """A vision-language backend's `Vision` (images in prompts), None for a text one."""
    return getattr(backend, "vision", None)
