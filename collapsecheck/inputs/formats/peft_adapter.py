"""PEFT / LoRA adapters: `adapter_config.json`. The base model (`--base-model`, else the
adapter's own `base_model_name_or_path` when that is a local directory) is loaded and the
adapter merged into it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.formats.base import Checkpoint, LoadBase, Require, own_files
from collapsecheck.settings import LoadSettings

KIND = "peft"
ADAPTER_CONFIG = "adapter_config.json"
EXPECTED = ADAPTER_CONFIG


def adapter_base_path(adapter: Path, base_model: Path | None) -> tuple[Path, str | None]:
    """The base model of a PEFT adapter: --base-model, else the adapter's own local path, else
    (no base named, as veRL's merger writes) the model folder the adapter sits in; with a
    note when the base was not named."""
    if base_model is not None:
        return base_model, None
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CollapsecheckError(f"{adapter / ADAPTER_CONFIG}: not valid JSON ({err})") from None
    named = config.get("base_model_name_or_path")
    if not named and (adapter.parent / "config.json").is_file():
        return adapter.parent, (
            f"{adapter} names no base model; the model folder it sits in, {adapter.parent}, "
            "was read as its base"
        )
    candidates = [Path(named), adapter / named] if named else []
    found = next((c for c in candidates if c.is_dir()), None)
    if found is None:
        raise CollapsecheckError(
            f"{adapter}: LoRA adapter on base model {named!r}, which is not a local "
            "directory; give its path with --base-model (nothing is downloaded)"
        )
    return found, None


def detect(path: Path, base_model: Path | None, require: Require) -> Checkpoint | None:
    """An adapter in `path`, its base found with `require` (the format registry)."""
    if not (path / ADAPTER_CONFIG).is_file():
        return None
    base_path, note = adapter_base_path(path, base_model)
    base = require(base_path)
    if base.kind == KIND and base.path.resolve() == path.resolve():
        base = base.base  # the folder around is read as this very adapter on its base
    has_tokenizer = (path / "tokenizer_config.json").is_file()
    return Checkpoint(KIND, path, path if has_tokenizer else base.config_dir, base, note)


def files(checkpoint: Checkpoint) -> list[Path]:
    return own_files(checkpoint.path)


def load_weights(
    checkpoint: Checkpoint, dtype: Any, settings: LoadSettings, load_base: LoadBase
) -> Any:
    from peft import PeftModel

    base = load_base(checkpoint.base)
    with warnings.catch_warnings():
        # PEFT calls transformers APIs that transformers has deprecated: the user can do
        # nothing about that FutureWarning, and it would bury the report
        warnings.simplefilter("ignore", FutureWarning)
        return PeftModel.from_pretrained(base, checkpoint.path).merge_and_unload()
