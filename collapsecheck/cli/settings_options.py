"""Settings dataclasses as options: a command's parameter typed with a settings dataclass
(`collapsecheck.settings`, `collapsecheck.config.GateSettings`) stands for that dataclass's
fields, each one option named like the field, shown under the group's heading in --help; the
command receives the dataclass built from them (the config file's values where a flag is not
given). So `def scan(..., load: LoadSettings, ...)` reads as "scan takes every flag of
LoadSettings", and a flag is declared once, in its dataclass."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from collapsecheck.cli.app import user_errors
from collapsecheck.config import GateSettings
from collapsecheck.errors import CollapsecheckError
from collapsecheck.settings import (
    AnalysisSettings,
    EnvSettings,
    LoadSettings,
    OutputSettings,
    PromptSettings,
    RewardSettings,
    SamplingSettings,
    ScoringSettings,
    WatchSettings,
    flag_name,
)

# The heading each settings group's options appear under in --help.
PANELS = {
    SamplingSettings: "Sampling",
    PromptSettings: "Prompts",
    ScoringSettings: "Reasoning and scoring",
    AnalysisSettings: "Analysis",
    RewardSettings: "Rewards (why it collapsed)",
    LoadSettings: "Model and engine",
    GateSettings: "Gate",
    OutputSettings: "Outputs",
    WatchSettings: "Following the run",
    EnvSettings: "Agents across turns",
}


def _option(field: dataclasses.Field, annotation: Any, panel: str) -> inspect.Parameter:
    """One field as an option. A field the config file may set (`in_config`) defaults to
    None on the command line: `from_config_file` then fills it from the file, or leaves the
    field's own default."""
    meta = field.metadata
    flags = meta["flags"] or (flag_name(field.name),)
    kind = meta["cli_type"] or annotation
    filled = meta.get("in_config", False)
    if meta["cli_type"] is not None and (field.default is None or filled):
        kind = kind | None
    option = typer.Option(
        *flags, help=meta["help"], rich_help_panel=panel, metavar=meta.get("metavar")
    )
    return inspect.Parameter(
        field.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None if filled else field.default,
        annotation=Annotated[kind, option],
    )


def from_config_file(
    fields: list[dataclasses.Field], values: dict[str, Any], config: Path | None
) -> dict[str, Any]:
    """The values of a settings group's fields, taken out of `values`: the command line's,
    then for a field the config file may set (`in_config`) and the command line left out,
    the file's (`config`: --config, where the command has it), else the field's default."""
    from collapsecheck.config import file_setting

    chosen = {}
    for field in fields:
        value = values.pop(field.name)
        if field.metadata.get("in_config") and value is None:
            found = file_setting(config, field.name)
            if found is None:
                continue
            value = parse_file_setting(field.name, *found)
        chosen[field.name] = value
    return chosen


def parse_file_setting(name: str, value: Any, where: str) -> Any:
    """A config file's value of a scan setting, checked where the file names it."""
    from collapsecheck.settings import parse_fractions

    parsers = {"early_answer_fractions": parse_fractions}
    if not isinstance(value, str | list):
        raise CollapsecheckError(f"{where}: expected a list or a comma-separated text")
    return parsers[name](value, where)


def offered(group: type, command: str) -> list[dataclasses.Field]:
    """The fields of a settings group that `command` offers: all of them, but for outputs,
    which name their commands."""
    return [
        f for f in dataclasses.fields(group) if command in f.metadata.get("commands", (command,))
    ]


def settings_options(group: type, command: str) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group)
    return [_option(f, hints[f.name], PANELS[group]) for f in offered(group, command)]


def takes_settings(command: Callable[..., None]) -> Callable[..., None]:
    """Expand each parameter typed with a settings dataclass into that dataclass's options;
    the command receives the dataclass, built and checked (`setting_checks`) before it runs."""
    from collapsecheck.setting_checks import check_group

    hints = typing.get_type_hints(command)
    signature = inspect.signature(command, eval_str=True)
    groups = {name: hint for name, hint in hints.items() if hint in PANELS}
    own = [p for name, p in signature.parameters.items() if name not in groups]
    # arguments and --prompts first, then the settings' options, then the command's own
    leading = [p for p in own if p.default is inspect.Parameter.empty or p.name == "prompts"]
    trailing = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p not in leading]
    name = command.__name__
    expanded = [option for group in groups.values() for option in settings_options(group, name)]

    @functools.wraps(command)
    def wrapper(**values: Any) -> None:
        built = {}
        with user_errors():
            config = values.get("config")
            for param, group in groups.items():
                built[param] = group(**from_config_file(offered(group, name), values, config))
                check_group(built[param])
            command(**built, **values)

    leading = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in leading]
    wrapper.__signature__ = signature.replace(parameters=leading + expanded + trailing)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {}
    del wrapper.__wrapped__  # typer must read the expanded signature, not the command's
    return wrapper
