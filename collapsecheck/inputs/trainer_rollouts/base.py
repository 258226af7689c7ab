"""What a trainer's rollout file holds, once read: generic rollout rows and what was decided
on the way (which reward, how responses were grouped)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collapsecheck.errors import CollapsecheckError

# (where: file and row, the row, its number in the file: a JSONL line, a parquet row)
Row = tuple[str, dict[str, Any], int]


@dataclass(frozen=True)
class TrainerRollouts:
    """Rows with `prompt` (text or chat messages; `rendered`: the context as text, chat
    markers and all) or `prompt_ids` (the exact context, `prompt_images` its images),
    `response` (text) or `response_ids` (the sampled ids), `truncated`, `reward` (a number or
    absent) and `group` (responses to one prompt); or, for a multi-turn rollout, `turns` (rows
    of those fields) with the trajectory's `reward`. `trainer` and `step` say where they came
    from, `notes` what the reader decided (shown to the user, kept in the report)."""

    trainer: str
    step: int | None
    rows: list[Row]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NamedSteps:
    """A trainer that names each step's rollout file after the step (`name`: the file name's
    pattern, the step its first group) and samples step s with the weights it saved at step
    s - 1; `folder`: where it keeps them inside a run, None where the user chooses it
    (--rollouts DIR)."""

    name: re.Pattern[str]
    folder: str | None = None

    def named(self, path: Path) -> bool:
        return path.is_file() and self.name.fullmatch(path.name) is not None

    def step_of(self, path: Path) -> int:
        return int(self.name.fullmatch(path.name).group(1))

    def policy_step(self, path: Path) -> int:
        return self.step_of(path) - 1

    def beside(self, run_dir: Path) -> Path | None:
        return None if self.folder is None else folder_holding(run_dir, self.folder, self.named)


def folder_holding(run_dir: Path, name: str, matches: Callable[[Path], bool]) -> Path | None:
    """`run_dir/name` when the trainer's rollouts are in it (a reader's `beside`)."""
    folder = run_dir / name
    return folder if folder.is_dir() and any(matches(p) for p in folder.iterdir()) else None


def number(value: Any, where: str, name: str, missing_ok: bool = False) -> float:
    """A finite number from a file's field (NaN too where `missing_ok`: a value the trainer
    left out), or one line naming the file, row and field."""
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric and (math.isfinite(value) or (missing_ok and math.isnan(value))):
        return float(value)
    raise CollapsecheckError(f"{where}: field {name!r} is not a finite number: {value!r}")


def text(value: Any, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise CollapsecheckError(f"{where}: field {name!r} is not text: {value!r:.60}")
    return value


def require(row: dict[str, Any], names: tuple[str, ...], where: str) -> None:
    missing = [n for n in names if n not in row]
    if missing:
        raise CollapsecheckError(f"{where}: no {', '.join(repr(n) for n in missing)} field")


def assistant_turns(messages: Any, where: str) -> list[dict[str, Any]]:
    """Each assistant message with every message before it as its context."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise CollapsecheckError(f"{where}: field 'messages' is not a list of messages")
    found = []
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index > 0:
            found.append({"messages": messages[:index], "response": message.get("content")})
    if not found:
        raise CollapsecheckError(f"{where}: the trajectory has no assistant turn")
    return found
