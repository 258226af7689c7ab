"""Stage 4, the work: one checkpoint diagnosed (`diagnose`), a scan request planned as work
units (`plan`) with their cost (`cost`), the results cache, the executors that run the units
(in this process, a shard or Slurm array task, Ray tasks), and the join into a run report."""

RUN_API = ("cached_scan", "scan_run", "score_run")


def __getattr__(name: str) -> object:
    """`collapsecheck.runs.scan_run` (and `cached_scan`, `score_run`) as before the package
    had stages; loaded on first use, so importing a stage's module loads nothing else."""
    if name in RUN_API:
        from collapsecheck.runs import run

        return getattr(run, name)
    raise AttributeError(f"module 'collapsecheck.runs' has no attribute {name!r}")
