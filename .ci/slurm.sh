#!/usr/bin/env bash
# Install and run a real single-node Slurm cluster (slurmctld + slurmd + munged)
# on this machine, for CI and the integration tests.  See .ci/SLURM.md.
#
#   bash .ci/slurm.sh install   # apt-get install slurm-wlm munge (skipped if present)
#   bash .ci/slurm.sh start     # munge key + munged, slurm.conf, slurmctld, slurmd; wait idle
#   bash .ci/slurm.sh stop      # scancel everything, stop slurmd, slurmctld, munged
#   bash .ci/slurm.sh status    # exit 0 iff sinfo works and a node is idle/mixed/alloc
#   bash .ci/slurm.sh restart   # stop + start
#
# Everything is idempotent.  Must run as root.
set -euo pipefail

SLURM_CONF_DIR=${SLURM_CONF_DIR:-/etc/slurm}
SLURM_CONF_FILE="$SLURM_CONF_DIR/slurm.conf"
SLURM_LOG_DIR=/var/log/slurm
SLURMCTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
SLURMCTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
SLURMCTLD_LOG="$SLURM_LOG_DIR/slurmctld.log"
SLURMD_LOG="$SLURM_LOG_DIR/slurmd.log"
JOBCOMP_LOG="$SLURM_LOG_DIR/jobcomp.log"
MAX_ARRAY_SIZE=1001
PARTITION=debug

MUNGE_KEY=/etc/munge/munge.key
MUNGE_RUN=/run/munge
MUNGE_PID="$MUNGE_RUN/munged.pid"
MUNGE_LOG=/var/log/munge/munged.log

START_TIMEOUT=${SLURM_START_TIMEOUT:-60}

# Short hostname: slurmd must find a NodeName equal to it (we also pass -N).
NODE_NAME=$(hostname -s 2>/dev/null || hostname)

log() { echo "[slurm.sh] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

# alive PID: true if PID exists and is not a zombie (in this sandbox exited
# daemons can linger as zombies, and `kill -0` succeeds on those).
alive() {
    local pid=$1 state
    [[ -n $pid && -r /proc/$pid/stat ]] || return 1
    state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

# pid_of PIDFILE COMM: pid from the pid file, if that process is alive and is COMM.
pid_of() {
    local file=$1 comm=$2 pid
    [[ -r $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    alive "$pid" || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm"* ]] || return 1
    echo "$pid"
}

# wait_gone PID SECONDS
wait_gone() {
    local pid=$1 t=$2 i
    for ((i = 0; i < t * 5; i++)); do
        alive "$pid" || return 0
        sleep 0.2
    done
    return 1
}

# ---------------------------------------------------------------- install ---
cmd_install() {
    need_root
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sbatch >/dev/null && command -v munged >/dev/null; then
        log "slurm and munge already installed (slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null || echo "?"))"
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    local pkgs=(slurm-wlm munge)
    # --no-install-recommends: 9 packages instead of 43 (no hdf5/rocm/ipmi/-dev
    # plugins); everything this setup uses is in slurm-wlm-basic-plugins.
    local opts=(-y -q --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    log "apt-get install ${pkgs[*]}"
    if ! apt-get install "${opts[@]}" "${pkgs[@]}"; then
        log "install failed; running apt-get update and retrying"
        apt-get update -q
        apt-get install "${opts[@]}" "${pkgs[@]}"
    fi
    if ! command -v slurmctld >/dev/null || ! command -v sbatch >/dev/null; then
        die "slurm binaries missing after install"
    fi
}

# ------------------------------------------------------------------ munge ---
munge_ok() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then
        log "munged already running"
        return 0
    fi
    id munge >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin munge ||
        true
    mkdir -p /etc/munge /var/lib/munge /var/log/munge "$MUNGE_RUN"
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating munge key $MUNGE_KEY"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$MUNGE_KEY" --force
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
        fi
    fi
    if id munge >/dev/null 2>&1; then
        chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge "$MUNGE_RUN"
    fi
    chmod 0700 /etc/munge /var/log/munge
    chmod 0711 /var/lib/munge
    chmod 0755 "$MUNGE_RUN"
    chmod 0400 "$MUNGE_KEY"
    # A stale socket/lock from a killed munged makes a new one refuse to start.
    local old
    if old=$(pid_of "$MUNGE_PID" munged); then
        log "munged (pid $old) is running but not answering; stopping it"
        kill "$old" 2>/dev/null || true
        wait_gone "$old" 10 || kill -9 "$old" 2>/dev/null || true
    fi
    rm -f "$MUNGE_RUN"/munge.socket.2 "$MUNGE_RUN"/munge.socket.2.lock "$MUNGE_PID"

    local started=0
    if id munge >/dev/null 2>&1; then
        if command -v runuser >/dev/null; then
            if runuser -u munge -- /usr/sbin/munged 9>&-; then started=1; fi
        else
            if su -s /bin/sh munge -c /usr/sbin/munged 9>&-; then started=1; fi
        fi
    fi
    if [[ $started -eq 1 ]]; then
        for _ in $(seq 1 25); do munge_ok && break; sleep 0.2; done
    fi
    if ! munge_ok; then
        # Fallback for containers where the munge user can't be used: run as
        # root and let munged accept root-owned files.
        log "munged as user 'munge' failed; falling back to root with --force"
        if old=$(pid_of "$MUNGE_PID" munged); then kill "$old" 2>/dev/null || true; fi
        chown -R root:root /etc/munge /var/lib/munge /var/log/munge "$MUNGE_RUN"
        rm -f "$MUNGE_RUN"/munge.socket.2 "$MUNGE_RUN"/munge.socket.2.lock "$MUNGE_PID"
        /usr/sbin/munged --force 9>&-
        for _ in $(seq 1 25); do munge_ok && break; sleep 0.2; done
    fi
    munge_ok || { tail -n 30 "$MUNGE_LOG" >&2 2>/dev/null || true; die "munged did not start"; }
    log "munged running (pid $(cat "$MUNGE_PID" 2>/dev/null || echo '?'))"
}

stop_munge() {
    local pid
    if pid=$(pid_of "$MUNGE_PID" munged); then
        log "stopping munged (pid $pid)"
        kill "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$MUNGE_PID"
}

# ----------------------------------------------------------------- config ---
node_line() {
    # Use the hardware slurmd itself detects (so slurmd never marks the node
    # invalid), but advertise only ~90% of memory, leaving headroom.
    local hw cpus sockets cores threads mem
    hw=$(slurmd -C 2>/dev/null | head -n 1 || true)
    cpus=$(sed -nE 's/.*CPUs=([0-9]+).*/\1/p' <<<"$hw")
    sockets=$(sed -nE 's/.*SocketsPerBoard=([0-9]+).*/\1/p' <<<"$hw")
    cores=$(sed -nE 's/.*CoresPerSocket=([0-9]+).*/\1/p' <<<"$hw")
    threads=$(sed -nE 's/.*ThreadsPerCore=([0-9]+).*/\1/p' <<<"$hw")
    mem=$(sed -nE 's/.*RealMemory=([0-9]+).*/\1/p' <<<"$hw")
    [[ -n $cpus ]] || cpus=$(nproc)
    [[ -n $mem ]] || mem=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    mem=$((mem * 9 / 10))
    ((mem >= 256)) || mem=256
    local topo=""
    if [[ -n $sockets && -n $cores && -n $threads ]] &&
        ((sockets * cores * threads == cpus)); then
        topo=" Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads"
    fi
    echo "NodeName=$NODE_NAME NodeAddr=127.0.0.1 CPUs=$cpus$topo RealMemory=$mem State=UNKNOWN"
}

render_conf() {
    cat <<EOF
# Generated by .ci/slurm.sh -- single-node CI cluster. Do not edit by hand.
ClusterName=ci
SlurmctldHost=$NODE_NAME(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$SLURMCTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$SLURMCTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$SLURMCTLD_LOG
SlurmdLogFile=$SLURMD_LOG
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in this sandbox: track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No slurmdbd (so no sacct); finished jobs are appended to this text file.
JobCompType=jobcomp/filetxt
JobCompLoc=$JOBCOMP_LOG
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MaxArraySize=$MAX_ARRAY_SIZE
MaxJobCount=20000
# Keep finished jobs visible to scontrol/squeue for 5 minutes.
MinJobAge=300
ReturnToService=2
InactiveLimit=0
KillWait=10
SlurmctldTimeout=60
SlurmdTimeout=60
Waittime=0
$(node_line)
PartitionName=$PARTITION Nodes=$NODE_NAME Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

# write_conf: writes slurm.conf; returns 0 if it changed, 1 if unchanged.
write_conf() {
    mkdir -p "$SLURM_CONF_DIR" "$SLURM_LOG_DIR" "$SLURMCTLD_SPOOL" "$SLURMD_SPOOL"
    chmod 0755 "$SLURMCTLD_SPOOL" "$SLURMD_SPOOL" "$SLURM_LOG_DIR"
    local tmp
    tmp=$(mktemp)
    render_conf >"$tmp"
    if [[ -f $SLURM_CONF_FILE ]] && cmp -s "$tmp" "$SLURM_CONF_FILE"; then
        rm -f "$tmp"
        return 1
    fi
    install -m 0644 "$tmp" "$SLURM_CONF_FILE"
    rm -f "$tmp"
    log "wrote $SLURM_CONF_FILE"
    return 0
}

# ----------------------------------------------------------------- status ---
# node_state prints the (compact) state of our node, empty if unknown.
node_state() {
    timeout 30 sinfo -h -N -n "$NODE_NAME" -o '%t' 2>/dev/null | head -n 1 | tr -d ' ' || true
}

ctld_listening() { timeout 3 bash -c '</dev/tcp/127.0.0.1/6817' 2>/dev/null; }

healthy() {
    command -v sinfo >/dev/null || return 1
    # Without munge every Slurm client call fails anyway, but only after ~10 s
    # of retries: fail fast instead.
    munge_ok || return 1
    # Likewise, clients retry ~10 s when slurmctld isn't listening.
    ctld_listening || return 1
    local st
    st=$(timeout 30 sinfo -h -o '%t' 2>/dev/null) || return 1
    # Plain idle/mix/alloc only: a suffix such as "*" (not responding) or
    # "~" (powered down) means the node can't run jobs right now.
    grep -qxE 'idle|mix|mixed|alloc|allocated|comp|completing' <<<"$st"
}

cmd_status() {
    if healthy; then
        sinfo
        return 0
    fi
    if ! command -v sinfo >/dev/null; then
        log "not healthy: sinfo not installed"
    elif ! munge_ok; then
        log "not healthy: munged not running"
    elif ! ctld_listening; then
        log "not healthy: slurmctld not listening on 127.0.0.1:6817"
    else
        log "not healthy: no node is idle/mix/alloc"
        timeout 30 sinfo 2>&1 || true
    fi
    return 1
}

print_logs() {
    local f
    for f in "$SLURMCTLD_LOG" "$SLURMD_LOG" "$MUNGE_LOG"; do
        if [[ -r $f ]]; then
            echo "----- tail -n 40 $f -----" >&2
            tail -n 40 "$f" >&2 || true
        fi
    done
    echo "----- sinfo -----" >&2
    sinfo -N -l >&2 2>&1 || true
    scontrol show node "$NODE_NAME" >&2 2>&1 || true
}

# ------------------------------------------------------------------ start ---
start_slurmctld() {
    local pid
    if pid=$(pid_of "$SLURMCTLD_PID" slurmctld); then
        return 0
    fi
    log "starting slurmctld"
    slurmctld -f "$SLURM_CONF_FILE" 9>&- || true
    for _ in $(seq 1 50); do
        scontrol ping 2>/dev/null | grep -q 'is UP' && return 0
        sleep 0.2
    done
    # Saved state can be incompatible (e.g. another hostname wrote it):
    # retry once with a clean state.
    if ! pid_of "$SLURMCTLD_PID" slurmctld >/dev/null; then
        log "slurmctld exited; retrying with clean state (-c)"
        slurmctld -c -f "$SLURM_CONF_FILE" 9>&- || true
    fi
    for _ in $(seq 1 50); do
        scontrol ping 2>/dev/null | grep -q 'is UP' && return 0
        sleep 0.2
    done
    print_logs
    die "slurmctld did not come up"
}

start_slurmd() {
    if pid_of "$SLURMD_PID" slurmd >/dev/null; then
        return 0
    fi
    log "starting slurmd (node $NODE_NAME)"
    slurmd -N "$NODE_NAME" -f "$SLURM_CONF_FILE" 9>&- || { print_logs; die "slurmd failed to start"; }
}

cmd_start() {
    need_root
    command -v slurmctld >/dev/null || die "slurm is not installed; run: bash $0 install"
    if healthy && [[ -f $SLURM_CONF_FILE ]] && cmp -s <(render_conf) "$SLURM_CONF_FILE"; then
        log "cluster already running and healthy"
        sinfo
        return 0
    fi
    local t0=$SECONDS
    start_munge
    if write_conf; then
        # Config changed: running daemons must be restarted to pick it up.
        stop_slurm_daemons
    fi
    start_slurmctld
    start_slurmd

    local st deadline=$((SECONDS + START_TIMEOUT)) resumed=0
    while :; do
        st=$(node_state)
        case $st in
        idle | mix | alloc | comp) break ;;
        down* | drain* | drng* | fail*)
            # e.g. left down by a previous unclean stop; put it back.
            if ((resumed == 0)) && pid_of "$SLURMD_PID" slurmd >/dev/null; then
                log "node is '$st'; resuming it"
                scontrol update NodeName="$NODE_NAME" State=RESUME 2>/dev/null || true
                resumed=1
            fi
            ;;
        esac
        if ((SECONDS >= deadline)); then
            print_logs
            die "node $NODE_NAME not idle after ${START_TIMEOUT}s (state: '${st:-unknown}')"
        fi
        sleep 0.5
    done
    log "cluster up in $((SECONDS - t0))s: node $NODE_NAME is $st"
    sinfo
}

# ------------------------------------------------------------------- stop ---
stop_slurm_daemons() {
    local pid_ctld pid_d
    pid_ctld=$(pid_of "$SLURMCTLD_PID" slurmctld || true)
    pid_d=$(pid_of "$SLURMD_PID" slurmd || true)
    [[ -z $pid_ctld && -z $pid_d ]] && return 0
    if [[ -n $pid_d ]]; then
        log "stopping slurmd (pid $pid_d)"
        kill -TERM "$pid_d" 2>/dev/null || true
        wait_gone "$pid_d" 20 || { log "slurmd did not exit; SIGKILL"; kill -9 "$pid_d" 2>/dev/null || true; }
    fi
    if [[ -n $pid_ctld ]]; then
        log "stopping slurmctld (pid $pid_ctld)"
        kill -TERM "$pid_ctld" 2>/dev/null || true
        wait_gone "$pid_ctld" 30 || { log "slurmctld did not exit; SIGKILL"; kill -9 "$pid_ctld" 2>/dev/null || true; }
    fi
    rm -f "$SLURMD_PID" "$SLURMCTLD_PID"
}

cmd_stop() {
    need_root
    if command -v scancel >/dev/null && pid_of "$SLURMCTLD_PID" slurmctld >/dev/null; then
        local jobs
        # %F: the array's master id (the job id for plain jobs).
        jobs=$(squeue -h -o '%F' 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [[ -n ${jobs// /} ]]; then
            log "cancelling jobs: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 1 30); do
                [[ -z $(squeue -h -t PD,R,CG,S -o '%i' 2>/dev/null) ]] && break
                sleep 0.5
            done
        fi
    fi
    stop_slurm_daemons
    stop_munge
    log "stopped"
}

# Serialise concurrent start/stop calls (e.g. several test workers at once).
lock() {
    exec 9>/run/slurm-ci.lock
    flock -w 120 9 || die "timed out waiting for /run/slurm-ci.lock"
}

case ${1:-} in
install) cmd_install ;;
start) lock && cmd_start ;;
stop) lock && cmd_stop ;;
restart) lock && cmd_stop && cmd_start ;;
status) cmd_status ;;
conf) render_conf ;;
*)
    echo "usage: $0 {install|start|stop|restart|status|conf}" >&2
    exit 2
    ;;
esac
