"""`encoder-eval select`: pick each (model, task)'s learning rate from the select phase.

Usage::

    encoder-eval select --results-dir results/select --out selection.json
    # results of a sweep older than the experiment file: tell select what it ran
    encoder-eval select --results-dir results/select --out selection.json \\
        --lr-keys lr03,lr06 --seeds 42,43

For every (model, task) pair the chosen LR is the one with the best seed-averaged dev
mean (`dev.mean` of the select cells). The policy, stated once:

* Expected cells: the LR keys x select seeds the sweep ran, as the experiment file it
  wrote into the results directory (`experiment.toml`) records them, and its models x
  tasks; flags that contradict the file are refused (`--models`/`--tasks` may narrow it).
  Without the file: every LR key of the grid (or `--lr-keys`) x every select seed 42-44
  (or `--seeds`), and the pairs present in the results, or `--models` x `--tasks`.
* Incomplete rows: an LR whose seed row lacks a seed is not eligible, and select refuses
  (exit 1, nothing written), listing every missing cell: a choice over a partly run grid is
  not the protocol's. When the results are a complete smaller grid (a shrunken sweep
  without an experiment file), the refusal names the `--lr-keys`/`--seeds` that describe it. With `--allow-partial` an LR with at least one
  finished seed is eligible with the mean over the seeds it has; the pair is marked
  `partial` and the seeds each mean used are recorded.
* Diverged cells: a diverged seed (non-finite loss) is never dropped. It makes its LR
  ineligible, since that LR does not train reliably for this model and task; it is recorded
  under `diverged_by_lr`, and that LR's `dev_mean_by_lr` is null. `--allow-partial` does not
  change this.
* Undefined scores: a seed whose dev mean is undefined (null: the metric is undefined on
  constant predictions) makes its LR ineligible the same way, recorded under
  `undefined_by_lr`; it is never read as 0.
* No eligible LR: the pair gets `lr_key: null` with a `reason`, the file is still written,
  and select exits 1 listing those pairs (the report sweep refuses them).
* Ties (equal means) go to the smaller LR.
* Cells of one pair must share their setup (`cell_setup`: the recipe signature, model
  revision, loader mode and trust_remote_code, data identity and selection split); a
  mismatch is refused, naming the entry and the cells. The shared setup is recorded per pair
  as `select_setup`, so that `summarize` can check the report cells ran with the same.
* Cells outside the expected LR keys or seeds are ignored, with a note.

`selection.json` (version 3; version 2 is still read, as a file without `experiment`; a
file of another version must be regenerated)::

    {"schema": "encoder-eval-selection", "version": 3, "created_at": ..., "results_dir": ...,
     "policy": {"lr_keys": [...], "seeds": [...], "allow_partial": false, "rule": ...},
     "experiment": {...} or null,  # the select phase's experiment file, as data
     "on_protocol": true,
     "pairs": {"<model>": {"<task>": {
         "lr_key": "lr06", "lr": 3.59e-05, "dev_mean": 0.81, "metric": "accuracy",
         "dev_mean_by_lr": {"lr01": 0.78, ...}, "seeds_by_lr": {"lr01": [42, 43, 44], ...},
         "diverged_by_lr": {"lr10": [43]}, "undefined_by_lr": {}, "missing_by_lr": {},
         "partial": false, "on_protocol": true, "reason": null,
         "select_setup": {"model_revision": ..., "mode": "auto", "trust_remote_code": false,
                          "selection_split": "dev", "data_identity": "hub:...@<sha>",
                          "recipe": {...}}}}}}

Exit status: 0 written; 1 refused or some pair has no selection; 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    report_errors,
)
from encoder_eval.core.fileio import check_output_file, output_errors
from encoder_eval.core.results import (
    EXPERIMENT_NAME,
    load_results,
    write_json_atomic,
)
from encoder_eval.plans import experiment
from encoder_eval.plans.plan import parse_lr_keys, parse_seeds, resolve_tasks, split_csv
from encoder_eval.plans.selection import (
    Refusal,
    format_selection,
    select_pairs,
    unselected_pairs,
)


def _unfinished_fix(exp: experiment.Experiment | None, results_dir: str) -> str | None:
    """How to finish a sweep whose experiment file says which cells to expect."""
    if exp is None:
        return None
    record = exp.phases.get("select")
    where = f"the script in {record.out_dir}" if record and record.out_dir else "its script"
    return (
        f"the select sweep recorded in {Path(results_dir) / EXPERIMENT_NAME} "
        f"is not finished: re-run {where} (encoder-eval status --results-dir "
        f"{results_dir} --emit DIR writes one for just the missing cells), or pass "
        "--allow-partial"
    )


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval select",
        description="Choose each (model, task)'s learning rate by seed-averaged dev mean over "
        "the select phase's cells and write selection.json.",
    )
    p.add_argument("--results-dir", required=True, help="select-phase result directory")
    p.add_argument("--out", default="selection.json", help="file to write")
    p.add_argument("--models", help="comma-separated models (default: those in the results)")
    p.add_argument("--tasks", help="comma-separated tasks (default: those in the results)")
    p.add_argument(
        "--lr-keys",
        help="LR keys the sweep ran (default: those its experiment "
        "file records, else the whole grid)",
    )
    p.add_argument(
        "--seeds",
        help="seeds the sweep ran (default: those its experiment file records, else 42,43,44)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="choose among LRs with missing seeds too (diverged LRs stay out)",
    )
    p.add_argument(
        "--redact-paths",
        action="store_true",
        help="leave local paths (model "
        "folders, the data mirror, task files, results folders) out of the file, "
        "for sharing; the report sweep then asks for the reader's own",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not Path(args.results_dir).is_dir():
            raise HarnessError(f"--results-dir {args.results_dir} is not a directory")
        check_output_file(args.out, "--out")  # before any work
        experiment.check_output_not_input(args.out, "--out", results_dirs=(args.results_dir,))
        tasks = split_csv(args.tasks) or None
        exp, lr_keys, seeds, models, tasks = experiment.select_expectations(
            args.results_dir,
            lr_keys=parse_lr_keys(args.lr_keys),
            seeds=parse_seeds(args.seeds),
            models=split_csv(args.models) or None,
            tasks=tasks,
        )
        if tasks:
            resolve_tasks(tasks)
        results = load_results(args.results_dir, phase="select")
        selection = select_pairs(
            results,
            models=models,
            tasks=tasks,
            lr_keys=lr_keys,
            seeds=seeds,
            allow_partial=args.allow_partial,
            note=lambda m: print(f"note: {m}", file=sys.stderr),
            unfinished_fix=_unfinished_fix(exp, args.results_dir),
        )
        selection["results_dir"] = os.path.abspath(args.results_dir)
        if exp is not None and args.redact_paths:
            exp = exp.redacted()
        selection["experiment"] = exp.to_dict() if exp else None
        if args.redact_paths:
            selection["results_dir"] = experiment.REDACTED
        out = Path(args.out)
    except Refusal as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_INCOMPLETE
    with output_errors(out):
        write_json_atomic(out, selection)
    print(format_selection(selection))
    if not selection["on_protocol"]:
        print("note: some select cells are off-protocol (shrunken sweep); so is this selection")
    print(f"wrote {out}")
    missing = unselected_pairs(selection)
    if missing:
        print(f"error: {len(missing)} pair(s) have no selection:", file=sys.stderr)
        for item in missing:
            print(f"  {item}", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
