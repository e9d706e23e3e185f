#!/usr/bin/env bash
# A real one-machine SLURM for tests and demos: munge + slurmctld + N emulated slurmd nodes.
#
#   bash slurm/local_cluster.sh start [NODES]   # NODES = 1 or 2 (default 2); prints the SLURM_CONF to export
#   bash slurm/local_cluster.sh stop            # stops what `start` started, by pid
#   bash slurm/local_cluster.sh status
#
# Needs root (it installs Debian's slurmctld/slurmd/slurm-client/munge with apt when they are missing,
# and runs the daemons as root). No systemd and no cgroups: processes are tracked by
# proctrack/linuxproc. Emulated nodes n1..nN are all this machine (Debian's slurmd is built with
# MULTIPLE_SLURMD); each declares this machine's cores, so a job may put one task on each.
# Knobs (environment): SLURM_LOCAL_DIR (state, spool, logs, pids; default /tmp/contrastive-pretrain-slurm),
# SLURM_LOCAL_PORT (slurmctld's port; nodes use the next ones; default 16817), SLURM_LOCAL_CPUS (the CPUs each
# node declares; default this machine's cores: more lets more jobs run at once, sharing the real cores).
set -euo pipefail

BASE=${SLURM_LOCAL_DIR:-/tmp/contrastive-pretrain-slurm}
CTLD_PORT=${SLURM_LOCAL_PORT:-16817}
CONF=$BASE/slurm.conf
PIDS=$BASE/pids
MARKER=.made-by-local-cluster

log() { echo "[local_cluster] $*" >&2; }

install_packages() {
    local missing=()
    for bin in slurmctld slurmd sbatch munged; do
        command -v "$bin" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        log "missing ${missing[*]} and cannot install them (needs root and apt-get)"
        exit 3
    fi
    log "installing slurmctld slurmd slurm-client munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

write_conf() {
    local nodes=$1 cpus mem
    cpus=${SLURM_LOCAL_CPUS:-$(slurmd -C | sed -n "s/.* CPUs=\([0-9]*\).*/\1/p")}
    # Declare less memory than there is, so slurmd's own count never drains the node.
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    mem=$(( mem > 2048 ? mem - 1024 : mem ))
    mkdir -p "$BASE/state" "$BASE/log"
    cat > "$CONF.tmp" <<EOF
# Written by slurm/local_cluster.sh: a one-machine test cluster.
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# Requeued jobs become eligible when the old credential expires: 10 s instead of 120 s.
AuthInfo=cred_expire=10
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/slurmctld.pid
SlurmdPidFile=$BASE/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=30
# Nodes keep the CPUs declared below even where SLURM_LOCAL_CPUS declares more than this machine has (no "Low CPUs" drain).
SlurmdParameters=config_overrides
OverTimeLimit=0
PropagateResourceLimits=NONE
EOF
    for i in $(seq 1 "$nodes"); do
        mkdir -p "$BASE/spool/n$i"
        echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((CTLD_PORT + i)) CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN" >> "$CONF.tmp"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged already answers (someone else's): it serves us too, and we do not stop it
    fi
    mkdir -p /run/munge
    chown munge:munge /run/munge 2>/dev/null || true
    chmod 0755 /run/munge
    [ -f /etc/munge/munge.key ] || { log "no /etc/munge/munge.key (the munge package's postinst makes it)"; exit 3; }
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    echo "munged $(cat /run/munge/munged.pid)" >> "$PIDS"
}

wait_idle() {
    local nodes=$1
    for _ in $(seq 120); do
        local up
        up=$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$' || true)
        [ "$up" -ge "$nodes" ] && return 0
        sleep 0.5
    done
    log "nodes did not become idle; see $BASE/log"
    sinfo -N >&2 || true
    exit 4
}

start() {
    local nodes=${1:-2}
    [[ $nodes =~ ^[12]$ ]] || { log "NODES must be 1 or 2, got '$nodes'"; exit 2; }
    # Run as root: clear only a folder this script made (its marker) or an empty one, never whatever
    # SLURM_LOCAL_DIR names.
    if [ -e "$BASE" ] && [ ! -f "$BASE/$MARKER" ] && [ -n "$(ls -A "$BASE" 2>/dev/null || echo x)" ]; then
        log "SLURM_LOCAL_DIR=$BASE exists and was not made by local_cluster.sh (no $MARKER): choose another folder"
        exit 2
    fi
    if [ -f "$PIDS" ] && grep -q '^slurmctld ' "$PIDS" && kill -0 "$(awk '/^slurmctld /{print $2}' "$PIDS")" 2>/dev/null; then
        log "already running (SLURM_CONF=$CONF); stop it first"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    install_packages
    export PATH=$PATH:/usr/sbin
    rm -rf "$BASE"
    mkdir -p "$BASE"
    : > "$BASE/$MARKER"
    : > "$PIDS"
    write_conf "$nodes"
    export SLURM_CONF=$CONF
    start_munge
    slurmctld -c -f "$CONF"
    for _ in $(seq 50); do [ -s "$BASE/slurmctld.pid" ] && break; sleep 0.1; done
    echo "slurmctld $(cat "$BASE/slurmctld.pid")" >> "$PIDS"
    for i in $(seq 1 "$nodes"); do
        slurmd -f "$CONF" -N "n$i"
        for _ in $(seq 50); do [ -s "$BASE/slurmd-n$i.pid" ] && break; sleep 0.1; done
        echo "slurmd $(cat "$BASE/slurmd-n$i.pid")" >> "$PIDS"
    done
    wait_idle "$nodes"
    log "up: $nodes node(s); logs in $BASE/log"
    echo "export SLURM_CONF=$CONF"
}

stop() {
    [ -f "$PIDS" ] || { log "not running (no $PIDS)"; return 0; }
    export PATH=$PATH:/usr/sbin
    SLURM_CONF=$CONF timeout 20 scontrol shutdown >/dev/null 2>&1 || true
    # scontrol shutdown stops slurmctld and every slurmd; kill by pid whatever is left, munged last.
    for _ in $(seq 100); do
        local alive=0
        while read -r name pid; do
            [ "$name" = munged ] && continue
            kill -0 "$pid" 2>/dev/null && alive=1
        done < "$PIDS"
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    tac "$PIDS" | while read -r name pid; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
        fi
    done
    rm -f "$PIDS"
    log "stopped"
}

status() {
    export PATH=$PATH:/usr/sbin
    [ -f "$PIDS" ] || { echo "not running"; return 1; }
    SLURM_CONF=$CONF sinfo -N
}

case "${1:-}" in
    start) start "${2:-2}" ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start [NODES] | stop | status" >&2; exit 2 ;;
esac
