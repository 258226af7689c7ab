"""The backend registry: one place maps backend and scorer names to implementations.

Adding a backend is one module implementing `collapsecheck.engines.backends.base.Backend` and one
line in BACKENDS. Modules are imported only when their backend is used, so an optional
engine (vLLM) costs nothing when it is not installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import AUTO

if TYPE_CHECKING:
    from collapsecheck.engines.backends.base import Backend
    from collapsecheck.inputs.formats.base import Checkpoint
    from collapsecheck.settings import LoadSettings


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend's class lives, which scorers it implements, and the optional package
    it needs with the install that brings it."""

    module: str
    cls: str
    scorers: tuple[str, ...]
    needs: tuple[str, str] | None = None  # (import name, how to install it)

    def load(self) -> type[Backend]:
        return getattr(importlib.import_module(self.module), self.cls)


VLLM_INSTALL = "pip install 'collapsecheck[vllm]' on a GPU machine; the README has the CPU build"
BACKENDS = {
    "transformers": BackendEntry(
        "collapsecheck.engines.backends.hf", "TransformersBackend", ("cached", "naive")
    ),
    "vllm": BackendEntry(
        "collapsecheck.engines.backends.vllm",
        "VLLMBackend",
        ("vllm",),
        needs=("vllm", VLLM_INSTALL),
    ),
}
# The backends that take vision-language checkpoints (a config with a `vision_config`), by
# the backend name they stand in for.
VISION_BACKENDS = {
    "transformers": BackendEntry(
        "collapsecheck.engines.backends.hf_vlm", "VisionLanguageBackend", ("cached", "naive")
    ),
}
BACKEND_NAMES = tuple(BACKENDS)
SCORER_NAMES = tuple(scorer for entry in BACKENDS.values() for scorer in entry.scorers)
# `--scorer auto`: the transformers cached scorer whatever samples (see docs/benchmarks.md)
DEFAULT_SCORER = "cached"


def check_engine_names(settings: LoadSettings) -> None:
    """--backend and --scorer name a registered engine (or auto): one line naming the choices."""
    for option, value, names in (
        ("--backend", settings.backend, BACKEND_NAMES),
        ("--scorer", settings.scorer, SCORER_NAMES),
    ):
        if value not in (AUTO, *names):
            choices = ", ".join((AUTO, *names))
            raise CollapsecheckError(f"{option} must be one of {choices}, got {value!r}")


def scorer_backend(scorer: str) -> str:
    """The backend that implements a scorer."""
    return next(name for name, entry in BACKENDS.items() if scorer in entry.scorers)


def installed(name: str) -> bool:
    """Whether the optional package a backend needs is importable."""
    import importlib.util

    needs = BACKENDS[name].needs
    return needs is None or importlib.util.find_spec(needs[0]) is not None


def require_installed(name: str, option: str) -> None:
    """Refuse a backend whose package is missing before anything loads."""
    if not installed(name):
        package, install = BACKENDS[name].needs  # type: ignore[misc]
        raise CollapsecheckError(f"{option} {name}: {package} is not installed ({install})")


def resolve_backend(name: str, device: str, vision: bool = False) -> str:
    """`auto`: vLLM where it is installed and a GPU is present and it takes the checkpoint
    (a vision-language one only where VISION_BACKENDS has it), transformers otherwise."""
    if name != AUTO:
        return name
    import torch

    gpu = device != "cpu" and torch.cuda.is_available()
    usable = "vllm" in VISION_BACKENDS or not vision
    return "vllm" if gpu and usable and installed("vllm") else "transformers"


def load_backend(checkpoint: Checkpoint, settings: LoadSettings) -> Backend:
    """The backend that samples, scoring with the scorer `settings` names: one backend when
    it implements that scorer too, else a split whose scorer loads only after the sampler is
    closed (one copy of the weights on the device at a time)."""
    from collapsecheck.engines.backends.base import SplitBackend
    from collapsecheck.inputs.formats.huggingface import is_vision_language

    vision = is_vision_language(checkpoint.config_dir)
    sampling = resolve_backend(settings.backend, settings.device, vision)
    scorer = DEFAULT_SCORER if settings.scorer == AUTO else settings.scorer
    scoring = scorer_backend(scorer)
    require_installed(sampling, "--backend")
    require_installed(scoring, "--scorer")
    if scoring == sampling:
        return backend_class(sampling, checkpoint).from_checkpoint(checkpoint, settings, scorer)
    sampler = backend_class(sampling, checkpoint).from_checkpoint(checkpoint, settings, None)
    scoring_class = backend_class(scoring, checkpoint)
    return SplitBackend(
        sampler, lambda: scoring_class.from_checkpoint(checkpoint, settings, scorer)
    )


def backend_class(name: str, checkpoint: Checkpoint) -> type[Backend]:
    """The backend's class, its vision-language one for a vision-language checkpoint."""
    from collapsecheck.inputs.formats.huggingface import is_vision_language

    if not is_vision_language(checkpoint.config_dir):
        return BACKENDS[name].load()
    if name not in VISION_BACKENDS:
        raise CollapsecheckError(
            f"{checkpoint.path}: a vision-language checkpoint; --backend {name} does not take "
            f"images yet (use {', '.join(VISION_BACKENDS)})"
        )
    return VISION_BACKENDS[name].load()
