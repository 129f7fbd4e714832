#!/usr/bin/env bash
# shellcheck disable=SC2034  # (template) the common.sh part inserted below reads these
# shellcheck disable=SC2154  # (template) EXIT_*, DONE_STATES: set by __CONSTANTS__
__HEADER__
set -euo pipefail
TEMPLATE=__TEMPLATE__
REQUEUE=(__REQUEUE__)
PYTHON=${PYTHON:-__PYTHON__}
PHASE=__PHASE__
__CONSTANTS__
STATES=() N_DONE=0 HAVE=0 SEEN_OUTS=0 DONE_AT_START=() ALL_OUTS=()

# Up front: this script submits Slurm jobs, so sbatch must be here (not bash's 127 later).
if ! command -v sbatch >/dev/null 2>&1; then
    echo "error: sbatch is not on PATH: this script submits Slurm jobs; run it on a Slurm" \
        "login node (or load Slurm's module), or run the cells here with a --mode shell" \
        "sweep's run_all.sh" >&2
    exit "$EXIT_INPUT_ERROR"
fi

check_failed() {
    check_error "$1"
    exit "$EXIT_INPUT_ERROR"
}

__COMMON__

# Jobs of this sweep already queued or running (by job name): never submit a cell twice.
declare -A QUEUED=()
if command -v squeue >/dev/null 2>&1; then
    while IFS= read -r name; do [ -n "$name" ] && QUEUED["$name"]=1; done < <(
        squeue -h -u "$(id -un)" -t pending,running,suspended,configuring,completing \
            -o '%j' 2>/dev/null)
fi
submitted=0 done_cells=0 queued=0

units() { # every unit of this script, in order
__UNITS__
}

# First pass: check every result file at once, so done units cost no Python start-up.
# shellcheck disable=SC2317  # called by units, from first_pass
unit() { ALL_OUTS+=("${@:5:$4}"); }
first_pass

# unit JOB_NAME LOG COMMENT N OUT_JSON_1..OUT_JSON_N VAR=VALUE... -- RUN_ARGS...
# (COMMENT names the job's cells for `encoder-eval status`: its unit in units.json)
unit() {
    local name=$1 log=$2 comment=$3 n=$4
    shift 4
    shift "$n" # the result files: checked in the first pass
    local envs=()
    while [ "$1" != "--" ]; do
        envs+=("$1")
        shift
    done
    shift
    done_at_start "$n"
    done_cells=$((done_cells + HAVE))
    if [ "$HAVE" -eq "$n" ]; then return 0; fi
    if [ -n "${QUEUED[$name]+x}" ]; then
        queued=$((queued + n - HAVE))
        return 0
    fi
    env "${envs[@]}" sbatch --export=ALL --job-name="$name" --output="$log" \
        --comment="$comment" ${REQUEUE[@]+"${REQUEUE[@]}"} "$TEMPLATE" "$@"
    submitted=$((submitted + 1))
}
units

echo "submitted $submitted job(s); $done_cells cell(s) already done;" \
    "$queued cell(s) already queued or running"
