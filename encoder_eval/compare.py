"""`encoder-eval compare`: is model A really better than model B, task by task?

Usage::

    encoder-eval compare --results-dir results/report [--models a,b,c] [--reference a]
        [--correction holm|fdr_bh] [--alpha 0.05] [--format markdown|json|csv] [--out F]
    # models reported in several directories (each with its own experiment file):
    encoder-eval compare --results-dir results/report --results-dir results/report-new

For every pair of models (or every model against `--reference`) and every task of the
report table (`summarize.build_table`: the same cells, at each pair's selected LR, with the
same refusals), one row holds:

* the seed level: the difference of seed means A - B with its Welch 95 % interval and
  p-value, and the almost-stochastic-order ε_min in both directions;
* the example level: a paired permutation test that swaps whole examples (every seed's
  prediction at once) between A and B, on the seed-averaged task score, read from the
  report cells' predictions files (each checked to reproduce its result's scores); for
  accuracy also McNemar's test on the seed-majority correctness (shown, not used);
* the two-level bootstrap interval of the difference (seeds and examples resampled);
* the combined test (`stats.combined_test`): the difference against a variance that adds
  the test-set variance (a bootstrap over the examples, `stats.example_variance`) to
  Welch's seed variance, with its 95 % interval;
* every p-value corrected across the pair's tasks (Holm by default, `--correction fdr_bh`);
* the verdict (`stats.verdict`): "A better" or "B better" only when the corrected combined
  p-value is at most alpha (the corrected Welch p-value when a model has no predictions);
  else "not distinguishable" ("not tested" when a model has fewer than two finished seeds);
* seeds needed: report seeds per model that would detect the observed difference at 80 %
  power under the verdict's test (none, when the test set's own variance hides it), and
  the smallest difference five seeds detect.

EVALUATION_METHODOLOGY.md, section 10, says what each test assumes and why the verdict
needs both sources of variance. Exit status: 0 printed; 1 refused (problems, unless --allow-partial);
2 bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import stats
from .errors import EXIT_INCOMPLETE, EXIT_OK, ArgumentParser, HarnessError, report_errors, warn_once
from .experiment import summarize_inputs
from .fileio import write_output
from .metrics import language_mean, metric_spec, score_array
from .predictions import PredictionsError, check_against_result, load_predictions
from .predictions import predictions_path as predictions_file
from .protocol import seed_arg
from .results import LoadedResult, load_results
from .select import load_selection
from .summarize import Table, build_table, format_refusal, task_header
from .tasks import task_knobs

COMPARE_SCHEMA = "encoder-eval-compare"
DEFAULT_RESAMPLES = 999
DEFAULT_SEED = 1234
POWER = 0.8
MDD_SEEDS = 5  # the protocol's report seeds
NOT_TESTED = "not tested"  # the verdict of a row with too few seeds for any test


@dataclass
class Examples:
    """One (model, task)'s report predictions over its seeds: a (seeds, examples) matrix,
    the gold labels and each example's language, in one fixed example order."""

    seeds: list[int]
    matrix: np.ndarray
    labels: np.ndarray
    languages: np.ndarray
    data_identity: str
    ids: list[tuple[str, int]]


@dataclass
class Row:
    """The comparison of model A with model B on one task."""

    model_a: str
    model_b: str
    task: str
    metric: str
    n_a: int
    n_b: int
    mean_a: float | None
    mean_b: float | None
    diff: float | None = None
    ci_low: float | None = None  # Welch interval of the difference
    ci_high: float | None = None
    p_seed: float | None = None
    p_seed_adj: float | None = None
    aso_a_over_b: float | None = None  # ε_min: below 0.5, A almost stochastically dominant
    aso_b_over_a: float | None = None
    example_test: str | None = None
    p_example: float | None = None
    p_example_adj: float | None = None
    p_mcnemar: float | None = None
    example_sd: float | None = None  # test-set sd of Δ (bootstrap over examples, seeds kept)
    p_combined: float | None = None  # seed + test-set variance: the verdict's test
    p_combined_adj: float | None = None
    comb_low: float | None = None  # the combined test's interval of the difference
    comb_high: float | None = None
    boot_low: float | None = None  # two-level bootstrap interval of the difference
    boot_high: float | None = None
    seeds_needed: int | None = None
    mdd_5: float | None = None
    verdict: str = stats.NOT_DISTINGUISHABLE
    notes: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    rows: list[Row]
    alpha: float
    correction: str
    n_resamples: int
    seed: int
    notes: list[str]


# ----------------------------------------------------------------------------- examples


def task_score(metric: str, euro: tuple[str, ...]):
    """The function (matrix, seed rows, example columns) -> the seed-averaged task score:
    per seed, the metric per language on the chosen examples and their headline language
    mean (`metrics.language_mean`, as a cell's report mean is computed); NaN when undefined."""

    def score(matrix: np.ndarray, labels: np.ndarray, langs: np.ndarray, cols) -> float:
        per_seed = []
        lab, lng = labels[cols], langs[cols]
        order = list(dict.fromkeys(lng.tolist()))
        for row in matrix:
            preds = row[cols]
            scores = {}
            for lang in order:
                sel = lng == lang
                scores[lang] = score_array(metric, preds[sel], lab[sel])
            mean, _ = language_mean(scores, euro)
            if mean is None:
                return math.nan
            per_seed.append(mean)
        return float(np.mean(per_seed))

    return score


def load_examples(cells: list[LoadedResult]) -> tuple[Examples | None, str | None]:
    """The predictions of one (model, task)'s report cells as an `Examples`, or None and why
    not (a missing, invalid or stale predictions file, or cells that disagree)."""
    if cells and metric_spec(cells[0].result.metric).granularity == "grouped":
        return None, (f"{cells[0].result.metric} is a per-query metric, and the example-level "
                      "tests resample single examples, not queries")  # fmt: skip
    rows, reference = [], None
    for c in sorted(cells, key=lambda c: c.cell["seed"]):
        path = predictions_file(c.path)
        try:
            preds = load_predictions(path)
        except PredictionsError as exc:
            return None, str(exc)
        problems = check_against_result(preds, c.result)
        if problems:
            return None, f"{path}: out of step with its result ({'; '.join(problems)})"
        ids = [(lang, i) for lang, p in preds.languages.items() for i in p.ids]
        labels = [x for p in preds.languages.values() for x in p.labels]
        if reference is None:
            reference = (ids, labels, preds.data_identity)
        elif (ids, labels, preds.data_identity) != reference:
            return None, f"{path}: other examples than seed {cells[0].cell['seed']}'s"
        rows.append([x for p in preds.languages.values() for x in p.predictions])
    if reference is None:
        return None, "no report cells"
    ids, labels, identity = reference
    return Examples(
        seeds=sorted(c.cell["seed"] for c in cells),
        matrix=np.asarray(rows, dtype=float),
        labels=np.asarray(labels, dtype=float),
        languages=np.asarray([lang for lang, _ in ids]),
        data_identity=identity,
        ids=ids,
    ), None


def _paired(a: Examples, b: Examples) -> str | None:
    """Why A's and B's predictions cannot be paired example by example (None: they can)."""
    if a.data_identity != b.data_identity:
        return f"the models read different data ({a.data_identity} vs {b.data_identity})"
    if a.ids != b.ids or not np.array_equal(a.labels, b.labels):
        return "the models' predictions files hold different examples"
    return None


def _majority_correct(ex: Examples) -> np.ndarray:
    """Per example: correct in more than half of the model's seeds."""
    return (ex.matrix == ex.labels).mean(axis=0) > 0.5


# ----------------------------------------------------------------------------- one row


def compare_cells(
    model_a: str,
    model_b: str,
    task: str,
    table: Table,
    cells: dict[tuple[str, str], list[LoadedResult]],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    examples: dict | None = None,
    bootstrap: bool = True,
) -> Row:
    """Every statistic of A against B on `task` but the correction and the verdict (those
    need the other tasks: `finish_rows`). `cells` are the table's included report results
    per (model, task); `examples` caches `load_examples` across rows."""
    knobs = task_knobs(task)
    sa, sb = table.cells.get((model_a, task)), table.cells.get((model_b, task))
    a_scores = [] if sa is None else [sa.scores[s] for s in sorted(sa.scores)]
    b_scores = [] if sb is None else [sb.scores[s] for s in sorted(sb.scores)]
    row = Row(model_a, model_b, task, knobs.metric, len(a_scores), len(b_scores),
              sa.mean if sa else None, sb.mean if sb else None)  # fmt: skip
    if len(a_scores) < 2 or len(b_scores) < 2:
        row.notes.append(
            f"too few finished seeds for a seed-level test ({len(a_scores)} and "
            f"{len(b_scores)}; at least 2 each)"
        )
        return row
    higher = metric_spec(knobs.metric).higher_is_better
    sign = 1.0 if higher else -1.0  # stats are "higher is better": flip a lower-is-better one
    welch = stats.welch(a_scores, b_scores)
    row.diff, row.p_seed = welch.diff, None if math.isnan(welch.pvalue) else welch.pvalue
    row.ci_low, row.ci_high = welch.low, welch.high
    if row.p_seed is None:
        row.notes.append("no seed varies in either model: the seed-level test is undefined")
    row.aso_a_over_b = stats.aso([sign * x for x in a_scores], [sign * x for x in b_scores],
                                 seed=seed).eps_min  # fmt: skip
    row.aso_b_over_a = stats.aso([sign * x for x in b_scores], [sign * x for x in a_scores],
                                 seed=seed).eps_min  # fmt: skip
    std_a, std_b = float(np.std(a_scores, ddof=1)), float(np.std(b_scores, ddof=1))
    examples = {} if examples is None else examples
    loaded, why = [], None
    for model in (model_a, model_b):
        if (model, task) not in examples:
            examples[(model, task)] = load_examples(cells.get((model, task), []))
        ex, why_not = examples[(model, task)]
        if ex is None:
            why = why or f"example-level tests unavailable for {model}: {why_not}"
        loaded.append(ex)
    if why is None and (unpaired := _paired(*loaded)):
        why = f"example-level tests unavailable: {unpaired}"
    if why is not None:
        row.notes.append(why)
        _power(row, std_a, std_b, 0.0)
        return row
    ea, eb = loaded
    k = min(len(ea.seeds), len(eb.seeds))
    if k < len(ea.seeds) or k < len(eb.seeds):
        row.notes.append(f"the example-level test pairs the first {k} seeds of each model")
    score = task_score(knobs.metric, knobs.euro_languages)
    labels, langs = ea.labels, ea.languages

    def diff_stat(ma: np.ndarray, mb: np.ndarray) -> float:
        cols = np.arange(ma.shape[1])
        return sign * (score(ma, labels, langs, cols) - score(mb, labels, langs, cols))

    test = stats.paired_swap_permutation(ea.matrix[:k], eb.matrix[:k], diff_stat,
                                         n_resamples=n_resamples, seed=seed)  # fmt: skip
    row.example_test, row.p_example = test.test, test.pvalue
    vex = stats.example_variance(
        lambda cols: score(ea.matrix, labels, langs, cols) - score(eb.matrix, labels, langs, cols),
        langs, n_resamples=max(2, n_resamples), seed=seed,
    )  # fmt: skip
    if math.isnan(vex):
        row.notes.append("the test-set variance is undefined (a resample's score is); "
                         "verdict on the seed level only")  # fmt: skip
        _power(row, std_a, std_b, 0.0)
    else:
        row.example_sd = math.sqrt(vex)
        comb = stats.combined_test(a_scores, b_scores, vex)
        row.p_combined = None if math.isnan(comb.pvalue) else comb.pvalue
        row.comb_low, row.comb_high = comb.low, comb.high
        _power(row, std_a, std_b, vex)
    if knobs.metric == "accuracy":
        row.p_mcnemar = stats.mcnemar(_majority_correct(ea), _majority_correct(eb)).pvalue

    if not bootstrap:
        return row

    def boot(seed_rows: list[np.ndarray], cols: np.ndarray) -> float:
        return score(ea.matrix[seed_rows[0]], labels, langs, cols) - score(
            eb.matrix[seed_rows[1]], labels, langs, cols
        )

    _, row.boot_low, row.boot_high = stats.two_level_bootstrap(
        boot, [len(ea.seeds), len(eb.seeds)], langs, n_resamples=n_resamples, seed=seed
    )
    return row


def _power(row: Row, std_a: float, std_b: float, example_var: float) -> None:
    """Seeds needed and MDD@5 under the verdict's test (`example_var` 0: Welch's)."""
    try:
        row.mdd_5 = stats.min_detectable_difference(std_a, std_b, n=MDD_SEEDS, power=POWER,
                                                    example_var=example_var)  # fmt: skip
        row.seeds_needed = stats.seeds_needed(row.diff, std_a, std_b, power=POWER,
                                              example_var=example_var)  # fmt: skip
    except stats.StatsInputError as exc:
        row.notes.append(f"seeds needed: {exc}")


def finish_rows(
    rows: list[Row], alpha: float, correction: str, family_of: Callable[[Row], object] | None = None
) -> None:
    """Correct the p-values of each family (by default a pair's tasks; seed level and
    example level corrected separately) and set every row's verdict."""
    by_family: dict[object, list[Row]] = defaultdict(list)
    for r in rows:
        by_family[(r.model_a, r.model_b) if family_of is None else family_of(r)].append(r)
    for family in by_family.values():
        for raw, adj in (("p_seed", "p_seed_adj"), ("p_example", "p_example_adj"),
                         ("p_combined", "p_combined_adj")):  # fmt: skip
            tested = [r for r in family if getattr(r, raw) is not None]
            if tested:
                fixed = stats.correct([getattr(r, raw) for r in tested], correction, alpha)
                for r, p in zip(tested, fixed.pvalues, strict=True):
                    setattr(r, adj, p)
        for r in family:
            if r.diff is None:  # too few seeds on a side: no test ran
                r.verdict = NOT_TESTED
                continue
            if r.p_seed_adj is None:  # no seed varies: the seed variance is unknown
                r.verdict = stats.NOT_DISTINGUISHABLE
                continue
            higher = metric_spec(r.metric).higher_is_better
            p = r.p_seed_adj if r.p_combined_adj is None else r.p_combined_adj
            r.verdict = stats.verdict(p, r.diff, alpha, higher_is_better=higher)
            if r.p_combined_adj is None:
                r.notes.append("verdict on the seed level only (no test-set variance)")


def compare_table(
    table: Table,
    results: list[LoadedResult],
    *,
    pairs: list[tuple[str, str]] | None = None,
    alpha: float = 0.05,
    correction: str = "holm",
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Compare every pair of the table's models (or `pairs`) on every task."""
    stats.correct([0.5], correction, alpha)  # refuses an unknown correction or a bad alpha
    if pairs is None:
        pairs = [(a, b) for i, a in enumerate(table.models) for b in table.models[i + 1 :]]
    if not pairs:
        raise HarnessError("compare needs at least two models; give --models a,b")
    cells = included_cells(table, results)
    cache: dict = {}
    rows = [
        compare_cells(a, b, t, table, cells, n_resamples=n_resamples, seed=seed, examples=cache)
        for a, b in pairs
        for t in table.tasks
    ]
    finish_rows(rows, alpha, correction)
    notes = [f"Not a protocol table: {p.message} [{p.rule}]." for p in table.problems]
    return Comparison(rows, alpha, correction, n_resamples, seed, notes)


def included_cells(
    table: Table, results: list[LoadedResult]
) -> dict[tuple[str, str], list[LoadedResult]]:
    """The report results behind each table cell's scores (finished seeds at its LR)."""
    out: dict[tuple[str, str], list[LoadedResult]] = defaultdict(list)
    for r in results:
        key = (r.cell["model"], r.cell["task"])
        stats_ = table.cells.get(key)
        if (stats_ is not None and r.cell["phase"] == "report"
                and r.cell["lr_key"] == stats_.lr_key and r.cell["seed"] in stats_.scores):  # fmt: skip
            out[key].append(r)
    return out


# ----------------------------------------------------------------------------- for summarize


@dataclass
class TaskMarks:
    """Per task: the best model by mean and every model not distinguishable from it."""

    best: str
    tied: list[str]
    notes: list[str]


def best_marks(
    table: Table,
    results: list[LoadedResult],
    *,
    alpha: float = 0.05,
    correction: str = "holm",
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, TaskMarks]:
    """For each task with two or more scored models: the best model by seed mean (in the
    metric's direction) and the models whose comparison with it (`compare_cells`, the same
    verdict as `compare`) is "not distinguishable"; p-values corrected across that task's
    comparisons with the best."""
    cells = included_cells(table, results)
    cache: dict = {}
    marks: dict[str, TaskMarks] = {}
    rows: list[Row] = []
    for task in table.tasks:
        scored = [m for m in table.models
                  if (m, task) in table.cells and table.cells[(m, task)].mean is not None]  # fmt: skip
        if len(scored) < 2:
            continue
        higher = metric_spec(task_knobs(task).metric).higher_is_better
        best = sorted(scored, key=lambda m: table.cells[(m, task)].mean, reverse=higher)[0]
        for other in scored:
            if other != best:
                rows.append(compare_cells(best, other, task, table, cells,
                                          n_resamples=n_resamples, seed=seed, examples=cache,
                                          bootstrap=False))  # fmt: skip
        marks[task] = TaskMarks(best, [], [])
    finish_rows(rows, alpha, correction, family_of=lambda r: r.task)
    for r in rows:
        if r.verdict == stats.NOT_DISTINGUISHABLE:
            marks[r.task].tied.append(r.model_b)
        marks[r.task].notes += [f"{r.model_b}: {n}" for n in r.notes]
    return marks


def bootstrap_intervals(
    table: Table,
    results: list[LoadedResult],
    *,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[tuple[str, str], tuple[float, float]]:
    """Each cell's two-level bootstrap interval of its seed-mean score (seeds and report
    examples resampled, `stats.two_level_bootstrap`); HarnessError naming the cells whose
    predictions files are missing or stale."""
    cells = included_cells(table, results)
    out, missing = {}, []
    for (model, task), stats_ in table.cells.items():
        if stats_.mean is None:
            continue
        ex, why = load_examples(cells.get((model, task), []))
        if ex is None:
            missing.append(f"{model}/{task}: {why}")
            continue
        knobs = task_knobs(task)
        score = task_score(knobs.metric, knobs.euro_languages)

        def one(seed_rows, cols, ex=ex, score=score):
            return score(ex.matrix[seed_rows[0]], ex.labels, ex.languages, cols)

        _, low, high = stats.two_level_bootstrap(one, [len(ex.seeds)], ex.languages,
                                                 n_resamples=n_resamples, seed=seed,
                                                 confidence=confidence)  # fmt: skip
        out[(model, task)] = (low, high)
    if missing:
        raise HarnessError(
            "--ci bootstrap resamples the report examples, but "
            f"{len(missing)} cell(s) lack usable predictions files (re-run those report cells, "
            "or use --ci t): " + "; ".join(missing)
        )
    return out


# ----------------------------------------------------------------------------- rendering


def _num(x: float | None, scale: float = 100.0, digits: int = 2) -> str:
    return "—" if x is None else f"{scale * x:.{digits}f}"


def _p(x: float | None) -> str:
    if x is None:
        return "—"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


CORRECTION_LABELS = {"holm": "Holm", "fdr_bh": "Benjamini-Hochberg"}


def footnotes(cmp: Comparison) -> list[str]:
    name = CORRECTION_LABELS[cmp.correction]
    return [
        "Scores x100. Δ = mean(A) - mean(B) over report seeds, with its Welch 95 % interval "
        "(seed level) and its two-level bootstrap 95 % interval (seeds and examples resampled).",
        f"p seed: Welch's t-test over seeds; p example: paired permutation test swapping whole "
        f"examples on the seed-averaged score ({cmp.n_resamples} resamples, seed {cmp.seed}); "
        "p combined: a t-test whose variance is Welch's seed variance plus the test-set "
        "variance of Δ (sd shown; bootstrap over examples, every seed kept), Satterthwaite "
        f"df; each corrected across each pair's tasks ({name}, alpha {cmp.alpha}).",
        f"Verdict: A or B better only when the corrected combined p-value is <= {cmp.alpha} "
        "(Welch's when predictions are missing): a seed-level test alone ignores the test "
        "sample, an example-level test alone treats each model as fixed and ignores seeds.",
        "ASO: ε_min of A over B / B over A (below 0.5: almost stochastically dominant; shown, "
        "not used for the verdict). McNemar (accuracy): on each model's seed-majority "
        "correctness, shown only.",
        "Seeds needed: report seeds per model for 80 % power of the verdict's test at the "
        "observed Δ, seed stds and test-set sd (— when the test set's noise alone hides Δ); "
        f"MDD@{MDD_SEEDS}: the smallest difference {MDD_SEEDS} seeds detect at 80 % power.",
        *cmp.notes,
    ]


def render_markdown(cmp: Comparison) -> str:
    lines: list[str] = []
    by_pair: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in cmp.rows:
        by_pair[(r.model_a, r.model_b)].append(r)
    for (a, b), rows in by_pair.items():
        lines += [f"### A = {a}, B = {b}", ""]
        lines.append("| Task | A | B | Δ [Welch 95 %] | Δ [bootstrap 95 %] | p seed (adj) | "
                     "p example (adj) | test-set sd | p combined (adj) | McNemar p | "
                     f"ASO A>B / B>A | verdict | seeds needed | MDD@{MDD_SEEDS} |")  # fmt: skip
        lines.append("|---|" + "---:|" * 13)
        for r in rows:
            delta = "—" if r.diff is None else (
                f"{_num(r.diff)} [{_num(r.ci_low)}, {_num(r.ci_high)}]"
            )  # fmt: skip
            boot = "—" if r.boot_low is None else f"[{_num(r.boot_low)}, {_num(r.boot_high)}]"
            aso = "—" if r.aso_a_over_b is None else (
                f"{r.aso_a_over_b:.2f} / {r.aso_b_over_a:.2f}"
            )  # fmt: skip
            lines.append(
                f"| {task_header(r.task)} | {_num(r.mean_a)} (n={r.n_a}) | "
                f"{_num(r.mean_b)} (n={r.n_b}) | {delta} | {boot} | "
                f"{_p(r.p_seed)} ({_p(r.p_seed_adj)}) | {_p(r.p_example)} ({_p(r.p_example_adj)}) "
                f"| {_num(r.example_sd)} | {_p(r.p_combined)} ({_p(r.p_combined_adj)}) "
                f"| {_p(r.p_mcnemar)} | {aso} | **{r.verdict}** | "
                f"{'—' if r.seeds_needed is None else r.seeds_needed} | {_num(r.mdd_5)} |"
            )
        notes = [f"{r.task}: {n}" for r in rows for n in r.notes]
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    return "\n".join([*lines, *footnotes(cmp)]) + "\n"


def to_dict(cmp: Comparison) -> dict:
    return {
        "schema": COMPARE_SCHEMA,
        "version": 1,
        "alpha": cmp.alpha,
        "correction": cmp.correction,
        "n_resamples": cmp.n_resamples,
        "seed": cmp.seed,
        "rows": [asdict(r) for r in cmp.rows],
        "footnotes": footnotes(cmp),
    }


CSV_FIELDS = [f for f in Row.__dataclass_fields__ if f != "notes"] + ["notes"]


def render_csv(cmp: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in cmp.rows:
        d = asdict(r)
        w.writerow(["" if d[k] is None else ("; ".join(d[k]) if k == "notes" else d[k])
                    for k in CSV_FIELDS])  # fmt: skip
    return buf.getvalue()


def render(cmp: Comparison, fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(cmp)
    if fmt == "json":
        return json.dumps(to_dict(cmp), indent=2) + "\n"
    return render_csv(cmp)


# ----------------------------------------------------------------------------- inputs


def load_report_dirs(
    dirs: list[str], selection: str | None, warn, models: list[str] | None = None,
    tasks: list[str] | None = None,
) -> tuple[Table, list[LoadedResult]]:  # fmt: skip
    """One table over the report results of `dirs` (a model may sit in one directory only),
    each directory's pairs taken from its own selection, checked across directories by
    `summarize.build_table`'s rules (recipe, data, software, ...)."""
    if selection is not None and len(dirs) > 1:
        raise HarnessError("--selection names one selection; with several --results-dir each "
                           "directory's experiment file names its own")  # fmt: skip
    results: list[LoadedResult] = []
    merged: dict = {}
    owner: dict[str, str] = {}
    for d in dirs:
        if not Path(d).is_dir():
            raise HarnessError(f"--results-dir {d} is not a directory")
        sel_path, _, _ = summarize_inputs(d, selection)
        sel = load_selection(sel_path)
        here = load_results(d, warn=warn, phase="report")
        present = {r.cell["model"] for r in here}
        for m in sorted(present):
            if m in owner:
                raise HarnessError(f"model {m!r} has report results in both {owner[m]} and {d}; "
                                   "compare reads each model from one directory")  # fmt: skip
            owner[m] = d
        if not merged:
            merged = {**sel, "pairs": {}}
        elif sel.get("on_protocol") is False:
            merged["on_protocol"] = False
        for m, by_task in (sel.get("pairs") or {}).items():
            if m in present or (len(dirs) == 1 and m not in merged["pairs"]):
                merged["pairs"][m] = by_task
        results += here
    if models is None:  # with one directory, its selection's models count even without results
        known = set(owner) | (set(merged["pairs"]) if len(dirs) == 1 else set())
        models = [m for m in merged["pairs"] if m in known] + sorted(known - set(merged["pairs"]))
    table = build_table(results, merged, models=models, tasks=tasks)
    return table, results


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval compare",
        description="Per task and pair of models: the difference with its intervals, seed- and "
        "example-level tests corrected across tasks, the verdict and the seeds needed.",
    )
    p.add_argument("--results-dir", action="append", required=True,
                   help="report-phase result directory (repeatable: one per set of models)")  # fmt: skip
    p.add_argument("--selection", help="selection.json (one --results-dir only; default: the "
                   "one its experiment file names)")  # fmt: skip
    p.add_argument("--models", help="comma-separated models (default: every model found)")
    p.add_argument("--reference", help="compare every other model with this one only")
    p.add_argument("--tasks", help="comma-separated tasks (default: the table's)")
    p.add_argument("--correction", choices=stats.CORRECTIONS, default="holm",
                   help="multiple-comparison correction across tasks (default: holm)")  # fmt: skip
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                   help="permutations and bootstrap replicates per test")  # fmt: skip
    p.add_argument("--seed", type=seed_arg, default=DEFAULT_SEED, help="seed of the resampling")
    p.add_argument("--allow-partial", action="store_true",
                   help="compare despite the table's problems (listed as notes)")  # fmt: skip
    p.add_argument("--format", choices=("markdown", "json", "csv"), default="markdown")
    p.add_argument("--out", help="write here instead of stdout")
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    from .sweep import split_csv

    args = build_parser().parse_args(argv)
    warn = warn_once()

    if args.out and not Path(args.out).absolute().parent.is_dir():
        raise HarnessError(f"--out {args.out}: its directory does not exist")
    table, results = load_report_dirs(args.results_dir, args.selection, warn,
                                      split_csv(args.models) or None,
                                      split_csv(args.tasks) or None)  # fmt: skip
    if table.problems and not args.allow_partial:
        print(format_refusal(table).replace("summarize refuses to print this table",
                                            "compare refuses this table"), file=sys.stderr)  # fmt: skip
        return EXIT_INCOMPLETE
    if len(table.models) < 2:
        raise HarnessError(f"compare needs at least two models; found {table.models}")
    pairs = None
    if args.reference:
        if args.reference not in table.models:
            raise HarnessError(f"--reference {args.reference!r} is not one of the models "
                               f"compared: {', '.join(table.models)}")  # fmt: skip
        pairs = [(args.reference, m) for m in table.models if m != args.reference]
    n = len(pairs) if pairs is not None else len(table.models) * (len(table.models) - 1) // 2
    print(f"compare: {n} pair(s) x {len(table.tasks)} task(s), {args.resamples} resamples, "
          f"seed {args.seed}", file=sys.stderr)  # fmt: skip
    cmp = compare_table(table, results, pairs=pairs, alpha=args.alpha,
                        correction=args.correction, n_resamples=args.resamples, seed=args.seed)  # fmt: skip
    text = render(cmp, args.format)
    write_output(text, args.out)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
