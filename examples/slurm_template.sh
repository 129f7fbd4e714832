#!/bin/bash
# Example Slurm template for `encoder-eval sweep --mode slurm|slurm-array`.
# The contract is the emit_slurm docstring in encoder_eval/plans/emit.py. In short: each job
# gets the complete `python -m encoder_eval.run` argument list of its cell as "$@", and
# the cell's values as exported variables (MODEL, MODEL_PATH, MODE, TASK, LR, LR_KEY,
# SEED, PHASE, OUT_JSON, RESULTS_DIR, DATA_DIR, DEVICE, MAX_STEPS, RECIPE_ARGS, RUN_ARGS).
# By default a job runs up to 4 units of one model in one warm process ("$@" is then one
# --spec FILE per unit, and TASK, LR, LR_KEY, SEED comma-separated lists): give --time for
# that many units, or sweep --units-per-job N / --no-warm (docs/slurm.md, "Warm jobs").
# Adapt the #SBATCH lines and the environment activation to your cluster; keep the rest.
# (launch.sh sets --job-name and --output itself.)
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=12:00:00
# #SBATCH --partition=gpu
# #SBATCH --account=my-project

set -euo pipefail

# Activate the environment the harness is installed in (edit this path).
# shellcheck source=/dev/null  # your cluster's environment, not checked here
source "$HOME/encoder-eval-harness/.venv/bin/activate"
# export HF_HOME=/scratch/$USER/hf-cache   # a shared model/dataset cache, if you have one

echo "cells ($N_CELLS): model=$MODEL task=$TASK lr=$LR ($LR_KEY) seed=$SEED phase=$PHASE"
exec python -m encoder_eval.run "$@"
