#!/usr/bin/env bash
# shellcheck disable=SC2034  # (template) the common.sh part inserted below reads these
# shellcheck disable=SC2154  # (template) EXIT_*, DONE_STATES: set by __CONSTANTS__
__HEADER__
# Usage: bash run_all.sh [--workers N | --gpus LIST [--workers-per-gpu K]] [--warm | --no-warm]
#                         [--stopped-timeout SECONDS]
#   (no flag)       one worker: the units in order, one process at a time
#   --workers N     N workers at once; each unit (one encoder_eval.run or, for probes,
#                   encoder_eval.probe process) is taken by exactly one of them
#   --gpus 0,1,2,3  workers on each listed GPU (see below), its processes seeing only that GPU
#                   (CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES)
#   --workers-per-gpu K  with --gpus: K workers per listed GPU (K units at once on each;
#                   small models use a few percent of a big GPU), e.g. --gpus 0 --workers-per-gpu 4;
#                   without it, as many as fit the first GPU's memory, at most 4 (the plan's
#                   largest model; ENCODER_EVAL_GPU_MEMORY_GIB=N gives the card's memory)
#   --warm          each worker runs its units in one long-lived encoder_eval.run process
#                   (python -m encoder_eval.run --warm-worker) instead of one process per
#                   unit: the imports and start-up are paid once per worker; the same
#                   results, skips, exit status and stop signals. The default with --gpus
#   --no-warm       one process per unit, also with --gpus
#   --stopped-timeout SECONDS  (default 300; 0: never) a warm worker stopped (SIGSTOP, state
#                   T) for this long while this script runs is killed and its unit fails;
#                   the next unit starts a fresh worker. Stopping the whole job (Ctrl-Z,
#                   scontrol suspend) stops this script too and is never counted
# Done cells are skipped and corrupt result files moved aside, so running it again fills
# the gaps. Exit status: 0 every cell of this script is done; 1 some unit failed or some
# cell is not done (e.g. the run's temporary folder was removed mid-run), its last line
# naming the cells not done; 2 bad input; 130 Ctrl-C; 75 SIGTERM stopped several workers,
# or a unit's process (a single worker is stopped by it at once); no unit starts after
# either signal.
set -u
PYTHON=${PYTHON:-__PYTHON__}
PHASE=__PHASE__
MODULE=__MODULE__
LOG_DIR=__LOG_DIR__
LOCK_DIR=__LOCK_DIR__
RESULTS_DIR=__RESULTS_DIR__
RERUN=__RERUN__
TOTAL_CELLS=__TOTAL_CELLS__
TOTAL_UNITS=__TOTAL_UNITS__
WORKER_BYTES=__WORKER_BYTES__ # one worker's GPU memory, for --gpus without --workers-per-gpu
__CONSTANTS__
STATES=() N_DONE=0 HAVE=0 SEEN_OUTS=0 DONE_AT_START=() ALL_OUTS=()
WORKERS=1 GPUS=() PER_GPU=1 WID=1 WPREFIX='' current='' UNIT_FD='' PREEMPTED=''
WARM='' WARM_PID='' W_IN='' W_OUT='' SHOWER='' STOPPED_TIMEOUT=300 LOST=''

die() {
    echo "error: $*" >&2
    exit "$EXIT_INPUT_ERROR"
}

while [ "$#" -gt 0 ]; do
    case $1 in
    --workers | --gpus | --workers-per-gpu | --stopped-timeout)
        if [ "$#" -lt 2 ]; then die "$1 needs a value, e.g. --workers 4 or --gpus 0,1"; fi
        set -- "$1=$2" "${@:3}"
        continue
        ;;
    --workers=*)
        WORKERS=${1#*=}
        if ! [[ $WORKERS =~ ^[1-9][0-9]{0,3}$ ]]; then
            die "--workers '$WORKERS' must be a whole number from 1, e.g. --workers 4"
        fi
        WORKERS_GIVEN=1
        ;;
    --workers-per-gpu=*)
        PER_GPU=${1#*=}
        if ! [[ $PER_GPU =~ ^[1-9][0-9]{0,3}$ ]]; then
            die "--workers-per-gpu '$PER_GPU' must be a whole number from 1, e.g." \
                "--gpus 0 --workers-per-gpu 4"
        fi
        PER_GPU_GIVEN=1
        ;;
    --gpus=*)
        IFS=, read -r -a GPUS <<<"${1#*=}"
        if [ "${#GPUS[@]}" -eq 0 ]; then die "--gpus is empty; list GPU indices, e.g. --gpus 0,1"; fi
        declare -A seen_gpu=()
        for gpu in "${GPUS[@]}"; do
            if ! [[ $gpu =~ ^([0-9]+|(GPU|MIG)-[A-Za-z0-9/-]+)$ ]]; then
                die "--gpus '${1#*=}': '$gpu' is not a GPU index (or GPU-/MIG- UUID); list" \
                    "them comma-separated, e.g. --gpus 0,1,2,3"
            fi
            if [ -n "${seen_gpu[$gpu]+x}" ]; then
                die "--gpus '${1#*=}' lists GPU $gpu twice; give each GPU once"
            fi
            seen_gpu[$gpu]=1
        done
        ;;
    --stopped-timeout=*)
        STOPPED_TIMEOUT=${1#*=}
        if ! [[ $STOPPED_TIMEOUT =~ ^[0-9]{1,7}$ ]]; then
            die "--stopped-timeout '$STOPPED_TIMEOUT' must be whole seconds, 0 for never," \
                "e.g. --stopped-timeout 600"
        fi
        STOPPED_TIMEOUT=$((10#$STOPPED_TIMEOUT))
        ;;
    --warm)
        if [ "$MODULE" != encoder_eval.run ]; then
            die "--warm runs encoder_eval.run units; this script's units are $MODULE" \
                "processes: run it without --warm"
        fi
        WARM=1
        ;;
    --no-warm) NO_WARM=1 ;;
    -h | --help)
        sed -n '2,/^set -u$/{/^set -u$/d;s/^# \{0,1\}//;p;}' "$0"
        exit 0
        ;;
    *) die "unknown argument '$1'; valid: --workers N, --gpus LIST (e.g. --gpus 0,1)," \
        "--workers-per-gpu K (with --gpus), --warm, --no-warm, --stopped-timeout SECONDS," \
        "--help" ;;
    esac
    shift
done
if [ -n "$WARM" ] && [ -n "${NO_WARM:-}" ]; then
    die "give --warm or --no-warm, not both"
fi
if [ "${#GPUS[@]}" -gt 0 ]; then
    # GPU plans run warm by default: a GPU process's start-up and first meeting with each
    # batch width cost most (docs/slurm.md, "One warm process per worker").
    if [ -z "${NO_WARM:-}" ] && [ "$MODULE" = encoder_eval.run ]; then WARM=1; fi
    if [ -n "${WORKERS_GIVEN:-}" ]; then
        die "give --workers or --gpus, not both (--gpus runs one worker per listed GPU," \
            "or --workers-per-gpu K of them)"
    fi
    if [ -z "${PER_GPU_GIVEN:-}" ]; then # K from a worker's memory and the card's
        PER_GPU=$("$PYTHON" -m encoder_eval.core.gpu_share --need-bytes "$WORKER_BYTES" \
            --gpu "${GPUS[0]}") || exit "$EXIT_INPUT_ERROR"
    fi
    WORKERS=$((${#GPUS[@]} * PER_GPU))
elif [ -n "${PER_GPU_GIVEN:-}" ]; then
    die "--workers-per-gpu needs --gpus (it runs K workers on each listed GPU), e.g." \
        "--gpus 0 --workers-per-gpu 4; without GPUs use --workers N"
fi

mkdir -p "$LOG_DIR" "$LOCK_DIR" "$RESULTS_DIR" || exit "$EXIT_INPUT_ERROR"
RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ee-run_all.XXXXXX") || exit "$EXIT_INPUT_ERROR"
trap 'rm -rf "$RUN_DIR"' EXIT
: >"$RUN_DIR/events"

# Ctrl-C reaches this script and its unit's process; the process saves what it must and
# exits 130, and this script then stops instead of going on to the next unit.
interrupted() {
    trap - INT
    stop_warm # a warm worker saves its cell first, as a unit's process would
    if [ -n "$WPREFIX" ]; then # a worker of several: the main script says how to resume
        echo "${WPREFIX}interrupted${current:+ during $current}" >&2
        exit "$EXIT_INTERRUPTED"
    fi
    echo "interrupted${current:+ during $current}: finished cells are kept and an" \
        "interrupted one resumes where it stopped; run $RERUN again to go on" >&2
    exit "$EXIT_INTERRUPTED"
}
trap interrupted INT

check_failed() {
    if [ "$1" -eq "$EXIT_INTERRUPTED" ]; then interrupted; fi
    check_error "$1"
    exit "$EXIT_INPUT_ERROR"
}

__COMMON__

# What happened, one line per event, shared by the workers (each line is one append).
record() { printf '%s\n' "$*" 2>/dev/null >>"$RUN_DIR/events" || run_dir_lost; }

# run_dir_lost [LABEL]: RUN_DIR is gone or not writable (a tmp purge, a job epilogue):
# units can no longer be claimed, so this worker starts none after it (another worker may
# still hold one); said once. The end of the script names every cell not done.
run_dir_lost() {
    if [ -z "$LOST" ]; then
        echo "${WPREFIX}error: the run's temporary folder $RUN_DIR is gone or not writable" \
            "(a tmp purge or a job epilogue?)${1:+ before $1 could be claimed}; this worker" \
            "starts no further unit" >&2
    fi
    LOST=1
}

# claim LABEL: take unit UNIT_INDEX for this worker, the first to claim it (mkdir is
# atomic); fails if another worker took it, or, setting LOST, if it cannot be claimed.
claim() {
    mkdir "$RUN_DIR/claim.$UNIT_INDEX" 2>/dev/null && return 0
    if [ -d "$RUN_DIR/claim.$UNIT_INDEX" ]; then return 1; fi
    run_dir_lost "$1"
    return 1
}

# counts: C_CELLS (done: DONE_BASE, those done at the first pass, plus the cells each
# finished unit added), C_UNITS (finished), C_RUN, C_SKIPPED, C_FAILED, FAILED_UNITS.
counts() {
    local kind arg
    C_CELLS=$DONE_BASE C_UNITS=0 C_RUN=0 C_SKIPPED=0 C_FAILED=0 FAILED_UNITS=()
    while read -r kind arg; do
        case $kind in
        skip) C_CELLS=$((C_CELLS + arg)) C_UNITS=$((C_UNITS + 1)) C_SKIPPED=$((C_SKIPPED + 1)) ;;
        ran) C_CELLS=$((C_CELLS + arg)) C_UNITS=$((C_UNITS + 1)) C_RUN=$((C_RUN + 1)) ;;
        failed) C_FAILED=$((C_FAILED + 1)) FAILED_UNITS+=("$arg") ;;
        esac
    done < <(cat "$RUN_DIR/events" 2>/dev/null)
}

say() {
    counts
    echo "${WPREFIX}[cells $C_CELLS/$TOTAL_CELLS done, units $C_UNITS/$TOTAL_UNITS, failed $C_FAILED] $*"
}

# take_unit_lock LABEL: a non-blocking flock on LOCK_DIR/LABEL.lock, held in UNIT_FD while
# the unit runs (the kernel frees it when its holders exit); fails if another runner of
# this sweep holds it. Without flock there is no unit lock (the cell locks still hold).
take_unit_lock() {
    command -v flock >/dev/null 2>&1 || return 0
    exec {UNIT_FD}>>"$LOCK_DIR/$1.lock" || return 0
    if flock -n "$UNIT_FD"; then return 0; fi
    exec {UNIT_FD}>&-
    UNIT_FD=
    return 1
}

release_unit_lock() {
    if [ -n "$UNIT_FD" ]; then exec {UNIT_FD}>&-; fi
    UNIT_FD=
}

# eta SECONDS: 2h05m, 2m10s or 42s.
eta() {
    local s=${1%%.*}
    if ! [[ $s =~ ^[0-9]+$ ]]; then
        echo "?"
    elif [ "$s" -ge 3600 ]; then
        printf '%dh%02dm\n' $((s / 3600)) $((s % 3600 / 60))
    elif [ "$s" -ge 60 ]; then
        printf '%dm%02ds\n' $((s / 60)) $((s % 60))
    else
        echo "${s}s"
    fi
}

# show_progress LOG: append stdin (the unit process's stderr) to LOG, and show each of its
# `--progress json` lines as one line: [w1] MODEL/TASK/LR_KEY/sSEED step 120/400 dev 0.81
# eta 2m10s; a probe's result lines ([1/2] MODEL:POOLING TASK: SCORE) as [w1] probe MODEL...;
# a cell's "stopping: ..." line (a stop signal arrived) as it is, on stderr, at once.
# It ignores Ctrl-C and SIGTERM: it ends when the process, saving its state, closes stderr
# (whose last lines say so).
show_progress() {
    trap '' INT TERM
    local log=$1 line cell step total dev left LC_ALL=C
    # The patterns of the lines a cell writes (encoder_eval/core/progress.py):
    __PROGRESS_PATTERNS__
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >>"$log"
        if [[ $line == "$stop_prefix"* ]]; then # a stop signal's acknowledgement, at once
            echo "${WPREFIX}$line" >&2
            continue
        fi
        if [ "$MODULE" = encoder_eval.probe ] && [[ $line =~ $re_probe ]]; then
            echo "[w$WID] probe ${BASH_REMATCH[1]}"
            continue
        fi
        [[ $line =~ $re_cell ]] || continue
        cell=${BASH_REMATCH[1]} step='?' total='?' dev=- left='?'
        if [[ $line =~ $re_step ]]; then step=${BASH_REMATCH[1]}; fi
        if [[ $line =~ $re_total ]]; then total=${BASH_REMATCH[1]}; fi
        if [[ $line =~ $re_dev ]]; then dev=$(printf '%.4g' "${BASH_REMATCH[1]}"); fi
        if [[ $line =~ $re_eta ]]; then left=$(eta "${BASH_REMATCH[1]}"); fi
        echo "[w$WID] $cell step $step/$total dev $dev eta $left"
    done
}

# start_warm: this worker's warm process (`python -m encoder_eval.run --warm-worker`),
# fed requests on W_IN and answering exit codes on W_OUT (two FIFOs in RUN_DIR).
start_warm() {
    local req="$RUN_DIR/warm-req.$WID" rep="$RUN_DIR/warm-rep.$WID"
    rm -f "$req" "$rep"
    if ! mkfifo "$req" "$rep" 2>/dev/null; then
        run_dir_lost
        return 1
    fi
    if [ -n "$UNIT_FD" ]; then # the unit lock is this script's: never held by the worker
        "$PYTHON" -m encoder_eval.run --warm-worker <"$req" >"$rep" {UNIT_FD}>&- &
    else
        "$PYTHON" -m encoder_eval.run --warm-worker <"$req" >"$rep" &
    fi
    WARM_PID=$!
    exec {W_IN}>"$req" {W_OUT}<"$rep"
}

# stop_warm: close the warm process's requests (it exits after its unit) and wait for it,
# and for the progress reader of its unit (whose last lines say what was saved).
stop_warm() {
    if [ -z "$WARM_PID" ]; then return 0; fi
    exec {W_IN}>&- {W_OUT}<&-
    kill -CONT "$WARM_PID" 2>/dev/null # a stopped worker handles its signal, then exits
    wait "$WARM_PID" 2>/dev/null
    if [ -n "$SHOWER" ]; then wait "$SHOWER" 2>/dev/null; fi
    WARM_PID='' W_IN='' W_OUT='' SHOWER=''
}

# proc_state PID: the one-letter state of process PID (R, S, D, T when stopped, ...).
proc_state() {
    local stat
    if [ -r "/proc/$1/stat" ]; then
        IFS= read -r -d '' stat 2>/dev/null <"/proc/$1/stat"
        stat=${stat##*) } # after the command name, which may hold anything
        echo "${stat%% *}"
    else
        stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
        stat=${stat#"${stat%%[! ]*}"}
        echo "${stat:0:1}"
    fi
}

# watch_warm SINCE: the watchdog, run each time the wait for the warm process's reply times
# out (every few seconds): prints when the process was first seen stopped (SIGSTOP), or
# nothing when it is not stopped; past --stopped-timeout it kills the process (which fails
# its unit) with a line saying why.
watch_warm() {
    if [ "$(proc_state "$WARM_PID")" != T ]; then return 0; fi
    local since=${1:-$SECONDS}
    if [ $((SECONDS - since)) -ge "$STOPPED_TIMEOUT" ]; then
        echo "${WPREFIX}warm worker (pid $WARM_PID) of $current was stopped (SIGSTOP) for" \
            "$((SECONDS - since))s, past --stopped-timeout $STOPPED_TIMEOUT: killed it" >&2
        kill -KILL "$WARM_PID" 2>/dev/null
    fi
    echo "$since"
}

# warm_unit LOG SPEC: run one unit (its spec file) in the warm process, its stdout appended to LOG
# and its stderr shown by show_progress (through a FIFO), as a unit's own process would;
# returns its exit code. A warm process that died (killed, out of memory) fails the unit
# with its exit status, and the next unit starts a fresh one; so does one stopped past
# --stopped-timeout (watch_warm).
warm_unit() {
    local log=$1 fifo="$RUN_DIR/warm-progress.$WID" rc='' status fd stopped='' wait_for=()
    shift
    if [ -z "$WARM_PID" ]; then start_warm || return "$EXIT_INCOMPLETE"; fi
    if ! [ -p "$fifo" ] && ! mkfifo "$fifo" 2>/dev/null; then
        run_dir_lost
        return "$EXIT_INCOMPLETE"
    fi
    show_progress "$log" <"$fifo" &
    SHOWER=$!
    # In a subshell: a warm process that has just died (SIGTERM between units) ends the
    # subshell by SIGPIPE, not this script; the read below then finds its end.
    (printf '%s\0' "$log" "$fifo" "$1" >&"$W_IN") 2>/dev/null
    if [ "$STOPPED_TIMEOUT" -gt 0 ]; then # wake up every few seconds for the watchdog
        wait_for=(-t "$((STOPPED_TIMEOUT < 10 ? 1 : 5))")
    fi
    until read -r ${wait_for[@]+"${wait_for[@]}"} rc <&"$W_OUT"; do
        status=$? # past 128: timed out, or a trapped signal interrupted it: read again
        if [ "$status" -le 128 ]; then break; fi
        if [ "$STOPPED_TIMEOUT" -gt 0 ]; then stopped=$(watch_warm "$stopped"); fi
    done
    # The progress reader ends at the end of the unit's stderr; if the process died before
    # opening it, opening the FIFO read-write here (never blocking) gives it that end.
    if [ -p "$fifo" ]; then
        exec {fd}<>"$fifo"
        exec {fd}>&-
    else # the FIFO is gone (RUN_DIR removed): no writer will ever open it, stop the reader
        kill -KILL "$SHOWER" 2>/dev/null
    fi
    { wait "$SHOWER"; } 2>/dev/null # (bash would report the reader killed above)
    SHOWER=''
    if ! [[ $rc =~ ^[0-9]+$ ]]; then # the warm process died during the unit
        exec {W_IN}>&- {W_OUT}<&-
        wait "$WARM_PID"
        rc=$?
        WARM_PID='' W_IN='' W_OUT=''
        if [ "$rc" -eq 0 ]; then rc=$EXIT_INCOMPLETE; fi
    fi
    return "$rc"
}

units() { # every unit of this script, in order
__UNITS__
}

# First pass: check every result file at once, so done units cost no Python start-up.
# shellcheck disable=SC2317  # called by units, from first_pass
unit() { ALL_OUTS+=("${@:3:$2}"); }
first_pass
DONE_BASE=0 # cells done before this run: the counts start from them (a resumed sweep)
for s in ${DONE_AT_START[@]+"${DONE_AT_START[@]}"}; do
    if is_done "$s"; then DONE_BASE=$((DONE_BASE + 1)); fi
done

# The second pass, by each worker: unit LABEL N OUT_1..OUT_N -- --spec FILE
unit() {
    local label=$1 n=$2
    shift 2
    local outs=("${@:1:$n}")
    shift "$n"
    shift # drop the --
    local log="$LOG_DIR/$label.log" rc start
    UNIT_INDEX=$((UNIT_INDEX + 1))
    done_at_start "$n"
    start=$HAVE # counted in DONE_BASE: the events below add the cells done since
    if [ -n "$LOST" ]; then return 0; fi # no unit can be claimed: the end names the cells
    if [ "$PASS" = claim ]; then
        # Each unit goes to the first worker of this script to claim it.
        claim "$label" || return 0
    else
        case " ${DEFERRED[*]} " in *" $UNIT_INDEX "*) ;; *) return 0 ;; esac
    fi
    if [ "$HAVE" -lt "$n" ]; then # again: another runner may have done some since
        check "${outs[@]}"
        HAVE=$N_DONE
    fi
    if [ "$HAVE" -eq "$n" ]; then
        record skip "$((n - start))"
        say "skip $label (all $n cells done)"
        return 0
    fi
    if ! take_unit_lock "$label" && [ "$PASS" = claim ]; then
        # Another runner of this sweep is on it: do the other units first, then come back
        # (its process then waits for the cells still running elsewhere, or skips them).
        DEFERRED+=("$UNIT_INDEX")
        echo "${WPREFIX}later: $label (another runner of this sweep is running it)"
        return 0
    fi
    current=$label
    say "starting $label ($((n - HAVE)) of $n cells to run), log: $log"
    # Appended, not truncated: a second runner of this script must not wipe this log.
    if [ -n "$WARM" ]; then
        warm_unit "$log" "$2" # the unit's spec file: -- --spec FILE
        rc=$?
    else
        { "$PYTHON" -m "$MODULE" "$@" 2>&1 >>"$log"; } | show_progress "$log"
        rc=${PIPESTATUS[0]}
    fi
    release_unit_lock
    if [ "$rc" -eq "$EXIT_INTERRUPTED" ]; then interrupted; fi
    # SIGTERM to a worker of several, or to this unit's process alone (exit "$EXIT_PREEMPTED"): stop here.
    if [ -n "$PREEMPTED" ] || [ "$rc" -eq "$EXIT_PREEMPTED" ]; then
        if [ -n "$WPREFIX" ]; then # the main script says how to resume
            echo "${WPREFIX}preempted${current:+ during $current}" >&2
        else
            echo "preempted${current:+ during $current}: SIGTERM stopped the cell; run" \
                "$RERUN again to resume" >&2
        fi
        exit "$EXIT_PREEMPTED"
    fi
    check "${outs[@]}"
    HAVE=$N_DONE
    record ran "$((HAVE - start))"
    if [ "$rc" -ne 0 ] || [ "$HAVE" -ne "$n" ]; then
        record failed "$label"
        echo "${WPREFIX}FAILED $label (exit $rc, $HAVE of $n cells written), see $log" >&2
        tail -n 5 "$log" | sed 's/^/    /' >&2
    fi
    current=
}

# worker ID [GPU]: take units in order until none is left, then the deferred ones.
# With --gpus, worker k sees GPU (k-1) mod (number listed): K workers on each GPU.
worker() {
    WID=$1
    if [ -n "${2:-}" ]; then export CUDA_VISIBLE_DEVICES=$2 HIP_VISIBLE_DEVICES=$2; fi
    PASS=claim DEFERRED=() UNIT_INDEX=-1 SEEN_OUTS=0
    units
    if [ "${#DEFERRED[@]}" -gt 0 ]; then
        PASS=deferred UNIT_INDEX=-1 SEEN_OUTS=0
        units
    fi
    stop_warm
}

# stop_workers SIGNAL: pass Ctrl-C (INT) or SIGTERM on to every worker's process group
# (each worker's process saves its state and exits 130 or 75; the worker then stops).
stop_workers() {
    local pid
    STOPPING=$1
    for pid in "${PIDS[@]}"; do kill -"$1" -- "-$pid" 2>/dev/null || true; done
}

if [ "$WORKERS" -eq 1 ]; then
    # In the foreground: Ctrl-C reaches the unit's process directly.
    worker 1 "${GPUS[0]:-}"
else
    PIDS=() STOPPING=''
    trap 'stop_workers INT' INT
    trap 'stop_workers TERM' TERM
    # Each worker in its own process group (stdin not the terminal, which would stop it):
    # Ctrl-C reaches this script only, and stop_workers passes it on.
    set -m
    for ((k = 1; k <= WORKERS; k++)); do
        (
            set +m
            WID=$k
            trap 'echo "$?" 2>/dev/null >"$RUN_DIR/rc.$WID"' EXIT
            trap interrupted INT
            trap 'PREEMPTED=1' TERM
            WPREFIX="[w$k] "
            gpu=''
            if [ "${#GPUS[@]}" -gt 0 ]; then gpu=${GPUS[(k - 1) % ${#GPUS[@]}]}; fi
            worker "$k" "$gpu"
        ) </dev/null &
        PIDS+=("$!")
    done
    set +m
    while [ -n "$(jobs -pr)" ]; do
        wait -n 2>/dev/null
        # A worker that was interrupted (preempted) stops the others, as Ctrl-C (SIGTERM) would.
        if [ -z "$STOPPING" ] && grep -qx 130 "$RUN_DIR"/rc.* 2>/dev/null; then
            stop_workers INT
        elif [ -z "$STOPPING" ] && grep -qx 75 "$RUN_DIR"/rc.* 2>/dev/null; then
            stop_workers TERM
        fi
    done
    trap - INT TERM
    if [ "$STOPPING" = INT ] || grep -qx 130 "$RUN_DIR"/rc.* 2>/dev/null; then
        WPREFIX='' current=''
        interrupted
    fi
    if [ "$STOPPING" = TERM ] || grep -qx 75 "$RUN_DIR"/rc.* 2>/dev/null; then
        echo "preempted: SIGTERM stopped the workers; the running cells saved their state;" \
            "run $RERUN again to resume" >&2
        exit "$EXIT_PREEMPTED"
    fi
    if grep -qx "$EXIT_INPUT_ERROR" "$RUN_DIR"/rc.* 2>/dev/null; then exit "$EXIT_INPUT_ERROR"; fi
fi

# The end: every result file checked again, so the exit status says whether every cell is
# done, whatever the workers recorded (a lost RUN_DIR loses their events).
counts
check ${ALL_OUTS[@]+"${ALL_OUTS[@]}"}
NOT_DONE=()
for ((i = 0; i < ${#ALL_OUTS[@]}; i++)); do
    if ! is_done "${STATES[i]:-}"; then
        name=${ALL_OUTS[i]##*/}
        NOT_DONE+=("${name%.json}")
    fi
done
if [ -n "$LOST" ] || ! [ -f "$RUN_DIR/events" ]; then # the units' events went with it
    echo "[cells $N_DONE/$TOTAL_CELLS done] stopped early: the run's temporary folder" \
        "$RUN_DIR was lost (not counted: which units ran or failed)"
else
    echo "[cells $N_DONE/$TOTAL_CELLS done, units $C_UNITS/$TOTAL_UNITS, failed $C_FAILED]" \
        "finished: $C_RUN run, $C_SKIPPED skipped (already done)"
fi
if [ "$C_FAILED" -gt 0 ]; then
    echo "failed units: ${FAILED_UNITS[*]} (logs in $LOG_DIR); re-run this script to retry them" >&2
fi
if [ "${#NOT_DONE[@]}" -gt 0 ]; then
    more=''
    if [ "${#NOT_DONE[@]}" -gt 20 ]; then more=" and $((${#NOT_DONE[@]} - 20)) more"; fi
    echo "not done: ${#NOT_DONE[@]} of ${#ALL_OUTS[@]} cells: ${NOT_DONE[*]:0:20}$more" >&2
    exit "$EXIT_INCOMPLETE"
fi
if [ "$C_FAILED" -gt 0 ]; then exit "$EXIT_INCOMPLETE"; fi
