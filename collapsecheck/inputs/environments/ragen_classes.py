"""RAGEN's own environment classes, imported from the RAGEN the user has installed, without
what only its trainer needs.

`import ragen.env` runs `ragen/__init__.py`, which imports veRL (and with it Ray, tensordict and
hydra) for an OmegaConf patch, and `ragen/env/__init__.py`, which imports every environment
RAGEN has (datasets, gym, gym_sokoban, matplotlib among their needs). Neither is needed to play
one environment. So the two packages are registered bare (their folders, their `__init__`
unrun), `ragen/env/__init__.py` is read, not run, for its `REGISTERED_ENVS` and
`REGISTERED_ENV_CONFIGS` (each name's class and the module it is imported from), and only the
two modules of the one environment type played are imported, with whatever they import
themselves (docs/decisions.md, "RAGEN's environments without its trainer")."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError

INSTALL = (
    "RAGEN installs from its repository: git clone https://github.com/mll-lab-nu/RAGEN && "
    "pip install -e RAGEN (its environments' own needs, gymnasium and the like, with it)"
)
REGISTRIES = ("REGISTERED_ENVS", "REGISTERED_ENV_CONFIGS")


@dataclass(frozen=True)
class RagenClasses:
    """One environment type's class and its config class, and the RAGEN folder they came
    from."""

    env_type: str
    env_class: Any
    config_class: Any
    origin: Path


def ragen_folder(where: str) -> Path:
    """The installed `ragen` package's folder, found without running its `__init__`."""
    loaded = sys.modules.get("ragen")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(next(iter(loaded.__path__)))
    try:
        spec = importlib.util.find_spec("ragen")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise CollapsecheckError(f"{where}: RAGEN is not installed (no module named 'ragen'); "
                                 f"{INSTALL}")  # fmt: skip
    return Path(next(iter(spec.submodule_search_locations)))


def bare_package(name: str, folder: Path) -> None:
    """`name` importable as the package in `folder` without running its `__init__.py` (kept
    where the package is already imported)."""
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__file__ = str(folder / "__init__.py")
    module.__package__ = name
    sys.modules[name] = module


def registry(init: Path) -> dict[str, dict[str, str]]:
    """`ragen/env/__init__.py`'s two registries as written: each environment type's class as
    `module:Name`, read from its imports and its dict and item assignments."""
    tree = ast.parse(init.read_text(encoding="utf-8"), filename=str(init))
    imported: dict[str, str] = {}
    found: dict[str, dict[str, str]] = {name: {} for name in REGISTRIES}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = f"ragen.env.{node.module}:{alias.name}"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and target.id in found and isinstance(value, ast.Dict):
                for key, name in zip(value.keys, value.values, strict=True):
                    if isinstance(key, ast.Constant) and isinstance(name, ast.Name):
                        found[target.id][key.value] = name.id
            elif (
                isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and target.value.id in found and isinstance(target.slice, ast.Constant)
                and isinstance(value, ast.Name)
            ):  # fmt: skip
                found[target.value.id][target.slice.value] = value.id
    return {
        registry: {kind: imported[name] for kind, name in names.items() if name in imported}
        for registry, names in found.items()
    }


def ragen_classes(env_type: str, where: str) -> RagenClasses:
    """`REGISTERED_ENVS[env_type]` and `REGISTERED_ENV_CONFIGS[env_type]` of the installed
    RAGEN; anything missing is one line naming it."""
    folder = ragen_folder(where)
    init = folder / "env" / "__init__.py"
    if not init.is_file():
        raise CollapsecheckError(f"{where}: {folder} has no env/__init__.py: not RAGEN's package")
    registered = registry(init)
    known = registered["REGISTERED_ENVS"]
    if env_type not in known or env_type not in registered["REGISTERED_ENV_CONFIGS"]:
        raise CollapsecheckError(
            f"{where}: RAGEN at {folder} registers no environment type {env_type!r} (it has: "
            f"{', '.join(sorted(known))})"
        )
    bare_package("ragen", folder)
    bare_package("ragen.env", folder / "env")
    env_class = imported(known[env_type], where)
    config_class = imported(registered["REGISTERED_ENV_CONFIGS"][env_type], where)
    return RagenClasses(env_type, env_class, config_class, folder)


def imported(target: str, where: str) -> Any:
    """`module:Name` imported; a module it needs that is not installed is one line naming it."""
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise CollapsecheckError(
            f"{where}: RAGEN's {module_name} needs {err.name!r}, which is not installed; {INSTALL}"
        ) from None
    except Exception as err:  # RAGEN's module can fail in any way
        raise CollapsecheckError(
            f"{where}: RAGEN's {module_name} failed to import ({type(err).__name__}: {err})"
        ) from None
    found = getattr(module, name, None)
    if found is None:
        raise CollapsecheckError(f"{where}: RAGEN's {module_name} has no {name}")
    return found
