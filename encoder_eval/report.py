"""`encoder-eval report`: one self-contained HTML page of a results folder, to browse.

Usage::

    encoder-eval report --results-dir results/report --out report.html
    # models reported in several folders: one page (--results-dir repeated)
    encoder-eval report --results-dir results/report --results-dir results/report-new \\
        --out report.html
    # results without an experiment file: name the selection (and the select results,
    # for the learning-rate curves)
    encoder-eval report --results-dir results/report --selection selection.json \\
        --select-results-dir results/select --out report.html
    # a smoke or unfinished run: the page says what is wrong with the table
    encoder-eval report --results-dir results/report --out report.html --allow-partial

The page holds the `summarize` table with its footnotes (each score links to the result
files behind it: cell, protocol, recipe, provenance, training), the score chart and the
learning-rate curves, `compare`'s verdicts for every pair of models, the leaderboard with
its critical-difference plot, and with `--probe-results-dir` a probe table. It needs no
network when viewed: CSS inline, figures as data URIs, no external script. The table's
json (`summarize --format json`) is embedded in the element `#table-data`.

The statistics flags are `summarize`'s and `compare`'s (one definition,
`stats_settings.StatsSettings`): `--no-marks`, `--marks-family` for the table's marks;
`--family` (default table), `--correction`, `--alpha` for the verdicts; `--resamples`,
`--seed`, `--jobs N`, and `--no-cache` (the comparisons are otherwise read from and kept in
the user's cache, `$ENCODER_EVAL_CACHE_DIR/comparisons/`, so a report after `summarize`
reuses its marks).

The table is refused as `summarize` refuses it (exit 1, each problem listed) unless
`--allow-partial`, which shows the page with the problems in a banner and the footnotes.
The library is `encoder_eval.reports.html`. Exit status: 0 written; 1 refused; 2 bad input.
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
from encoder_eval.core.fileio import write_atomic
from encoder_eval.plans.plan import split_csv
from encoder_eval.reports.comparison_cache import print_note
from encoder_eval.reports.html import build_report, render_html
from encoder_eval.reports.stats_settings import add_statistics_arguments
from encoder_eval.reports.table_loading import (
    check_results_dirs,
    open_statistics,
    print_refusal,
    table_parser,
)


def build_parser() -> argparse.ArgumentParser:
    p = table_parser(
        "report",
        "Write one self-contained HTML page: the table with footnotes, figures, "
        "compare's verdicts, the leaderboard and each cell's provenance.",
        results_dir="report-phase (or probe) result directory",
        allow_partial="write the page despite the table's problems (shown in a banner)",
    )
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.add_argument(
        "--select-results-dir",
        help="select-phase results, for the learning-rate "
        "curves (default: those the experiment file names)",
    )
    p.add_argument("--probe-results-dir", help="also show a table of the probe results here")
    p.add_argument("--title", help="the page's title (default: names the results directory)")
    add_statistics_arguments(p, marks=True, verdicts=True)
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dirs = check_results_dirs(args.results_dir)
    if args.probe_results_dir and not Path(args.probe_results_dir).is_dir():
        raise HarnessError(f"--probe-results-dir {args.probe_results_dir} is not a directory")
    if not Path(args.out).absolute().parent.is_dir():
        raise HarnessError(f"--out {args.out}: its directory does not exist")
    warn = warn_once()
    settings, cache = open_statistics(args, warn)
    report = build_report(
        dirs,
        selection=args.selection,
        select_results_dir=args.select_results_dir,
        probe_results_dir=args.probe_results_dir,
        models=split_csv(args.models) or None,
        tasks=split_csv(args.tasks) or None,
        allow_partial=args.allow_partial,
        settings=settings,
        cache=cache,
        title=args.title,
        warn=warn,
    )
    print_note(cache)
    if print_refusal(report.table, args.allow_partial, "report"):
        return EXIT_INCOMPLETE
    write_atomic(args.out, render_html(report))
    print(f"wrote {args.out}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
