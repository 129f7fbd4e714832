"""Each task's one primary metric, computed with scikit-learn and scipy.

A metric that is undefined on its input is reported as undefined (None, with the reason
from `undefined_reason`), never as a plain 0.0 that a table would average as a score:
- MCC with constant predictions or constant labels;
- Spearman with fewer than two examples, or constant predictions or targets;
- binary F1 when neither the labels nor the predictions hold a positive example.
F1 / macro-F1 count a class that is never predicted as F1 0 (that value is defined).
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
from scipy.stats import rankdata, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from .errors import unknown_name


def accuracy(preds: Sequence, labels: Sequence) -> float:
    return float(accuracy_score(labels, preds))


def f1(preds: Sequence, labels: Sequence) -> float:
    """Binary F1 of the positive class (label 1), as GLUE reports it for MRPC and QQP."""
    return float(f1_score(labels, preds, average="binary", pos_label=1, zero_division=0))


def macro_f1(preds: Sequence, labels: Sequence) -> float:
    """Unweighted mean of per-class F1 over the classes seen in labels or predictions."""
    return float(f1_score(labels, preds, average="macro", zero_division=0))


def mcc(preds: Sequence, labels: Sequence) -> float:
    """Matthews correlation (call `compute_metric` for the undefined cases)."""
    return float(matthews_corrcoef(np.asarray(labels), np.asarray(preds)))


def spearman(preds: Sequence, labels: Sequence) -> float:
    """Spearman rank correlation (call `compute_metric` for the undefined cases)."""
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
    return None


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its function (predictions, labels) -> score, its direction, whether it
    scores examples one by one ("pointwise") or needs per-group data such as a query's
    candidates ("grouped"), and the short label tables print."""

    name: str
    fn: Callable[[Sequence, Sequence], float]
    higher_is_better: bool
    granularity: Literal["pointwise", "grouped"]
    label: str


METRIC_SPECS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec("accuracy", accuracy, True, "pointwise", "acc"),
        MetricSpec("f1", f1, True, "pointwise", "F1"),
        MetricSpec("macro_f1", macro_f1, True, "pointwise", "macro-F1"),
        MetricSpec("mcc", mcc, True, "pointwise", "MCC"),
        MetricSpec("spearman", spearman, True, "pointwise", "Spearman"),
    )
}

METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    name: spec.fn for name, spec in METRIC_SPECS.items()
}


def metric_spec(name: str) -> MetricSpec:
    """The spec of metric `name`; an unknown name is a HarnessError listing the valid ones."""
    if name not in METRIC_SPECS:
        raise unknown_name("metric", name, METRIC_SPECS)
    return METRIC_SPECS[name]


def improves(new: float | None, best: float | None, metric: str) -> bool:
    """Whether score `new` is strictly better than `best` under `metric`'s direction; an
    undefined (None or NaN) `new` never improves, and anything defined beats no best."""
    if new is None or math.isnan(new):
        return False
    if best is None or math.isnan(best) or math.isinf(best):
        return True
    return new > best if metric_spec(metric).higher_is_better else new < best


def compute_metric(name: str, preds: Sequence, labels: Sequence) -> float | None:
    """Score predictions with the named metric; None when it is undefined on this input
    (`undefined_reason` says why); `metric_spec(name).higher_is_better` gives its direction."""
    spec = metric_spec(name)
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    if len(labels) == 0:
        raise ValueError("cannot score an empty split")
    if undefined_reason(name, preds, labels) is not None:
        return None
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
    metric: str, predictions: dict[str, Sequence], labels: dict[str, Sequence]
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Score each language; returns (scores, undefined) where undefined maps a language
    whose metric is undefined on its predictions to the reason (its score is None)."""
    scores, undefined = {}, {}
    for lang, preds in predictions.items():
        scores[lang] = compute_metric(metric, preds, labels[lang])
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
    value and the same undefined cases (None); `tests/test_metrics.py` checks the two agree."""
    metric_spec(name)
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape or labels.size == 0:
        raise ValueError(f"{preds.size} predictions for {labels.size} labels")
    if undefined_reason(name, preds, labels) is not None:
        return None
    if name == "accuracy":
        return float(np.mean(preds == labels))
    if name == "spearman":
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
