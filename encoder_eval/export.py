"""`encoder-eval export`: a results folder in other tools' formats.

Usage::

    # EuroEval's benchmark-result records, one line per (model, task) of the table
    encoder-eval export --format euroeval --results-dir results/report --out ours.jsonl
    # one JSON Lines row per report example, language and seed (from the predictions files)
    encoder-eval export --format examples --results-dir results/report --out examples.jsonl

Both read the `summarize` table of the folder (same inputs, same refusals: exit 1 unless
`--allow-partial`) and export the cells it counts: each pair's selected LR, its finished
report seeds. docs/export.md gives every field. The library is
`encoder_eval.reports.export`. Exit status: 0 written; 1 refused; 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    report_errors,
    warn_once,
)
from encoder_eval.core.fileio import write_output
from encoder_eval.core.results import load_results
from encoder_eval.plans.experiment import summarize_inputs
from encoder_eval.plans.plan import split_csv
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports.export import FORMATS, euroeval_records, example_rows, to_jsonl
from encoder_eval.reports.table import build_table, format_refusal


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval export",
        description="Export the table's cells as EuroEval benchmark-result records, or one "
        "row per report example.",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        required=True,
        help="euroeval: EuroEval's euroeval_benchmark_results.jsonl records; "
        "examples: one row per example, language and seed",
    )
    p.add_argument("--results-dir", required=True, help="report-phase result directory")
    p.add_argument(
        "--selection",
        help="selection.json (default: the one the results directory's experiment file names)",
    )
    p.add_argument("--models", help="comma-separated models (default: selection + results)")
    p.add_argument("--tasks", help="comma-separated tasks (default: selection + results)")
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="export despite the table's problems (the cells it has)",
    )
    p.add_argument("--out", help="write here instead of stdout")
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.results_dir).is_dir():
        raise HarnessError(f"--results-dir {args.results_dir} is not a directory")
    if args.out and not Path(args.out).absolute().parent.is_dir():
        raise HarnessError(f"--out {args.out}: its directory does not exist")
    selection_path, _, _ = summarize_inputs(args.results_dir, args.selection)
    results = load_results(args.results_dir, warn=warn_once(), phase="report")
    table = build_table(
        results,
        load_selection(selection_path),
        models=split_csv(args.models) or None,
        tasks=split_csv(args.tasks) or None,
    )
    if table.problems and not args.allow_partial:
        print(
            format_refusal(table).replace(
                "summarize refuses to print this table", "export refuses this table"
            ),
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    if args.format == "euroeval":
        rows = euroeval_records(table, results)
    else:
        rows = example_rows(table, results)
    write_output(to_jsonl(rows), args.out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
