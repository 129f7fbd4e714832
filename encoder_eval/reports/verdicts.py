"""Is model A really better than model B? Per-task verdicts with confidence intervals,
significance corrected over a family, and the seeds needed to tell a difference.

`compare_table` gives a `Comparison` (one `Row` per task and pair); `best_marks` gives the
table's bold/≈ marks; `bootstrap_intervals` the two-level bootstrap intervals. The
statistics are EVALUATION_METHODOLOGY.md section 10; the command is `encoder_eval.compare`.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from encoder_eval.cells.predictions import PredictionsError, check_against_result, load_predictions
from encoder_eval.cells.predictions import predictions_path as predictions_file
from encoder_eval.core import power_analysis, stats
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.metrics import metric_spec, resample_scorer, sign, swap_scorer
from encoder_eval.core.results import LoadedResult
from encoder_eval.data.tasks import task_knobs
from encoder_eval.reports.comparison_cache import ComparisonCache, RowFlags
from encoder_eval.reports.stats_settings import (
    DEFAULT_ALPHA,
    DEFAULT_CORRECTION,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    DEFAULTS,
    FAMILIES,
    MARK_FAMILIES,
    StatsSettings,
)
from encoder_eval.reports.table import CI_METHODS, Table

COMPARE_SCHEMA = "encoder-eval-compare"
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
    ids: np.ndarray  # each example's id within its language (`languages`)


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
    std_a: float | None = None  # seed stds (ddof 1)
    std_b: float | None = None
    example_sd: float | None = None  # test-set sd of Δ (bootstrap over examples, what seeds share)
    p_combined: float | None = None  # seed + test-set variance: the verdict's test
    p_combined_adj: float | None = None
    comb_low: float | None = None  # the combined test's interval of the difference
    comb_high: float | None = None
    boot_low: float | None = None  # two-level bootstrap interval of the difference
    boot_high: float | None = None
    verdict_test: str | None = None  # "combined" or "welch" (no predictions)
    p_verdict: float | None = None  # that test's p-value
    p_verdict_adj: float | None = None  # corrected in the row's family, every test in one
    family_size: int | None = None  # tests in the family the verdict is corrected over
    power_alpha: float | None = None  # the level seeds needed and MDD are sized at
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
    family: str = "pair"


# Which diagnostics beside the verdict a row holds: all of them (`compare` of one pair),
# or the bootstrap interval only (the report's tables, `compare` of several pairs unless
# --all-tests): the paired permutation test and ASO cost most of a row and the verdict
# reads neither, so at 14 models (1,547 rows) they would take CPU-hours.
FULL_FLAGS = RowFlags(bootstrap=True, example_test=True, aso=True)
VERDICT_FLAGS = RowFlags(bootstrap=True, example_test=False, aso=False)


# ----------------------------------------------------------------------------- examples


def seed_mean(per_seed: np.ndarray, seed_rows: np.ndarray | None = None) -> np.ndarray:
    """Per resample (row of `per_seed`, every seed's task score), the seed-averaged task
    score over the seeds `seed_rows` (a (resamples, k) index matrix; None: all seeds, in
    order); NaN when a chosen seed's score is undefined."""
    chosen = per_seed if seed_rows is None else np.take_along_axis(per_seed, seed_rows, axis=1)
    return chosen.mean(axis=1)


def model_scorer(ex: Examples, metric: str, euro: tuple[str, ...]):
    """`metrics.resample_scorer` of one model's predictions: (resamples, examples) example
    indices -> (resamples, seeds) task scores."""
    return resample_scorer(metric, ex.matrix, ex.labels, ex.languages, euro)


def load_examples(cells: list[LoadedResult]) -> tuple[Examples | None, str | None]:
    """The predictions of one (model, task)'s report cells as an `Examples`, or None and why
    not (a missing, invalid or stale predictions file, or cells that disagree)."""
    if cells and metric_spec(cells[0].result.metric).granularity == "grouped":
        return None, (
            f"{cells[0].result.metric} is a per-query metric, and the example-level "
            "tests resample single examples, not queries"
        )
    rows, reference = [], None
    for c in sorted(cells, key=lambda c: c.cell["seed"]):
        path = predictions_file(c.path)
        # The reason is printed in every format (notes, LaTeX, a paper): it names the file
        # within its results folder (flat: the file name), never a full, often temporary, path.
        shown = path.name
        try:
            preds = load_predictions(path)
        except PredictionsError as exc:
            return None, str(exc).replace(str(path), shown)
        problems = check_against_result(preds, c.result)
        if problems:
            return None, f"{shown}: out of step with its result ({'; '.join(problems)})"
        parts = list(preds.languages.items())
        seen = (
            np.repeat(np.asarray([lang for lang, _ in parts]), [len(p) for _, p in parts]),
            np.concatenate([np.asarray(p.ids) for _, p in parts]),
            np.concatenate([np.asarray(p.labels, dtype=float) for _, p in parts]),
        )
        if reference is None:
            reference = (*seen, preds.data_identity)
        elif preds.data_identity != reference[3] or not all(
            np.array_equal(x, y) for x, y in zip(seen, reference, strict=False)
        ):
            return None, f"{shown}: other examples than seed {cells[0].cell['seed']}'s"
        rows.append(np.concatenate([np.asarray(p.predictions, dtype=float) for _, p in parts]))
    if reference is None:
        return None, "no report cells"
    languages, ids, labels, identity = reference
    return Examples(
        seeds=sorted(c.cell["seed"] for c in cells),
        matrix=np.vstack(rows),
        labels=labels,
        languages=languages,
        data_identity=identity,
        ids=ids,
    ), None


def _paired(a: Examples, b: Examples) -> str | None:
    """Why A's and B's predictions cannot be paired example by example (None: they can)."""
    if a.data_identity != b.data_identity:
        return f"the models read different data ({a.data_identity} vs {b.data_identity})"
    if not (
        np.array_equal(a.languages, b.languages)
        and np.array_equal(a.ids, b.ids)
        and np.array_equal(a.labels, b.labels)
    ):
        return "the models' predictions files hold different examples"
    return None


def _majority_correct(ex: Examples) -> np.ndarray:
    """Per example: correct in more than half of the model's seeds."""
    return (ex.matrix == ex.labels).mean(axis=0) > 0.5


# ----------------------------------------------------------------------------- one row


def _row_head(model_a: str, model_b: str, task: str, table: Table) -> Row:
    """A row's fields read straight off the table (models, task, metric, seed counts,
    means): what `compare_cells` starts from, and what a cached row must agree with."""
    sa, sb = table.cells.get((model_a, task)), table.cells.get((model_b, task))
    return Row(
        model_a,
        model_b,
        task,
        task_knobs(task).metric,
        0 if sa is None else len(sa.scores),
        0 if sb is None else len(sb.scores),
        sa.mean if sa else None,
        sb.mean if sb else None,
    )


HEAD_FIELDS = ("model_a", "model_b", "task", "metric", "n_a", "n_b", "mean_a", "mean_b")


def _agrees_with_table(row: Row, table: Table) -> bool:
    """Whether a cached row's cheap fields are the table's (a check beside the cache's
    HMAC: a row that disagrees is recomputed)."""
    head = _row_head(row.model_a, row.model_b, row.task, table)

    def same(x: object, y: object) -> bool:  # NaN is NaN here
        return x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)

    return all(same(getattr(row, f), getattr(head, f)) for f in HEAD_FIELDS)


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
    example_test: bool = True,
    aso: bool = True,
) -> Row:
    """Every statistic of A against B on `task` but the correction, the verdict and the
    seeds needed (those need the row's family: `finish_rows`). `cells` are the table's
    included report results per (model, task); `examples` caches, across rows,
    `load_examples` and each model's bootstrap replicates of its seed scores (the draws
    are the same for every pair); `bootstrap`, `example_test` and `aso` skip the
    diagnostics the verdict does not use (the marks read none of them)."""
    knobs = task_knobs(task)
    sa, sb = table.cells.get((model_a, task)), table.cells.get((model_b, task))
    a_scores = [] if sa is None else [sa.scores[s] for s in sorted(sa.scores)]
    b_scores = [] if sb is None else [sb.scores[s] for s in sorted(sb.scores)]
    row = _row_head(model_a, model_b, task, table)
    if len(a_scores) < 2 or len(b_scores) < 2:
        row.notes.append(
            f"too few finished seeds for a seed-level test ({len(a_scores)} and "
            f"{len(b_scores)}; at least 2 each)"
        )
        return row
    direction = sign(knobs.metric)  # stats read "higher is better"
    seed = stats.task_seed(seed, task)  # each task its own stream; its pairs share it
    welch = stats.welch(a_scores, b_scores)
    row.diff, row.p_seed = welch.diff, None if math.isnan(welch.pvalue) else welch.pvalue
    row.ci_low, row.ci_high = welch.low, welch.high
    if row.p_seed is None:
        row.notes.append("no seed varies in either model: the seed-level test is undefined")
    if aso:
        row.aso_a_over_b = stats.aso(
            [direction * x for x in a_scores], [direction * x for x in b_scores], seed=seed
        ).eps_min
        row.aso_b_over_a = stats.aso(
            [direction * x for x in b_scores], [direction * x for x in a_scores], seed=seed
        ).eps_min
    std_a, std_b = float(np.std(a_scores, ddof=1)), float(np.std(b_scores, ddof=1))
    row.std_a, row.std_b = std_a, std_b
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
        return row
    ea, eb = loaded
    k = min(len(ea.seeds), len(eb.seeds))
    if k < len(ea.seeds) or k < len(eb.seeds):
        row.notes.append(f"the example-level test pairs the first {k} seeds of each model")
    labels, langs, euro = ea.labels, ea.languages, knobs.euro_languages
    if example_test:
        swap = swap_scorer(knobs.metric, ea.matrix[:k], eb.matrix[:k], labels, langs, euro)

        def diff_stat(swapped: np.ndarray) -> np.ndarray:
            """A's minus B's seed-averaged score with the `swapped` examples exchanged."""
            swapped_a, swapped_b = swap(swapped)
            return direction * (seed_mean(swapped_a) - seed_mean(swapped_b))

        test = stats.paired_swap_permutation(
            ea.matrix[:k],
            eb.matrix[:k],
            diff_stat,
            n_resamples=n_resamples,
            seed=seed,
            on_swaps=True,
        )
        row.example_test = test.test
        row.p_example = None if math.isnan(test.pvalue) else test.pvalue
        if row.p_example is None:
            row.notes.append("the example-level test is undefined (the task score is)")
    replicates = [
        _replicates(model, task, ex, cells, examples, max(2, n_resamples), seed)
        for model, ex in ((model_a, ea), (model_b, eb))
    ]
    vex = stats.shared_example_part(np.hstack(replicates), len(ea.seeds))
    if math.isnan(vex):
        row.notes.append(
            "the test-set variance is undefined (a resample's score is); "
            "verdict on the seed level only"
        )
    else:
        row.example_sd = math.sqrt(vex)
        comb = stats.combined_test(a_scores, b_scores, vex)
        row.p_combined = None if math.isnan(comb.pvalue) else comb.pvalue
        row.comb_low, row.comb_high = comb.low, comb.high
    if knobs.metric == "accuracy":
        row.p_mcnemar = stats.mcnemar(_majority_correct(ea), _majority_correct(eb)).pvalue

    if not bootstrap:
        return row

    slots, scores = _bootstrap_scores(
        task, (model_a, model_b), (ea, eb), cells, examples, n_resamples, seed
    )
    low, high = stats.percentile_interval(
        seed_mean(scores[model_a], slots[0]) - seed_mean(scores[model_b], slots[1])
    )
    if math.isnan(low):
        row.notes.append("the bootstrap interval is undefined (a resample's score is)")
    else:
        row.boot_low, row.boot_high = low, high
    return row


def _replicates(
    model: str,
    task: str,
    ex: Examples,
    cells: dict[tuple[str, str], list[LoadedResult]],
    examples: dict,
    n_resamples: int,
    seed: int,
) -> np.ndarray:
    """`model`'s (resamples, seeds) bootstrap replicates of its seed scores on `task`
    (`stats.example_replicates`), from the `examples` cache. The draws depend only on the
    examples' languages, the count and the seed, so on a miss every model of the task whose
    predictions pair with `ex` is scored on the same draws at once and cached: the marks
    compare each model with up to 13 others, and draw once per task, not once per pair."""
    key = ("replicates", model, task, n_resamples, seed)
    if key in examples:
        return examples[key]
    chosen = [
        (m, peer)
        for m, peer in _peers(model, task, ex, cells, examples)
        if ("replicates", m, task, n_resamples, seed) not in examples
    ]
    both = stats.example_replicates(
        _stacked_scorer(task, chosen, ex),
        ex.languages,
        n_resamples=n_resamples,
        seed=seed,
        vectorized=True,
    )
    for m, columns in _columns_of(both, chosen).items():
        examples[("replicates", m, task, n_resamples, seed)] = columns
    return examples[key]


def _stacked_scorer(task: str, chosen: list[tuple[str, Examples]], ex: Examples):
    """One `resample_scorer` over every chosen model's seeds stacked (they pair with `ex`):
    one set of draw counts for them all."""
    knobs = task_knobs(task)
    matrix = np.vstack([peer.matrix for _, peer in chosen])
    return resample_scorer(knobs.metric, matrix, ex.labels, ex.languages, knobs.euro_languages)


def _columns_of(scored: np.ndarray, chosen: list[tuple[str, Examples]]) -> dict[str, np.ndarray]:
    """Each chosen model's columns (its seeds) of a stacked scorer's output."""
    out, at = {}, 0
    for m, peer in chosen:
        out[m] = scored[:, at : at + len(peer.seeds)]
        at += len(peer.seeds)
    return out


def _peers(
    model: str, task: str, ex: Examples, cells: dict, examples: dict
) -> list[tuple[str, Examples]]:
    """`model` and every other model of `task` whose predictions pair with `ex`, loading
    them into the `examples` cache: the statistics whose draws every pair of a task
    shares score them all at once."""
    known = list(cells) + [k for k in examples if len(k) == 2]  # models loaded or loadable
    out = []
    for m in dict.fromkeys([model] + [m for (m, t) in known if t == task]):
        if (m, task) not in examples:
            examples[(m, task)] = load_examples(cells.get((m, task), []))
        peer = ex if m == model else examples[(m, task)][0]
        if peer is not None and _paired(ex, peer) is None:
            out.append((m, peer))
    return out


def _bootstrap_scores(
    task: str,
    models: tuple[str, str],
    loaded: tuple[Examples, Examples],
    cells: dict,
    examples: dict,
    n_resamples: int,
    seed: int,
) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The two-level bootstrap's seed draws (one (resamples, k) matrix per side) and each
    model's (resamples, seeds) scores on its example draws (`stats.two_level_draws`),
    from the `examples` cache. The draws depend on the sides' seed counts, the examples and
    the seed alone, so on a miss every model of the task whose predictions pair with A's
    is scored on them at once: `report` compares every pair, and each task is drawn once."""
    ea, eb = loaded
    pattern = (len(ea.seeds), len(eb.seeds))
    key = ("bootstrap", None, task, ea.data_identity, pattern, n_resamples, seed)
    slots, scores = examples.get(key, (None, {}))
    if all(m in scores for m in models):
        return slots, scores
    chosen = [(m, p) for m, p in _peers(models[0], task, ea, cells, examples) if m not in scores]
    if models[1] not in dict(chosen) and models[1] not in scores:
        chosen.append((models[1], eb))
    scorer = _stacked_scorer(task, chosen, ea)
    slots, scored = stats.two_level_draws(scorer, pattern, ea.languages, n_resamples, seed)
    scores.update(_columns_of(scored, chosen))
    examples[key] = (slots, scores)
    return slots, scores


def _power(row: Row, level: float) -> None:
    """Seeds needed and MDD@5 under the verdict's test (Welch's when there is no test-set
    variance) at `level`, the alpha the family's correction applies to its first test."""
    vex = 0.0 if row.example_sd is None or row.p_combined is None else row.example_sd**2
    row.power_alpha = level
    mdd = power_analysis.min_detectable_difference(
        row.std_a, row.std_b, n=MDD_SEEDS, alpha=level, power=POWER, example_var=vex
    )
    needed = power_analysis.seeds_needed(
        row.diff, row.std_a, row.std_b, alpha=level, power=POWER, example_var=vex, scale=100
    )  # its reason's scores x100, as every table shows them
    if isinstance(mdd, stats.Undefined):
        row.notes.append(f"MDD@{MDD_SEEDS}: {mdd.reason}")
    else:
        row.mdd_5 = mdd
    if isinstance(needed, stats.Undefined):
        row.notes.append(f"seeds needed: {needed.reason}")
    else:
        row.seeds_needed = needed


def family_key(family: str) -> Callable[[Row], object]:
    """Which rows are corrected together: "pair", each pair's tasks; "table", every row."""
    if family not in FAMILIES:
        raise HarnessError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    if family == "table":
        return lambda r: "table"
    return lambda r: (r.model_a, r.model_b)


def finish_rows(
    rows: list[Row],
    alpha: float,
    correction: str,
    family_of: Callable[[Row], object] | None = None,
    power: bool = True,
) -> None:
    """Correct the p-values of each family (by default a pair's tasks) and set every row's
    verdict and seeds needed. The verdict's p-value (the combined test's, or Welch's for a
    row without predictions) is corrected in one family whichever test each row used; the
    seed-level and example-level p-values are corrected separately, as diagnostics.
    `power` False skips seeds needed (a simulation that wants the verdicts alone)."""
    by_family: dict[object, list[Row]] = defaultdict(list)
    for r in rows:
        if r.diff is not None:
            r.verdict_test = "welch" if r.p_combined is None else "combined"
            r.p_verdict = r.p_seed if r.p_combined is None else r.p_combined
        by_family[(r.model_a, r.model_b) if family_of is None else family_of(r)].append(r)
    for family in by_family.values():
        for raw, adj in (
            ("p_seed", "p_seed_adj"),
            ("p_example", "p_example_adj"),
            ("p_verdict", "p_verdict_adj"),
        ):
            tested = [r for r in family if getattr(r, raw) is not None]
            if tested:
                fixed = stats.correct([getattr(r, raw) for r in tested], correction, alpha)
                for r, p in zip(tested, fixed.pvalues, strict=True):
                    setattr(r, adj, p)
        size = sum(r.p_verdict is not None for r in family)
        for r in family:
            if r.p_combined is not None:
                r.p_combined_adj = r.p_verdict_adj
            if r.diff is None:  # too few seeds on a side: no test ran
                r.verdict = NOT_TESTED
                continue
            r.family_size = size
            if power and (r.p_seed is not None or r.p_combined is not None):
                _power(r, power_analysis.family_alpha(alpha, max(1, size)))
            if r.p_seed_adj is None:  # no seed varies: the seed variance is unknown
                r.verdict = stats.NOT_DISTINGUISHABLE
                continue
            r.verdict = stats.verdict(
                r.p_verdict_adj, r.diff, alpha, higher_is_better=sign(r.metric) > 0
            )
            if r.p_combined is None:
                r.notes.append("verdict on the seed level only (no test-set variance)")


def compare_table(
    table: Table,
    results: list[LoadedResult],
    settings: StatsSettings = DEFAULTS,
    cache: ComparisonCache | None = None,
    *,
    pairs: list[tuple[str, str]] | None = None,
    flags: RowFlags | None = None,
) -> Comparison:
    """Compare every pair of the table's models (or `pairs`) on every task; each verdict is
    corrected within its `settings.family` (FAMILIES; by default every row shown) by
    `settings.correction` at `settings.alpha`. The rows are computed over `settings.jobs`
    processes and read from / kept in `cache` (`compute_rows`); `flags` says which
    diagnostics beside the verdict they hold (default: all)."""
    alpha, correction = settings.alpha, settings.correction
    stats.correct([0.5], correction, alpha)  # refuses an unknown correction or a bad alpha
    key = family_key(settings.family)
    if pairs is None:
        pairs = [(a, b) for i, a in enumerate(table.models) for b in table.models[i + 1 :]]
    if not pairs:
        raise HarnessError("compare needs at least two models; give --models a,b")
    cells = included_cells(table, results)
    requests = [(a, b, t) for a, b in pairs for t in table.tasks]
    rows = compute_rows(requests, table, cells, settings, flags=flags or FULL_FLAGS, cache=cache)
    finish_rows(rows, alpha, correction, family_of=key)
    notes = [f"Not a protocol table: {p.message} [{p.rule}]." for p in table.problems]
    return Comparison(
        rows, alpha, correction, settings.n_resamples, settings.seed, notes, settings.family
    )


# What each flag of `RowFlags` adds to a row: left None when the flag is off.
FLAG_FIELDS = {
    "bootstrap": ("boot_low", "boot_high"),
    "example_test": ("example_test", "p_example"),
    "aso": ("aso_a_over_b", "aso_b_over_a"),
}
_ROW_FIELDS = {f.name for f in fields(Row)}


def _row_from(data: dict, flags: RowFlags) -> Row | None:
    """A cached row as a `Row` with only what `flags` asks for; None when it is not one."""
    if set(data) != _ROW_FIELDS or not isinstance(data.get("notes"), list):
        return None
    if not all(isinstance(n, str) for n in data["notes"]):
        return None
    for name, value in data.items():
        if name != "notes" and not (value is None or isinstance(value, (str, int, float))):
            return None
    return _only(Row(**data), flags)


def _only(row: Row, flags: RowFlags) -> Row:
    """`row` without what `flags` does not ask for (a row computed with more serves less)."""
    for flag, names in FLAG_FIELDS.items():
        if not getattr(flags, flag):
            for name in names:
                setattr(row, name, None)
    return row


def compute_rows(
    requests: list[tuple[str, str, str]],
    table: Table,
    cells: dict[tuple[str, str], list[LoadedResult]],
    settings: StatsSettings,
    *,
    flags: RowFlags,
    cache: ComparisonCache | None = None,
) -> list[Row]:
    """`compare_cells` of each (A, B, task) in `requests`, in order: the rows `cache` holds
    are read, the others computed over `settings.jobs` processes (each row's resampling is
    seeded by `settings.seed` and its task alone, `stats.task_seed`, so the rows are the
    same whatever the jobs) and kept in `cache`. The commands keep large blocks in the heap
    for the resampling (`core/heap.py`, `table_loading.open_table_command`)."""
    n_resamples, seed = settings.n_resamples, settings.seed
    out: list[Row | None] = [None] * len(requests)
    keys: dict[int, str | None] = {}
    for i, (a, b, task) in enumerate(requests):
        key = None
        if cache is not None:
            knobs = task_knobs(task)
            scoring = {"metric": knobs.metric, "euro": list(knobs.euro_languages)}
            key = cache.key(a, b, task, scoring, table.cells, cells, settings)
        hit = None if key is None else cache.get(key, flags)
        row = None if hit is None else _row_from(hit, flags)
        if row is not None and (row.model_a, row.model_b, row.task) == (a, b, task):
            if _agrees_with_table(row, table):
                cache.reused += 1
                out[i] = row
                continue
        if hit is not None and key is not None:
            cache.reject(key)  # not a row, or not this table's: recomputed, written over
        keys[i] = key
    misses = list(keys)
    fresh = _compute(
        [requests[i] for i in misses], table, cells, n_resamples, seed, flags, settings.jobs
    )
    for i, row in zip(misses, fresh, strict=True):
        out[i] = _only(row, flags)
        if cache is not None:
            cache.computed += 1
            if keys[i] is not None:
                cache.put(keys[i], flags, asdict(row))
    return out  # type: ignore[return-value]


# Per worker process of `_compute`: (table, cells, n_resamples, seed, flags).
_WORKER: tuple = ()


def _init_worker(*state: object) -> None:
    global _WORKER
    _WORKER = state


def _compare_chunk(chunk: list[tuple[str, str, str]]) -> list[Row]:
    table, cells, n_resamples, seed, flags = _WORKER
    return _compare_serial(chunk, table, cells, n_resamples, seed, flags)


def _compare_serial(
    requests: list[tuple[str, str, str]],
    table: Table,
    cells: dict,
    n_resamples: int,
    seed: int,
    flags: RowFlags,
) -> list[Row]:
    examples: dict = {}  # each (model, task)'s predictions loaded once
    first = {task: i for i, (_, _, task) in reversed(list(enumerate(requests)))}
    order = sorted(range(len(requests)), key=lambda i: (first[requests[i][2]], i))
    last = {requests[i][2]: i for i in order}
    rows: list[Row | None] = [None] * len(requests)
    for i in order:  # task by task, so that a task's predictions are dropped once it is done
        a, b, task = requests[i]
        rows[i] = compare_cells(
            a,
            b,
            task,
            table,
            cells,
            n_resamples=n_resamples,
            seed=seed,
            examples=examples,
            bootstrap=flags.bootstrap,
            example_test=flags.example_test,
            aso=flags.aso,
        )
        if last[task] == i:
            # keys: (model, task) and (kind, model or None, task, ...)
            for key in [k for k in examples if k[1 if len(k) == 2 else 2] == task]:
                del examples[key]
    return rows  # type: ignore[return-value]


def _compute(
    requests: list[tuple[str, str, str]],
    table: Table,
    cells: dict,
    n_resamples: int,
    seed: int,
    flags: RowFlags,
    jobs: int,
) -> list[Row]:
    """The rows of `requests`, over `jobs` processes (fork on Linux; the state travels as
    the pool's initializer arguments, so a spawn start works too). Chunks keep a task's
    pairs together so each worker loads a (model, task)'s predictions once."""
    if jobs <= 1 or len(requests) <= 1:
        return _compare_serial(requests, table, cells, n_resamples, seed, flags)
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, (_, _, task) in enumerate(requests):
        by_task[task].append(i)
    pieces = max(1, -(-jobs // len(by_task)))  # split a task when tasks are fewer than jobs
    chunks = [idx[j::pieces] for idx in by_task.values() for j in range(pieces)]
    chunks = [c for c in chunks if c]
    context = multiprocessing.get_context("fork") if sys.platform == "linux" else None
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(chunks)),
        mp_context=context,
        initializer=_init_worker,
        initargs=(table, cells, n_resamples, seed, flags),
    ) as pool:
        parts = pool.map(_compare_chunk, [[requests[i] for i in c] for c in chunks])
        out: list[Row | None] = [None] * len(requests)
        for chunk, rows in zip(chunks, parts, strict=True):
            for i, row in zip(chunk, rows, strict=True):
                out[i] = row
    return out  # type: ignore[return-value]


def included_cells(
    table: Table, results: list[LoadedResult]
) -> dict[tuple[str, str], list[LoadedResult]]:
    """The report results behind each table cell's scores (finished seeds at its LR)."""
    out: dict[tuple[str, str], list[LoadedResult]] = defaultdict(list)
    for r in results:
        key = (r.cell["model"], r.cell["task"])
        stats_ = table.cells.get(key)
        if (
            stats_ is not None
            and r.cell["phase"] == "report"
            and r.cell["lr_key"] == stats_.lr_key
            and r.cell["seed"] in stats_.scores
        ):
            out[key].append(r)
    return out


# ----------------------------------------------------------------------------- for summarize


@dataclass
class TaskMarks:
    """Per task: the best model by mean and every model not distinguishable from it."""

    best: str
    tied: list[str]
    notes: list[str]


def mark_pairs(ordered: list[str], family: str) -> list[tuple[str, str]]:
    """The comparisons behind one task's marks, models `ordered` best first: the best against
    each other model, and with `family` "table" every other pair too (the best is picked by
    its mean, so a correction over its k - 1 comparisons alone does not hold its level)."""
    best, rest = ordered[0], ordered[1:]
    pairs = [(best, o) for o in rest]
    if family == "table":
        pairs += [(a, b) for i, a in enumerate(rest) for b in rest[i + 1 :]]
    return pairs


def mark_family_key(family: str) -> Callable[[Row], object]:
    """The marks' correction family: "table", every comparison of every task at once;
    "task", each task's comparisons with its best."""
    if family not in MARK_FAMILIES:
        raise HarnessError(f"unknown marks family {family!r}; valid: {', '.join(MARK_FAMILIES)}")
    return (lambda r: "table") if family == "table" else (lambda r: r.task)


def best_marks(
    table: Table,
    results: list[LoadedResult],
    settings: StatsSettings = DEFAULTS,
    cache: ComparisonCache | None = None,
) -> dict[str, TaskMarks]:
    """For each task with two or more scored models: the best model by seed mean (in the
    metric's direction) and the models whose comparison with it (`compare_cells`, the same
    verdict as `compare`) is "not distinguishable". With `family` "table" (the default)
    every pair of scored models on every task is tested and corrected as one family, so the
    chance that any mark of the table is a false difference stays at most alpha although
    the best is picked by its mean; with "task", the seed's rule, only the best against each
    other model, corrected across that task's comparisons (it does not control the choice of
    the best: among equal models some loses its ≈ more often than alpha). `family` is
    `settings.marks_family`; alpha and the correction are `DEFAULT_ALPHA` and
    `DEFAULT_CORRECTION` whatever `settings.alpha` and `settings.correction` (the verdicts'
    level, `compare`'s and `report`'s --alpha and --correction). The rows are computed over
    `settings.jobs` processes and read from / kept in `cache` (`compute_rows`)."""
    family = settings.marks_family
    key = mark_family_key(family)
    cells = included_cells(table, results)
    marks: dict[str, TaskMarks] = {}
    requests: list[tuple[str, str, str]] = []
    for task in table.tasks:
        scored = [
            m
            for m in table.models
            if (m, task) in table.cells and table.cells[(m, task)].mean is not None
        ]
        if len(scored) < 2:
            continue
        direction = sign(task_knobs(task).metric)
        ordered = sorted(scored, key=lambda m: -direction * table.cells[(m, task)].mean)
        requests += [(a, b, task) for a, b in mark_pairs(ordered, family)]
        marks[task] = TaskMarks(ordered[0], [], [])
    rows = compute_rows(
        requests,
        table,
        cells,
        settings,
        flags=RowFlags(bootstrap=False, example_test=False, aso=False),  # never read by marks
        cache=cache,
    )
    finish_rows(rows, DEFAULT_ALPHA, DEFAULT_CORRECTION, family_of=key)
    for r in rows:
        if r.model_a != marks[r.task].best:
            continue
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
        scorer = model_scorer(ex, knobs.metric, knobs.euro_languages)

        def one(seed_rows, cols, scorer=scorer):
            return seed_mean(scorer(cols), seed_rows[0])

        _, low, high = stats.two_level_bootstrap(
            one,
            [len(ex.seeds)],
            ex.languages,
            n_resamples=n_resamples,
            seed=stats.task_seed(seed, task),
            confidence=confidence,
            vectorized=True,
        )
        if not math.isnan(low):  # undefined (a resample's score is): no interval shown
            out[(model, task)] = (low, high)
    if missing:
        raise HarnessError(
            "--ci bootstrap resamples the report examples, but "
            f"{len(missing)} cell(s) lack usable predictions files (re-run those report cells, "
            "or use --ci t): " + "; ".join(missing)
        )
    return out


# ----------------------------------------------------------------------------- inputs


def add_statistics(
    table: Table,
    results: list[LoadedResult],
    settings: StatsSettings = DEFAULTS,
    cache: ComparisonCache | None = None,
) -> None:
    """Set the table's interval method (`settings.ci`; bootstrap intervals computed here)
    and, with `settings.marks`, each task's best model and those not distinguishable from
    it (`best_marks`, corrected over `settings.marks_family`, over `settings.jobs`
    processes, rows read from and kept in `cache`)."""
    ci = settings.ci
    if ci not in CI_METHODS:
        raise HarnessError(f"--ci {ci!r} must be one of {', '.join(CI_METHODS)}")
    table.ci_method = ci
    if ci == "bootstrap":
        table.bootstrap = bootstrap_intervals(
            table, results, n_resamples=settings.n_resamples, seed=settings.seed
        )
    if settings.marks:
        table.marks = best_marks(table, results, settings, cache)
        table.marks_family = settings.marks_family
