"""NeuCo-Bench's SVM probe: the config's search space, the seeded Bayesian search, and the
stored probe's sklearn-free predictions against scikit-learn's own."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.svm import SVC, SVR

from encoder_eval.cells import probing as P
from encoder_eval.cells.svm_probe import SvmSearch, fit_svm
from encoder_eval.core.errors import HarnessError

SEED = 2712


def _data(n: int = 120, classes: int = 2, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    y = rng.integers(0, classes, size=n)
    x[:, 0] += 1.5 * y  # the class shows in dimension 0
    return x, y


@pytest.mark.parametrize("classes", [2, 3, 4])
def test_stored_svm_predicts_as_sklearn_classifier(classes, tmp_path):
    x, y = _data(classes=classes)
    params = {"C": 3.0, "degree": 3, "gamma": 0.2, "coef0": 0.5}
    shift, scale = x.mean(axis=0), x.std(axis=0)
    z = (x - shift) / scale
    probe = fit_svm(P.CLASSIFICATION, z, y, params, shift, scale)
    reference = SVC(kernel="poly", decision_function_shape="ovo", **params).fit(z, y)
    test_x = np.random.default_rng(SEED + classes).normal(size=(400, 5)) * 2
    test_z = (test_x - shift) / scale
    np.testing.assert_allclose(probe.decision(test_x).squeeze(-1) if classes == 2
                               else probe.decision(test_x),
                               reference.decision_function(test_z), rtol=1e-9, atol=1e-9)  # fmt: skip
    np.testing.assert_array_equal(probe.predict(test_x), reference.predict(test_z))
    # stored as JSON data and loaded back: the same predictions, no pickle
    P.save_probe(tmp_path, probe)
    assert b"support_vectors" in (tmp_path / "probe.json").read_bytes()
    loaded, task_type = P.load_probe(tmp_path)
    assert task_type == P.CLASSIFICATION and loaded.classes == list(range(classes))
    np.testing.assert_array_equal(loaded.predict(test_x), reference.predict(test_z))


def test_stored_svm_predicts_as_sklearn_regressor(tmp_path):
    x, _ = _data()
    y = 2.0 * x[:, 1] - x[:, 2] ** 2 + 40.0
    offset, span = float(y.min()), float(np.ptp(y))
    params = {"C": 10.0, "degree": 2, "coef0": 1.0, "epsilon": 0.01}  # gamma: sklearn's "scale"
    probe = fit_svm(P.REGRESSION, x, y, params, np.zeros(5), np.ones(5), offset, span)
    reference = SVR(kernel="poly", gamma="scale", **params).fit(x, (y - offset) / span)
    np.testing.assert_allclose(probe.predict(x), reference.predict(x) * span + offset, rtol=1e-9)
    P.save_probe(tmp_path, probe)
    loaded, task_type = P.load_probe(tmp_path)
    assert task_type == P.REGRESSION
    np.testing.assert_allclose(loaded.predict(x), probe.predict(x))


def _search(**extra) -> SvmSearch:
    # Narrow enough that no trial is slow: libsvm's poly fits with a large C, gamma and
    # degree take seconds each, with no iteration cap (as in NeuCo-Bench).
    params = {"C_start_end": [0.01, 10.0], "kernel_degree_list": [2, 3],
              "kernel_gamma_start_end": [0.001, 0.3], "kernel_coef0_start_end": [0.0, 2.0],
              "epsilon_list": [0.01, 0.1], "opt_params": {"n_iter": 6, "n_initial_points": 3},
              **extra}  # fmt: skip
    return SvmSearch.from_params(params, "c.yaml")


@pytest.mark.parametrize("task_type", [P.CLASSIFICATION, P.REGRESSION])
def test_search_stays_in_its_ranges_is_seeded_and_finds_the_signal(task_type):
    x, y = _data(n=160)
    if task_type == P.REGRESSION:
        y = 1.5 * x[:, 0] + 0.2 * np.random.default_rng(SEED).normal(size=len(x))
        task = P.ProbeTask("t", task_type, P.R2, x, y)
    else:
        task = P.ProbeTask("t", task_type, "f1", x, y)
    config = P.ProbeConfig(k_folds=3, seed=7, normalize_labels=True, std_ddof=0)
    search = _search()
    a, b = (P.probe_task(task, config, search) for _ in range(2))
    assert a.fold_scores == b.fold_scores and a.chosen == b.chosen  # seeded: identical reruns
    assert a.mean_score > 0.7  # the probe finds the signal in dimension 0
    assert [len(t) for t in a.trials] == [6, 6, 6]  # n_iter trials per fold, no more
    for fold_trials in a.trials:
        for trial in fold_trials:
            p = trial["params"]
            assert 0.01 <= p["C"] <= 10.0 and p["degree"] in (2, 3)
            assert 0.001 <= p["gamma"] <= 0.3 and 0.0 <= p["coef0"] <= 2.0
            assert ("epsilon" in p) == (task_type == P.REGRESSION)
    # each fold keeps its best trial's hyperparameters
    for chosen, fold_trials in zip(a.chosen, a.trials, strict=True):
        best = max(fold_trials, key=lambda t: t["score"])
        assert chosen == best["params"]
    # another search seed draws other trials
    other = P.probe_task(task, config, _search(opt_params={"n_iter": 6, "n_initial_points": 3,
                                                           "random_state": 99}))  # fmt: skip
    assert other.trials != a.trials
    record = P.result_record(a, {"method": "m"}, config, fold_results=True, provenance={})
    assert record["hyperparameters"]["name"] == "svm"
    assert record["hyperparameters"]["search"]["C"] == {"range": [0.01, 10.0],
                                                        "prior": "log-uniform"}  # fmt: skip
    assert record["hyperparameters"]["per_fold"] == a.chosen
    assert record["folds"][0]["hyperparameters"] == a.chosen[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kernel_degree_list": [1, 2]}, "kernel_coef0_start_end cannot be searched with degree 1"),
        ({"kernel_coef0_start_end": None, "kernel_degree_list": 1},
         "kernel_gamma_start_end cannot be searched with degree 1"),
        ({"C_start_end": [0.0, 1.0]}, "C_start_end is searched on a log scale"),
        ({"C_start_end": [5.0, 1.0]}, r"\[min, max\] with min < max"),
        ({"kernel_degree_list": [2, 2.5]}, "kernel_degree_list must be a positive integer"),
        ({"opt_params": {"cv": 5}}, "opt_params must not set cv"),
        ({"opt_params": {"n_iters": 5}}, "Did you mean 'n_iter'"),
        ({"opt_params": {"n_iter": 0}}, "opt_params n_iter must be an integer"),
        ({"epsilon_list": [-0.1]}, "epsilon_list must be a list of numbers >= 0"),
        ({"batch_size": 32}, "unknown svm probe_params key 'batch_size'"),
    ],
)  # fmt: skip
def test_svm_params_are_checked_as_neuco_bench_does(change, message):
    params = {"C_start_end": [0.01, 100.0], "kernel_degree_list": [2, 3],
              "kernel_gamma_start_end": [0.001, 1.0], "kernel_coef0_start_end": [0.0, 2.0]}  # fmt: skip
    params.update(change)
    params = {k: v for k, v in params.items() if v is not None}
    with pytest.raises(HarnessError, match=message):
        SvmSearch.from_params(params, "c.yaml")


def test_svm_params_defaults():
    search = SvmSearch.from_params({"C_start_end": [0.1, 10], "kernel_degree_list": 1}, "c")
    assert search.degrees == (1,) and search.gamma_range is None and search.coef0_range is None
    assert (search.n_iter, search.n_initial_points, search.random_state) == (50, 10, None)
    described = search.to_dict()
    assert described["gamma"] == "scale" and described["coef0"] == 0.0
    assert described["sampler"].startswith("optuna TPESampler")
