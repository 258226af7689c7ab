"""Checkpoints in: find and check a Hugging Face causal-LM directory, then load its tokenizer
and model with transformers, offline (nothing is fetched from a hub).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
DTYPES = ("auto", "float32", "bfloat16", "float16")


def weight_files(path: Path) -> list[Path]:
    return [path / name for name in WEIGHT_FILES if (path / name).is_file()]


def check_checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint directory, or a clear error saying what is missing."""
    path = Path(path)
    if not path.exists():
        raise CollapsecheckError(f"checkpoint not found: {path}")
    if not path.is_dir():
        raise CollapsecheckError(f"{path}: a checkpoint must be a directory")
    if not (path / "config.json").is_file():
        raise CollapsecheckError(
            f"{path}: not a Hugging Face checkpoint directory (no config.json)"
        )
    if not weight_files(path):
        raise CollapsecheckError(
            f"{path}: no model weights found (looked for {', '.join(WEIGHT_FILES)})"
        )
    return path


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


def quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers on the user's terminal."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    quiet_transformers()
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # transformers raises many types for a bad tokenizer
        raise CollapsecheckError(
            f"{path}: could not load the tokenizer ({_first_line(err)})"
        ) from None


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CollapsecheckError(f"--device {device}: CUDA is not available on this machine")
    if not (device == "cpu" or device.startswith("cuda")):
        raise CollapsecheckError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise CollapsecheckError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def load_model(path: Path, device: str, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # corrupt or mismatched weights surface as many exception types
        files = ", ".join(str(f) for f in weight_files(path))
        raise CollapsecheckError(
            f"{files}: could not load the model weights ({_first_line(err)})"
        ) from None
    return model.to(device).eval()
