"""`encoder-eval export`: a results folder in other tools' formats.

Usage::

    # EuroEval's benchmark-result records, one line per (model, task) of the table
    encoder-eval export --format euroeval --results-dir results/report --out ours.jsonl
    # one JSON Lines row per report example, language and seed (from the predictions files)
    encoder-eval export --format examples --results-dir results/report --out examples.jsonl

Both read the `summarize` table of the folder, or of several (`--results-dir` repeated:
one table, `table.load_table`), with the same inputs and refusals (exit 1 unless
`--allow-partial`), and export the cells it counts: each pair's selected LR, its finished
report seeds. docs/export.md gives every field. The library is
`encoder_eval.reports.export`. Exit status: 0 written; 1 refused; 2 bad input.
"""

from __future__ import annotations

import argparse
import sys

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    report_errors,
    warn_once,
)
from encoder_eval.core.fileio import check_output_file, write_output
from encoder_eval.plans.experiment import check_table_output
from encoder_eval.plans.plan import split_csv
from encoder_eval.reports.export import FORMATS, euroeval_records, example_rows, to_jsonl
from encoder_eval.reports.table import (
    add_table_arguments,
    check_results_dirs,
    load_table,
    refusal,
)


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
    add_table_arguments(p, allow_partial="export despite the table's problems (the cells it has)")
    p.add_argument("--out", help="write here instead of stdout")
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dirs = check_results_dirs(args.results_dir)
    if args.out:  # every output path before any work
        check_output_file(args.out, "--out")
        check_table_output(args.out, dirs, args.selection)
    loaded = load_table(
        dirs,
        args.selection,
        models=split_csv(args.models) or None,
        tasks=split_csv(args.tasks) or None,
        warn=warn_once(),
    )
    if refused := refusal(loaded.table, args.allow_partial, "export"):
        print(refused, file=sys.stderr)
        return EXIT_INCOMPLETE
    if args.format == "euroeval":
        rows = euroeval_records(loaded.table, loaded.results)
    else:
        rows = example_rows(loaded.table, loaded.results)
    write_output(to_jsonl(rows), args.out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
