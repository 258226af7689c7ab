"""The backend registry: one place maps backend and scorer names to implementations.

Adding a backend is one module implementing `collapsecheck.backends.base.Backend` and one
line in BACKENDS. Modules are imported only when their backend is used, so an optional
engine (vLLM) costs nothing when it is not installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collapsecheck.backends.base import Backend
    from collapsecheck.formats.base import Checkpoint
    from collapsecheck.settings import LoadSettings

AUTO = "auto"


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend's class lives and which scorers it implements (the first is its own
    default)."""

    module: str
    cls: str
    scorers: tuple[str, ...]

    def load(self) -> type[Backend]:
        return getattr(importlib.import_module(self.module), self.cls)


BACKENDS = {
    "transformers": BackendEntry(
        "collapsecheck.backends.hf", "TransformersBackend", ("cached", "naive")
    ),
    "vllm": BackendEntry("collapsecheck.backends.vllm", "VLLMBackend", ("vllm",)),
}
BACKEND_NAMES = tuple(BACKENDS)
SCORER_NAMES = tuple(scorer for entry in BACKENDS.values() for scorer in entry.scorers)
# `--scorer auto`: the transformers cached scorer whatever samples (see docs/benchmarks.md)
DEFAULT_SCORER = "cached"


def scorer_backend(scorer: str) -> str:
    """The backend that implements a scorer."""
    return next(name for name, entry in BACKENDS.items() if scorer in entry.scorers)


def resolve_backend(name: str, device: str) -> str:
    """`auto`: vLLM where it is installed and a GPU is present, transformers otherwise."""
    if name != AUTO:
        return name
    import importlib.util

    import torch

    gpu = device != "cpu" and torch.cuda.is_available()
    return "vllm" if gpu and importlib.util.find_spec("vllm") is not None else "transformers"


def load_backend(checkpoint: Checkpoint, settings: LoadSettings) -> Backend:
    """The backend that samples, scoring with the scorer `settings` names: one backend when
    it implements that scorer too, else a split of two over the same checkpoint."""
    from collapsecheck.backends.base import SplitBackend

    sampling = resolve_backend(settings.backend, settings.device)
    scorer = DEFAULT_SCORER if settings.scorer == AUTO else settings.scorer
    scoring = scorer_backend(scorer)
    if scoring == sampling:
        return BACKENDS[sampling].load().from_checkpoint(checkpoint, settings, scorer)
    sampler = BACKENDS[sampling].load().from_checkpoint(checkpoint, settings, None)
    try:
        return SplitBackend(
            sampler, BACKENDS[scoring].load().from_checkpoint(checkpoint, settings, scorer)
        )
    except BaseException:
        sampler.close()
        raise
