"""`encoder-eval export`: a results folder in other tools' formats.

Usage::

    # EuroEval's "Every Eval Ever" records, one line per (model, task) of the table
    # (`--format eee` is the same)
    encoder-eval export --format euroeval --results-dir results/report --out ours.jsonl
    # EuroEval's older BenchmarkResult records (what it read before 2026-03)
    encoder-eval export --format euroeval-legacy --results-dir results/report --out old.jsonl
    # the Hub's model-page results of one model: one YAML file per task in a folder
    # (--benchmark mteb, or the protocol's benchmark dataset org/name: where entries point)
    encoder-eval export --format hub-eval-results --results-dir results/report \\
        --models my-encoder --source-url https://huggingface.co/datasets/me/results \\
        --out eval_results/
    # one JSON Lines row per report example, language and seed (from the predictions files)
    encoder-eval export --format examples --results-dir results/report --out examples.jsonl

Each reads the `summarize` table of the folder, or of several (`--results-dir` repeated:
one table, `table_loading.load_table`), with the same inputs and refusals (exit 1 unless
`--allow-partial`), and exports the cells it counts: each pair's selected LR, its finished
report seeds. docs/export.md gives every field. The library is
`encoder_eval.reports.export` (and `reports.hub_results`). Exit status: 0 written; 1
refused; 2 bad input.
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
from encoder_eval.core.fileio import check_output_file, write_atomic, write_output
from encoder_eval.plans.experiment import check_outside_results, check_table_output
from encoder_eval.reports.export import (
    FORMATS,
    eee_records,
    euroeval_records,
    example_rows,
    to_jsonl,
)
from encoder_eval.reports.hub_results import (
    add_hub_entry_arguments,
    check_hub_entry_arguments,
    check_source_url,
    hub_files,
    link_notes,
    one_model,
)
from encoder_eval.reports.table_loading import (
    add_table_arguments,
    check_results_dirs,
    print_refusal,
    table_of_args,
)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval export",
        description="Export the table's cells as EuroEval's records (Every Eval Ever, or "
        "its older BenchmarkResult), as the Hub's model-page results, or one row per "
        "report example.",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        required=True,
        help="euroeval (or eee): EuroEval's Every Eval Ever (EEE) records; euroeval-legacy: its "
        "older BenchmarkResult records; hub-eval-results: one .eval_results YAML file per "
        "task for a model's Hub page (--out DIR, --source-url); examples: one row per "
        "example, language and seed",
    )
    add_table_arguments(p, allow_partial="export despite the table's problems (the cells it has)")
    p.add_argument(
        "--out",
        help="write here instead of stdout (hub-eval-results: the folder for the files)",
    )
    p.add_argument(
        "--source-url",
        help="hub-eval-results: the https link each entry's source names (where the "
        "results can be read, e.g. the dataset repository of `push --repo`)",
    )
    add_hub_entry_arguments(p, "hub-eval-results")
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dirs = check_results_dirs(args.results_dir)
    hub = args.format == "hub-eval-results"
    benchmarks = check_hub_entry_arguments(args, hub, "--format hub-eval-results")
    if hub:  # every output path before any work
        _check_hub_out(args, dirs)
    elif args.source_url:
        raise HarnessError("--source-url is for --format hub-eval-results")
    elif args.out:
        check_outside_results(args.out, dirs)
        check_output_file(args.out, "--out")
        check_table_output(args.out, dirs, args.selection)
    loaded = table_of_args(args, warn_once(), dirs)
    if print_refusal(loaded.table, args.allow_partial, "export"):
        return EXIT_INCOMPLETE
    if hub:
        model = one_model(loaded.table, None)
        files = hub_files(loaded.table, loaded.results, model, source_url=args.source_url,
                          results_dir=dirs, warn=warn_once(), benchmark=args.benchmark,
                          benchmark_map=benchmarks, source_user=args.source_user,
                          source_org=args.source_org)  # fmt: skip
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_atomic(out / name, text)
            print(out / name)
        for line in link_notes(files, args.benchmark, benchmarks):
            print(line, file=sys.stderr)
        return EXIT_OK
    if args.format in ("euroeval", "eee"):
        rows = eee_records(loaded.table, loaded.results)
    elif args.format == "euroeval-legacy":
        rows = euroeval_records(loaded.table, loaded.results)
    else:
        rows = example_rows(loaded.table, loaded.results)
    write_output(to_jsonl(rows), args.out)
    return EXIT_OK


def _check_hub_out(args: argparse.Namespace, dirs: list[str]) -> None:
    """hub-eval-results: a source link, and an output folder that is not (inside) a
    results folder (which keeps results only)."""
    check_source_url(args.source_url)
    if not args.out:
        raise HarnessError("--format hub-eval-results writes one file per task: give --out DIR")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HarnessError(f"--out {args.out} is not a folder (hub-eval-results writes several)")
    check_outside_results(args.out, dirs)


if __name__ == "__main__":
    sys.exit(main())
