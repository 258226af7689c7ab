"""Where a run's work goes: split into shards (`--shard I/N`, or a Slurm array task's share)
and planned before it starts (`--dry-run`). The pipeline below
(`scan`, `cached_scan`) never knows where it runs: every share scans its checkpoints into the
same results cache, each entry under a lock of its own, and a plain `scan RUN` joins them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapsecheck.cache import cache_entry, default_cache_root
from collapsecheck.checkpoint import Checkpoint
from collapsecheck.discovery import RunCheckpoint
from collapsecheck.dump import REPORT_FILE
from collapsecheck.errors import CollapsecheckError
from collapsecheck.plan import Plan, plan_work
from collapsecheck.progress import ProgressHook
from collapsecheck.prompts import load_prompts
from collapsecheck.reasoning import action_spec
from collapsecheck.report import Report
from collapsecheck.runs import cached_scan, for_step
from collapsecheck.settings import Settings

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

    def share(self, checkpoints: Sequence[RunCheckpoint]) -> list[RunCheckpoint]:
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


def is_cached(checkpoint: Checkpoint, prompts: Path, settings: Settings, root: Path) -> bool:
    entry = cache_entry(root, checkpoint, prompts, settings.numbers())
    return (entry / REPORT_FILE).is_file()


def plan_scan(
    checkpoints: Sequence[Checkpoint], prompts: Path, settings: Settings,
    cache_root: Path | None, cached: bool = True,
) -> Plan:  # fmt: skip
    """The plan of a scan of `checkpoints`, read from the prompt file, the settings and the
    cache (`cached`: whether the scan goes through it); no weights load."""
    listed = load_prompts(
        prompts, num_prompts=settings.sampling.num_prompts, field=settings.prompts.prompt_field
    )
    root = cache_root if cache_root is not None else default_cache_root()
    done = sum(is_cached(c, prompts, settings, root) for c in checkpoints) if cached else 0
    return plan_work(
        len(listed), settings.sampling.k, settings.sampling.max_new_tokens,
        settings.scoring.negatives_bound, action_spec(settings.scoring) is not None,
        checkpoints=len(checkpoints), cached=done,
    )  # fmt: skip


def scan_share(
    checkpoints: Sequence[RunCheckpoint], prompts: Path, settings: Settings,
    cache_root: Path | None, rescan: bool, progress: ProgressHook,
) -> list[Report]:  # fmt: skip
    """A shard's checkpoints scanned into the results cache, one entry (and one lock) each;
    the run report is the join's to write."""
    reports = []
    for c in checkpoints:
        hook = for_step(progress, c.label)
        reports.append(
            cached_scan(c.checkpoint, prompts, settings, cache_root=cache_root, rescan=rescan,
                        progress=hook)
        )  # fmt: skip
    return reports
