"""Where a run's work goes: planned before it starts (`--dry-run`), split into shards
(`--shard I/N`, or a Slurm array task's share), or spread as one Ray task per checkpoint over
a Ray cluster (`--ray`). The pipeline below (`scan`, `cached_scan`) never knows where it runs:
every share or task scans its checkpoints into the same results cache, each entry under a
lock of its own, and a plain `scan RUN` (or the `--ray` driver) joins them.
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapsecheck.engines.reasoning import action_spec
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import Checkpoint
from collapsecheck.inputs.discovery import RunCheckpoint
from collapsecheck.inputs.prompts import load_prompts
from collapsecheck.progress import ProgressHook
from collapsecheck.reports.dump import REPORT_FILE
from collapsecheck.reports.report import Report
from collapsecheck.runs.cache import cache_entry, default_cache_root
from collapsecheck.runs.cost import Plan, plan_work
from collapsecheck.runs.run import cached_scan, for_step
from collapsecheck.settings import Settings

# a bare --ray: what ray.init() does with no address (RAY_ADDRESS, else a cluster running on
# this machine, else a new local one)
RAY_DEFAULT = "default"
RAY_PORTS = {"ray://": 10001, "": 6379}  # Ray client's and the head node's default ports
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


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise CollapsecheckError(
            "--ray needs the ray package: pip install 'collapsecheck[ray]'"
        ) from None
    return ray


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A Ray address (host:port or ray://host:port) whose port answers, or one clear line:
    Ray itself retries an unreachable address for a minute before it gives up."""
    scheme = "ray://" if address.startswith("ray://") else ""
    host, _, port = address.removeprefix(scheme).rpartition(":")
    if not host or not port.isdigit():
        host, port = address.removeprefix(scheme), str(RAY_PORTS[scheme])
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise CollapsecheckError(
            f"--ray {address}: nothing answers at {host}:{port} ({err.strerror or err})"
        ) from None


def connect_ray(address: str) -> str:
    """Join the Ray cluster `--ray` names: an address, `auto` (the cluster running here, a
    veRL job's), `local` (a new local one) or RAY_DEFAULT (as ray.init() chooses); a line
    that says which cluster it joined."""
    ray = _ray()
    if address not in (RAY_DEFAULT, "auto", "local"):
        check_reachable(address)
    try:
        with warnings.catch_warnings():  # Ray's own warnings would break the one error line
            warnings.simplefilter("ignore")
            ray.init(
                address=None if address == RAY_DEFAULT else address,
                ignore_reinit_error=True, logging_level="ERROR", log_to_driver=False,
            )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CollapsecheckError(f"--ray {address}: no Ray cluster to join ({reason})") from None
    resources = ray.cluster_resources()
    return (
        f"Ray: joined the cluster at {ray.get_runtime_context().gcs_address} "
        f"({resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs)"
    )


def task_resources(cluster: Mapping[str, float]) -> dict[str, float]:
    """One GPU per checkpoint where the cluster has GPUs, one CPU otherwise."""
    return {"num_gpus": 1} if cluster.get("GPU", 0) >= 1 else {"num_cpus": 1}


def scan_into_cache(
    checkpoint: Checkpoint, prompts: Path, settings: Settings, cache_root: Path, rescan: bool
) -> str:
    """One Ray task: a checkpoint scanned into the results cache; the host it ran on."""
    cached_scan(checkpoint, prompts, settings, cache_root=cache_root, rescan=rescan)
    return socket.gethostname()


def _task_failure(error: Exception) -> str:
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return text[-1] if isinstance(cause, CollapsecheckError) and text else type(cause).__name__


def scan_on_ray(
    checkpoints: Sequence[RunCheckpoint], prompts: Path, settings: Settings,
    cache_root: Path | None, rescan: bool, progress: ProgressHook,
) -> list[str]:  # fmt: skip
    """Each checkpoint not yet in the results cache as one Ray task on the joined cluster
    (`connect_ray`); the hosts they ran on. Every task writes its own cache entry, so a
    failed or killed task costs only its checkpoint; the run report is the driver's to write,
    from the cache, which must therefore be a folder every node sees."""
    ray = _ray()
    root = (cache_root if cache_root is not None else default_cache_root()).resolve()
    prompts = prompts.resolve()
    todo = [
        c for c in checkpoints if rescan or not is_cached(c.checkpoint, prompts, settings, root)
    ]
    task = ray.remote(scan_into_cache).options(**task_resources(ray.cluster_resources()))
    pending = {task.remote(c.checkpoint, prompts, settings, root, rescan): c for c in todo}
    advance = progress("ray tasks", len(todo))
    hosts, failed = [], []
    while pending:
        (done,), _ = ray.wait(list(pending), num_returns=1)
        step = pending.pop(done)
        try:
            hosts.append(ray.get(done))
        except ray.exceptions.RayError as err:
            failed.append(f"{step.label}: {_task_failure(err)}")
        advance(1)
    if failed:
        raise CollapsecheckError(
            f"{len(failed)} of {len(todo)} Ray tasks failed (the others are in the results "
            f"cache): {'; '.join(failed)}"
        )
    unseen = [c.label for c in todo if not is_cached(c.checkpoint, prompts, settings, root)]
    if unseen:
        raise CollapsecheckError(
            f"the Ray tasks of steps {', '.join(unseen)} wrote their results under {root}, "
            "which this machine does not see: give --out a folder every node shares"
        )
    return hosts
