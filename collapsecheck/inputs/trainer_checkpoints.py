"""Checkpoint folders trainers write that hold no Hugging Face weights the tool can read: what
the folder is, and the trainer's option or script that writes Hugging Face weights (docs/
formats.md, "Their checkpoints"). Each layout is one entry of LAYOUTS: a test on the folder
and what to say. Never "no checkpoint found" for a folder a trainer wrote."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ITERATION = re.compile(r"iter_\d{7}")
DEEPSPEED_STATES = re.compile(r"(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt")


def has(path: Path, pattern: str) -> bool:
    return path.is_dir() and any(path.glob(pattern))


def torch_distributed(path: Path) -> bool:
    """torch.distributed.checkpoint files: `.metadata` beside `*.distcp` shards."""
    return (path / ".metadata").is_file() and has(path, "*.distcp")


def megatron_iteration(path: Path) -> bool:
    return torch_distributed(path) and (
        ITERATION.fullmatch(path.name) is not None or (path / "common.pt").is_file()
    )


def megatron_save_folder(path: Path) -> bool:
    return (path / "latest_checkpointed_iteration.txt").is_file() and has(path, "iter_*")


def mcore_adapter(path: Path) -> bool:
    """ROLL's Megatron strategy: `mca_config.json` beside `iter_NNNNNNN/mp_rank_*/`."""
    return (path / "mca_config.json").is_file() and has(path, "iter_*")


def deepspeed_tag(path: Path) -> bool:
    return path.is_dir() and any(DEEPSPEED_STATES.fullmatch(p.name) for p in path.iterdir())


def deepspeed_folder(path: Path) -> bool:
    """OpenRLHF's `_actor/`: DeepSpeed's `latest` and its `global_stepN/` tags."""
    return (path / "latest").is_file() and (
        has(path, "global_step*") or has(path, "zero_to_fp32.py")
    )


def openrlhf_checkpoints(path: Path) -> bool:
    return deepspeed_folder(path / "_actor")


def prime_rl_trainer(path: Path) -> bool:
    trainer = path / "trainer" if (path / "trainer").is_dir() else path
    return torch_distributed(trainer) and (trainer.parent / "orchestrator").is_dir()


@dataclass(frozen=True)
class Layout:
    test: Callable[[Path], bool]
    says: str  # {path}: the folder


LAYOUTS = (
    Layout(
        prime_rl_trainer,
        (
            "a prime-rl trainer checkpoint (torch distributed, no Hugging Face weights): prime-rl "
            "writes Hugging Face weights only to broadcasts/step_N/ with the filesystem weight "
            "transport (without config and tokenizer: copy those from the base model), or, before "
            "v0.8.1.dev57, to weights/step_N/ (ckpt.weights)"
        ),
    ),
    Layout(
        megatron_iteration,
        (
            "a Megatron torch_dist checkpoint (slime's --save iter_NNNNNNN/): convert it with "
            "slime's tools/convert_torch_dist_to_hf.py --input-dir {path} --output-dir OUT "
            "--origin-hf-dir BASE_HF_MODEL, or let slime write Hugging Face weights as it trains "
            "(--save-hf PATH)"
        ),
    ),
    Layout(
        mcore_adapter,
        (
            "ROLL's Megatron checkpoint (mcore_adapter: mca_config.json, iter_NNNNNNN/): convert "
            "it with ROLL's mcore_adapter/tools/convert.py --checkpoint_path {path} "
            "--output_path OUT, or train with the FSDP2 strategy, which saves Hugging Face weights"
        ),
    ),
    Layout(
        megatron_save_folder,
        (
            "slime's (Megatron's) --save folder of torch_dist iterations (iter_NNNNNNN/): convert "
            "one with slime's tools/convert_torch_dist_to_hf.py, or train with --save-hf PATH"
        ),
    ),
    Layout(
        openrlhf_checkpoints,
        (
            "OpenRLHF's checkpoint folder (DeepSpeed states in _actor/): point at the Hugging Face "
            "copies --ckpt.save_hf writes ({path}/global_stepN_hf/; --save_hf_ckpt before 0.10.2) "
            "or the final model in --ckpt.output_dir, or convert _actor/ with DeepSpeed's "
            "zero_to_fp32.py"
        ),
    ),
    Layout(
        deepspeed_folder,
        (
            "a DeepSpeed checkpoint folder (OpenRLHF's _actor/): write Hugging Face weights with "
            "`python zero_to_fp32.py {path} OUT -t global_stepN --safe_serialization` and copy "
            "config.json and the tokenizer from the base model, or train with --ckpt.save_hf"
        ),
    ),
    Layout(
        deepspeed_tag,
        (
            "a DeepSpeed checkpoint (OpenRLHF's _actor/global_stepN/): write Hugging Face weights "
            "with `python zero_to_fp32.py {parent} OUT -t {name} --safe_serialization` and copy "
            "config.json and the tokenizer from the base model, or train with --ckpt.save_hf "
            "(written to global_stepN_hf/ beside _actor/)"
        ),
    ),
)


def trainer_layout(path: Path) -> str | None:
    """What a trainer's checkpoint folder that the tool cannot read is, and what to do."""
    layout = next((layout for layout in LAYOUTS if layout.test(path)), None)
    if layout is None:
        return None
    return layout.says.format(path=path, parent=path.parent, name=path.name)
