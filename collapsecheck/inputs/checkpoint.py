"""Checkpoints in: the registry of checkpoint formats (one module each in
`collapsecheck.inputs.formats`), tried in order, and loading a recognised checkpoint's tokenizer and
model with transformers, offline (nothing is fetched from a hub).

Adding a format is one module with KIND, EXPECTED, detect, files and load_weights, and one
entry in FORMATS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.formats import huggingface, peft_adapter, verl_fsdp
from collapsecheck.inputs.formats.base import (
    WEIGHT_FILES,
    Checkpoint,
    CheckpointFormat,
    first_line,
    quiet_transformers,
    weight_files,
)
from collapsecheck.inputs.trainer_checkpoints import trainer_layout
from collapsecheck.settings import LoadSettings

FORMATS: dict[str, CheckpointFormat] = {
    module.KIND: module  # type: ignore[misc]
    for module in (huggingface, verl_fsdp, peft_adapter)
}
HUGGINGFACE, VERL_FSDP, PEFT = huggingface.KIND, verl_fsdp.KIND, peft_adapter.KIND

__all__ = ["FORMATS", "Checkpoint", "detect_checkpoint", "load_model", "require_checkpoint"]


def detect_checkpoint(path: Path, base_model: Path | None = None) -> Checkpoint | None:
    """The checkpoint in `path` in the first format that recognises it, or None."""
    for fmt in FORMATS.values():
        found = fmt.detect(path, base_model, require_checkpoint)
        if found is not None:
            return found
    return None


def describe_directory(path: Path) -> str:
    """What a directory that is no checkpoint holds, for the error message."""
    if not path.exists():
        return "not found"
    if not path.is_dir():
        return "a checkpoint must be a directory"
    written = trainer_layout(path)
    if written is not None:
        return written
    names = ("config.json", *WEIGHT_FILES, peft_adapter.ADAPTER_CONFIG, "huggingface", "actor")
    notable = [name for name in names if (path / name).exists()]
    shards = verl_fsdp.shard_files(path)
    if shards:
        notable.append(f"{len(shards)} veRL shard(s) {shards[0][2].name}...")
    found = ", ".join(notable) or "none of the files a checkpoint has"
    *others, last = [fmt.EXPECTED for fmt in FORMATS.values()]
    return f"no checkpoint here (found: {found}; expected {', '.join(others)}, or {last})"


def require_checkpoint(path: str | Path, base_model: str | Path | None = None) -> Checkpoint:
    """The checkpoint in `path`, or an error saying what the directory holds instead."""
    path = Path(path)
    base = Path(base_model) if base_model is not None else None
    checkpoint = detect_checkpoint(path, base) if path.is_dir() else None
    if checkpoint is None:
        if not path.exists():
            raise CollapsecheckError(f"checkpoint not found: {path}")
        raise CollapsecheckError(f"{path}: {describe_directory(path)}")
    return checkpoint


def checkpoint_files(checkpoint: Checkpoint) -> list[Path]:
    """The files that define a checkpoint, its base's included (the results cache's key)."""
    own = FORMATS[checkpoint.kind].files(checkpoint)
    return own + (checkpoint_files(checkpoint.base) if checkpoint.base else [])


def load_tokenizer(checkpoint: Checkpoint, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    quiet_transformers()
    path = checkpoint.config_dir
    try:
        return AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except Exception as err:  # transformers raises many types for a bad tokenizer
        raise CollapsecheckError(
            f"{path}: could not load the tokenizer ({first_line(err)})"
        ) from None


def resolve_device(device: str) -> str:
    """`auto`: the GPU where there is one. A CUDA device on a machine without one is refused."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CollapsecheckError(f"--device {device}: CUDA is not available on this machine")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    """`auto`: bfloat16 on GPUs that support it (else float16), float32 on CPU."""
    import torch

    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def _load_weights(checkpoint: Checkpoint, dtype: Any, settings: LoadSettings) -> Any:
    def load_base(base: Checkpoint) -> Any:
        return _load_weights(base, dtype, settings)

    return FORMATS[checkpoint.kind].load_weights(checkpoint, dtype, settings, load_base)


def load_model(checkpoint: Checkpoint, device: str, dtype: Any, settings: LoadSettings) -> Any:
    """The causal LM of a checkpoint, in eval mode on `device`, or spread over the visible GPUs
    as `--device-map` says (accelerate places it; Hugging Face directories only)."""
    quiet_transformers()
    if settings.device_map and checkpoint.kind != HUGGINGFACE:
        raise CollapsecheckError(
            f"{checkpoint.path}: --device-map loads Hugging Face directories; a {checkpoint.kind} "
            "checkpoint is merged in memory on one device (merge it to a Hugging Face folder "
            "first, for example with veRL's model merger)"
        )
    try:
        model = _load_weights(checkpoint, dtype, settings)
    except CollapsecheckError:
        raise
    except ImportError as err:
        raise CollapsecheckError(
            f"{checkpoint.path}: loading a {checkpoint.kind} checkpoint needs {err.name}: "
            f"pip install 'collapsecheck[{checkpoint.kind}]'"
        ) from None
    except Exception as err:  # corrupt or mismatched weights surface as many exception types
        files = ", ".join(str(f) for f in weight_files(checkpoint.path)) or str(checkpoint.path)
        raise CollapsecheckError(
            f"{files}: could not load the model weights ({first_line(err)})"
        ) from None
    return model.eval() if settings.device_map else model.to(device).eval()
