#!/usr/bin/env bash
# shellcheck disable=SC2034  # (template) the common.sh part inserted below reads these
# shellcheck disable=SC2154  # (template) EXIT_*, DONE_STATES: set by __CONSTANTS__
__HEADER__
set -euo pipefail
MANIFEST=__MANIFEST__
ARRAY_SCRIPT=__ARRAY_SCRIPT__
ARRAYS_DIR=__ARRAYS_DIR__
LOG=__LOG__
JOB_NAME=__JOB_NAME__
REQUEUE=(__REQUEUE__)
PYTHON=${PYTHON:-__PYTHON__}
PHASE=__PHASE__
__CONSTANTS__
DEFAULT_MAX_ARRAY_SIZE=__DEFAULT_MAX_ARRAY_SIZE__
ROWS_COMMENT=__ROWS_COMMENT__ # the job comment names its rows file (encoder-eval status reads it)
STATES=() N_DONE=0

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

if command -v squeue >/dev/null 2>&1 &&
    [ -n "$(squeue -h -u "$(id -un)" -n "$JOB_NAME" -o %i 2>/dev/null)" ]; then
    echo "jobs of this launch script ($JOB_NAME) are still queued or running; wait for" \
        "them or run scancel --name=$JOB_NAME, then launch again (or write a script for" \
        "the cells neither done nor queued: encoder-eval status --emit DIR)" >&2
    exit 3
fi

max=$(scontrol show config 2>/dev/null |
    sed -n 's/^MaxArraySize *= *\([0-9][0-9]*\).*/\1/p' | head -n 1) || true
max=${max:-$DEFAULT_MAX_ARRAY_SIZE}
chunk=${EE_ARRAY_CHUNK:-$max}
if [ "$chunk" -gt "$max" ]; then chunk=$max; fi
throttle=${EE_ARRAY_THROTTLE:+%$EE_ARRAY_THROTTLE}

# Manifest rows (0-based, header excluded) with a cell not done yet.
row_cells=() ALL_OUTS=()
while IFS=$'\t' read -r -a f; do # f: N, then N result files, then the rest
    row_cells+=("${f[0]}")
    ALL_OUTS+=("${f[@]:1:f[0]}")
done < <(tail -n +2 "$MANIFEST")
check ${ALL_OUTS[@]+"${ALL_OUTS[@]}"}
pending=() n=0 cells=0 todo=0 seen_outs=0
for size in "${row_cells[@]}"; do
    missing=0
    for ((i = seen_outs; i < seen_outs + size; i++)); do
        is_done "${STATES[i]:-}" || missing=$((missing + 1))
    done
    if [ "$missing" -gt 0 ]; then pending+=("$n"); fi
    seen_outs=$((seen_outs + size)) n=$((n + 1)) cells=$((cells + size))
    todo=$((todo + missing))
done
if [ "${#pending[@]}" -eq 0 ]; then
    echo "submitted 0 array task(s): all $cells cells are done"
    exit 0
fi
mkdir -p "$ARRAYS_DIR"
stamp=$(date +%Y%m%d-%H%M%S)-$$
k=0 total=0
for ((start = 0; start < ${#pending[@]}; start += chunk)); do
    part=("${pending[@]:start:chunk}")
    rows="$ARRAYS_DIR/rows-$stamp-$k.txt"
    printf '%s\n' "${part[@]}" >"$rows"
    sbatch --export=ALL --job-name="$JOB_NAME" --output="$LOG" --comment="$ROWS_COMMENT$rows" \
        --array="0-$((${#part[@]} - 1))$throttle" ${REQUEUE[@]+"${REQUEUE[@]}"} \
        "$ARRAY_SCRIPT" "$MANIFEST" "$rows"
    k=$((k + 1)) total=$((total + ${#part[@]}))
done
echo "submitted $total array task(s) ($todo cell(s) to run) in $k array job(s)" \
    "of at most $chunk; $((cells - todo)) cell(s) already done"
