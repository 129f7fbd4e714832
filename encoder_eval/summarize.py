"""`encoder-eval summarize`: the results table, mean ± std over the report seeds.

Usage::

    encoder-eval summarize --results-dir results/report \\
        [--format markdown|json|csv] [--out FILE]
    # one table over several folders (a second model, a noise-check twin, in its own):
    encoder-eval summarize --results-dir results/report --results-dir results/report-twin
    # the selection file and the expected report seeds come from the experiment file the
    # report sweep wrote into results/report; for results without one, name the selection:
    encoder-eval summarize --results-dir results/report --selection selection.json
    # a smoke or unfinished run: print anyway, footnotes give the real seed counts
    encoder-eval summarize ... --allow-partial

Each (model, task) cell of the table is the mean ± sample standard deviation (ddof=1)
of the report-split score over the report seeds 45-49 at the LR chosen in
`selection.json`, with its 95 % interval (the t quantile over seeds; `--ci bootstrap`: a
two-level bootstrap over seeds and report examples); nothing is picked here. Per task the
best model is bold and `≈` marks each model `compare` calls not distinguishable from it
(`--no-marks` skips the tests; the comparisons run on `--jobs N` processes and are kept in
the user's cache, `$ENCODER_EVAL_CACHE_DIR/comparisons/`, so another format reads them back:
`--no-cache` neither reads nor writes it). Scores are shown x100. Each task's column
names its metric; tasks reported on dev (validation) are marked `*`. Bucket columns
(Multilingual, GLUE, SuperGLUE, Ranking) average the model's task means within the bucket
(shown for a bucket of two or more of the table's tasks; JSON and CSV carry every bucket),
and `Average` averages its task means (each task weighs the same) except the ranking
tasks', which have their own column; an average is shown only when all its tasks have a
score. `GLUE score` and `SuperGLUE score` are the seed paper's benchmark scores
(`tasks.BENCHMARK_SCORES`): the macro-average over a fixed task set (SuperGLUE without
ReCoRD), shown when a table holds every task of the set.

The table is refused (exit 1, each offending cell listed) when:

* a cell lacks report seeds (`missing_seeds`) or a pair has no selected LR
  (`no_selection`);
* the selection is off-protocol for a pair of the table (`selection_off_protocol`: a
  shrunken select sweep, off-protocol select cells) or was made over missing select seeds
  (`selection_partial`), as `selection.json` itself records;
* a result sits at an LR other than the selected one (`wrong_lr`; never averaged);
* a result is off-protocol (`off_protocol`: shrunken recipe, seed outside 45-49, ...);
* a report seed diverged (`diverged`; counted, never averaged);
* a report score is undefined (`undefined_metric`: a null `report.mean`, e.g. constant
  predictions; never averaged, never read as 0);
* cells disagree on the recipe (`recipe`), on precision (`precision`), on the selection
  split (`selection_split`: a protocol variant, one per table), on
  `provenance.software.transformers` (`transformers`), one model's cells on
  `provenance.model_revision` (`model_revision`) or on the loader mode and
  trust_remote_code (`loader`), or one task's cells on the data they read
  (`data_identity`);
* a report cell ran otherwise than its pair's select cells did, as `select_setup` in the
  selection records them (`select_report_mismatch`: model revision, loader, recipe, data
  identity or selection split).

The footnote and the json format name the selection split the table used.

`--results-dir` repeated makes one table of several folders (`table_loading.load_table`: each
folder's selection from its experiment file, or `--selection` once for all or once per
folder); besides the rules above, a folder named twice, a cell in two folders with other
contents, a model its folders' selections choose otherwise for, and folders of other
protocols are refused with one error (docs/tables.md).

`--allow-partial` prints the table anyway and turns every problem into a footnote; cells
averaged over fewer seeds than expected carry `†` and a footnote such as "avg@2 instead of
avg@5". Unparseable result files are skipped with one warning each.

The library functions (`build_table`, `render_markdown`, `render_csv`, `table_to_dict`)
return data and strings; only `main` prints. `--plots DIR` writes the figures of
`encoder_eval.reports.plots` once the table is accepted.

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
from encoder_eval.plans.experiment import check_table_output
from encoder_eval.plans.plan import split_csv
from encoder_eval.reports.comparison_cache import print_note
from encoder_eval.reports.plots import write_plots
from encoder_eval.reports.probe_table import load_probe_results, probe_folder, probe_table
from encoder_eval.reports.stats_settings import add_statistics_arguments
from encoder_eval.reports.table_loading import (
    check_results_dirs,
    open_statistics,
    table_of_args,
    table_parser,
)
from encoder_eval.reports.table_render import FORMATS, footnotes, refusal, render
from encoder_eval.reports.verdicts import add_statistics


def build_parser() -> argparse.ArgumentParser:
    p = table_parser(
        "summarize",
        "Tabulate mean ± std over the report seeds at each pair's selected LR; "
        "refuses incomplete or non-comparable tables unless --allow-partial.",
        results_dir="report-phase (or probe) result directory",
        allow_partial="print despite problems; footnotes give real seed counts and problems",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="markdown",
        help="latex: a booktabs table for a paper (needs booktabs, graphicx)",
    )
    p.add_argument("--out", help="write the table here instead of stdout")
    add_statistics_arguments(p, ci=True, marks=True)
    p.add_argument(
        "--plots",
        metavar="DIR",
        help="also write PNG plots here: the final "
        "scores, and (with --select-results-dir) the learning-rate curves",
    )
    p.add_argument(
        "--select-results-dir",
        help="select-phase results, for the LR curves (default: those the experiment file names)",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warn = warn_once()  # --plots reads the report results again: one warning per file

    dirs = check_results_dirs(args.results_dir)
    if args.out:  # every output path before any work
        check_output_file(args.out, "--out")
        check_table_output(args.out, dirs, args.selection)
    if args.plots:
        check_output_dir(args.plots, "--plots")

    if probes := probe_folder(dirs):
        return _main_probe(args, probes, warn)
    loaded = table_of_args(args, warn)
    table = loaded.table
    refused = refusal(table, args.allow_partial)
    settings, cache = open_statistics(args, warn)
    if refused is None:
        add_statistics(table, loaded.results, settings, cache)
    text = render(table, args.format)
    print_note(cache)
    if note := loaded.seeds_note():
        print(note, file=sys.stderr)
    if refused is not None:
        print(refused, file=sys.stderr)
        return EXIT_INCOMPLETE
    if args.plots:
        select_dirs = [args.select_results_dir] if args.select_results_dir else loaded.select_dirs
        written = write_plots(
            [Path(d) for d in select_dirs] or None,
            [Path(d) for d in dirs],
            None,
            Path(args.plots),
            warn=warn,
            expected_n=len(table.expected_seeds),
            selection=loaded.selection,
        )
        print(f"wrote {len(written)} plot(s) to {args.plots}", file=sys.stderr)
    if args.format == "csv" and table.problems:
        for note in footnotes(table):
            print(f"note: {note}", file=sys.stderr)
    write_output(text, args.out)
    return EXIT_OK


def _main_probe(args: argparse.Namespace, results_dir: str, warn) -> int:
    """`summarize` of a folder of probe results (`encoder_eval.cells.probe_cell`)."""
    if args.ci != "t" or args.plots or args.selection:
        raise HarnessError("probe results take the t interval only, no --selection, no --plots")
    table = probe_table(
        load_probe_results(results_dir, warn=warn),
        models=split_csv(args.models) or None,
        tasks=split_csv(args.tasks) or None,
    )
    if refused := refusal(table, args.allow_partial):
        print(refused, file=sys.stderr)
        return EXIT_INCOMPLETE
    if args.format == "csv" and table.problems:
        for note in footnotes(table):
            print(f"note: {note}", file=sys.stderr)
    write_output(render(table, args.format), args.out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
