"""A RAGEN run's configuration, read as RAGEN composes it, never run (SPEC "RAGEN's own
environments"): the run's saved Hydra config (`.hydra/config.yaml`, looked for beside and above
the checkpoint as the temperature's config is), or the file `--env-config` names (a saved
config, or one of RAGEN's own `config/*.yaml`, composed with its `defaults` as Hydra composes
it: each default file from the same folder, in order, the file's own keys last unless
`_self_` says where; a default that is not there, such as veRL's `ppo_trainer`, is skipped and
named).

Every value `ragen:TAG` plays by comes from here with the key it came from; the flags override
some of them (`runs.units.PlayedTraces`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.trainer_configs import (
    ABOVE_CHECKPOINT,
    HYDRA_CONFIG,
    ancestors,
    lookup,
    read_config,
)

MAX_DEPTH = 8  # defaults lists nest (an experiment's `base`, base's `envs`) no deeper than this
VAL_SEED_UNSET = 123  # es_manager.reset's validation seed where `seed.val` is not set


@dataclass(frozen=True)
class Read:
    """One value and where it came from: `FILE (dotted.key)`, or RAGEN's code default."""

    value: Any
    source: str


@dataclass(frozen=True)
class RagenConfig:
    """A composed RAGEN configuration: its content, the file it was read from, and the files
    composed into it (and the defaults that were not found)."""

    path: Path
    content: dict[str, Any]
    composed: tuple[Path, ...] = ()
    missing: tuple[str, ...] = ()

    def read(self, key: str, default: Any = None, *, required: bool = False) -> Read:
        """The value at a dotted key (a whole `${other.key}` followed); `default` (RAGEN's own
        code default, said so) where the config does not set it; a key RAGEN itself requires
        and the config lacks is one line naming the file and key."""
        value = lookup(self.content, key)
        if value is not None:
            return Read(value, f"{self.path} ({key})")
        if required:
            raise CollapsecheckError(f"{self.path}: RAGEN's config sets no {key}")
        return Read(default, f"RAGEN's default ({key} unset in {self.path})")


def find_config(checkpoint: Path | None, named: Path | None) -> RagenConfig:
    """The configuration `ragen:TAG` reads: `--env-config FILE`, else the run's saved
    `.hydra/config.yaml` beside or above the checkpoint; neither is one line, exit 2."""
    if named is not None:
        if not named.is_file():
            raise CollapsecheckError(f"--env-config {named}: no such file")
        return compose(named)
    if checkpoint is not None:
        start = checkpoint if checkpoint.is_dir() else checkpoint.parent
        for folder in ancestors(start.resolve(), ABOVE_CHECKPOINT):
            if (folder / HYDRA_CONFIG).is_file():
                return compose(folder / HYDRA_CONFIG)
    raise CollapsecheckError(
        f"--env ragen:...: no RAGEN config found (no {HYDRA_CONFIG} beside or up to "
        f"{ABOVE_CHECKPOINT} folders above {checkpoint}); name one with --env-config FILE (the "
        "run's saved config, or RAGEN's config/base.yaml)"
    )


def compose(path: Path, depth: int = 0) -> RagenConfig:
    """`path` composed with its `defaults` list as Hydra composes a primary config."""
    content = read_config(path)
    if isinstance(content, str):
        raise CollapsecheckError(f"--env-config {path}: {content}")
    defaults = content.pop("defaults", None) or []
    if not isinstance(defaults, list) or depth > MAX_DEPTH:
        raise CollapsecheckError(f"{path}: `defaults` is not a list of config names")
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    merged: dict[str, Any] = {}
    composed: list[Path] = []
    missing: list[str] = []
    for entry in defaults:
        if entry == "_self_":
            merged = merged_into(merged, content)
            composed.append(path)
            continue
        name = default_name(entry, path)
        if name is None:
            missing.append(str(entry))
            continue
        found = path.parent / f"{name}.yaml"
        if not found.is_file():
            missing.append(name)
            continue
        part = compose(found, depth + 1)
        merged = merged_into(merged, part.content)
        composed += part.composed
        missing += part.missing
    return RagenConfig(path, merged, tuple(composed), tuple(missing))


def default_name(entry: Any, path: Path) -> str | None:
    """A defaults entry's file name (`envs`, or `{group: name}`'s `group/name`): None where it
    names an optional or overriding group entry this reader does not follow."""
    if isinstance(entry, str):
        return None if entry.startswith(("override ", "optional ")) else entry
    if isinstance(entry, Mapping) and len(entry) == 1:
        ((group, name),) = entry.items()
        if isinstance(group, str) and isinstance(name, str) and "@" not in group:
            return f"{group.removeprefix('optional ')}/{name}"
    return None


def merged_into(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Hydra's merge: mappings key by key, anything else (a list too) replaced whole."""
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merged_into(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass(frozen=True)
class RagenSetup:
    """What `ragen:TAG` plays by, each value with where it came from (SPEC "RAGEN's own
    environments"): the tag's `custom_envs` entry, the agent proxy's turn and parsing keys,
    the format penalty, the validation layout (the tag's seeds and group size) and the
    validation sampling."""

    config: RagenConfig
    tag: str
    entry: dict[str, Any]
    env_type: str
    max_actions_per_traj: Read
    max_tokens: Read
    action_sep: Read
    enable_think: Read
    max_actions_per_turn: Read
    context_window_mode: Read
    max_context_window: Read
    max_turn: Read
    format_penalty: Read
    first_seed: Read
    groups: Read
    group_size: Read
    temperature: Read
    response_length: Read
    max_model_len: Read
    notes: tuple[str, ...] = field(default=())

    def sources(self) -> dict[str, str]:
        """Each value as the report names it: `name: value (source)`."""
        reads = {
            "max_turn": self.max_turn, "group_size": self.group_size, "groups": self.groups,
            "first_seed": self.first_seed, "temperature": self.temperature,
            "action_sep": self.action_sep, "max_actions_per_turn": self.max_actions_per_turn,
            "max_actions_per_traj": self.max_actions_per_traj, "max_tokens": self.max_tokens,
            "format_penalty": self.format_penalty, "enable_think": self.enable_think,
            "context_window_mode": self.context_window_mode,
            "max_context_window": self.max_context_window,
            "response_length": self.response_length, "max_model_len": self.max_model_len,
        }  # fmt: skip
        return {name: f"{read.value!r} ({read.source})" for name, read in reads.items()}


def setup_for(config: RagenConfig, tag: str) -> RagenSetup:
    """The tag's entry and every value RAGEN's managers read for it; a tag the config's
    `custom_envs` lacks is one line naming the file and the tags it has."""
    envs = lookup(config.content, "custom_envs")
    if not isinstance(envs, Mapping) or tag not in envs:
        have = ", ".join(sorted(envs)) if isinstance(envs, Mapping) else "none"
        raise CollapsecheckError(
            f"--env ragen:{tag}: {config.path} has no custom_envs entry {tag!r} (it has: {have})"
        )
    entry = envs[tag]
    if not isinstance(entry, Mapping) or not isinstance(entry.get("env_type"), str):
        raise CollapsecheckError(f"{config.path} (custom_envs.{tag}): no env_type")
    at = f"custom_envs.{tag}"
    traj = config.read(f"{at}.max_actions_per_traj", required=True)
    length = config.read("actor_rollout_ref.rollout.response_length")
    tokens = config.read(f"{at}.max_tokens")
    if tokens.value is None:  # ctx_manager falls back to the response length
        tokens = Read(length.value, f"{length.source}, as {at}.max_tokens is unset")
    seed, groups, notes = validation_seeds(config, tag)
    return RagenSetup(
        config, tag, dict(entry), entry["env_type"], traj, tokens,
        config.read("agent_proxy.action_sep", required=True),
        config.read("agent_proxy.enable_think", required=True),
        config.read("agent_proxy.max_actions_per_turn", required=True),
        config.read("agent_proxy.context_window_mode", "full"),
        config.read("agent_proxy.max_context_window", -1),
        config.read("agent_proxy.max_turn", required=True),
        config.read("es_manager.format_penalty", 0.0),
        seed, groups,
        config.read("es_manager.val.group_size", required=True),
        config.read("actor_rollout_ref.rollout.val_kwargs.temperature", required=True),
        length, config.read("actor_rollout_ref.rollout.max_model_len"), tuple(notes),
    )  # fmt: skip


def validation_seeds(config: RagenConfig, tag: str) -> tuple[Read, Read, list[str]]:
    """The first seed and the number of the tag's validation groups, as `es_manager.reset`
    hands them out: group g (counted over all validation tags, in their order) resets with
    `seed.val + g` (123 where unset)."""
    base = config.read("seed.val", VAL_SEED_UNSET)
    tags = lookup(config.content, "es_manager.val.env_configs.tags") or []
    counts = lookup(config.content, "es_manager.val.env_configs.n_groups") or []
    where = f"{config.path} (es_manager.val.env_configs)"
    if tag not in tags:
        note = (
            f"{tag} is not among the validation tags {list(tags)} of {config.path}: its start "
            f"states are seeds {base.value} on, as if it were validated first"
        )
        return base, Read(None, where), [note]
    if len(counts) != len(tags):
        raise CollapsecheckError(f"{where}: tags and n_groups differ in length")
    index = list(tags).index(tag)
    offset = sum(int(n) for n in counts[:index])
    first = Read(int(base.value) + offset, f"{base.source} + {offset} groups of earlier tags")
    return first, Read(int(counts[index]), f"{where}: n_groups[{index}]"), []
