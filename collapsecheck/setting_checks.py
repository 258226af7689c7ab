"""The checks of settings that need names the layers above `settings` own: the registered
backends and scorers, and the reasoning and action specs. Settings themselves stay plain
declarations (`collapsecheck.settings`); the CLI runs these right after it builds them, and
the Python API when a scan starts: both before any model loads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collapsecheck.engines.backends.registry import check_engine_names
from collapsecheck.engines.reasoning import action_spec, reasoning_spec
from collapsecheck.settings import GROUPS, LoadSettings, ScoringSettings, Settings


def check_segments(scoring: ScoringSettings) -> None:
    """A bad tag pair or regex fails here, with the flag that gave it."""
    reasoning_spec(scoring)
    action_spec(scoring)


CHECKS: dict[type, Callable[[Any], None]] = {
    LoadSettings: check_engine_names,
    ScoringSettings: check_segments,
}


def check_group(values: Any) -> None:
    """Run the check of one settings group, where it has one."""
    check = CHECKS.get(type(values))
    if check is not None:
        check(values)


def checked(settings: Settings) -> Settings:
    """`settings`, every group checked."""
    for group in GROUPS:
        check_group(getattr(settings, group))
    return settings
