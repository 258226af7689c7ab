"""Gate settings from a config file: `--config FILE`, else `collapsecheck.toml` in the working
directory, else the `[tool.collapsecheck]` table of its `pyproject.toml`. Options given on the
command line win over the file; the file wins over the defaults.

    [tool.collapsecheck]
    fail_on = ["template_collapse", "low_entropy_collapse"]
    dependence_high = 0.7
    dependence_collapsed = 0.3
    entropy_low = 0.05
    max_drop = 0.0

    [tool.collapsecheck.min]      # any metric of the SPEC: fail below this point value
    normalized_mi = 0.5
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError
from collapsecheck.measures.regimes import (
    ACTION_COLLAPSE,
    COLLAPSES,
    DECORATIVE,
    LOOPING,
    MIXED,
    POST_HOC,
    REGIMES,
    STALLING,
    FlowThresholds,
    Thresholds,
)
from collapsecheck.settings import GROUPS, setting

CONFIG_FILE = "collapsecheck.toml"
THRESHOLD_KEYS = ("dependence_high", "dependence_collapsed", "entropy_low")
FLOW_THRESHOLD_KEYS = tuple(f.name for f in fields(FlowThresholds))
# settings of a scan the file may hold beside the gate's (`setting(in_config=True)`): the
# commands take them where the flag is not given (collapsecheck.cli, `takes_settings`)
SCAN_KEYS = tuple(
    f.name for group in GROUPS.values() for f in fields(group) if f.metadata["in_config"]
)
KNOWN_KEYS = {*THRESHOLD_KEYS, *FLOW_THRESHOLD_KEYS, *SCAN_KEYS, "fail_on", "max_drop", "min"}
FAIL_REGIMES = (*REGIMES, DECORATIVE, ACTION_COLLAPSE, MIXED, POST_HOC, LOOPING, STALLING)


@dataclass(frozen=True)
class GateConfig:
    """What makes a checkpoint fail: its regime, metric minimums, a drop against a baseline."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    flow_thresholds: FlowThresholds = field(default_factory=FlowThresholds)
    fail_on: frozenset[str] = frozenset(COLLAPSES)
    minimums: dict[str, float] = field(default_factory=dict)
    max_drop: float = 0.0
    source: str = "defaults"


def parse_fail_on(value: Any, where: str = "--fail-on") -> frozenset[str]:
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise CollapsecheckError(f"{where}: expected regimes as a list or a comma-separated text")
    regimes = {str(v).strip() for v in items if str(v).strip()}
    if regimes == {"none"}:
        return frozenset()
    unknown = regimes - set(FAIL_REGIMES)
    if unknown:
        raise CollapsecheckError(
            f"{where}: unknown regime {', '.join(sorted(unknown))} "
            f"(choose from {', '.join(FAIL_REGIMES)}, or none)"
        )
    return frozenset(regimes)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CollapsecheckError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _read_table(path: Path) -> tuple[dict[str, Any], str] | None:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise CollapsecheckError(f"{path}: invalid TOML ({err})") from None
    except UnicodeDecodeError:
        raise CollapsecheckError(f"{path}: not valid UTF-8 text") from None
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("collapsecheck")
        return (table, f"{path} [tool.collapsecheck]") if table is not None else None
    return data, str(path)


def find_config(explicit: Path | None, directory: Path | None = None) -> tuple[dict[str, Any], str]:
    """The config table and where it came from ({} and "defaults" when there is none)."""
    if explicit is not None:
        if not explicit.is_file():
            raise CollapsecheckError(f"--config: file not found: {explicit}")
        found = _read_table(explicit)
        if found is None:
            raise CollapsecheckError(f"{explicit}: no [tool.collapsecheck] table")
        return found
    directory = directory or Path.cwd()
    for candidate in (directory / CONFIG_FILE, directory / "pyproject.toml"):
        if candidate.is_file():
            found = _read_table(candidate)
            if found is not None:
                return found
    return {}, "defaults"


def file_setting(config: Path | None, key: str) -> tuple[Any, str] | None:
    """A scan setting's value in the config file (`--config`, else the one found) and where
    it was read, for the error that names it; None where the file does not set it."""
    table, where = find_config(config)
    return (table[key], f"{where}: {key}") if key in table else None


def gate_from_table(table: dict[str, Any], where: str) -> GateConfig:
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        raise CollapsecheckError(
            f"{where}: unknown setting {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(KNOWN_KEYS))})"
        )
    thresholds = {k: _number(table[k], f"{where}: {k}") for k in THRESHOLD_KEYS if k in table}
    flow = {k: _number(table[k], f"{where}: {k}") for k in FLOW_THRESHOLD_KEYS if k in table}
    minimums = table.get("min", {})
    if not isinstance(minimums, dict):
        raise CollapsecheckError(f"{where}: min must be a table of metric = value")
    try:
        return GateConfig(
            thresholds=Thresholds(**thresholds),
            flow_thresholds=FlowThresholds(**flow),
            fail_on=parse_fail_on(table["fail_on"], f"{where}: fail_on")
            if "fail_on" in table
            else frozenset(COLLAPSES),
            minimums={k: _number(v, f"{where}: min.{k}") for k, v in minimums.items()},
            max_drop=_number(table.get("max_drop", 0.0), f"{where}: max_drop"),
            source=where,
        )
    except ValueError as err:
        raise CollapsecheckError(f"{where}: {err}") from None


def load_gate(
    config: Path | None = None,
    *,
    fail_on: str | None = None,
    thresholds: dict[str, float | None] | None = None,
    minimums: dict[str, float | None] | None = None,
    max_drop: float | None = None,
) -> GateConfig:
    """The gate: command-line values (None where not given) over the config file's."""
    gate = gate_from_table(*find_config(config))
    given = {k: v for k, v in (thresholds or {}).items() if v is not None}
    flow = {k: given.pop(k) for k in FLOW_THRESHOLD_KEYS if k in given}
    try:
        merged = replace(gate.thresholds, **given)
    except ValueError as err:
        raise CollapsecheckError(f"thresholds: {err}") from None
    return replace(
        gate,
        thresholds=merged,
        flow_thresholds=replace(gate.flow_thresholds, **flow),
        fail_on=parse_fail_on(fail_on) if fail_on is not None else gate.fail_on,
        minimums={**gate.minimums, **{k: v for k, v in (minimums or {}).items() if v is not None}},
        max_drop=max_drop if max_drop is not None else gate.max_drop,
    )


MINIMUM_FLAGS = {
    "min_normalized_mi": "normalized_mi",
    "min_retrieval_skill": "retrieval_skill",
    "min_valid_reasoning_rate": "valid_reasoning_rate",
    "min_conditional_entropy": "conditional_entropy_est",
    "min_action_state_nmi": "action_state_nmi",
    "min_action_reasoning_nmi": "action_reasoning_nmi",
    "min_action_input_nmi": "action_input_nmi",
}


@dataclass(frozen=True)
class GateSettings:
    """The gate's command-line flags (none change the numbers: the verdict and the rules are
    decided again from stored metrics). None: take the config file's value, else the default."""

    dependence_high: float | None = setting(
        None, "Input dependence is high at or above this (default 0.7).", numbers=False
    )
    dependence_collapsed: float | None = setting(
        None, "Input dependence is collapsed at or below this (default 0.3).", numbers=False
    )
    entropy_low: float | None = setting(
        None, "H(Z|X) per token below this is low (default 0.05 nats).", numbers=False
    )
    fail_on: str | None = setting(
        None, "Regimes that fail the gate, comma-separated, or none (default: the collapses).",
        numbers=False,
    )  # fmt: skip
    min_normalized_mi: float | None = setting(None, "Fail below this.", numbers=False)
    min_retrieval_skill: float | None = setting(None, "Fail below this.", numbers=False)
    min_valid_reasoning_rate: float | None = setting(None, "Fail below this.", numbers=False)
    min_conditional_entropy: float | None = setting(None, "Fail below this.", numbers=False)
    min_action_state_nmi: float | None = setting(None, "Fail below this.", numbers=False)
    min_action_reasoning_nmi: float | None = setting(None, "Fail below this.", numbers=False)
    min_action_input_nmi: float | None = setting(None, "Fail below this.", numbers=False)
    flow_collapsed: float | None = setting(
        None, "Action collapse at or below this action_state_share (default 0.3).", numbers=False
    )
    flow_faithful: float | None = setting(
        None, "Faithful at or above this action_reasoning_share (default 0.5).", numbers=False
    )
    flow_decorative_reasoning: float | None = setting(
        None, "Decorative at or below this action_reasoning_share (default 0.2)...", numbers=False
    )
    flow_decorative_input: float | None = setting(
        None, "...and at or above this action_input_share (default 0.5).", numbers=False
    )
    early_post_hoc: float | None = setting(
        None, "Post hoc at or above this early_answer_without_reasoning (default 0.8).",
        numbers=False,
    )  # fmt: skip
    looping_line: float | None = setting(
        None, "Episodes loop at or above this revisit_rate lower bound (default 0.2).",
        numbers=False,
    )  # fmt: skip
    stalling_line: float | None = setting(
        None, "Episodes stall at or above this stall_rate lower bound (default 0.3).",
        numbers=False,
    )  # fmt: skip
    config: Path | None = setting(
        None, "Gate settings file (default: ./collapsecheck.toml or ./pyproject.toml).",
        numbers=False,
    )  # fmt: skip

    def load(self) -> GateConfig:
        """The gate: these flags over the config file's values over the defaults."""
        return load_gate(
            self.config,
            fail_on=self.fail_on,
            thresholds={key: getattr(self, key) for key in (*THRESHOLD_KEYS, *FLOW_THRESHOLD_KEYS)},
            minimums={metric: getattr(self, flag) for flag, metric in MINIMUM_FLAGS.items()},
        )
