"""Checkpoints in: recognise a checkpoint directory of any supported format and load its
tokenizer and model with transformers, offline (nothing is fetched from a hub).

- Hugging Face, also HF Trainer / TRL `checkpoint-N`: config.json and weights
  (`model.safetensors`, a sharded `*.index.json`, or `pytorch_model.bin`).
- veRL FSDP actor: `model_world_size_W_rank_R.pt` shards beside `huggingface/config.json`;
  the shards are merged in memory.
- PEFT / LoRA adapter: `adapter_config.json`; its base model (a local path, or
  `--base-model`) is loaded and the adapter merged into it.

A veRL `global_step_N/` folder is looked into: a merged Hugging Face model in
`actor/huggingface/` or `huggingface/` is preferred, else the shards in `actor/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError

HUGGINGFACE, VERL_FSDP, PEFT = "huggingface", "verl-fsdp", "peft"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
ADAPTER_CONFIG = "adapter_config.json"
SHARD_GLOB = "model_world_size_*_rank_*.pt"
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Checkpoint:
    """A recognised checkpoint: its format, where its weights are, where its config and
    tokenizer are, and (PEFT) its base model."""

    kind: str
    path: Path
    config_dir: Path
    base: Checkpoint | None = None

    def files(self) -> list[Path]:
        """The files that define the model (for the results cache's key)."""
        own = sorted(p for p in self.path.iterdir() if p.is_file())
        if self.kind == VERL_FSDP:
            own = sorted(self.path.glob(SHARD_GLOB)) + sorted(
                p for p in self.config_dir.iterdir() if p.is_file()
            )
        return own + (self.base.files() if self.base else [])


def weight_files(path: Path) -> list[Path]:
    return [path / name for name in WEIGHT_FILES if (path / name).is_file()]


def _is_huggingface(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and bool(weight_files(path))


def _is_verl_actor(path: Path) -> bool:
    return (
        path.is_dir()
        and any(path.glob(SHARD_GLOB))
        and (path / "huggingface" / "config.json").is_file()
    )


def _adapter_base(adapter: Path, base_model: Path | None) -> Checkpoint:
    """The base model of a PEFT adapter: --base-model, else the adapter's own local path."""
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CollapsecheckError(f"{adapter / ADAPTER_CONFIG}: not valid JSON ({err})") from None
    named = config.get("base_model_name_or_path")
    if base_model is None:
        candidates = [Path(named), adapter / named] if named else []
        base_model = next((c for c in candidates if c.is_dir()), None)
        if base_model is None:
            raise CollapsecheckError(
                f"{adapter}: LoRA adapter on base model {named!r}, which is not a local "
                "directory; give its path with --base-model (nothing is downloaded)"
            )
    base = detect_checkpoint(base_model)
    if base is None:
        raise CollapsecheckError(f"--base-model {base_model}: {describe_directory(base_model)}")
    return base


def detect_checkpoint(path: Path, base_model: Path | None = None) -> Checkpoint | None:
    """The checkpoint in `path` in any supported layout, or None if there is none."""
    for candidate in (path, path / "actor" / "huggingface", path / "huggingface"):
        if _is_huggingface(candidate):
            return Checkpoint(HUGGINGFACE, candidate, candidate)
    for candidate in (path, path / "actor"):
        if _is_verl_actor(candidate):
            return Checkpoint(VERL_FSDP, candidate, candidate / "huggingface")
    if (path / ADAPTER_CONFIG).is_file():
        base = _adapter_base(path, base_model)
        has_tokenizer = (path / "tokenizer_config.json").is_file()
        return Checkpoint(PEFT, path, path if has_tokenizer else base.config_dir, base)
    return None


def describe_directory(path: Path) -> str:
    """What a directory that is no checkpoint holds, for the error message."""
    if not path.exists():
        return "not found"
    if not path.is_dir():
        return "a checkpoint must be a directory"
    notable = [
        name
        for name in ("config.json", *WEIGHT_FILES, ADAPTER_CONFIG, "huggingface", "actor")
        if (path / name).exists()
    ]
    shards = sorted(p.name for p in path.glob(SHARD_GLOB))
    if shards:
        notable.append(f"{len(shards)} veRL shard(s) {shards[0]}...")
    found = ", ".join(notable) or "none of the files a checkpoint has"
    return (
        f"no checkpoint here (found: {found}; expected config.json with weights, veRL "
        f"{SHARD_GLOB} with huggingface/config.json, or {ADAPTER_CONFIG})"
    )


def require_checkpoint(path: str | Path, base_model: Path | None = None) -> Checkpoint:
    path = Path(path)
    checkpoint = detect_checkpoint(path, base_model) if path.is_dir() else None
    if checkpoint is None:
        if not path.exists():
            raise CollapsecheckError(f"checkpoint not found: {path}")
        raise CollapsecheckError(f"{path}: {describe_directory(path)}")
    return checkpoint


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


def quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers on the user's terminal."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


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


def _load_weights(
    checkpoint: Checkpoint, dtype: Any, trust_remote_code: bool, trust_pickle: bool
) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if checkpoint.kind == HUGGINGFACE:
        return AutoModelForCausalLM.from_pretrained(
            checkpoint.path, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code
        )
    if checkpoint.kind == VERL_FSDP:
        from collapsecheck.verl import load_fsdp_state_dict

        config = AutoConfig.from_pretrained(
            checkpoint.config_dir, local_files_only=True, trust_remote_code=trust_remote_code
        )
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=trust_remote_code
        )
        state = load_fsdp_state_dict(checkpoint.path, trust_pickle)
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        missing = [k for k in missing if k not in tied and "lm_head" not in k]
        if missing or unexpected:
            raise CollapsecheckError(
                f"{checkpoint.path}: the merged shards do not fit the config "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        if tied:
            model.tie_weights()
        return model
    from peft import PeftModel

    base = _load_weights(checkpoint.base, dtype, trust_remote_code, trust_pickle)
    return PeftModel.from_pretrained(base, checkpoint.path).merge_and_unload()


def load_model(
    checkpoint: Checkpoint,
    device: str,
    dtype: Any,
    *,
    trust_remote_code: bool = False,
    trust_pickle: bool = False,
) -> Any:
    """The causal LM of a checkpoint, in eval mode on `device`."""
    quiet_transformers()
    try:
        model = _load_weights(checkpoint, dtype, trust_remote_code, trust_pickle)
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
            f"{files}: could not load the model weights ({_first_line(err)})"
        ) from None
    return model.to(device).eval()
