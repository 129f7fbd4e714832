"""The metrics against scikit-learn and scipy on many random cases, and the degenerate ones."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.metrics import (
    METRIC_SPECS,
    METRICS,
    compute_metric,
    direction,
    improves,
    macro_f1,
    metric_spec,
    sign,
    undefined_reason,
)
from encoder_eval.core.receipt import TaskResult

CASES = 200  # random cases per metric

# The reference calls on tiny cases (sklearn's, not ours) warn about a single label.
pytestmark = pytest.mark.filterwarnings("ignore:A single label was found:UserWarning")


def _classes(rng: np.random.Generator, n_classes: int, size: int, skew: bool) -> np.ndarray:
    p = rng.dirichlet(np.ones(n_classes) * (0.3 if skew else 3.0))
    return rng.choice(n_classes, size=size, p=p)


def _classification_cases(seed: int, n_classes=(2, 7)):
    """(preds, labels, k) with varied sizes, class counts and agreement; seeded."""
    rng = np.random.default_rng(seed)
    for case in range(CASES):
        k = int(rng.integers(*n_classes)) if isinstance(n_classes, tuple) else n_classes
        size = int(rng.choice([2, 3, 5, 17, 64, 301, 1000]))
        labels = _classes(rng, k, size, skew=case % 3 == 0)
        noise = _classes(rng, k, size, skew=case % 5 == 0)
        keep = rng.random(size) < rng.random()  # agreement between 0 and ~100%
        preds = np.where(keep, labels, noise)
        yield preds, labels, k


def _as_list(case_index: int, array: np.ndarray):
    """Alternate numpy arrays and plain lists: the metrics take any sequence."""
    return array.tolist() if case_index % 2 else array


@pytest.mark.parametrize("seed", [0])
def test_accuracy_matches_sklearn(seed):
    for i, (preds, labels, _) in enumerate(_classification_cases(seed)):
        got = compute_metric("accuracy", _as_list(i, preds), _as_list(i, labels))
        assert got == pytest.approx(accuracy_score(labels, preds), abs=1e-12)
        assert type(got) is float


@pytest.mark.parametrize("seed", [2])
def test_binary_f1_matches_sklearn(seed):
    for i, (preds, labels, _) in enumerate(_classification_cases(seed, n_classes=2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no UndefinedMetricWarning from our call
            got = compute_metric("f1", _as_list(i, preds), _as_list(i, labels))
        tp = int(np.sum((preds == 1) & (labels == 1)))
        denominator = int(np.sum(preds == 1) + np.sum(labels == 1))
        if not denominator:
            assert got is None  # no positive anywhere: undefined
            continue
        want = f1_score(labels, preds, average="binary", pos_label=1, zero_division=0)
        assert got == pytest.approx(want, abs=1e-12)
        assert got == pytest.approx(2 * tp / denominator, abs=1e-12)


@pytest.mark.parametrize("seed", [4])
def test_macro_f1_matches_sklearn(seed):
    for i, (preds, labels, _) in enumerate(_classification_cases(seed)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = compute_metric("macro_f1", _as_list(i, preds), _as_list(i, labels))
        want = f1_score(labels, preds, average="macro", zero_division=0)
        assert got == pytest.approx(want, abs=1e-12)
        # By hand: the mean over classes seen in labels or predictions.
        seen = np.union1d(labels, preds)
        per_class = []
        for c in seen:
            tp = np.sum((preds == c) & (labels == c))
            per_class.append(2 * tp / (np.sum(preds == c) + np.sum(labels == c)))
        assert got == pytest.approx(float(np.mean(per_class)), abs=1e-12)


@pytest.mark.parametrize("seed", [6])
def test_mcc_matches_sklearn(seed):
    for i, (preds, labels, _) in enumerate(_classification_cases(seed)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = compute_metric("mcc", _as_list(i, preds), _as_list(i, labels))
        if len(set(preds.tolist())) < 2 or len(set(labels.tolist())) < 2:
            assert got is None  # undefined, never a plain 0.0
            continue
        assert got == pytest.approx(matthews_corrcoef(labels, preds), abs=1e-12)
        assert -1.0 <= got <= 1.0


@pytest.mark.parametrize("seed", [8])
def test_spearman_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    for i in range(CASES):
        size = int(rng.choice([3, 4, 10, 57, 400, 1500]))
        labels = rng.normal(size=size)
        if i % 4 == 0:  # STS-B-like scores: many ties
            labels = np.round(rng.uniform(0, 5, size=size) * 5) / 5
        if i % 4 == 1:  # SeaHorse-like: sixths
            labels = rng.integers(0, 7, size=size) / 6
        preds = labels * rng.uniform(-1, 2) + rng.normal(scale=rng.uniform(0.01, 3), size=size)
        if i % 7 == 0:
            preds = preds.astype(np.float32)
        got = compute_metric("spearman", _as_list(i, preds), _as_list(i, labels))
        want = spearmanr(preds, labels).statistic
        assert got == pytest.approx(float(want), abs=1e-9)
        assert type(got) is float


def test_perfect_and_inverted_scores():
    labels = [0, 1, 1, 0, 1]
    assert compute_metric("accuracy", labels, labels) == 1.0
    assert compute_metric("f1", labels, labels) == 1.0
    assert compute_metric("macro_f1", labels, labels) == 1.0
    assert compute_metric("mcc", labels, labels) == 1.0
    assert compute_metric("mcc", [1 - x for x in labels], labels) == -1.0
    assert compute_metric("spearman", [0.1, 0.2, 0.3], [1, 2, 3]) == pytest.approx(1.0)
    assert compute_metric("spearman", [0.3, 0.2, 0.1], [1, 2, 3]) == pytest.approx(-1.0)


# ----------------------------------------------------------------------------- degenerate


def _no_warnings(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args)


@pytest.mark.parametrize("constant", [0, 1, 2])
def test_mcc_constant_predictions_or_labels_is_undefined(constant):
    labels = [0, 1, 2, 1, 0, 2, 1]
    assert _no_warnings(compute_metric, "mcc", [constant] * len(labels), labels) is None
    assert undefined_reason("mcc", [constant] * len(labels), labels) == "constant predictions"
    assert undefined_reason("mcc", labels, [constant] * len(labels)) == "constant labels"
    assert _no_warnings(compute_metric, "mcc", [constant] * 4, [constant] * 4) is None
    assert compute_metric("mcc", [constant], [constant]) is None


def test_spearman_constant_targets_or_predictions_is_undefined():
    assert _no_warnings(compute_metric, "spearman", [0.1, 0.5, 0.9], [2.0, 2.0, 2.0]) is None
    assert _no_warnings(compute_metric, "spearman", [3.3, 3.3, 3.3], [1.0, 2.0, 5.0]) is None
    assert _no_warnings(compute_metric, "spearman", [1.0, 1.0], [1.0, 1.0]) is None
    assert undefined_reason("spearman", [0.7], [4.0]) == "fewer than two examples"
    with pytest.warns(Warning, match="constant"):  # where scipy would say nan
        assert np.isnan(spearmanr([0.1, 0.5, 0.9], [2.0, 2.0, 2.0]).statistic)


def test_f1_without_positive_predictions_is_zero_and_without_positives_undefined():
    assert _no_warnings(compute_metric, "f1", [0, 0, 0, 0], [0, 1, 1, 0]) == 0.0
    assert _no_warnings(compute_metric, "f1", [1, 1, 0], [0, 0, 0]) == 0.0
    assert _no_warnings(compute_metric, "f1", [0, 0, 0], [0, 0, 0]) is None  # no positives
    assert undefined_reason("f1", [0, 0], [0, 0]).startswith("no positive")


def test_macro_f1_with_a_missing_class():
    # Class 2 is in the labels but never predicted: its F1 is 0 and it still counts.
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 0, 1, 1, 1, 0]
    expected = (0.8 + 0.8 + 0.0) / 3  # class 0: p=2/3 r=1; class 1: p=2/3 r=1
    assert _no_warnings(macro_f1, preds, labels) == pytest.approx(expected)
    assert compute_metric("macro_f1", preds, labels) == pytest.approx(
        f1_score(labels, preds, average="macro", zero_division=0)
    )
    # A class in neither labels nor predictions (CB's small dev can lack one) is not averaged.
    assert compute_metric("macro_f1", [0, 1, 1], [0, 1, 1]) == 1.0


# ----------------------------------------------------------------------------- errors


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        compute_metric("accuracy", [0, 1, 1], [0, 1])


def test_empty_input_is_an_error():
    for name in METRICS:
        with pytest.raises(ValueError, match="empty"):
            compute_metric(name, [], [])


def test_unknown_metric_suggests_a_close_one():
    with pytest.raises(HarnessError) as err:
        compute_metric("acuracy", [1], [1])
    message = str(err.value)
    assert "unknown metric 'acuracy'" in message and "Did you mean 'accuracy'?" in message
    assert all(name in message for name in METRICS)
    with pytest.raises(HarnessError, match="Did you mean 'macro_f1'"):
        compute_metric("macro-f1", [1], [1])


def test_metric_set():
    assert set(METRICS) == {"accuracy", "f1", "macro_f1", "mcc", "spearman", "mrr_at_10",
                            "ndcg_at_10"}  # fmt: skip


# ----------------------------------------------------------------------------- specs


def test_every_metric_has_one_spec():
    assert list(METRICS) == list(METRIC_SPECS)
    for name, spec in METRIC_SPECS.items():
        assert spec.name == name and METRICS[name] is spec.fn is metric_spec(name).fn
        grouped = name in ("mrr_at_10", "ndcg_at_10")  # per query: they need the query groups
        assert spec.higher_is_better is True
        assert spec.granularity == ("grouped" if grouped else "pointwise")
        assert spec.label
    with pytest.raises(dataclasses.FrozenInstanceError):
        METRIC_SPECS["mcc"].higher_is_better = False


def test_metric_spec_of_an_unknown_name_suggests_a_close_one():
    with pytest.raises(HarnessError, match="unknown metric 'spearmann'.*Did you mean 'spearman'"):
        metric_spec("spearmann")


def test_improves_reads_the_direction_and_never_counts_undefined(monkeypatch):
    assert improves(0.6, 0.5, "accuracy") and not improves(0.5, 0.5, "accuracy")
    assert not improves(0.4, 0.5, "accuracy")
    assert improves(-0.9, -math.inf, "mcc") and improves(0.1, None, "mcc")
    assert not improves(None, 0.5, "accuracy") and not improves(math.nan, -math.inf, "f1")
    lower = dataclasses.replace(METRIC_SPECS["accuracy"], higher_is_better=False)
    monkeypatch.setitem(METRIC_SPECS, "accuracy", lower)
    assert improves(0.4, 0.5, "accuracy") and not improves(0.6, 0.5, "accuracy")
    assert improves(0.9, -math.inf, "accuracy")  # no best yet: any defined score is one
    with pytest.raises(HarnessError, match="unknown metric"):
        improves(0.5, 0.4, "acc")


def test_one_direction_rule_for_registry_metrics_and_receipts(monkeypatch):
    """`direction` is the one rule: `sign` applies it to a registry metric, a receipt's
    `TaskResult.sign` to the direction it recorded (the synthetic suite's perplexity)."""
    assert (direction(True), direction(False)) == (1.0, -1.0)
    for name, spec in METRIC_SPECS.items():
        assert sign(name) == direction(spec.higher_is_better) == 1.0
        assert TaskResult(name, 0.5, spec.higher_is_better, 10).sign == sign(name)
    lower = dataclasses.replace(METRIC_SPECS["mcc"], higher_is_better=False)
    monkeypatch.setitem(METRIC_SPECS, "mcc", lower)
    assert sign("mcc") == TaskResult("perplexity", 3.0, False, 10).sign == -1.0


@pytest.mark.parametrize("name", ["accuracy", "f1", "macro_f1", "mcc", "spearman"])
def test_score_array_equals_compute_metric(name):
    """The numpy path of the resampling loops gives scikit-learn's / scipy's value, and the
    same undefined cases, on seeded random inputs (seed printed)."""
    from encoder_eval.core.metrics import compute_metric, score_array

    seed = 20261201
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        k = int(rng.integers(2, 5)) if name != "f1" else 2
        if name == "spearman":
            labels = rng.normal(size=n).round(int(rng.integers(0, 3)))
            preds = rng.normal(size=n).round(int(rng.integers(0, 3)))
        else:
            labels = rng.integers(0, k, size=n)
            preds = np.where(rng.random(n) < 0.6, labels, rng.integers(0, k, size=n))
        if trial % 17 == 0:
            preds = np.full(n, preds[0])  # constant predictions: undefined for some metrics
        want = compute_metric(name, preds.tolist(), labels.tolist())
        got = score_array(name, preds, labels)
        assert (want is None) == (got is None), (trial, preds, labels)
        if want is not None:
            assert got == pytest.approx(want, abs=1e-12), (trial, preds, labels)
