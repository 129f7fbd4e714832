"""The resampling statistics as they were before they were vectorised (issue 37, item 2):
a loop over resamples, seeds and languages calling a scalar numpy metric, and scipy's
`permutation_test` called per resample. Kept verbatim as the reference the vectorised code
must equal to 1e-12 on fixed seeds (tests/test_stats_scale.py) and as the baseline of
bench/bench_stats.py. Not used by the package."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps
from scipy.stats import rankdata

from encoder_eval.core.metrics import language_mean, undefined_reason


def _confusion(preds: np.ndarray, labels: np.ndarray) -> np.ndarray:
    classes, inverse = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    k, n = classes.size, labels.size
    return np.bincount(inverse[:n] * k + inverse[n:], minlength=k * k).reshape(k, k), classes


def score_array(name: str, preds: np.ndarray, labels: np.ndarray) -> float | None:
    """The scalar metric of every resample before issue 37."""
    preds, labels = np.asarray(preds), np.asarray(labels)
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


def seed_scores(metric: str, euro: tuple[str, ...]):
    """(matrix, labels, languages, columns) -> every seed's task score, NaN if undefined."""

    def scores(matrix: np.ndarray, labels: np.ndarray, langs: np.ndarray, cols) -> np.ndarray:
        out = np.empty(len(matrix))
        lab, lng = labels[cols], langs[cols]
        order = list(dict.fromkeys(lng.tolist()))
        for i, row in enumerate(matrix):
            preds = row[cols]
            per_lang = {}
            for lang in order:
                sel = lng == lang
                per_lang[lang] = score_array(metric, preds[sel], lab[sel])
            mean, _ = language_mean(per_lang, euro)
            out[i] = math.nan if mean is None else mean
        return out

    return scores


def task_score(metric: str, euro: tuple[str, ...]):
    """The seed-averaged task score; NaN when a seed's score is undefined."""
    per_seed = seed_scores(metric, euro)

    def score(matrix: np.ndarray, labels: np.ndarray, langs: np.ndarray, cols) -> float:
        values = per_seed(matrix, labels, langs, cols)
        return math.nan if np.isnan(values).any() else float(np.mean(values))

    return score


def _members(strata):
    groups = np.asarray(strata)
    return [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]


def two_level_bootstrap(score, n_seeds, strata, n_resamples=1000, seed=1234, confidence=0.95):
    members = _members(strata)
    rng = np.random.default_rng(seed)
    point = float(score([np.arange(k) for k in n_seeds], np.arange(len(strata))))
    values = np.empty(n_resamples)
    for r in range(n_resamples):
        seeds = [rng.integers(0, k, size=k) for k in n_seeds]
        examples = np.concatenate([m[rng.integers(0, m.size, size=m.size)] for m in members])
        values[r] = score(seeds, examples)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return point, float(low), float(high)


def example_replicates(seed_scores_fn, strata, n_resamples=999, seed=1234) -> np.ndarray:
    members = _members(strata)
    rng = np.random.default_rng(seed)
    rows = [
        np.asarray(
            seed_scores_fn(np.concatenate([m[rng.integers(0, m.size, m.size)] for m in members])),
            dtype=float,
        )
        for _ in range(n_resamples)
    ]
    return np.vstack(rows)


def paired_swap_permutation(a, b, statistic, n_resamples=999, seed=1234):
    """(observed difference, p-value) of scipy's permutation_test, one resample a call."""
    n = a.shape[1]
    stacked = np.concatenate([a, b], axis=1)

    def swapped(x: np.ndarray, y: np.ndarray) -> float:
        return statistic(stacked[:, x], stacked[:, y])

    res = sps.permutation_test(
        (np.arange(n), np.arange(n, 2 * n)),
        swapped,
        permutation_type="samples",
        alternative="two-sided",
        vectorized=False,
        n_resamples=n_resamples,
        random_state=np.random.default_rng(seed),
    )
    return float(statistic(a, b)), float(res.pvalue)


def example_statistics(ma, mb, labels, langs, metric, euro, direction, n_resamples, seed):
    """What `compare_cells` computed from two models' predictions before issue 37:
    (observed Δ, permutation p-value, V_ex replicates, bootstrap low, bootstrap high)."""
    k = min(len(ma), len(mb))
    score = task_score(metric, euro)

    def diff_stat(x, y):
        cols = np.arange(x.shape[1])
        return direction * (score(x, labels, langs, cols) - score(y, labels, langs, cols))

    diff, p = paired_swap_permutation(ma[:k], mb[:k], diff_stat, n_resamples, seed)
    per_seed = seed_scores(metric, euro)
    both = np.concatenate([ma, mb])
    reps = example_replicates(
        lambda cols: per_seed(both, labels, langs, cols), langs, max(2, n_resamples), seed
    )

    def boot(seed_rows, cols):
        return score(ma[seed_rows[0]], labels, langs, cols) - score(
            mb[seed_rows[1]], labels, langs, cols
        )

    _, low, high = two_level_bootstrap(boot, [len(ma), len(mb)], langs, n_resamples, seed)
    return diff, p, reps, low, high
