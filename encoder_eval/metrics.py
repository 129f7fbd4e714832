"""Each task's one primary metric, computed with scikit-learn and scipy.

Degenerate inputs get a defined value rather than NaN, so a table never shows a hole:
- MCC with constant predictions or constant labels: 0.0 (no correlation measurable);
- F1 / macro-F1 when a class is never predicted: that class's F1 is 0.0;
- Spearman when predictions or targets are constant: 0.0.
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
    preds, labels = np.asarray(preds), np.asarray(labels)
    if np.unique(preds).size < 2 or np.unique(labels).size < 2:
        return 0.0
    return float(matthews_corrcoef(labels, preds))


def spearman(preds: Sequence, labels: Sequence) -> float:
    preds, labels = np.asarray(preds, dtype=float), np.asarray(labels, dtype=float)
    if preds.size < 2 or np.ptp(preds) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(spearmanr(preds, labels).statistic)


METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "mcc": mcc,
    "spearman": spearman,
}


def compute_metric(name: str, preds: Sequence, labels: Sequence) -> float:
    """Score predictions with the named metric; higher is better for every metric here."""
    if name not in METRICS:
        raise unknown_name("metric", name, METRICS)
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    if len(labels) == 0:
        raise ValueError("cannot score an empty split")
    return METRICS[name](preds, labels)
