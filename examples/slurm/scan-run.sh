#!/usr/bin/env bash
# Scan a training run over a Slurm array, then join it: each array task scans its share of the
# run's checkpoints into one results cache (on a file system every node sees); the join job,
# started only when every task succeeded (afterok), writes the run report, table, plot and gate
# from the cache without loading a model.
#
#   examples/slurm/scan-run.sh RUN_DIR PROMPTS CACHE_DIR [TASKS]
#
# Each task reads its share from SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN and
# SLURM_ARRAY_TASK_COUNT (collapsecheck says which share it took). A failed task leaves the join
# pending unless slurmctld runs with DependencyParameters=kill_invalid_depend; read the join's
# final state (sacct) rather than sbatch's exit code. Not yet run against a real Slurm here
# (see docs/runs.md); add your partition, GPUs (--gres=gpu:1) and time to the sbatch lines.
set -euo pipefail
run_dir=$1 prompts=$2 cache=$3 tasks=${4:-4}
scan=(collapsecheck scan "$run_dir" -p "$prompts" -k 8 --out "$cache")

array=$(sbatch --parsable --array="0-$((tasks - 1))" --job-name=collapsecheck-shard \
    --wrap="${scan[*]}")
sbatch --parsable --dependency="afterok:${array}" --job-name=collapsecheck-join \
    --wrap="${scan[*]} --json $cache/run.json --plot $cache/run.png --junit $cache/gate.xml"
