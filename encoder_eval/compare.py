"""`encoder-eval compare`: is model A really better than model B, task by task?

Usage::

    encoder-eval compare --results-dir results/report [--models a,b,c] [--reference a]
        [--correction holm|fdr_bh] [--alpha 0.05] [--family table|pair] [--jobs N] [--no-cache]
        [--format markdown|json|csv] [--out F]
    # models reported in several directories (each with its own experiment file, or
    # --selection once for all or once per directory):
    encoder-eval compare --results-dir results/report --results-dir results/report-new

For every pair of models (or every model against `--reference`) and every task of the
report table (`table.build_table`: the same cells, at each pair's selected LR, with the
same refusals), one row holds:

* the seed level: the difference of seed means A - B with its Welch 95 % interval and
  p-value, and the almost-stochastic-order ε_min in both directions;
* the example level: a paired permutation test that swaps whole examples (every seed's
  prediction at once) between A and B, on the seed-averaged task score, read from the
  report cells' predictions files (each checked to reproduce its result's scores); for
  accuracy also McNemar's test on the seed-majority correctness (shown, not used);
* the two-level bootstrap interval of the difference (seeds and examples resampled);
* the combined test (`stats.combined_test`): the difference against a variance that adds
  the test-set variance (a bootstrap over the examples, `stats.shared_example_variance`:
  what the seeds of a model share, so per-example seed noise is not counted twice) to
  Welch's seed variance, with its 95 % interval;
* every p-value corrected within a family (Holm by default, `--correction fdr_bh`): every
  row shown (`--family table`, the default: any false "better" in the output at most
  alpha; with two models, the pair's tasks) or each pair's tasks (`--family pair`); the
  verdict's p-values (combined, or Welch's for a row without predictions) in one family;
* the verdict (`stats.verdict`): "A better" or "B better" only when that corrected p-value
  is at most alpha; else "not distinguishable" ("not tested" when a model has fewer than
  two finished seeds);
* seeds needed: report seeds per model that would detect the observed difference at 80 %
  power under the verdict's test at the level its correction applies (alpha / the
  family's number of tests; none, when the test set's own variance hides it), and the
  smallest difference five seeds detect at that level.

Each row is computed on `--jobs N` processes (the same numbers whatever N) and kept in the
user's cache, `$ENCODER_EVAL_CACHE_DIR/comparisons/` (`reports/comparison_cache.py`; never
the results folder), keyed by the content of its inputs and authenticated, so a second run
reads it back and says on stderr how many rows it read (`--no-cache`: neither read nor
written).

EVALUATION_METHODOLOGY.md, section 10, says what each test assumes and why the verdict
needs both sources of variance. Exit status: 0 printed; 1 refused (problems, unless --allow-partial);
2 bad input.
"""

from __future__ import annotations

import argparse
import sys

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    HarnessError,
    report_errors,
    warn_once,
)
from encoder_eval.core.fileio import check_output_file, write_output
from encoder_eval.reports.comparison_cache import print_note
from encoder_eval.reports.stats_settings import add_statistics_arguments
from encoder_eval.reports.table_loading import (
    open_statistics,
    print_refusal,
    table_of_args,
    table_parser,
)
from encoder_eval.reports.verdicts import FULL_FLAGS, VERDICT_FLAGS, compare_table
from encoder_eval.reports.verdicts_render import render


def build_parser() -> argparse.ArgumentParser:
    p = table_parser(
        "compare",
        "Per task and pair of models: the difference with its intervals, seed- and "
        "example-level tests corrected across tasks, the verdict and the seeds needed.",
        allow_partial="compare despite the table's problems (listed as notes)",
    )
    p.add_argument("--reference", help="compare every other model with this one only")
    add_statistics_arguments(p, verdicts=True)
    p.add_argument(
        "--all-tests",
        action="store_true",
        help="also run the paired permutation test and ASO on every pair when several pairs "
        "are compared (by default only a single pair gets them: the verdict reads neither, "
        "and over 14 models they cost CPU-hours)",
    )
    p.add_argument(
        "--format",
        choices=("markdown", "json", "csv", "latex"),
        default="markdown",
        help="latex: a booktabs table per pair for a paper (needs booktabs, graphicx)",
    )
    p.add_argument("--out", help="write here instead of stdout")
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warn = warn_once()

    if args.out:  # before any work
        check_output_file(args.out, "--out")
    loaded = table_of_args(args, warn)
    table, results = loaded.table, loaded.results
    if print_refusal(table, args.allow_partial, "compare"):
        return EXIT_INCOMPLETE
    if len(table.models) < 2:
        raise HarnessError(f"compare needs at least two models; found {table.models}")
    pairs = None
    if args.reference:
        if args.reference not in table.models:
            raise HarnessError(
                f"--reference {args.reference!r} is not one of the models "
                f"compared: {', '.join(table.models)}"
            )
        pairs = [(args.reference, m) for m in table.models if m != args.reference]
    n = len(pairs) if pairs is not None else len(table.models) * (len(table.models) - 1) // 2
    full = n == 1 or args.all_tests
    print(
        f"compare: {n} pair(s) x {len(table.tasks)} task(s), {args.n_resamples} resamples, "
        f"seed {args.seed}"
        + ("" if full else "; no permutation test or ASO (several pairs: --all-tests)"),
        file=sys.stderr,
    )
    settings, cache = open_statistics(args, warn)
    cmp = compare_table(
        table, results, settings, cache, pairs=pairs, flags=FULL_FLAGS if full else VERDICT_FLAGS
    )
    if not full:
        cmp.notes.append(
            f"The paired permutation test and ASO were not run on these {n} pairs (the "
            "verdict reads neither); --all-tests runs them, or compare one pair with --models."
        )
    text = render(cmp, args.format)
    print_note(cache)
    write_output(text, args.out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
