# shellcheck shell=bash disable=SC2154  # (template) PHASE: exported from the manifest row
# >>> inserted by encoder_eval.sweep (slurm-array): load this array task's cells.
# $1 is the cells manifest, $2 the list of manifest rows this array job covers.
__ee_manifest=$1 __ee_rows=$2
__ee_index=$(sed -n "$((${SLURM_ARRAY_TASK_ID:?not an array task} + 1))p" "$__ee_rows")
if [ -z "$__ee_index" ]; then
    echo "encoder_eval: no manifest row for array task $SLURM_ARRAY_TASK_ID in $__ee_rows" >&2
    exit 1
fi
__ee_row=$(sed -n "$((__ee_index + 2))p" "$__ee_manifest") # line 1 is the header
__ee_f=()
while [[ $__ee_row == *$'\t'* ]]; do
    __ee_f+=("${__ee_row%%$'\t'*}")
    __ee_row=${__ee_row#*$'\t'}
done
__ee_f+=("$__ee_row")
__ee_n=${__ee_f[0]} # the row: N, N result files, the variables, the run arguments
__ee_i=$((__ee_n + 1))
__ee_vars=(__VARIABLES__)
for __ee_var in "${__ee_vars[@]}"; do
    export "$__ee_var=${__ee_f[$__ee_i]}"
    __ee_i=$((__ee_i + 1))
done
# Done already (e.g. by another runner since the launch)? The check is encoder_eval.done
# (no torch) run by $PYTHON, else by the Python that wrote this script; it moves corrupt
# result files aside. When it cannot run here, the task runs: the run skips done cells.
__ee_python=${PYTHON:-__PYTHON__}
__ee_rc=0
printf '%s\0' "${__ee_f[@]:1:__ee_n}" |
    "$__ee_python" -m encoder_eval.done --phase "$PHASE" --files0-from - || __ee_rc=$?
if [ "$__ee_rc" -eq 0 ]; then
    echo "encoder_eval: all $__ee_n cell(s) of this task are already done, skipping"
    exit 0
elif [ "$__ee_rc" -ne 1 ]; then
    echo "encoder_eval: could not check this task's result files with $__ee_python (exit" \
        "$__ee_rc); running the task, which skips the cells already done" >&2
fi
set -- "${__ee_f[@]:__ee_i}"
unset __ee_manifest __ee_rows __ee_index __ee_row __ee_f __ee_i __ee_var __ee_vars __ee_n \
    __ee_python __ee_rc
# <<< end of the inserted part; the template follows.
