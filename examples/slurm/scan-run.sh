#!/usr/bin/env bash
# Scan a training run over a Slurm array, then join it: each array task scans its share of the
# run's checkpoints into one results cache (on a file system every node sees); the join job,
# started only when every task succeeded (afterok), writes the run report, table, plot and gate
# from the cache without loading a model.
#
#   examples/slurm/scan-run.sh [--wait] RUN_DIR PROMPTS CACHE_DIR [TASKS]
#
# SCAN_OPTIONS (environment) adds options to every scan, e.g. SCAN_OPTIONS="-n 64 -k 8".
# Each task reads its share from SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN and
# SLURM_ARRAY_TASK_COUNT (collapsecheck says which share it took). The join writes
# CACHE_DIR/run.json, run.png and gate.xml.
#
# A failed task leaves the join pending forever unless slurmctld runs with
# DependencyParameters=kill_invalid_depend, which cancels it; even then `sbatch --wait` on the
# join exits 0. So --wait waits for the join and then reads its final state: the script exits
# 0 only when the join COMPLETED (the gate passed), 1 otherwise, naming the state.
# Tested against a real one-node Slurm by `make test-cluster` (tests/cluster/test_slurm.py).
# Add your partition, GPUs (--gres=gpu:1) and time limits to the sbatch lines.
set -euo pipefail
wait=no
if [ "${1:-}" = --wait ]; then
    wait=yes
    shift
fi
run_dir=$1 prompts=$2 cache=$3 tasks=${4:-4}
read -r -a extra <<<"${SCAN_OPTIONS:-}"
scan=(collapsecheck scan "$run_dir" -p "$prompts" --out "$cache" "${extra[@]}")
join=("${scan[@]}" --json "$cache/run.json" --plot "$cache/run.png" --junit "$cache/gate.xml")

array=$(sbatch --parsable --array="0-$((tasks - 1))" --job-name=collapsecheck-shard \
    --wrap="$(printf '%q ' "${scan[@]}")")
echo "shards: array job $array ($tasks tasks)"
if [ "$wait" = no ]; then
    sbatch --parsable --dependency="afterok:${array}" --job-name=collapsecheck-join \
        --wrap="$(printf '%q ' "${join[@]}")"
    exit 0
fi
joined=$(sbatch --parsable --wait --dependency="afterok:${array}" \
    --job-name=collapsecheck-join --wrap="$(printf '%q ' "${join[@]}")" || true)
joined=${joined%%;*}
state=$(scontrol show job "$joined" -o | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
echo "join: job $joined $state"
[ "$state" = COMPLETED ] || {
    echo "the join did not complete ($state): a shard failed or the gate failed; see" \
        "slurm-${array}_*.out and slurm-${joined}.out" >&2
    exit 1
}
