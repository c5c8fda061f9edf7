#!/usr/bin/env bash
# A single-node Slurm on this machine (Debian's slurmctld, slurmd and munge), to try
# scripts/slurm/ without a cluster; harness/tests/slurm.rs runs a sweep on it. As root:
#   scripts/slurm/local-cluster.sh install     # the Debian packages (CI runs this)
#   scripts/slurm/local-cluster.sh start DIR   # slurm.conf, state, logs and PID files in DIR;
#                                              # then: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm/local-cluster.sh stop DIR    # stops the daemons start started, by PID
# Safe to run twice: a running munged (and /etc/munge/munge.key) is used and left as it is;
# each DIR gets its own ports, so two clusters can run side by side. Accounting is off.
set -euo pipefail
cmd=${1:?usage: local-cluster.sh install | start DIR | stop DIR}
need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "error: local-cluster.sh $cmd needs root" >&2
        exit 2
    fi
}
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
case $cmd in
install)
    need_root
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        exit 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmd slurmctld slurm-client munge >/dev/null
    ;;
start)
    need_root
    dir=${2:?usage: local-cluster.sh start DIR}
    mkdir -p "$dir/state" "$dir/spool"
    dir=$(cd "$dir" && pwd)
    # munge: one per machine, shared; started here only if none answers.
    if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge
        [ -f /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge
        chmod 400 /etc/munge/munge.key
        runuser -u munge -- munged
        for _ in $(seq 50); do
            [ -f /run/munge/munged.pid ] && break
            sleep 0.1
        done
        cp /run/munge/munged.pid "$dir/munged.pid"
    fi
    # Two free ports of our own (the defaults 6817/6818 may be another cluster's).
    port=$((20000 + ($$ * 7) % 20000))
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null; do
        port=$((port + 2))
    done
    host=$(hostname -s)
    cat >"$dir/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$dir/slurm.conf
    pid_alive "$dir/slurmctld.pid" || slurmctld -f "$SLURM_CONF"
    pid_alive "$dir/slurmd.pid" || slurmd -f "$SLURM_CONF"
    for _ in $(seq 150); do
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$SLURM_CONF"
            exit 0
        fi
        sleep 0.2
    done
    echo "error: the local Slurm did not come up in 30 s; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    exit 1
    ;;
stop)
    dir=${2:?usage: local-cluster.sh stop DIR}
    for daemon in slurmd slurmctld munged; do
        pidfile=$dir/$daemon.pid
        if pid_alive "$pidfile"; then
            pid=$(cat "$pidfile")
            kill "$pid"
            for _ in $(seq 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
        fi
        rm -f "$pidfile"
    done
    ;;
*)
    echo "error: unknown command '$cmd' (install, start DIR, stop DIR)" >&2
    exit 2
    ;;
esac
