"""veRL FSDP actor checkpoints: `model_world_size_W_rank_R.pt` shards beside
`huggingface/config.json` (in the folder or its `actor/`), merged in memory. Older veRL (the
one verl-agent ships) saves the config and tokenizer beside the shards, with no
`huggingface/`: read from there. SkyRL's `global_step_N/policy/` holds the same shards (its
FSDP strategy's `save_checkpoint` torch.saves each rank's FSDP2 state dict under the same
names, skyrl/backends/skyrl_train/distributed/fsdp_strategy.py at SkyRL a956457) with
`huggingface/`: read alike.

Each shard is one rank's state dict. Its values are DTensors (FSDP2) whose placements say how
to merge them, one per mesh dimension (Shard(d): concatenate along d in mesh order;
Replicate: one replica, as HSDP's `(Replicate(), Shard(0))` on a 2-D mesh needs), or plain
tensors, taken once when every rank holds the same one (as veRL's merger does).

The shards are Python pickles: loading one can run code. They are loaded with
`weights_only=True`, which allows tensors and DTensors only; a shard that needs more is
refused unless the user passes `--trust-checkpoint-pickle`.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.formats.base import (
    Checkpoint,
    LoadBase,
    Require,
    model_from_config,
    own_files,
)
from collapsecheck.settings import LoadSettings

KIND = "verl-fsdp"
SHARD_NAME = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")
SHARD_PATTERN = "model_world_size_W_rank_R.pt"
EXPECTED = f"veRL {SHARD_PATTERN} shards with huggingface/config.json"
LOCATIONS = (".", "actor", "policy")  # policy/: SkyRL's global_step_N/
LORA_META = "lora_train_meta.json"  # a LoRA run's {"r", "lora_alpha", "task_type"}
PEFT_PREFIX = "base_model.model."
LORA_A, LORA_B = ".lora_A.default.weight", ".lora_B.default.weight"


def shard_files(directory: Path) -> list[tuple[int, int, Path]]:
    """(world size, rank, path) of every shard file in a directory."""
    found = []
    for path in sorted(directory.glob("model_world_size_*_rank_*.pt")):
        match = SHARD_NAME.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), int(match.group(2)), path))
    return found


def config_folder(actor: Path) -> Path | None:
    """Where an actor folder's config.json is: `huggingface/`, or (older veRL) the folder."""
    return next((f for f in (actor / "huggingface", actor) if (f / "config.json").is_file()), None)


def detect(path: Path, base_model: Path | None, require: Require) -> Checkpoint | None:
    for candidate in (path / location for location in LOCATIONS):
        config = config_folder(candidate) if candidate.is_dir() else None
        if config is not None and shard_files(candidate):
            note = (
                f"{candidate} holds a LoRA run's shards: merged in memory as W + alpha/r B A "
                f"from its {LORA_META}"
                if (candidate / LORA_META).is_file()
                else None
            )
            return Checkpoint(KIND, candidate, config, note=note)
    return None


def files(checkpoint: Checkpoint) -> list[Path]:
    shards = [path for _, _, path in shard_files(checkpoint.path)]
    meta = [checkpoint.path / LORA_META] if (checkpoint.path / LORA_META).is_file() else []
    config = [p for p in own_files(checkpoint.config_dir) if p.suffix != ".pt"]  # not the shards
    return shards + meta + config


def shard_paths(actor_dir: Path) -> list[Path]:
    """The shards of one world size, in rank order, all ranks present."""
    found: dict[int, dict[int, Path]] = {}
    for world, rank, path in shard_files(actor_dir):
        found.setdefault(world, {})[rank] = path
    if len(found) != 1:
        raise CollapsecheckError(
            f"{actor_dir}: shards of {len(found)} different world sizes; expected one"
        )
    world, ranks = next(iter(found.items()))
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise CollapsecheckError(
            f"{actor_dir}: world size {world} but no shard for rank(s) {missing}"
        )
    return [ranks[r] for r in range(world)]


def load_shard(path: Path, trust_pickle: bool) -> dict[str, Any]:
    import torch
    import torch.distributed.tensor  # lets weights_only unpickle DTensors

    logging.getLogger("torch.distributed.device_mesh").setLevel(logging.ERROR)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not trust_pickle:
            raise CollapsecheckError(
                f"{path}: this shard holds Python objects beyond tensors, and unpickling them "
                "can run code from the file; pass --trust-checkpoint-pickle only if you trust it"
            ) from None
    return torch.load(path, map_location="cpu", weights_only=False)


def _assemble(key: str, mesh: Any, placements: Sequence[Any], local: Sequence[Any]) -> Any:
    """The full tensor from the local shards of the ranks in `mesh` (a tensor of ranks),
    one mesh dimension at a time: Shard(d) concatenates along d in mesh order, Replicate
    takes the first replica (HSDP's replicas hold the same shards)."""
    import torch

    if mesh.ndim == 0:
        return local[int(mesh)]
    placement, inner = placements[0], placements[1:]
    if placement.is_replicate():
        return _assemble(key, mesh[0], inner, local)
    if placement.is_shard():
        parts = [_assemble(key, mesh[i], inner, local) for i in range(mesh.shape[0])]
        return torch.cat(parts, dim=placement.dim)
    raise CollapsecheckError(f"parameter {key}: placement {placement} cannot be merged")


def _merge(key: str, values: list[Any]) -> Any:
    """One parameter from every rank's value: DTensors by their placements; a plain tensor
    taken once when every rank holds the same one, refused otherwise."""
    import torch
    from torch.distributed.tensor import DTensor

    if not isinstance(values[0], DTensor):
        first = values[0]
        if all(v.shape == first.shape and torch.equal(v, first) for v in values[1:]):
            return first
        raise CollapsecheckError(
            f"parameter {key}: the ranks hold different plain tensors and no DTensor placement "
            "says how to merge them"
        )
    mesh = values[0].device_mesh.mesh
    return _assemble(key, mesh, values[0].placements, [v.to_local() for v in values])


def fit_report(model: Any, state: dict[str, Any]) -> str | None:
    """What does not fit between a model and a state dict: a few names of each kind, with
    counts (None when everything fits). Tied weights the state leaves out are fine."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in expected if k not in state and k not in tied and "lm_head" not in k]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {expected[k]}"
        for k in state
        if k in expected and tuple(state[k].shape) != expected[k]
    ]
    parts = [
        f"{len(names)} {kind} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        for kind, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("of another shape", mismatched),
        )
        if names
    ]
    return "; ".join(parts) or None


def load_fsdp_state_dict(actor_dir: Path, trust_pickle: bool = False) -> dict[str, Any]:
    """The full state dict of a veRL FSDP actor checkpoint (tensors only)."""
    import torch

    shards = [load_shard(p, trust_pickle) for p in shard_paths(actor_dir)]
    keys = [k for k, v in shards[0].items() if isinstance(v, torch.Tensor)]
    return {key: _merge(key, [shard[key] for shard in shards]).contiguous() for key in keys}


def lora_scale(actor_dir: Path) -> float:
    """alpha / r from veRL's lora_train_meta.json ({"r", "lora_alpha", "task_type"})."""
    path = actor_dir / LORA_META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        return float(meta["lora_alpha"]) / float(meta["r"])
    except FileNotFoundError:
        raise CollapsecheckError(
            f"{actor_dir}: the shards hold LoRA weights but no {LORA_META} gives their rank and "
            "alpha"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        raise CollapsecheckError(f"{path}: no usable r and lora_alpha ({err})") from None


def merge_lora(state: dict[str, Any], scale: float, base: dict[str, Any] | None) -> dict[str, Any]:
    """A PEFT-wrapped state dict, as veRL saves a LoRA run, merged as PEFT merges: every
    adapted weight becomes W + scale B A. `base` supplies the weights the shards leave out
    (`save_lora_only`)."""
    merged = dict(base or {})
    for key, value in state.items():
        if not (key.endswith(LORA_A) or key.endswith(LORA_B)):
            merged[key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")] = value
    for key, a in state.items():
        if not key.endswith(LORA_A):
            continue
        name = key.removeprefix(PEFT_PREFIX)[: -len(LORA_A)] + ".weight"
        b = state[key[: -len(LORA_A)] + LORA_B]
        if name not in merged:
            raise CollapsecheckError(
                f"LoRA weights for {name} but no base weight for it: give the base model with "
                "--base-model"
            )
        weight = merged[name]
        merged[name] = (weight.float() + scale * (b.float() @ a.float())).to(weight.dtype)
    return merged


def lora_base_state(checkpoint: Checkpoint, settings: LoadSettings, load_base: LoadBase) -> Any:
    """The base weights of `save_lora_only` shards: --base-model, else the config's model path
    when it is a local directory."""
    from collapsecheck.inputs.formats import huggingface

    named = settings.base_model
    if named is None:
        config = json.loads((checkpoint.config_dir / "config.json").read_text(encoding="utf-8"))
        local = Path(config.get("_name_or_path") or "")
        named = local if str(local) and huggingface.is_model_directory(local) else None
    if named is None:
        raise CollapsecheckError(
            f"{checkpoint.path}: the shards hold only LoRA weights (save_lora_only) and the "
            "config names no local base model: give it with --base-model (nothing is downloaded)"
        )
    base = Checkpoint(huggingface.KIND, Path(named), Path(named))
    return load_base(base).state_dict()


def load_weights(
    checkpoint: Checkpoint, dtype: Any, settings: LoadSettings, load_base: LoadBase
) -> Any:
    model = model_from_config(checkpoint.config_dir, dtype, settings.trust_remote_code)
    state = load_fsdp_state_dict(checkpoint.path, settings.trust_checkpoint_pickle)
    if any(key.endswith(LORA_A) for key in state):
        only_lora = all(k.endswith(LORA_A) or k.endswith(LORA_B) for k in state)
        base = lora_base_state(checkpoint, settings, load_base) if only_lora else None
        state = merge_lora(state, lora_scale(checkpoint.path), base)
    misfit = fit_report(model, state)
    if misfit is not None:
        raise CollapsecheckError(
            f"{checkpoint.path}: the merged shards do not fit {checkpoint.config_dir}/config.json: "
            f"{misfit}"
        )
    model.load_state_dict(state, strict=False)
    if getattr(model, "_tied_weights_keys", None):
        model.tie_weights()
    return model
