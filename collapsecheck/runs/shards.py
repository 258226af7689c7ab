"""Which share of a run this process scans: `--shard I/N`, or a Slurm array task's share
read from its variables. Plain Python: a wrong shard is refused before any model library or
array library loads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from collapsecheck.errors import CollapsecheckError

if TYPE_CHECKING:
    from collapsecheck.runs.plan import ScanPlan

T = TypeVar("T")

SLURM_TASK, SLURM_MIN, SLURM_COUNT = (
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_COUNT",
)


@dataclass(frozen=True)
class Shard:
    """Share `index` of `count` (0-based): the run's checkpoints index, index + count, ..."""

    index: int
    count: int
    source: str  # the option or the variables it was read from

    def share(self, checkpoints: Sequence[T]) -> list[T]:
        """Round robin in step order, so early and late (larger, slower) steps mix."""
        return [c for i, c in enumerate(checkpoints) if i % self.count == self.index]

    def describe(self) -> str:
        return f"shard {self.index}/{self.count} ({self.source})"


def parse_shard(value: str) -> Shard:
    """--shard I/N, 0 <= I < N."""
    index, sep, count = value.partition("/")
    try:
        shard = Shard(int(index), int(count), "--shard")
    except ValueError:
        shard = None
    if not sep or shard is None or not 0 <= shard.index < shard.count:
        raise CollapsecheckError(f"--shard expects I/N with 0 <= I < N, got {value!r}")
    return shard


def slurm_shard(environ: Mapping[str, str]) -> Shard | None:
    """A Slurm array task's share: I = task id - the array's first id, N = its task count
    (an array of N tasks with ids min, min + 1, ...; a stepped array is refused)."""
    if SLURM_TASK not in environ:
        return None
    try:
        task, first = int(environ[SLURM_TASK]), int(environ.get(SLURM_MIN, "0"))
        count = int(environ[SLURM_COUNT])
    except (KeyError, ValueError):
        raise CollapsecheckError(
            f"{SLURM_TASK} is set but {SLURM_MIN}/{SLURM_COUNT} are missing or not numbers: "
            "pass --shard I/N"
        ) from None
    if not 0 <= task - first < count:
        raise CollapsecheckError(
            f"Slurm array task {task} is not one of {count} consecutive tasks from {first} "
            "(a stepped --array?): pass --shard I/N"
        )
    return Shard(task - first, count, f"{SLURM_TASK}={task} of {count}")


def resolve_shard(option: str | None, environ: Mapping[str, str]) -> Shard | None:
    """--shard I/N, else a Slurm array task's share when its variables are set, else none."""
    return parse_shard(option) if option is not None else slurm_shard(environ)


def share_of(plan: ScanPlan, shard: Shard) -> ScanPlan:
    """A shard's share of a plan: its checkpoints round robin in run order, each with all of
    its units (a checkpoint's rollout steps stay together: one model load)."""
    return plan.only([u for group in shard.share(plan.by_checkpoint()) for u in group])
