#!/usr/bin/env bash
# A real one-node Slurm cluster for `make test-cluster`: munged, slurmctld and slurmd on this
# machine, with a config written into DIR (no cgroups: proctrack/linuxproc, task/none, which
# runs in a container). Needs root and Debian's slurm-wlm and munge (installed if missing).
#
#   scripts/slurm-one-node.sh start DIR    # prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-one-node.sh stop DIR
#
# DependencyParameters=kill_invalid_depend: a job whose afterok dependency can never be met
# (an array task failed) is cancelled instead of waiting forever.
set -euo pipefail
action=$1 dir=$(realpath -m "$2")

install_slurm() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_config() {
    local node cpus memory
    node=$(hostname)
    cpus=$(nproc)
    memory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))
    mkdir -p "$dir/state" "$dir/spool"
    cat >"$dir/slurm.conf" <<EOF
ClusterName=collapsecheck-test
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
DependencyParameters=kill_invalid_depend
ReturnToService=2
MinJobAge=3600
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$node CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    install_slurm
    write_config
    export SLURM_CONF=$dir/slurm.conf
    mkdir -p /run/munge
    chown munge:munge /run/munge
    [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key; }
    pgrep -x munged >/dev/null || runuser -u munge -- munged
    slurmctld -i
    slurmd
    for _ in $(seq 60); do
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return
        fi
        sleep 1
    done
    echo "slurm-one-node: the node did not come up; see $dir/slurmctld.log and slurmd.log" >&2
    exit 1
}

stop() {
    for pid in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
        [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
    done
}

"$action"
