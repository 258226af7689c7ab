"""The trainer's saved configuration, where it lies beside its rollouts or checkpoints in a
form read without running code (YAML, JSON, TOML; a pickle such as TRL's `training_args.bin`
stays unread): what it says of the temperature the rollouts were sampled at (SPEC "Traces
the trainer sampled: their temperature").

Each trainer's rollout reader declares a `SavedConfig`: the files its trainer (or Hydra, for
its entry point) writes, relative to a folder, and the keys naming the temperature of its
training and of its evaluation rollouts. Hydra saves `.hydra/config.yaml` unresolved: a value
that is a whole `${dotted.key}` is followed to that key; any other interpolation (an
environment variable, a resolver) cannot be read without running it, and is said so."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# how far above the rollouts (their folder, then its parents) and above the checkpoint a saved
# configuration is looked for: prime-rl's run folder is 4 above its traces.jsonl's folder
ABOVE_ROLLOUTS = 5
ABOVE_CHECKPOINT = 3
HYDRA_CONFIG = ".hydra/config.yaml"  # where a Hydra entry point saves the config it composed
REFERENCE = re.compile(r"\$\{([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)\}")
MAX_HOPS = 16


def never(path: Path) -> bool:
    return False


def always(path: Path) -> bool:
    return True


@dataclass(frozen=True)
class TemperatureKeys:
    """Where a configuration names the temperature of one kind of rollouts: the first of
    `keys` that is set (dotted); 0 (greedy) where `do_sample` is set false. `default`: the
    trainer's own default, in words, for the warning where nothing says it, and `usual`: that
    default's value where it is one number."""

    keys: tuple[str, ...]
    default: str
    usual: float | None = None
    do_sample: str | None = None


@dataclass(frozen=True)
class SavedConfig:
    """Where a trainer saves its configuration (`files`, relative to a folder; none where it
    saves none that can be read without running code) and which keys name the temperature of
    its training and evaluation rollouts. A rollout file is an evaluation dump where
    `evaluates(path)` says so, or where the configuration's `evaluation_dir` key names a
    folder holding it (veRL writes training and validation dumps alike, to folders its config
    names)."""

    trainer: str
    training: TemperatureKeys
    evaluation: TemperatureKeys
    files: tuple[str, ...] = ()
    evaluates: Callable[[Path], bool] = field(default=never, compare=False)
    evaluation_dir: str | None = None


@dataclass(frozen=True)
class ConfigReading:
    """What one configuration file says: the temperature (None: not said), the key that
    said it, or why it could not be read."""

    path: Path
    temperature: float | None
    key: str | None = None
    problem: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path} ({self.key})"


def candidate_folders(rollouts: Path, checkpoint: Path | None) -> list[Path]:
    """The folders a saved configuration is looked for in, nearest first: the rollouts' own
    and those above it, then the checkpoint's and those above it."""
    start = rollouts if rollouts.is_dir() else rollouts.parent
    found = list(ancestors(start.resolve(), ABOVE_ROLLOUTS))
    if checkpoint is not None:
        found += [p for p in ancestors(checkpoint.resolve(), ABOVE_CHECKPOINT) if p not in found]
    return found


def ancestors(folder: Path, levels: int) -> Iterator[Path]:
    yield folder
    yield from list(folder.parents)[:levels]


def read_config(path: Path) -> dict[str, Any] | str:
    """A configuration file's content as a mapping, or why it cannot be read."""
    try:
        content = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(content)
        elif path.suffix == ".toml":
            data = tomllib.loads(content)
        else:
            data = yaml.safe_load(content)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as error:
        return f"not readable ({' '.join(str(error).split())[:120]})"
    return data if isinstance(data, dict) else "not a mapping of settings"


def lookup(config: dict[str, Any], key: str) -> Any:
    """The value at a dotted key (None where absent), a whole `${other.key}` followed."""
    value: Any = None
    for _ in range(MAX_HOPS):
        value = config
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        reference = REFERENCE.fullmatch(value) if isinstance(value, str) else None
        if reference is None:
            return value
        key = reference.group(1)
    return value


def temperature_in(
    config: dict[str, Any], keys: TemperatureKeys
) -> tuple[float | None, str | None, str | None]:
    """(temperature, key, problem) of one kind of rollouts in a configuration."""
    if keys.do_sample is not None and lookup(config, keys.do_sample) is False:
        return 0.0, keys.do_sample, None
    for key in keys.keys:
        value = lookup(config, key)
        if value is None:
            continue
        if isinstance(value, str) and "${" in value:
            return None, key, f"{key} is {value!r}, which only running the trainer resolves"
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            return None, key, f"{key} is {value!r}, not a temperature"
        return float(value), key, None
    return None, None, None


def is_evaluation(saved: SavedConfig, rollouts: Path, config: dict[str, Any]) -> bool:
    """Whether the rollouts are an evaluation dump: the reader says so, or the configuration
    names the folder they lie in as its evaluation dumps' (a path ending in its folders)."""
    if saved.evaluates(rollouts):
        return True
    named = lookup(config, saved.evaluation_dir) if saved.evaluation_dir else None
    if not isinstance(named, str) or not named.strip() or "${" in named:
        return False
    wanted = [p for p in Path(named).parts if p not in (".", "/")]
    folder = (rollouts if rollouts.is_dir() else rollouts.parent).resolve().parts
    return bool(wanted) and list(folder[-len(wanted) :]) == wanted


def saved_temperature(
    saved: SavedConfig, rollouts: Path, checkpoint: Path | None
) -> tuple[ConfigReading | None, list[ConfigReading]]:
    """The nearest saved configuration that names the rollouts' temperature, and every
    configuration file found that does not (or cannot be read), nearest first."""
    unsaid: list[ConfigReading] = []
    for folder in candidate_folders(rollouts, checkpoint):
        for name in saved.files:
            path = folder / name
            if not path.is_file():
                continue
            config = read_config(path)
            if isinstance(config, str):
                unsaid.append(ConfigReading(path, None, problem=config))
                continue
            evaluation = is_evaluation(saved, rollouts, config)
            keys = saved.evaluation if evaluation else saved.training
            value, key, problem = temperature_in(config, keys)
            reading = ConfigReading(path, value, key, problem)
            if value is not None:
                return reading, unsaid
            unsaid.append(reading)
    return None, unsaid


def kind_of(saved: SavedConfig, rollouts: Path) -> TemperatureKeys:
    """The keys of these rollouts' kind, where no configuration was found to tell (veRL's
    evaluation folders cannot be told without one: training)."""
    return saved.evaluation if saved.evaluates(rollouts) else saved.training
