"""`encoder-eval leaderboard`: the models ranked across the tasks of a report table.

Usage::

    encoder-eval leaderboard --results-dir results/report \\
        [--selection selection.json] [--models a,b] [--tasks t1,t2] [--allow-partial] \\
        [--format markdown|json|csv] [--out FILE] [--bootstrap 1000] [--seed 0] [--plot DIR]
    # models reported in several folders: one leaderboard (--results-dir repeated)
    encoder-eval leaderboard --results-dir results/report --results-dir results/report-new

It reads the accepted `summarize` table (same inputs, same refusals) and gives each model
four aggregates over the table's tasks, each with a 95 % bootstrap interval on the model's
position under it:

* mean score: the mean over tasks of the model's task mean (each task weighs the same);
* mean rank: per task the models are ranked by task mean (1 = best, ties share the average
  rank, `scipy.stats.rankdata`), then averaged over tasks; lowest is best;
* Borda count: per task a model scores the number of models it beats, a tie counting 0.5
  (= number of models - its average rank), summed over tasks; highest is best;
* NeuCo-Bench std-weighted rank: Σ over tasks of rank x weight, the weight of a task being
  the standard deviation of its task means across models over the sum of those stds over
  tasks (equal weights when every std is 0, said in a note); lowest is best.

A bootstrap replicate resamples, per (model, task), the seeds with replacement (a new task
mean) and then the tasks with replacement, recomputes every aggregate (the NeuCo weights on
the resampled tasks) and the models' positions; the interval is the 2.5 and 97.5
percentiles of a model's position. With three models or more and two tasks or more, the
Friedman test on the task means and the Nemenyi critical difference (Demšar 2006) say which
models' mean ranks are not distinguishable; `--plot DIR` draws them as `cd.png`.

A model missing a task (no cell, or no finished seed) is refused (exit 1, each listed);
`--allow-partial` drops it and says so under the table, and turns the summarize table's
own problems into notes. Definitions and assumptions: EVALUATION_METHODOLOGY.md, "The
leaderboard across tasks".

Exit status: 0 printed; 1 refused; 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    HarnessError,
    report_errors,
    warn_once,
)
from encoder_eval.core.fileio import check_output_dir, check_output_file, write_output
from encoder_eval.core.protocol import seed_arg
from encoder_eval.plans.plan import split_csv
from encoder_eval.reports.plots import plot_critical_difference
from encoder_eval.reports.probe_table import load_probe_results, probe_folder, probe_table
from encoder_eval.reports.ranking import (
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    Refused,
    build_leaderboard,
    notes,
    render,
)
from encoder_eval.reports.table_loading import (
    check_results_dirs,
    table_of_args,
    table_parser,
)


def build_parser() -> argparse.ArgumentParser:
    p = table_parser(
        "leaderboard",
        "Rank models across the tasks of the report table: mean score, mean "
        "rank, Borda count and NeuCo-Bench's std-weighted rank, each with a bootstrap "
        "interval on the position; Friedman/Nemenyi critical difference.",
        results_dir="report-phase (or probe) result directory",
        allow_partial="drop models missing a task "
        "and turn the table's problems into notes (all said under the table)",
    )
    p.add_argument(
        "--format",
        choices=("markdown", "json", "csv", "latex"),
        default="markdown",
        help="latex: a booktabs table for a paper (needs booktabs, graphicx)",
    )
    p.add_argument("--out", help="write the leaderboard here instead of stdout")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_REPLICATES,
        metavar="N",
        help=f"bootstrap replicates (default {DEFAULT_REPLICATES})",
    )
    p.add_argument(
        "--seed",
        type=seed_arg,
        default=DEFAULT_SEED,
        help=f"bootstrap seed (default {DEFAULT_SEED})",
    )
    p.add_argument(
        "--plot",
        metavar="DIR",
        help="write the critical-difference plot cd.png here (three models or more)",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dirs = check_results_dirs(args.results_dir)
    if args.out:  # every output path before any work
        check_output_file(args.out, "--out")
    if args.plot:
        check_output_dir(args.plot, "--plot")

    warn = warn_once()
    note = None
    if probes := probe_folder(dirs):  # rows (model, pooling), "seeds" the probe folds
        if args.selection:
            raise HarnessError("--selection does not apply to probe results")
        table = probe_table(
            load_probe_results(probes, warn=warn),
            models=split_csv(args.models) or None,
            tasks=split_csv(args.tasks) or None,
        )
    else:
        loaded = table_of_args(args, warn, dirs)
        table, note = loaded.table, loaded.seeds_note()
    if note:
        print(note, file=sys.stderr)
    try:
        board = build_leaderboard(
            table, allow_partial=args.allow_partial, replicates=args.bootstrap, seed=args.seed
        )
    except Refused as exc:
        print(exc.message(), file=sys.stderr)
        return EXIT_INCOMPLETE
    print(f"bootstrap: {board.replicates} replicates, seed {board.seed}", file=sys.stderr)
    text = render(board, args.format)
    if args.plot:
        if board.critical_difference is None:
            print(f"note: no cd.png: {board.cd_note}", file=sys.stderr)
        else:
            path = plot_critical_difference(board.critical_difference, Path(args.plot))
            print(f"wrote {path}", file=sys.stderr)
    if args.format == "csv":
        for note in notes(board):
            print(f"note: {note}", file=sys.stderr)
    write_output(text, args.out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
