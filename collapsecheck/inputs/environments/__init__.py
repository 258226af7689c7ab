"""Environments an agent is played in (`scan --env SPEC`, SPEC "Agents across turns"): one
adapter module per framework's protocol, each a loader of its specs, which make one `Game` per
episode (`protocol`):

- `factories`: `FILE.py:FACTORY`, `package.module:FACTORY` or a built-in (`frozenlake`),
  played as collapsecheck plays them (the chat of observations and responses);
- `ragen`: `ragen:TAG`, RAGEN's own environments as RAGEN's managers play them.

A framework is one module and one line of `ADAPTERS` (its prefix and loader)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.factories import (
    Environment,
    EnvironmentSpec,
    kept_info,
    load_factory,
    parse_env_args,
)
from collapsecheck.inputs.environments.protocol import (
    EnvironmentSource,
    Game,
    Resolved,
    TurnPlayed,
)
from collapsecheck.inputs.environments.ragen import load_ragen

# a SPEC `PREFIX:NAME` is loaded by its adapter as loader(NAME, near, config); any other by
# `load_factory`
ADAPTERS: dict[str, Callable[[str, Path | None, Path | None], EnvironmentSource]] = {
    "ragen": load_ragen,
}


def load_environment(
    spec: str,
    kwargs: Mapping[str, Any],
    near: Path | None = None,
    config: Path | None = None,
) -> EnvironmentSource:
    """The SPEC loaded and checked before any model loads (`near`: the checkpoint, beside
    which a framework's saved config is looked for; `config`: --env-config)."""
    prefix, sep, name = spec.partition(":")
    if sep and prefix in ADAPTERS:
        if kwargs:
            raise CollapsecheckError(
                f"--env {spec}: --env-arg goes with FILE.py:FACTORY (the {prefix} environment is "
                "built from its config)"
            )
        return ADAPTERS[prefix](name, near, config)
    if config is not None:
        raise CollapsecheckError(
            f"--env-config goes with --env {' or '.join(f'{p}:TAG' for p in ADAPTERS)}"
        )
    return load_factory(spec, kwargs)


__all__ = [
    "ADAPTERS",
    "Environment",
    "EnvironmentSource",
    "EnvironmentSpec",
    "Game",
    "Resolved",
    "TurnPlayed",
    "kept_info",
    "load_environment",
    "parse_env_args",
]
