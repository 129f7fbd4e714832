"""The renderings of a `Table` (`reports/table.py`): markdown, json, csv and latex, the
footnotes every format carries, and the refusal text of a table with problems.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.metrics import metric_spec
from encoder_eval.data.tasks import (
    BENCHMARK_LABELS,
    BENCHMARK_SCORES,
    SEPARATE_BUCKETS,
    TASK_KNOBS,
    in_suite_average,
    task_label,
)
from encoder_eval.reports import latex
from encoder_eval.reports.latex import Score
from encoder_eval.reports.table import CellStats, Table, task_header

TABLE_SCHEMA = "encoder-eval-table"
# What each selection split means, as the table's footnote states it.
SELECTION_SPLIT_NOTES = {
    "dev": "LR selection and early stopping on the official dev split (the specification's "
    "default; for dev-reported tasks the score is a maximum over evaluations).",
    "holdout": "LR selection and early stopping on a held-out slice of train (strict: the "
    "official dev split is untouched until the report score).",
}
CI_NOTES = {
    "t": "[low, high]: 95 % interval of the seed mean, Student t quantile on n - 1 degrees "
    "of freedom (none for one seed).",
    "bootstrap": "[low, high]: 95 % two-level bootstrap interval of the seed mean (seeds and "
    "report examples resampled, percentile method).",
}
MARKS_NOTES = {
    "table": "Bold: the task's best model by mean; ≈: not distinguishable from it (the verdict "
    "of `encoder-eval compare`: a t-test carrying seed and test-set variance). Every pair of "
    "models on every task is tested, Holm-corrected as one family, so the chance that any "
    "mark of the table comes from a false difference is at most 0.05.",
    "task": "Bold: the task's best model by mean; ≈: not distinguishable from it (the verdict "
    "of `encoder-eval compare`: a t-test carrying seed and test-set variance, Holm-corrected "
    "across the task's comparisons with the best only, --marks-family task: this does not "
    "account for the best being picked by its mean, nor for the other tasks).",
}
BUCKET_LABELS = {
    "multilingual": "Multilingual",
    "glue": "GLUE",
    "superglue": "SuperGLUE",
    "ranking": "Ranking",
}

FORMATS = ("markdown", "json", "csv", "latex")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def score_cell(
    cell: CellStats | None,
    expected_n: int,
    interval: tuple[float, float] | None = None,
    mark: str | None = None,
) -> Score:
    """`72.31 ± 1.05 [70.98, 73.64]` (x100: mean ± std [95 % interval]); `—` for no score;
    `†` when averaged over fewer seeds; bold when `mark` is "best", `≈` when "tied"."""
    if cell is None or cell.mean is None:
        return Score("—")
    std = "n/a" if cell.std is None else f"{100 * cell.std:.2f}"
    ci = "" if interval is None else f" [{_pct(interval[0])}, {_pct(interval[1])}]"
    return Score(
        f"{_pct(cell.mean)} ± {std}{ci}",
        best=mark == "best",
        tied=mark == "tied",
        dagger=cell.n != expected_n,
    )


def format_cell(
    cell: CellStats | None,
    expected_n: int,
    interval: tuple[float, float] | None = None,
    mark: str | None = None,
) -> str:
    """The markdown of `score_cell`."""
    return score_cell(cell, expected_n, interval, mark).markdown()


def _seed_range(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


PROBE_NOTES = (
    "Scores x100: mean ± sample std (ddof=1) over the {n} probe folds (repeated shuffle-splits "
    "of train) of each fold's linear probe on frozen embeddings, scored on the report split; "
    "rows are model:pooling.",
    "[low, high]: 95 % interval of the fold mean, Student t quantile on n - 1 degrees of "
    "freedom. The folds share the report examples and most training rows, so it speaks of "
    "the probe's fitting noise, not of a new training set or test set.",
)


def _dagger_notes(table: Table) -> list[str]:
    """`† avg@k instead of avg@n: cells` for the cells averaged over fewer seeds (or folds)."""
    by_n: dict[int, list[str]] = defaultdict(list)
    for c in table.partial_cells():
        by_n[c.n].append(f"{c.model}/{c.task}")
    n = len(table.expected_seeds)
    notes = [f"† avg@{k} instead of avg@{n}: {', '.join(by_n[k])}." for k in sorted(by_n)]
    empty = [f"{c.model}/{c.task}" for c in table.empty_cells()]
    if empty:
        what = "fold" if table.kind == "probe" else "report seed"
        notes.append(f"— no finished {what} (see below): {', '.join(empty)}.")
    return notes


def _cut_note(table: Table) -> list[str]:
    """The note naming the cells whose t interval was cut to the metric's range."""
    if table.ci_method != "t" and table.kind != "probe":
        return []
    found = (table.cells.get((m, t)) for m in table.models for t in table.tasks)
    cut = [c for c in found if c is not None and c.t_interval_cut]  # in the table's order
    if not cut:
        return []
    ranges = {c.metric: metric_spec(c.metric).score_range for c in cut}
    shown = "; ".join(
        f"{metric_spec(m).label} [{_pct(lo)}, {_pct(hi)}]" for m, (lo, hi) in ranges.items()
    )
    cells = ", ".join(f"{c.model}/{c.task}" for c in cut)
    return [
        f"Intervals cut at the metric's range ({shown}), which the t interval of so few "
        f"seeds reaches past: {cells}."
    ]


def footnotes(table: Table) -> list[str]:
    n = len(table.expected_seeds)
    if table.kind == "probe":
        notes = [PROBE_NOTES[0].format(n=n), PROBE_NOTES[1], *_cut_note(table)]
        if any(TASK_KNOBS[t].report_split == "validation" for t in table.tasks):
            notes.append("* reported on the dev (validation) split: the test labels are hidden.")
        notes += _dagger_notes(table)
        notes += [f"Not a protocol table: {p.message} [{p.rule}]." for p in table.problems]
        return notes
    seeds = _seed_range(table.expected_seeds)
    partial = table.partial_cells()
    over = (
        f"over the report seeds each cell has (the protocol's: {seeds}, avg@{n}; see †)"
        if partial
        else f"over report seeds {seeds} (avg@{n})"
    )
    notes = [
        f"Scores x100: mean ± sample std (ddof=1) of the report-split score {over}, at the LR "
        "chosen on the select seeds.",
        CI_NOTES[table.ci_method],
        *_cut_note(table),
    ]
    if table.marks is not None:
        notes.append(MARKS_NOTES[table.marks_family])
        for task, m in table.marks.items():
            if m.notes:
                notes.append(f"{task}: " + "; ".join(m.notes) + ".")
    if table.selection_split in SELECTION_SPLIT_NOTES:
        notes.append(SELECTION_SPLIT_NOTES[table.selection_split])
    elif len(table.selection_splits) > 1:
        notes.append(
            "LR selection and early stopping: the cells mix selection splits "
            f"({', '.join(table.selection_splits)}) [selection_split]."
        )
    if any(TASK_KNOBS[t].report_split == "validation" for t in table.tasks):
        notes.append("* reported on the dev (validation) split: the test labels are hidden.")
    for name in table.benchmark_scores:
        tasks = BENCHMARK_SCORES[name]
        notes.append(
            f"{BENCHMARK_LABELS[name]}: the macro-average of the task means over "
            f"{', '.join(task_label(t) for t in tasks)} (each task's metric "
            "as in its column" + ("; ReCoRD excluded" if name == "superglue_score" else "") + ")."
        )
    separate = [t for t in table.tasks if not in_suite_average(t)]
    if separate:
        notes.append(
            f"Average leaves out the ranking tasks ({', '.join(separate)}), which "
            "have their own column."
        )
    notes += _dagger_notes(table)
    for p in table.problems:
        notes.append(f"Not a protocol table: {p.message} [{p.rule}].")
    return notes


def table_grid(table: Table) -> tuple[list[str], list[list[Score | str]]]:
    """The table's header and rows, each cell with its marks: what every text format shows."""
    n = len(table.expected_seeds)
    head = ["Model", *(task_header(t) for t in table.tasks)]
    head += [BUCKET_LABELS.get(b, b.title()) for b in table.bucket_columns]
    head += [BENCHMARK_LABELS[name] for name in table.benchmark_scores] + ["Average"]
    rows: list[list[Score | str]] = []
    for model in table.models:
        row: list[Score | str] = [model]
        row += [
            score_cell(
                table.cells.get((model, t)), n, table.interval(model, t), table.mark(model, t)
            )
            for t in table.tasks
        ]
        row += [_pct(table.bucket_mean(model, b)) for b in table.bucket_columns]
        row += [_pct(table.benchmark_score(model, name)) for name in table.benchmark_scores]
        row.append(_pct(table.overall_mean(model)))
        rows.append(row)
    return head, rows


def render_markdown(table: Table) -> str:
    head, rows = table_grid(table)
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "---|" + "---:|" * (len(head) - 1),
    ]
    for row in rows:
        cells = [c.markdown() if isinstance(c, Score) else c for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *footnotes(table)]) + "\n"


def render_latex(table: Table) -> str:
    """The table for a paper: booktabs, marks as in markdown, the footnotes as table notes."""
    head, rows = table_grid(table)
    return latex.render_table(head, rows, footnotes(table))


def table_to_dict(table: Table) -> dict:
    """The table as plain data (the json format; also what a plotting hook takes)."""
    rows = []
    for model in table.models:
        cells = {}
        for t in table.tasks:
            c = table.cells.get((model, t))
            ci = table.interval(model, t)
            cells[t] = (
                None
                if c is None
                else {
                    "mean": c.mean,
                    "std": c.std,
                    "n": c.n,
                    "seeds": sorted(c.scores),
                    "ci": None
                    if ci is None
                    else {"low": ci[0], "high": ci[1], "method": table.ci_method},
                    "mark": table.mark(model, t),
                    "scores": {str(s): v for s, v in sorted(c.scores.items())},
                    "diverged_seeds": c.diverged,
                    "undefined_seeds": c.undefined,
                    "missing_seeds": c.missing,
                    "lr_key": c.lr_key,
                    "lr": c.lr,
                    "metric": c.metric,
                    "off_protocol": c.off_protocol,
                }
            )
        rows.append(
            {
                "model": model,
                "cells": cells,
                "buckets": {b: table.bucket_mean(model, b) for b in table.buckets},
                "benchmark_scores": {
                    name: table.benchmark_score(model, name) for name in table.benchmark_scores
                },
                "average": table.overall_mean(model),
            }
        )
    return {
        "schema": TABLE_SCHEMA,
        "version": 1,
        "kind": table.kind,
        "std": "sample standard deviation (ddof=1)",
        "ci_method": table.ci_method,
        "expected_seeds": table.expected_seeds,
        "selection_split": table.selection_split,
        "selection_splits": table.selection_splits,
        "benchmark_scores": {
            name: {"label": BENCHMARK_LABELS[name], "tasks": list(BENCHMARK_SCORES[name])}
            for name in table.benchmark_scores
        },
        "average_excludes_buckets": list(SEPARATE_BUCKETS),
        "tasks": [
            {
                "task": t,
                "metric": TASK_KNOBS[t].metric,
                "bucket": TASK_KNOBS[t].bucket,
                "report_split": TASK_KNOBS[t].report_split,
                "dev_reported": TASK_KNOBS[t].report_split == "validation",
            }
            for t in table.tasks
        ],
        "rows": rows,
        "footnotes": footnotes(table),
        "problems": [p.to_dict() for p in table.problems],
    }


CSV_COLUMNS = (
    "model",
    "kind",
    "task",
    "metric",
    "report_split",
    "bucket",
    "lr_key",
    "lr",
    "n",
    "seeds",
    "mean",
    "std",
    "ci_low",
    "ci_high",
    "ci_method",
    "mark",
    "diverged_seeds",
)


def _csv_row(model: str, kind: str, name: str, mean: float | None, **fields) -> list:
    """One row of `render_csv`: the named columns filled, every other one empty."""
    row = dict.fromkeys(CSV_COLUMNS, "")
    row.update(model=model, kind=kind, task=name, mean="" if mean is None else repr(mean))
    row.update(fields)
    return [row[c] for c in CSV_COLUMNS]


def render_csv(table: Table) -> str:
    """Long format: one row per (model, task), then one per bucket and overall average."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for model in table.models:
        for t in table.tasks:
            k = TASK_KNOBS[t]
            c = table.cells.get((model, t))
            known = {"report_split": k.report_split, "bucket": k.bucket}
            if c is None:
                w.writerow(_csv_row(model, "task", t, None, metric=k.metric, **known))
                continue
            ci = table.interval(model, t)
            w.writerow(
                _csv_row(
                    model,
                    "task",
                    t,
                    c.mean,
                    **known,
                    metric=c.metric,
                    lr_key=c.lr_key,
                    lr="" if c.lr is None else f"{c.lr:g}",
                    n=c.n,
                    seeds=" ".join(map(str, sorted(c.scores))),
                    std="" if c.std is None else repr(c.std),
                    ci_low="" if ci is None else repr(ci[0]),
                    ci_high="" if ci is None else repr(ci[1]),
                    ci_method=table.ci_method,
                    mark=table.mark(model, t) or "",
                    diverged_seeds=" ".join(map(str, c.diverged)),
                )
            )
        for b in table.buckets:
            w.writerow(_csv_row(model, "bucket", b, table.bucket_mean(model, b), bucket=b))
        for name in table.benchmark_scores:
            w.writerow(_csv_row(model, "benchmark", name, table.benchmark_score(model, name)))
        w.writerow(_csv_row(model, "average", "", table.overall_mean(model)))
    return buf.getvalue()


def render(table: Table, fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(table)
    if fmt == "json":
        return json.dumps(table_to_dict(table), indent=2) + "\n"
    if fmt == "csv":
        return render_csv(table)
    if fmt == "latex":
        return render_latex(table)
    raise HarnessError(f"--format {fmt!r} must be one of {', '.join(FORMATS)}")


def format_refusal(table: Table, command: str = "summarize") -> str:
    """The refusal of `command` (summarize, report, export, compare) over a table with
    problems: each problem with its cells."""
    refuses = (
        "summarize refuses to print this table"
        if command == "summarize"
        else f"{command} refuses this table"
    )
    lines = [
        f"error: {refuses} ({len(table.problems)} problem(s)); fix "
        "them, or pass --allow-partial to print it anyway with footnotes"
    ]
    for p in table.problems:
        lines.append(f"[{p.rule}] {p.message}:")
        lines += [f"  {c}" for c in p.cells]
    return "\n".join(lines)


def refusal(table: Table, allow_partial: bool, command: str = "summarize") -> str | None:
    """`command`'s refusal message when the table has problems and `--allow-partial` was
    not given; None when the table may be shown."""
    if table.problems and not allow_partial:
        return format_refusal(table, command)
    return None
