"""Hugging Face causal-LM directories, also HF Trainer / TRL `checkpoint-N`: config.json and
weights (`model.safetensors`, a sharded `*.index.json`, or `pytorch_model.bin`). A veRL
`global_step_N/` that holds a merged model in `actor/huggingface/` or `huggingface/` is read
from there, and SkyRL's `{export_path}/global_step_N/` (trainer.hf_save_interval) from its
`policy/`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collapsecheck.inputs.formats import peft_adapter
from collapsecheck.inputs.formats.base import Checkpoint, LoadBase, Require, own_files, weight_files
from collapsecheck.settings import LoadSettings

KIND = "huggingface"
EXPECTED = "config.json with weights"
LOCATIONS = (".", "actor/huggingface", "huggingface", "policy")  # policy/: SkyRL's HF export


def is_model_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and bool(weight_files(path))


MERGER_ADAPTER = "lora_adapter"  # veRL's model merger puts a LoRA run's adapter here


def detect(path: Path, base_model: Path | None, require: Require) -> Checkpoint | None:
    for candidate in (path / location for location in LOCATIONS):
        if not is_model_directory(candidate):
            continue
        model = Checkpoint(KIND, candidate, candidate, note=text_reading_note(candidate))
        adapter = candidate / MERGER_ADAPTER
        if (adapter / peft_adapter.ADAPTER_CONFIG).is_file():
            note = (
                f"{candidate} holds base weights and {adapter} a LoRA adapter (veRL's model "
                "merger): read as the base with the adapter applied"
            )
            return Checkpoint(peft_adapter.KIND, adapter, candidate, model, note)
        return model
    return None


# The vision-language model types whose images collapsecheck scores (`hf_vlm`), each tested
# exact against the model's own forward (tests/test_vision.py)
VISION_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
# The vision-language model types read as text policies, their language model alone through
# transformers' causal-LM class for the type (named here, as transformers' auto mapping names
# it, so that detection imports no model library: tests/test_startup.py holds the two equal),
# each tested to give the shipped class's logits on text (tests/test_stateful_layers.py).
# Others of a family whose images are not scored are refused: a causal-LM class for a
# vision-language type is not always its language model alone (Gemma 3's is the whole
# vision-language model).
TEXT_READ_FAMILIES = {"qwen3_5": "Qwen3_5ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}


def vision_model_type(path: Path) -> str | None:
    """The `model_type` of a vision-language checkpoint (Qwen2-VL and the like: its config
    has a vision tower), None for any other."""
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(config, dict) and "vision_config" in config):
        return None
    return str(config.get("model_type"))


def is_vision_language(path: Path) -> bool:
    """A vision-language checkpoint, read with its images (`hf_vlm`), unless it is
    `read_as_text`."""
    return vision_model_type(path) is not None and read_as_text(path) is None


def read_as_text(path: Path) -> str | None:
    """The causal-LM class a vision-language checkpoint of TEXT_READ_FAMILIES is read by, its
    language model alone (Qwen3.5's `Qwen3_5ForCausalLM`: Qwen ships the family in its
    vision-language class), else None."""
    kind = vision_model_type(path)
    return TEXT_READ_FAMILIES.get(kind) if kind is not None else None


def text_reading_note(path: Path) -> str | None:
    """What the report says of a checkpoint `read_as_text`."""
    reader = read_as_text(path)
    if reader is None:
        return None
    return (
        f"{path}: a {vision_model_type(path)} vision-language checkpoint, read as a text "
        f"policy: its language model alone ({reader}); collapsecheck scores images for "
        f"{', '.join(VISION_FAMILIES)} only"
    )


def files(checkpoint: Checkpoint) -> list[Path]:
    return own_files(checkpoint.path)


def load_weights(
    checkpoint: Checkpoint, dtype: Any, settings: LoadSettings, load_base: LoadBase
) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    placement = {"device_map": settings.device_map} if settings.device_map else {}
    auto = (
        AutoModelForImageTextToText if is_vision_language(checkpoint.path) else AutoModelForCausalLM
    )
    return auto.from_pretrained(
        checkpoint.path,
        dtype=dtype,
        local_files_only=True,
        trust_remote_code=settings.trust_remote_code,
        **placement,
    )
