"""`encoder-eval sweep`: write the launch script for one phase of the protocol.

Usage::

    # selection phase: every (model, task, grid LR, select seed 42-44) cell, dev only
    encoder-eval sweep --phase select --out-dir runs/select \\
        --results-dir results/select --mode shell
    bash runs/select/run_all.sh                 # one unit at a time
    bash runs/select/run_all.sh --gpus 0,1,2,3  # or --workers N: several at once

    # reporting phase: the 5 report seeds (45-49) at each pair's selected LR
    encoder-eval sweep --phase report --selection selection.json \\
        --out-dir runs/report --results-dir results/report --mode shell

    # on a cluster: array jobs over the phase (MaxArraySize tasks each), or one sbatch per
    # job; a job runs the seeds of one (model, task, LR) unless --group says otherwise
    encoder-eval sweep --phase select --mode slurm-array --slurm-template my.sbatch ...
    encoder-eval sweep --phase select --mode slurm --slurm-template my.sbatch ...
    bash runs/select/launch.sh
    encoder-eval status --results-dir results/select   # done, queued, running, missing

    encoder-eval sweep --show-grid     # the LR grid, seed sets and recipe flags

    # linear probes on frozen embeddings: one encoder_eval.probe process per (model, task),
    # every pooling from its one forward pass; one result file per (model, pooling, task)
    encoder-eval sweep --phase probe --model minilm=/path/to/minilm \\
        --pooling mean,first --tasks all --out-dir runs/probe --results-dir results/probe
    bash runs/probe/run_all.sh --workers 2      # or --mode slurm + a template running
                                                # python -m encoder_eval.probe "$@"

What runs: `--models` (default: every model of MODEL_REGISTRY, or only the `--model`
additions when any are given), `--tasks` (task keys and the groups all, glue, superglue,
multilingual; default: the five multilingual tasks; `--tasks-file F` adds user tasks),
`--model NAME=PATH_OR_HUB_ID[:MODE]` (repeatable) to add a model without editing the
registry. Smoke-run shrinking: `--lr-keys lr03,lr06`, `--seeds 42,43`, `--max-steps N`,
`--max-seq-len N`; the cells then carry the shrunken values, `run` marks them
off-protocol, and `summarize` refuses them without `--allow-partial`.

Every cell command carries the whole recipe explicitly (`--weight-decay 0.1
--adam-beta2 0.95 --early-stop --patience 3 --epoch-cap 20 --bsz 32 ...`). Every script
is idempotent: a cell that is done (`results.cell_state`: its result file parses, validates
and names the cell) is skipped when the script gets to it, a corrupt result file is moved
aside into `<results dir>/.corrupt/` and its cell runs again, so re-running a script fills
the gaps. Nothing here imports torch: it runs on a login node.

This module is the command line; what a phase runs is `plan.py` (Cell, Plan, and
`build_plan` over typed `PlanInputs` and `CellSettings`),
how it is launched `emit.py` (the script bodies are `encoder_eval/plans/templates/*.sh`).

Adding a model is one row of `MODEL_REGISTRY` (re-exported here from `models.py`)::

    "my-encoder-base": ModelEntry("org/my-encoder-base", mode="auto"),
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from encoder_eval.core.errors import EXIT_OK, ArgumentParser, report_errors
from encoder_eval.core.protocol import PHASES, PROBE_PHASE, SWEEP_PHASES
from encoder_eval.data.models import MODEL_REGISTRY
from encoder_eval.plans import experiment, sweep_config
from encoder_eval.plans.arguments import (
    add_emit_arguments,
    add_plan_arguments,
    add_probe_arguments,
    check_utf8_args,
    check_utf8_plan,
    emit_options,
    format_grid,
    plan_and_config,
)
from encoder_eval.plans.arguments import plan_from_args as plan_from_args  # tests use it
from encoder_eval.plans.emit import (
    DEFAULT_GROUP,
    EMIT_MODES,
    SLURM_VARIABLES,
    Emitted,
    SlurmLaunch,
    emit,
    emit_shell,
    emit_slurm,
    emit_slurm_array,
)
from encoder_eval.plans.plan import (
    GROUPS,
    Cell,
    Plan,
    build_plan,
    build_probe_plan,
    model_table,
    parse_lr_keys,
    parse_seeds,
    resolve_models,
    resolve_tasks,
    split_csv,
)

# Re-exported for the tests, which drive a sweep through these names; no module imports a
# command (tests/test_layers.py).
__all__ = [
    "DEFAULT_GROUP",
    "EMIT_MODES",
    "GROUPS",
    "MODEL_REGISTRY",
    "PHASES",
    "SLURM_VARIABLES",
    "Cell",
    "Emitted",
    "Plan",
    "SlurmLaunch",
    "build_plan",
    "build_probe_plan",
    "emit",
    "emit_shell",
    "emit_slurm",
    "emit_slurm_array",
    "main",
    "model_table",
    "parse_lr_keys",
    "parse_seeds",
    "resolve_models",
    "resolve_tasks",
    "split_csv",
]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval sweep",
        description="Write the launch script (shell, Slurm, or Slurm array) for one phase of "
        "the protocol. Scripts skip cells that are done and move corrupt result files aside, "
        "so re-running fills gaps.",
    )
    add_plan_arguments(p, SWEEP_PHASES)
    add_probe_arguments(p)
    add_emit_arguments(p)
    p.add_argument("--out-dir", help="where the script and logs go (default: runs/<phase>)")
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite an experiment.toml that "
        "records another experiment in --results-dir or --out-dir (refused without)",
    )
    p.add_argument(
        "--show-grid",
        action="store_true",
        help="print the LR grid, seed sets and recipe flags, then exit",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.show_grid:
        print(format_grid())
        return EXIT_OK
    check_utf8_args(args)
    plan, cfg = plan_and_config(args)
    out_dir = (cfg.out_dir if cfg else args.out_dir) or os.path.join("runs", plan.phase)
    check_utf8_plan(plan, out_dir)
    record = None
    if cfg is not None:
        sweep_config.check_consent(cfg)
        record = sweep_config.for_plan(plan, out_dir, cfg)
        if not args.force:
            experiment.check_unchanged(plan, out_dir, record)
    emitted = emit(
        plan,
        out_dir,
        args.mode,
        **emit_options(args),
    )
    if plan.phase == PROBE_PHASE:  # experiment.toml records the fine-tuning phases only
        print(emitted.describe())
        summarize = f"encoder-eval summarize --results-dir {shlex.quote(plan.results_dir)}"
        print(f"then: {summarize}")
        return EXIT_OK
    manifests = sweep_config.write_for_plan(plan, out_dir, cfg, record)
    if plan.shrunk:
        print("note: shrunken sweep, its results are off-protocol: " + "; ".join(plan.shrunk))
    print(emitted.describe())
    print(f"wrote {' and '.join(map(str, manifests))}: what this sweep runs, for later commands")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
