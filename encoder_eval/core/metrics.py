"""Each task's one primary metric, computed with scikit-learn and scipy.

A metric that is undefined on its input is reported as undefined (None, with the reason
from `undefined_reason`), never as a plain 0.0 that a table would average as a score:
- MCC with constant predictions or constant labels;
- Spearman with fewer than two examples, or constant predictions or targets;
- binary F1 when neither the labels nor the predictions hold a positive example.
F1 / macro-F1 count a class that is never predicted as F1 0 (that value is defined).
The ranking metrics (MRR@10, NDCG@10) are "grouped": they take, beside the scores and the
relevance labels, each example's query and first-stage rank (`RankGroups`); they are
undefined only when a score is not finite.
Each metric is described once, by its `MetricSpec` in `METRIC_SPECS`: its function, its
direction (every metric here is "higher is better"; `improves` is the one comparison that
reads it), whether it scores examples one by one or needs per-group data (ranking), and
the short label tables print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from encoder_eval.core.errors import unknown_name

# scikit-learn and scipy (a second or more to import) are imported in the functions that
# compute with them: `run` and the task files read METRIC_SPECS' names to refuse a bad
# name before any heavy import (issue 29, item 20).


def accuracy(preds: Sequence, labels: Sequence) -> float:
    from sklearn.metrics import accuracy_score  # heavy: on use only (see above)

    return float(accuracy_score(labels, preds))


def f1(preds: Sequence, labels: Sequence) -> float:
    """Binary F1 of the positive class (label 1), as GLUE reports it for MRPC and QQP."""
    from sklearn.metrics import f1_score  # heavy: on use only (see above)

    return float(f1_score(labels, preds, average="binary", pos_label=1, zero_division=0))


def macro_f1(preds: Sequence, labels: Sequence) -> float:
    """Unweighted mean of per-class F1 over the classes seen in labels or predictions."""
    from sklearn.metrics import f1_score  # heavy: on use only (see above)

    return float(f1_score(labels, preds, average="macro", zero_division=0))


def mcc(preds: Sequence, labels: Sequence) -> float:
    """Matthews correlation (call `compute_metric` for the undefined cases)."""
    from sklearn.metrics import matthews_corrcoef  # heavy: on use only (see above)

    return float(matthews_corrcoef(np.asarray(labels), np.asarray(preds)))


def spearman(preds: Sequence, labels: Sequence) -> float:
    """Spearman rank correlation (call `compute_metric` for the undefined cases)."""
    from scipy.stats import spearmanr  # heavy: on use only (see above)

    preds, labels = np.asarray(preds, dtype=float), np.asarray(labels, dtype=float)
    return float(spearmanr(preds, labels).statistic)


def _constant(values: Sequence) -> bool:
    return np.unique(np.asarray(values)).size < 2


def undefined_reason(name: str, preds: Sequence, labels: Sequence) -> str | None:
    """Why metric `name` is undefined on this input, or None when it is defined."""
    if name in ("mcc", "spearman"):
        if len(labels) < 2:
            return "fewer than two examples"
        if _constant(labels):
            return "constant labels"
        if _constant(preds):
            return "constant predictions"
    if name == "f1" and not (np.any(np.asarray(labels) == 1) or np.any(np.asarray(preds) == 1)):
        return "no positive example in labels or predictions"
    spec = METRIC_SPECS.get(name)
    if (
        spec is not None
        and spec.granularity == "grouped"
        and not np.all(np.isfinite(np.asarray(preds, dtype=float)))
    ):
        return "a candidate's score is not finite"
    return None


@dataclass(frozen=True)
class RankGroups:
    """Per example of a ranking split: the query it is a candidate of, and its rank in the
    first-stage (BM25) list, which breaks ties between equal scores."""

    query_ids: Sequence
    first_stage_ranks: Sequence

    def __len__(self) -> int:
        return len(self.query_ids)


RANK_CUTOFF = 10  # the @10 of MRR@10 and NDCG@10


def ranked_order(scores: Sequence, groups: RankGroups) -> dict:
    """{query: its candidates' example indices in ranked order}: by score, highest first,
    ties broken by first-stage rank (lower first); queries in order of first appearance.
    The one ranking rule the metrics and the TREC run file share."""
    by_query: dict = {}
    for i, (score, qid, rank) in enumerate(
        zip(scores, groups.query_ids, groups.first_stage_ranks, strict=True)
    ):
        by_query.setdefault(qid, []).append((-float(score), rank, i))
    return {qid: [i for _, _, i in sorted(cands)] for qid, cands in by_query.items()}


def ranked_relevances(scores: Sequence, labels: Sequence, groups: RankGroups) -> list[list]:
    """Each query's relevance labels in the order `ranked_order` ranks its candidates."""
    if len(labels) != len(groups):
        raise ValueError(f"{len(labels)} labels for {len(groups)} candidates")
    return [[labels[i] for i in order] for order in ranked_order(scores, groups).values()]


def reciprocal_rank_at(relevances: Sequence, k: int = RANK_CUTOFF) -> float:
    """1 / the rank of the first relevant candidate among the top `k`; 0 when none is (the
    seed's `compute_mrr_at_10`)."""
    for i, rel in enumerate(relevances[:k]):
        if rel == 1:
            return 1.0 / (i + 1)
    return 0.0


def ndcg_at(relevances: Sequence, k: int = RANK_CUTOFF) -> float:
    """DCG of the top `k` over the DCG of the ideal order of the same candidates; 0 when no
    candidate is relevant (the seed's `compute_ndcg_at_10`)."""
    dcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(relevances[:k]))
    ideal = sorted(relevances, reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mrr_at_10(preds: Sequence, labels: Sequence, groups: RankGroups) -> float:
    """MRR@10 over all queries of the split (a query without a relevant candidate counts 0)."""
    per_query = [reciprocal_rank_at(r) for r in ranked_relevances(preds, labels, groups)]
    return float(math.fsum(per_query) / len(per_query))


def ndcg_at_10(preds: Sequence, labels: Sequence, groups: RankGroups) -> float:
    """NDCG@10 over all queries of the split (a query without a relevant candidate counts 0)."""
    per_query = [ndcg_at(r) for r in ranked_relevances(preds, labels, groups)]
    return float(math.fsum(per_query) / len(per_query))


def first_stage_scores(groups: RankGroups) -> list[float]:
    """Scores that rank every query's candidates in first-stage order (minus the rank), so
    a grouped metric of them is the first stage's own score."""
    return [-float(rank) for rank in groups.first_stage_ranks]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its function (predictions, labels) -> score, its direction, whether it
    scores examples one by one ("pointwise") or needs per-group data such as a query's
    candidates ("grouped": its function takes a third argument, the `RankGroups`), and the
    short label tables print, and the range its scores lie in (None: unbounded), where an
    interval of a mean over seeds is cut (`aggregate.seed_interval`)."""

    name: str
    fn: Callable[..., float]
    higher_is_better: bool
    granularity: Literal["pointwise", "grouped"]
    label: str
    score_range: tuple[float, float] | None = None


METRIC_SPECS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec("accuracy", accuracy, True, "pointwise", "acc", (0.0, 1.0)),
        MetricSpec("f1", f1, True, "pointwise", "F1", (0.0, 1.0)),
        MetricSpec("macro_f1", macro_f1, True, "pointwise", "macro-F1", (0.0, 1.0)),
        MetricSpec("mcc", mcc, True, "pointwise", "MCC", (-1.0, 1.0)),
        MetricSpec("spearman", spearman, True, "pointwise", "Spearman", (-1.0, 1.0)),
        MetricSpec("mrr_at_10", mrr_at_10, True, "grouped", "MRR@10", (0.0, 1.0)),
        MetricSpec("ndcg_at_10", ndcg_at_10, True, "grouped", "NDCG@10", (0.0, 1.0)),
    )
}

METRICS: dict[str, Callable[..., float]] = {name: spec.fn for name, spec in METRIC_SPECS.items()}


def metric_spec(name: str) -> MetricSpec:
    """The spec of metric `name`; an unknown name is a HarnessError listing the valid ones."""
    if name not in METRIC_SPECS:
        raise unknown_name("metric", name, METRIC_SPECS)
    return METRIC_SPECS[name]


def direction(higher_is_better: bool) -> float:
    """+1 when a higher score is better, -1 otherwise: a score times its direction is
    higher-is-better. The one rule; `sign` applies it to a registry metric, a receipt
    (`receipt.TaskResult.sign`) to the direction it recorded."""
    return 1.0 if higher_is_better else -1.0


def sign(metric: str) -> float:
    """+1 for a higher-is-better metric, -1 for a lower-is-better one (`direction`). A score
    times its sign is higher-is-better: the one way the harness reads a metric's direction."""
    return direction(metric_spec(metric).higher_is_better)


def improves(new: float | None, best: float | None, metric: str) -> bool:
    """Whether score `new` is strictly better than `best` under `metric`'s direction; an
    undefined (None or NaN) `new` never improves, and anything defined beats no best."""
    if new is None or math.isnan(new):
        return False
    if best is None or math.isnan(best) or math.isinf(best):
        return True
    return sign(metric) * new > sign(metric) * best


def compute_metric(
    name: str, preds: Sequence, labels: Sequence, groups: RankGroups | None = None
) -> float | None:
    """Score predictions with the named metric; None when it is undefined on this input
    (`undefined_reason` says why); `metric_spec(name).higher_is_better` gives its direction.
    A grouped metric needs `groups` (each example's query and first-stage rank)."""
    spec = metric_spec(name)
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    if len(labels) == 0:
        raise ValueError("cannot score an empty split")
    if undefined_reason(name, preds, labels) is not None:
        return None
    if spec.granularity == "grouped":
        if groups is None or len(groups) != len(labels):
            raise ValueError(f"metric {name} needs each example's query and first-stage rank")
        return spec.fn(preds, labels, groups)
    return spec.fn(preds, labels)


# ----------------------------------------------------------------------------- languages


def deciding_languages(langs: list[str], euro: tuple[str, ...]) -> list[str]:
    """The languages whose mean is a cell's headline score and decides its early stopping
    and best checkpoint: the Euro languages among `langs`, or all of them when none is."""
    return [lang for lang in langs if lang in euro] or list(langs)


def language_mean(
    scores: dict[str, float | None], euro: tuple[str, ...]
) -> tuple[float | None, list[str]]:
    """The headline mean over the deciding languages scored (`deciding_languages`); None
    when any of those is undefined: an undefined score is never averaged as 0."""
    langs = deciding_languages(list(scores), euro)
    values = [scores[lang] for lang in langs]
    if not values or any(v is None for v in values):
        return None, langs
    return float(np.mean(values)), langs


def score_splits(
    metric: str,
    predictions: dict[str, Sequence],
    labels: dict[str, Sequence],
    groups: dict[str, RankGroups] | None = None,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Score each language; returns (scores, undefined) where undefined maps a language
    whose metric is undefined on its predictions to the reason (its score is None).
    `groups` (per language) is what a grouped metric needs beside predictions and labels."""
    scores, undefined = {}, {}
    for lang, preds in predictions.items():
        scores[lang] = compute_metric(metric, preds, labels[lang], (groups or {}).get(lang))
        if scores[lang] is None:
            undefined[lang] = undefined_reason(metric, preds, labels[lang])
    return scores, undefined


# ----------------------------------------------------------------------------- resampling


RESAMPLE_BATCH = 2_000_000  # array elements per batch of resamples: bounds peak memory


def resample_scorer(
    name: str,
    matrix: np.ndarray,
    labels: np.ndarray,
    languages: np.ndarray,
    euro: tuple[str, ...],
) -> Callable[[np.ndarray], np.ndarray]:
    """Score a (seeds, examples) prediction matrix on many resamples at once, for the
    bootstraps and permutation tests of `compare`: the returned function maps a
    (resamples, k) matrix of example indices (columns of `matrix`) to the (resamples, seeds)
    task scores, each the metric per language on that resample's examples and then their
    headline mean (`deciding_languages`, as `language_mean`); NaN where undefined, in the
    cases of `undefined_reason`. Resamples are scored in batches of about `RESAMPLE_BATCH`
    array elements. Every seed reads the same draw counts (how often each example is
    drawn), so stacking several models' seeds in `matrix` scores them on one set of counts.
    Classification metrics take per-language counts as products of the draw counts with
    each seed's indicator columns; Spearman reads each resample's average ranks
    (`rankdata`'s ties) off its draw counts over a language's values sorted once, and takes
    the Pearson of the ranks weighted by those counts.
    Pointwise metrics only: resampling a grouped metric must resample whole queries."""
    if metric_spec(name).granularity == "grouped":
        raise ValueError(f"{name} is a per-query metric; resampling takes single examples")
    matrix, labels = np.atleast_2d(np.asarray(matrix)), np.asarray(labels)
    names, lang = np.unique(np.asarray(languages), return_inverse=True)
    if matrix.shape[1:] != labels.shape or lang.shape != labels.shape or labels.size == 0:
        raise ValueError(
            f"{matrix.shape} predictions for {labels.shape} labels and {lang.shape} languages"
        )
    is_euro = np.isin(names, list(euro)) if euro else None
    n_seeds = matrix.shape[0]
    if name == "spearman":
        per_language = _spearman_batch(matrix, labels, lang, names.size)
    else:
        per_language = _confusion_batch(name, matrix, labels, lang, names.size)

    def scores(index: np.ndarray) -> np.ndarray:
        index = np.atleast_2d(np.asarray(index))
        per_resample = max(index.shape[1], labels.size, n_seeds * names.size)
        rows = max(1, RESAMPLE_BATCH // per_resample)
        out = np.empty((index.shape[0], n_seeds))
        with _one_blas_thread():
            for start in range(0, index.shape[0], rows):
                value, present = per_language(index[start : start + rows])
                out[start : start + rows] = _headline(value, present, is_euro)
        return out

    return scores


_BLAS = None  # threadpoolctl's controller of the BLAS numpy loaded, made on first use


def _one_blas_thread():
    """A context in which numpy's BLAS runs on one thread. The resampling's matrix
    products are small and many; OpenBLAS's worker threads spin while they wait, and on a
    shared machine one 13 x 151,674 x 70 product cost 0.71 s of CPU on two threads against
    8.5 ms on one (measured in bench/README.md, under Shared draw counts)."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def _headline(value: np.ndarray, present: np.ndarray, is_euro: np.ndarray | None) -> np.ndarray:
    """(resamples, seeds) headline means from per-language scores `value` (resamples, seeds,
    languages; NaN: undefined) over the languages `present` (resamples, languages): the
    deciding ones (Euro among the present, else all present, `deciding_languages`), NaN
    when any of those is undefined (`language_mean`)."""
    deciding = present
    if is_euro is not None:
        euro_present = present & is_euro
        deciding = np.where(euro_present.any(axis=1, keepdims=True), euro_present, present)
    chosen = deciding[:, None, :]
    total = np.where(chosen, value, 0.0).sum(axis=2)
    mean = total / deciding.sum(axis=1)[:, None]
    return np.where((np.isnan(value) & chosen).any(axis=2), np.nan, mean)


class _Indicators(NamedTuple):
    """A classification metric's 0/1 columns per example, examples of one language side by
    side (`order`, `spans`: `language_blocks`): per seed, right or wrong (accuracy: `width`
    1) or the hits of each of the `k` classes then its predictions (`width` 2k); `gold` the
    labels per class."""

    order: np.ndarray | None
    spans: list[tuple[int, int]]
    columns: np.ndarray  # (examples, seeds * width), float32
    gold: np.ndarray | None  # (examples, k), float32
    positive: np.ndarray | None
    width: int
    k: int


def language_blocks(lang: np.ndarray, n_lang: int) -> tuple[np.ndarray | None, list]:
    """(order, spans): `order` puts the examples of each language code side by side (stable)
    and `spans[code]` is that language's (start, end) in that order. When every language is
    already one block (as `load_examples` reads them, file by file), `order` is None (the
    examples as they are) and the spans are the blocks themselves: no column is gathered,
    and a language's columns are the same, in the same order, either way."""
    n_cols = lang.size
    if n_cols and np.count_nonzero(lang[1:] != lang[:-1]) == np.unique(lang).size - 1:
        starts = np.flatnonzero(np.r_[True, lang[1:] != lang[:-1]])
        ends = np.r_[starts[1:], n_cols]
        at = {int(lang[s]): (int(s), int(e)) for s, e in zip(starts, ends, strict=True)}
        return None, [at.get(code, (0, 0)) for code in range(n_lang)]
    order = np.argsort(lang, kind="stable")
    bounds = np.searchsorted(lang[order], np.arange(n_lang + 1))
    return order, [(int(bounds[code]), int(bounds[code + 1])) for code in range(n_lang)]


def _indicators(name: str, matrix: np.ndarray, labels: np.ndarray, lang: np.ndarray, n_lang: int):
    n_cols = matrix.shape[1]
    order, spans = language_blocks(lang, n_lang)

    def side_by_side(x: np.ndarray) -> np.ndarray:
        return x if order is None else x[..., order]

    if name == "accuracy":
        columns = side_by_side(matrix == labels).T  # (columns, seeds): right or wrong
        return _Indicators(
            order, spans, np.ascontiguousarray(columns, np.float32), None, None, 1, 0
        )
    classes = np.unique(np.concatenate([labels.ravel(), matrix.ravel()]))
    k = classes.size
    true = side_by_side(np.searchsorted(classes, labels))
    pred = side_by_side(np.searchsorted(classes, matrix))  # (seeds, columns)
    said = pred[:, :, None] == np.arange(k)
    hit = said & (pred == true)[:, :, None]
    # (columns, seeds * 2k): per seed, the hits of each class, then its predictions
    columns = np.concatenate([hit, said], axis=2).transpose(1, 0, 2).reshape(n_cols, -1)
    gold = (true[:, None] == np.arange(k)).astype(np.float32)  # (columns, classes)
    positive = np.flatnonzero(classes == 1)
    return _Indicators(
        order, spans, np.ascontiguousarray(columns, np.float32), gold, positive, 2 * k, k
    )


def _scores_from_made(
    name: str, ind: _Indicators, made: np.ndarray, n: np.ndarray, t: np.ndarray | None
) -> np.ndarray:
    """(rows, seeds, languages) scores from per-language products `made` (rows, languages,
    seeds * width), example counts `n` (rows, languages) and label counts `t` (rows or 1,
    languages, k; accuracy: None)."""
    rows, n_lang = made.shape[0], made.shape[1]
    made = made.astype(np.float64).reshape(rows, n_lang, -1, ind.width).transpose(0, 2, 1, 3)
    if name == "accuracy":
        with np.errstate(invalid="ignore", divide="ignore"):
            return made[..., 0] / n[:, None, :]
    tp, p = made[..., : ind.k], made[..., ind.k :]
    return _from_counts(name, tp, t.astype(np.float64)[:, None], p, ind.positive)


def _confusion_batch(
    name: str, matrix: np.ndarray, labels: np.ndarray, lang: np.ndarray, n_lang: int
):
    """The per-language scorer of a classification metric (see `resample_scorer`). A batch
    of resamples is first turned into draw counts (resamples x examples, one `bincount`
    shared by every seed), then each seed's per-language counts are one matrix product of
    those counts with its 0/1 indicator columns: correct for accuracy; hits and predictions
    per class, with the labels per class shared, for F1, macro-F1 and MCC. The counts are
    integers below 2**24, exact in float32 whatever the order of the sums, so the scores
    are the same as counting one resample at a time."""
    n_cols = matrix.shape[1]
    ind = _indicators(name, matrix, labels, lang, n_lang)
    position = None  # each example's column in `ind`'s order (None: its own)
    if ind.order is not None:
        position = np.empty_like(ind.order)
        position[ind.order] = np.arange(n_cols)

    def per_language(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = index.shape[0]
        drawn = np.bincount(
            (
                np.arange(rows)[:, None] * n_cols + (index if position is None else position[index])
            ).ravel(),
            minlength=rows * n_cols,
        ).reshape(rows, n_cols)
        weights = drawn.astype(np.float32)
        n = np.stack([drawn[:, a:b].sum(axis=1) for a, b in ind.spans], axis=1)  # (rows, langs)
        made = np.stack([weights[:, a:b] @ ind.columns[a:b] for a, b in ind.spans], axis=1)
        t = None
        if ind.gold is not None:  # (rows, langs, k)
            t = np.stack([weights[:, a:b] @ ind.gold[a:b] for a, b in ind.spans], axis=1)
        return _scores_from_made(name, ind, made, n, t), n > 0

    return per_language


def swap_scorer(
    name: str,
    a: np.ndarray,
    b: np.ndarray,
    labels: np.ndarray,
    languages: np.ndarray,
    euro: tuple[str, ...],
) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The scores of the paired swap permutation test (`stats.paired_swap_permutation`):
    the returned function maps a (resamples, examples) 0/1 swap matrix to A's and B's
    (resamples, seeds) task scores with the swapped examples' predictions exchanged
    (`a`, `b`: (seeds, examples)): the scores `resample_scorer` gives on [a | b] at the
    columns each side holds. A classification metric's per-language counts are A's own
    plus the swap matrix times (B's indicators - A's), and B's own minus the same product:
    one matrix product for both sides and no draw counts, exact as in `resample_scorer`.
    Spearman: `_spearman_swap`."""
    if metric_spec(name).granularity == "grouped":
        raise ValueError(f"{name} is a per-query metric; resampling takes single examples")
    a, b, labels = np.atleast_2d(a), np.atleast_2d(b), np.asarray(labels)
    n_ex, n_seeds = labels.size, a.shape[0]
    names, lang = np.unique(np.asarray(languages), return_inverse=True)
    if a.shape != b.shape or a.shape[1:] != labels.shape or lang.shape != labels.shape:
        raise ValueError(f"{a.shape} and {b.shape} predictions for {labels.shape} labels")
    is_euro = np.isin(names, list(euro)) if euro else None
    if name == "spearman":
        per_language = _spearman_swap(a, b, labels, lang, names.size)
        rows_per_batch = max(1, RESAMPLE_BATCH // (2 * n_ex))
    else:
        per_language, width = _confusion_swap(name, a, b, labels, lang, names.size)
        rows_per_batch = max(1, RESAMPLE_BATCH // max(n_ex, n_seeds * width * names.size))

    def scores(swap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        swap = np.atleast_2d(np.asarray(swap)).astype(bool, copy=False)
        out_a, out_b = np.empty((2, swap.shape[0], n_seeds))
        with _one_blas_thread():
            for start in range(0, swap.shape[0], rows_per_batch):
                values = per_language(swap[start : start + rows_per_batch])
                present = np.ones((values[0].shape[0], names.size), dtype=bool)
                for value, out in zip(values, (out_a, out_b), strict=True):
                    out[start : start + value.shape[0]] = _headline(value, present, is_euro)
        return out_a, out_b

    return scores


def _confusion_swap(
    name: str, a: np.ndarray, b: np.ndarray, labels: np.ndarray, lang: np.ndarray, n_lang: int
):
    """The per-language scorer of `swap_scorer` for a classification metric, and the
    width of its indicator columns per seed."""
    n_seeds = a.shape[0]
    ind = _indicators(name, np.concatenate([a, b]), labels, lang, n_lang)
    half = n_seeds * ind.width
    own_a, own_b = ind.columns[:, :half], ind.columns[:, half:]
    change = np.ascontiguousarray(own_b - own_a)  # -1, 0 or 1
    base_a = np.stack([own_a[s:e].sum(axis=0) for s, e in ind.spans])  # (langs, seeds * width)
    base_b = np.stack([own_b[s:e].sum(axis=0) for s, e in ind.spans])
    n = np.array([[e - s for s, e in ind.spans]], dtype=float)  # (1, langs)
    t = None if ind.gold is None else np.stack([ind.gold[s:e].sum(axis=0) for s, e in ind.spans])

    def per_language(swap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = (swap if ind.order is None else swap[:, ind.order]).astype(np.float32)
        moved = np.stack([m[:, s:e] @ change[s:e] for s, e in ind.spans], axis=1)
        counts_n = np.broadcast_to(n, (m.shape[0], n_lang))
        label_counts = None if t is None else t[None]
        return tuple(
            _scores_from_made(name, ind, made, counts_n, label_counts)
            for made in (base_a + moved, base_b - moved)
        )

    return per_language, ind.width


def _from_counts(
    name: str, tp: np.ndarray, t: np.ndarray, p: np.ndarray, positive: np.ndarray
) -> np.ndarray:
    """F1 / macro-F1 / MCC from per-class counts (..., classes): hits `tp`, true `t` and
    predicted `p`, with `score_array`'s undefined cases as NaN."""
    t = np.broadcast_to(t, tp.shape)
    fp, fn = p - tp, t - tp
    denom = 2 * tp + fp + fn
    with np.errstate(invalid="ignore", divide="ignore"):
        f1_per_class = np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1.0), 0.0)
        if name == "macro_f1":  # over the classes seen in labels or predictions
            seen = denom > 0
            return np.where(seen, f1_per_class, 0.0).sum(axis=-1) / seen.sum(axis=-1)
        if name == "f1":  # the positive class 1; undefined when never seen
            if positive.size == 0:
                return np.full(tp.shape[:-1], np.nan)
            j = positive[0]
            return np.where(denom[..., j] > 0, f1_per_class[..., j], np.nan)
        n = t.sum(axis=-1)
        cov = tp.sum(axis=-1) * n - (t * p).sum(axis=-1)
        scale = np.sqrt((n * n - (p * p).sum(axis=-1)) * (n * n - (t * t).sum(axis=-1)))
        defined = (n >= 2) & ((t > 0).sum(axis=-1) >= 2) & ((p > 0).sum(axis=-1) >= 2)
        return np.where(defined, cov / np.where(scale > 0, scale, 1.0), np.nan)


def _weighted_ranks(
    weights: np.ndarray, order: np.ndarray, last: np.ndarray, run_of: np.ndarray
) -> np.ndarray:
    """Average ranks (scipy `rankdata`'s "average") of every pooled value within each
    resample that draws value j `weights[:, j]` times, without sorting per resample: `order`
    sorts the pool once, `last` is each run of equal values' last position in that order,
    `run_of` each value's run. A value's rank is the count drawn below its run plus (its
    run's count + 1) / 2. `weights` are integer counts: summed as int32 (exact, half the
    memory traffic of floats), and a pool of distinct values skips the runs' gather."""
    upto = np.cumsum(weights[:, order], axis=1, dtype=np.int32)
    if last.size < order.size:
        upto = upto[:, last]
    run = np.diff(upto, axis=1, prepend=0)
    return (upto - (run - 1.0) / 2.0)[:, run_of]


def _sorting(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, last, run_of) of `values` for `_weighted_ranks`: the stable sorting order,
    each run of equal values' last position in it, and each value's run."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    change = ordered[1:] != ordered[:-1]
    run_of = np.empty(order.size, dtype=np.int64)
    run_of[order] = np.concatenate([[0], np.cumsum(change)])
    return order, np.flatnonzero(np.append(change, True)), run_of


class _Runs(NamedTuple):
    """A pool of values sorted once (`order`, stable) and its runs of equal values longer
    than one: their first and last positions in that order (`starts`, `ends`), the
    positions inside them (`tied`, ascending) and the run of each (`tied_run`, an index
    into `starts`). A value alone in its run is ranked by a count; a longer run shares the
    average rank of the picks in it."""

    order: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    tied: np.ndarray
    tied_run: np.ndarray


def _runs(values: np.ndarray) -> _Runs:
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    run = np.concatenate([[0], np.cumsum(ordered[1:] != ordered[:-1])])
    length = np.bincount(run)
    multi = length > 1
    ends = np.flatnonzero(np.append(run[1:] != run[:-1], True))[multi]
    tied = np.flatnonzero(multi[run])
    return _Runs(order, ends - length[multi] + 1, ends, tied, (np.cumsum(multi) - 1)[run[tied]])


def _spearman_batch(matrix: np.ndarray, labels: np.ndarray, lang: np.ndarray, n_lang: int):
    """The per-language scorer of Spearman (see `resample_scorer`): each language's pool of
    columns is sorted once per seed (`_runs`) and for the labels (`_sorting`); a resample
    is the number of times it draws each column, its correlation the Pearson of the ranks
    weighted by those counts (the Pearson of the drawn multiset). The gold ranks are
    `_weighted_ranks`; a seed's, in its sorted order, are twice the count drawn up to a
    value minus its own count, plus one (doubled: integers), and a run of equal values
    shares its average. The sum of squared rank deviations is the tie formula (N^3 - N -
    sum of (t^3 - t) over the runs' counts t) / 12, whose runs are each value's own count
    (one sum per resample for every seed) but for the seed's longer runs. Ranks are half
    integers and counts integers, so the sums are exact: the values are those of the
    weighted Pearson of the ranks computed term by term, to the bit."""
    matrix, labels = matrix.astype(float), labels.astype(float)
    n_cols = labels.size
    pools = []
    for code in range(n_lang):
        pool = np.flatnonzero(lang == code)
        pools.append((pool, _sorting(labels[pool]), [_runs(row[pool]) for row in matrix]))

    def per_language(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = index.shape[0]
        drawn = np.bincount(
            (np.arange(rows)[:, None] * n_cols + index).ravel(), minlength=rows * n_cols
        ).reshape(rows, n_cols)
        value = np.full((rows, matrix.shape[0], n_lang), np.nan)
        present = np.zeros((rows, n_lang), dtype=bool)
        for code, (pool, gold_sort, pred_runs) in enumerate(pools):
            counts = drawn[:, pool].astype(np.int32)
            weights = counts.astype(float)
            n = weights.sum(axis=1)
            present[:, code] = n > 0
            dg = _weighted_ranks(counts, *gold_sort) - ((n + 1.0) / 2.0)[:, None]
            wdg = weights * dg  # sums to 0 over a resample: the mean rank drops out of cov
            var_g = np.einsum("ij,ij->i", wdg, dg)
            cubes = counts.astype(np.int64) ** 3 - counts
            own_ties = cubes.sum(axis=1).astype(float)  # every value its own run
            for s, runs in enumerate(pred_runs):
                drawn_sorted = counts[:, runs.order]
                upto = np.cumsum(drawn_sorted, axis=1, dtype=np.int32)
                rank2 = upto + upto
                rank2 -= drawn_sorted
                rank2 += 1
                ties = own_ties
                if runs.tied.size:
                    before = np.where(runs.starts > 0, upto[:, runs.starts - 1], 0)
                    count = upto[:, runs.ends] - before
                    rank2[:, runs.tied] = (before + before + count + 1)[:, runs.tied_run]
                    count = count.astype(np.int64)
                    ties = (
                        own_ties
                        - cubes[:, runs.order[runs.tied]].sum(axis=1)
                        + (count**3 - count).sum(axis=1)
                    )
                cov = np.einsum("ij,ij->i", wdg[:, runs.order], rank2.astype(float)) / 2.0
                var_p = (n**3 - n - ties) / 12.0
                defined = (n >= 2) & (var_p > 0) & (var_g > 0)  # 0: constant in the resample
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = np.clip(cov / np.sqrt(var_p * var_g), -1.0, 1.0)
                value[:, s, code] = np.where(defined, r, np.nan)
        return value, present

    return per_language


class _SwapPool(NamedTuple):
    """One seed's 2n predictions of a language (A's n, then B's) sorted once (`_runs`), for
    `_spearman_swap`: per sorted position its example (`example`) and whether it is B's
    (`is_b`); the gold rank deviations there, zero in `g_single` inside runs longer than
    one; those runs (`starts`, `ends`: positions; `length`; `gold`: their sum of the
    deviations) and their positions (`tied`, each run starting at `tied_starts` within
    it, deviations `g_tied`); and the part of B's covariance linear in the swap row
    (`k_b` + swap row @ `lin`, over the n examples)."""

    example: np.ndarray
    is_b: np.ndarray
    g_single: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    length: np.ndarray
    gold: np.ndarray
    tied: np.ndarray
    tied_starts: np.ndarray
    g_tied: np.ndarray
    k_b: float
    lin: np.ndarray


def _swap_pool(va: np.ndarray, vb: np.ndarray, dg: np.ndarray) -> _SwapPool:
    n = va.size
    runs = _runs(np.concatenate([va, vb]))
    g = dg[runs.order % n]
    g_single = g.copy()
    g_single[runs.tied] = 0.0
    length = runs.ends - runs.starts + 1
    position = np.arange(1, 2 * n + 1, dtype=float)
    # wa @ h is what B's covariance reads of A's picks linearly: h = g (i + 1) + the sum of
    # g over the positions from i on, both over single runs (see `_spearman_swap`)
    h = g_single * position + np.cumsum(g_single[::-1])[::-1]
    where = np.empty(2 * n, dtype=np.int64)
    where[runs.order] = np.arange(2 * n)
    h_a, h_b = h[where[:n]], h[where[n:]]
    return _SwapPool(
        example=runs.order % n,
        is_b=runs.order >= n,
        g_single=g_single,
        starts=runs.starts,
        ends=runs.ends,
        length=length.astype(float),
        gold=np.bincount(runs.tied_run, weights=g[runs.tied], minlength=length.size),
        tied=runs.tied,
        tied_starts=np.cumsum(length) - length,
        g_tied=g[runs.tied],
        k_b=float(g_single @ position) - float(h_a.sum()),
        lin=h_b - h_a,
    )


def _spearman_swap(a: np.ndarray, b: np.ndarray, labels: np.ndarray, lang: np.ndarray, n_lang: int):
    """The per-language scorer of `swap_scorer` for Spearman: the values `_spearman_batch`
    gives on [a | b] at the columns each side holds, without its draw counts or sorting.
    Every example is on each side once, so the gold ranks never change (their deviations
    `dg` from the mean rank, and their sum of squares, are computed once). Per seed, a
    language's 2n predictions of A and B are sorted once (`_swap_pool`); a swap row picks
    A's n of them (`wa`, 0/1 in that order) and B's are the rest, so A's rank of a value
    alone in its run is the count `C` of A's picks up to it, and B's its position minus
    that. A's covariance (the mean rank drops out: the deviations sum to 0) is then
    sum(wa g C) over single runs, one matrix product; B's is linear in the swap row
    (`lin`, one product for every seed) plus the same sum; a run of equal values takes the
    average rank of the picks in it, and the sum of squared rank deviations is the tie
    formula (n^3 - n - sum of (t^3 - t) over the runs' picks t) / 12. Ranks are half
    integers, so every sum is exact and the values are `_spearman_batch`'s to the bit."""
    a, b, labels = a.astype(float), b.astype(float), labels.astype(float)
    n_seeds = a.shape[0]
    pools = []
    for code in range(n_lang):
        pool = np.flatnonzero(lang == code)
        n = pool.size
        ones = np.ones((1, n), dtype=np.int32)
        dg = _weighted_ranks(ones, *_sorting(labels[pool]))[0] - (n + 1.0) / 2.0
        var_g = float(np.einsum("i,i->", dg, dg))
        sides = [_swap_pool(a[s, pool], b[s, pool], dg) for s in range(n_seeds)]
        lin = np.stack([side.lin for side in sides], axis=1)  # (n, seeds)
        contiguous = pool.size and pool[-1] - pool[0] == n - 1
        pools.append((slice(pool[0], pool[-1] + 1) if contiguous else pool, n, var_g, sides, lin))

    def per_language(swap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = swap.shape[0]
        value_a = np.full((rows, n_seeds, n_lang), np.nan)
        value_b = np.full((rows, n_seeds, n_lang), np.nan)
        for code, (pool, n, var_g, sides, lin) in enumerate(pools):
            w = swap[:, pool]
            linear = w.astype(float) @ lin  # (rows, seeds)
            small = np.int16 if n < 2**15 else np.int64  # counts up to n, exact
            for s, side in enumerate(sides):
                wa = w[:, side.example] == side.is_b  # A's picks, in sorted order
                upto = np.cumsum(wa, axis=1, dtype=small)
                before = np.where(side.starts > 0, upto[:, side.starts - 1], 0).astype(float)
                count_a = upto[:, side.ends] - before  # A's picks per long run
                sum_a = np.zeros((rows, side.starts.size))
                if side.tied.size:
                    sum_a = np.add.reduceat(
                        wa[:, side.tied] * side.g_tied, side.tied_starts, axis=1
                    )
                np.multiply(upto, wa, out=upto)
                single = upto.astype(float) @ side.g_single  # A's sum(wa g C), single runs
                count_b = side.length - count_a
                rank_a = before + (count_a + 1.0) / 2.0
                rank_b = (side.starts - before) + (count_b + 1.0) / 2.0
                cov_a = single + np.einsum("ij,ij->i", rank_a, sum_a)
                cov_b = (
                    side.k_b
                    - linear[:, s]
                    + single
                    + np.einsum("ij,ij->i", rank_b, side.gold - sum_a)
                )
                for cov, count, value in ((cov_a, count_a, value_a), (cov_b, count_b, value_b)):
                    ties = np.einsum("ij->i", count * count * count - count)
                    var_p = (n**3 - n - ties) / 12.0
                    defined = (n >= 2) & (var_p > 0) & (var_g > 0)
                    with np.errstate(invalid="ignore", divide="ignore"):
                        r = np.clip(cov / np.sqrt(var_p * var_g), -1.0, 1.0)
                    value[:, s, code] = np.where(defined, r, np.nan)
        return value_a, value_b

    return per_language


def score_array(name: str, preds: np.ndarray, labels: np.ndarray) -> float | None:
    """`compute_metric(name, preds, labels)` computed with numpy alone: the one-resample
    case of `resample_scorer` (scikit-learn's per-call input checks cost more than the
    arithmetic in a resampling loop). The same value and the same undefined cases (None);
    `tests/test_metrics.py` checks the two agree. Pointwise metrics only."""
    if metric_spec(name).granularity == "grouped":
        raise ValueError(f"{name} is a per-query metric; score_array resamples single examples")
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape or labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"{preds.size} predictions for {labels.size} labels")
    n = labels.size
    value = resample_scorer(name, preds[None, :], labels, np.zeros(n, dtype=int), ())(
        np.arange(n)[None, :]
    )[0, 0]
    return None if math.isnan(value) else float(value)
