# shellcheck shell=bash disable=SC2154  # (template) PYTHON, PHASE, DONE_STATES: set by the script this goes into
# ---- inserted from encoder_eval/plans/templates/common.sh: deciding which cells are done.
# Every script decides "done" with `python -m encoder_eval.done` (no torch: fast on a login
# node), which also moves corrupt results aside into .corrupt/ in their results directory
# (one line each), so their cells run again.

# is_done STATE: whether a state `encoder_eval.done --states` prints is a done cell's
# (DONE_STATES, from encoder_eval/core/results.py).
is_done() {
    case " $DONE_STATES " in *" $1 "*) [ -n "$1" ] ;; *) return 1 ;; esac
}

# check FILE...: STATES gets one word per file, in order (ok and diverged are done; see
# python -m encoder_eval.done --help), N_DONE how many are done. A check that cannot run
# calls the script's check_failed with its exit status.
check() {
    local out rc=0 s
    STATES=()
    N_DONE=0
    if [ "$#" -eq 0 ]; then return 0; fi
    out=$(printf '%s\0' "$@" |
        "$PYTHON" -m encoder_eval.done --phase "$PHASE" --states --files0-from -) || rc=$?
    if [ "$rc" -gt 1 ]; then
        check_failed "$rc"
    fi
    while IFS= read -r s; do
        if [ -n "$s" ]; then STATES+=("$s"); fi
        if is_done "$s"; then N_DONE=$((N_DONE + 1)); fi
    done <<<"$out"
}

# check_error RC: the message of a check that could not run.
check_error() {
    echo "error: could not check the result files with $PYTHON (exit $1); set PYTHON to the" \
        "interpreter encoder_eval is installed in, then run this script again" >&2
}

# first_pass: check every result file of every unit at once (`units` calls `unit`, which the
# caller defined to add a unit's result files to ALL_OUTS), so done units cost no Python
# start-up. DONE_AT_START gets the states, in unit order; done_at_start reads them.
first_pass() {
    ALL_OUTS=()
    units
    check ${ALL_OUTS[@]+"${ALL_OUTS[@]}"}
    DONE_AT_START=(${STATES[@]+"${STATES[@]}"})
    SEEN_OUTS=0
}

# done_at_start N: HAVE gets how many of the next unit's N result files were done at the
# first pass (call it once per unit, in unit order).
done_at_start() {
    local i
    HAVE=0
    for ((i = SEEN_OUTS; i < SEEN_OUTS + $1; i++)); do
        if is_done "${DONE_AT_START[i]:-}"; then HAVE=$((HAVE + 1)); fi
    done
    SEEN_OUTS=$((SEEN_OUTS + $1))
}
# ---- end of common.sh
