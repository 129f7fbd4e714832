"""Each task's one primary metric, computed with scikit-learn and scipy.

A metric that is undefined on its input is reported as undefined (None, with the reason
from `undefined_reason`), never as a plain 0.0 that a table would average as a score:
- MCC with constant predictions or constant labels;
- Spearman with fewer than two examples, or constant predictions or targets;
- binary F1 when neither the labels nor the predictions hold a positive example.
F1 / macro-F1 count a class that is never predicted as F1 0 (that value is defined).
Every metric here is "higher is better".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import spearmanr
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


METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "mcc": mcc,
    "spearman": spearman,
}


def compute_metric(name: str, preds: Sequence, labels: Sequence) -> float | None:
    """Score predictions with the named metric; None when it is undefined on this input
    (`undefined_reason` says why). Higher is better for every metric here."""
    if name not in METRICS:
        raise unknown_name("metric", name, METRICS)
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    if len(labels) == 0:
        raise ValueError("cannot score an empty split")
    if undefined_reason(name, preds, labels) is not None:
        return None
    return METRICS[name](preds, labels)
