"""Where a plan's units run (`runs.plan`): in this process (`run_here`), as one share of a
run (`--shard I/N`, or a Slurm array task's share: `runs.shards`), or as one Ray task per
checkpoint on a Ray cluster (`--ray`: `run_on_ray`). The units never know where they run:
every share or task writes its units into the same results cache, each entry under a lock
of its own, and a plain `scan RUN` (or the `--ray` driver) joins them (`runs.join`).
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from collapsecheck.engines.backends.base import Backend
from collapsecheck.errors import CollapsecheckError
from collapsecheck.measures.regimes import VerdictThresholds
from collapsecheck.progress import ProgressHook, silent
from collapsecheck.reports.report import Report
from collapsecheck.runs.loading import open_backend
from collapsecheck.runs.plan import ScanPlan
from collapsecheck.runs.units import WorkUnit, for_step, run_unit
from collapsecheck.settings import RAY_DEFAULT, Settings

RAY_PORTS = {"ray://": 10001, "": 6379}  # Ray client's and the head node's default ports


def run_here(
    plan: ScanPlan, verdicts: VerdictThresholds, progress: ProgressHook = silent,
    labelled: bool = True, start: Backend | None = None,
) -> list[Report]:  # fmt: skip
    """Every unit of the plan in this process, in order: finished cache entries read, the
    others run, with one model load per checkpoint for all of its units still to run.
    `labelled`: progress stages name each unit's step (a run's); `start`: the units' prior
    baseline, already loaded by the caller (a watch holds it for the whole run)."""
    advance = progress("run", len(plan.units)) if labelled else (lambda n: None)
    todo = set(plan.todo())
    reports = []
    with nullcontext(start) if start is not None else held_baseline(plan, todo) as baseline:
        for group in plan.by_checkpoint():
            fresh = [u for u in group if u in todo]
            checkpoint = group[0].checkpoint
            # a unit alone loads its own model (its load is timed in its report); the start's
            # own scan uses the start already held for the others
            shared = len(fresh) > 1
            opened = open_backend(checkpoint, None, plan.settings) if shared else nullcontext()
            if baseline is not None and checkpoint == plan.prior:
                opened = nullcontext(baseline)
            with opened as model:
                for unit in group:
                    hook = for_step(progress, unit.label) if labelled else progress
                    reports.append(run_unit(
                        unit, plan.settings, verdicts, rescan=unit in fresh, progress=hook,
                        backend=model, parsed=plan.parsed, baseline=baseline,
                    ))  # fmt: skip
                    advance(1)
    return reports


def held_baseline(plan: ScanPlan, todo: set[WorkUnit]) -> AbstractContextManager[Backend | None]:
    """The prior baseline of the units still to run (SPEC "Scored under the start"), loaded
    once for all of them when more than one needs it; else nothing (a unit alone loads it)."""
    needing = [u for u in plan.units if u in todo and u.prior is not None]
    if len(needing) < 2:
        return nullcontext()
    return open_backend(plan.prior, None, plan.settings)


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


def run_in_task(group: Sequence[WorkUnit], settings: Settings, rescan: bool) -> str:
    """One Ray task: a checkpoint's units run into the results cache (their rollout files
    read on the node); the host it ran on."""
    plan = ScanPlan(tuple(group), (None,) * len(group), settings, rescan)
    run_here(plan, VerdictThresholds(), labelled=False)
    return socket.gethostname()


def _task_failure(error: Exception) -> str:
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return text[-1] if isinstance(cause, CollapsecheckError) and text else type(cause).__name__


def run_on_ray(plan: ScanPlan, progress: ProgressHook = silent) -> list[str]:
    """Each checkpoint with units still to run as one Ray task on the joined cluster
    (`connect_ray`); the hosts they ran on. Every unit writes its own cache entry, so a failed
    or killed task costs only its checkpoint; the run report is the driver's to write (the
    join), from the cache, which must therefore be a folder every node sees."""
    ray = _ray()
    todo = set(plan.todo())
    groups = [[u for u in g if u in todo] for g in plan.by_checkpoint()]
    groups = [g for g in groups if g]
    task = ray.remote(run_in_task).options(**task_resources(ray.cluster_resources()))
    pending = {task.remote(g, plan.settings, plan.rescan): g for g in groups}
    advance = progress("ray tasks", len(groups))
    hosts, failed = [], []
    while pending:
        (done,), _ = ray.wait(list(pending), num_returns=1)
        group = pending.pop(done)
        try:
            hosts.append(ray.get(done))
        except ray.exceptions.RayError as err:
            failed.append(f"{', '.join(u.label for u in group)}: {_task_failure(err)}")
        advance(1)
    if failed:
        raise CollapsecheckError(
            f"{len(failed)} of {len(groups)} Ray tasks failed (the others are in the results "
            f"cache): {'; '.join(failed)}"
        )
    unseen = [u for g in groups for u in g if not u.finished()]
    if unseen:
        raise CollapsecheckError(
            f"the Ray tasks of steps {', '.join(u.label for u in unseen)} wrote their results "
            f"under {unseen[0].dump.parent}, which this machine does not see: give --out a "
            "folder every node shares"
        )
    return hosts
