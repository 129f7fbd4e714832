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
from typing import Literal

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


def _confusion(preds: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The confusion counts (true class x predicted class) over the classes seen."""
    classes, inverse = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    k, n = classes.size, labels.size
    return np.bincount(inverse[:n] * k + inverse[n:], minlength=k * k).reshape(k, k), classes


def score_array(name: str, preds: np.ndarray, labels: np.ndarray) -> float | None:
    """`compute_metric(name, preds, labels)` computed with numpy alone, for resampling loops
    that score thousands of resamples (the paired tests and bootstraps of `compare`):
    scikit-learn's per-call input checks cost more than the arithmetic there. The same
    value and the same undefined cases (None); `tests/test_metrics.py` checks the two agree.
    Pointwise metrics only: resampling a grouped metric must resample whole queries."""
    if metric_spec(name).granularity == "grouped":
        raise ValueError(f"{name} is a per-query metric; score_array resamples single examples")
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape or labels.size == 0:
        raise ValueError(f"{preds.size} predictions for {labels.size} labels")
    if undefined_reason(name, preds, labels) is not None:
        return None
    if name == "accuracy":
        return float(np.mean(preds == labels))
    if name == "spearman":
        from scipy.stats import rankdata  # heavy: on use only (see the top)

        return float(np.corrcoef(rankdata(preds), rankdata(labels))[0, 1])
    cm, classes = _confusion(preds, labels)
    tp = np.diag(cm).astype(float)
    fp, fn = cm.sum(axis=0) - tp, cm.sum(axis=1) - tp
    denom = 2 * tp + fp + fn
    f1_per_class = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    if name == "macro_f1":
        return float(np.mean(f1_per_class))
    if name == "f1":
        pos = np.flatnonzero(classes == 1)
        return float(f1_per_class[pos[0]]) if pos.size else 0.0
    t, p, n = cm.sum(axis=1).astype(float), cm.sum(axis=0).astype(float), float(cm.sum())
    cov = np.trace(cm) * n - t @ p
    scale = np.sqrt((n * n - p @ p) * (n * n - t @ t))
    return float(cov / scale) if scale > 0 else 0.0
