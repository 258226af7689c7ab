"""Environments an agent is played in (`scan --env SPEC`, SPEC "Agents across turns"): one
adapter module per framework's protocol, each a loader of its specs, which make one `Game` per
episode (`protocol`):

- `factories`: `FILE.py:FACTORY`, `package.module:FACTORY` or a built-in (`frozenlake`),
  played as collapsecheck plays them (the chat of observations and responses);
- `ragen`: `ragen:TAG`, RAGEN's own environments as RAGEN's managers play them;
- the frameworks whose trainers play a chat (SPEC "Every framework's environment"), each a
  `chat.Session` behind `chat.ChatGame`: `skyrl` (SkyRL-gym), `trl_tools` (TRL's
  environment_factory), `textarena`, `gem`, `openenv`;
- the harnesses that drive the model themselves through collapsecheck's OpenAI-compatible
  endpoint (SPEC "Agents behind an OpenAI client"; `protocol.DrivenSource`): `command` (any
  harness, run as a command) and `verifiers_envs` (verifiers' classic environments, in
  process); the endpoint is `openai_wire` (the wire format), `endpoint` (the app, served or in
  process, and its recording), `tool_calls` and `conversations` (the recording as episodes).

Every call into an environment's code goes through `calls.call_within` (--env-timeout). A
framework is one module and one line of `ADAPTERS` (its prefix and `protocol.Adapter`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.environments.command import COMMAND
from collapsecheck.inputs.environments.factories import (
    Environment,
    EnvironmentSpec,
    kept_info,
    load_factory,
    parse_env_args,
)
from collapsecheck.inputs.environments.gem import GEM
from collapsecheck.inputs.environments.openenv import OPENENV
from collapsecheck.inputs.environments.protocol import (
    Adapter,
    DrivenSource,
    EnvironmentSource,
    Game,
    Loading,
    Resolved,
    TurnPlayed,
    refuse_unused,
)
from collapsecheck.inputs.environments.ragen import RAGEN
from collapsecheck.inputs.environments.skyrl import SKYRL
from collapsecheck.inputs.environments.textarena import TEXTARENA
from collapsecheck.inputs.environments.trl_tools import TRL_TOOLS
from collapsecheck.inputs.environments.verifiers_envs import VERIFIERS

# a SPEC `PREFIX:NAME` is loaded by its adapter; any other is a factory's, played as the one
# adapter that recognises what it makes plays it, else as collapsecheck plays it (`factories`)
ADAPTERS: dict[str, Adapter] = {
    "command": COMMAND,
    "gem": GEM,
    "openenv": OPENENV,
    "ragen": RAGEN,
    "skyrl": SKYRL,
    "textarena": TEXTARENA,
    "trl": TRL_TOOLS,
    "verifiers": VERIFIERS,
}


def load_environment(
    spec: str,
    kwargs: Mapping[str, Any] | None = None,
    near: Path | None = None,
    config: Path | None = None,
    dataset: Path | None = None,
    timeout: float = 60.0,
) -> EnvironmentSource:
    """The SPEC loaded and checked before any model loads (`kwargs`: --env-arg; `near`: the
    checkpoint; `config`: --env-config; `dataset`: --prompts; `timeout`: --env-timeout)."""
    return loaded_environment(spec, Loading(dict(kwargs or {}), near, config, dataset, timeout))


def loaded_environment(spec: str, loading: Loading) -> EnvironmentSource:
    prefix, _, name = spec.partition(":")
    if prefix in ADAPTERS:  # `skyrl` alone is `skyrl:` (a SkyRL dataset's own env_class)
        return ADAPTERS[prefix].load(name, loading)
    factory, made = load_factory(spec, loading.kwargs, loading.timeout)
    claims = [p for p, a in ADAPTERS.items() if a.recognises is not None and a.recognises(made)]
    if len(claims) > 1:
        named = " or ".join(f"{p}:{spec}" for p in claims)
        raise CollapsecheckError(
            f"--env {spec}: what the factory makes has what {' and '.join(claims)} "
            f"environments have; say which it is: --env {named}"
        )
    if claims:
        adopt = ADAPTERS[claims[0]].adopt
        assert adopt is not None, "an adapter that recognises a factory's object adopts it"
        return adopt(factory, loading)  # an adopter refuses the options it does not use
    refuse_unused(spec, loading, ("--env-arg",), FACTORY_TAKES)
    return factory


FACTORY_TAKES = (
    "--env-config and --prompts go with a framework's environment: "
    + ", ".join(f"{p}:" for p in ADAPTERS)
    + "..."
)


__all__ = [
    "ADAPTERS",
    "DrivenSource",
    "Environment",
    "EnvironmentSource",
    "EnvironmentSpec",
    "Game",
    "Loading",
    "Resolved",
    "TurnPlayed",
    "kept_info",
    "load_environment",
    "parse_env_args",
]
