"""Stage 4, the work: one checkpoint diagnosed (`diagnose`), a scan request planned as work
units (`plan`) with their cost (`cost`), the results cache, the executors that run the units
(in this process, a shard or Slurm array task, Ray tasks), and the join into a run report."""
