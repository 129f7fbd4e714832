"""The probing core on embeddings given as arrays: fold protocol, Q, leakage, stored probes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score
from sklearn.model_selection import ShuffleSplit
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from encoder_eval.cells import probing as P
from encoder_eval.core.errors import HarnessError

SEED = 20261201


def _classification(rng: np.random.Generator, n: int, d: int = 8, classes: int = 2):
    x = rng.normal(size=(n, d))
    if classes == 2:
        y = (x[:, 0] + 0.8 * rng.normal(size=n) > 0).astype(int)
    else:
        y = np.argmax(x[:, :classes] + 0.7 * rng.normal(size=(n, classes)), axis=1)
    return x, y


def _regression(rng: np.random.Generator, n: int, d: int = 6):
    x = rng.normal(size=(n, d))
    return x, 2.0 * x[:, 0] - x[:, 1] + 0.5 * rng.normal(size=n) + 10.0


def _class_task(rng, classes: int = 2, metric: str = "accuracy") -> P.ProbeTask:
    tx, ty = _classification(rng, 240, classes=classes)
    rx, ry = _classification(rng, 120, classes=classes)
    return P.ProbeTask("cls", P.CLASSIFICATION, metric, tx, ty, {"en": rx}, {"en": ry})


def _regr_task(rng) -> P.ProbeTask:
    tx, ty = _regression(rng, 200)
    rx, ry = _regression(rng, 100)
    return P.ProbeTask("reg", P.REGRESSION, "spearman", tx, ty, {"en": rx}, {"en": ry})


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_q_recomputes_from_q_t(kind):
    print("seed", SEED)
    rng = np.random.default_rng(SEED)
    task = _class_task(rng) if kind == "classification" else _regr_task(rng)
    config = P.ProbeConfig(k_folds=5, seed=3)
    record = P.result_record(P.probe_task(task, config), {"model": "m", "pooling": "mean"},
                             config, fold_results=True)  # fmt: skip
    q_t = np.asarray(record["q_t"])
    assert len(q_t) == 5 and np.unique(q_t).size > 1  # folds differ, so std is not 0
    mean, std = q_t.mean(), q_t.std(ddof=1)
    assert record["mean_score"] == pytest.approx(mean, abs=1e-12)
    assert record["std_dev"] == pytest.approx(std, abs=1e-12)
    assert record["q_stat"] == pytest.approx(2 * mean / (0.02 + std), rel=1e-12)
    assert record["schema"] == "encoder-eval-probe" and record["schema_version"] == 1
    assert record["protocol"]["on_protocol"] and record["protocol"]["neuco_rules"] == []
    assert record["secondary"]["metric"] == ("macro_f1" if kind == "classification" else "r2")
    assert len(record["hyperparameters"]["per_fold"]) == 5
    assert set(record["hyperparameters"]["per_fold"]) <= set(record["hyperparameters"]["grid"])
    without = P.result_record(P.probe_task(task, config), {"model": "m"}, config)
    assert "q_t" not in without and "folds" not in without


def test_folds_follow_the_documented_protocol():
    """Each fold: ShuffleSplit (10 % held out), scaler and probe fitted on the fold's other
    rows, C chosen on the held-out tenth from the fixed grid, the chosen probe scored on the
    report split: recomputed here with plain scikit-learn pipelines."""
    rng = np.random.default_rng(SEED + 1)
    task = _class_task(rng)
    config = P.ProbeConfig(k_folds=4, seed=11)
    outcome = P.probe_task(task, config)
    splits = ShuffleSplit(4, test_size=0.1, random_state=11).split(task.train_x)
    for fold, (fit, held) in enumerate(splits):
        best = None
        for c in P.C_GRID:
            pipe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
            pipe.fit(task.train_x[fit], task.train_y[fit])
            val = accuracy_score(task.train_y[held], pipe.predict(task.train_x[held]))
            if best is None or val > best[0]:
                best = (val, c, pipe)
        assert outcome.chosen[fold] == best[1]
        expected = accuracy_score(task.report_y["en"], best[2].predict(task.report_x["en"]))
        assert outcome.fold_scores[fold] == pytest.approx(expected, abs=1e-12)
        # the harness's own predictor agrees with the sklearn pipeline row by row
        np.testing.assert_array_equal(
            outcome.fold_probes[fold].predict(task.report_x["en"]),
            best[2].predict(task.report_x["en"]),
        )


def test_rerun_is_byte_identical(tmp_path):
    rng = np.random.default_rng(SEED + 2)
    tasks = [_class_task(rng, classes=3, metric="macro_f1"), _regr_task(rng)]
    config = P.ProbeConfig(k_folds=4, seed=7)
    texts = []
    for attempt in ("a", "b"):
        for task in tasks:
            record = P.result_record(P.probe_task(task, config), {"model": "m"}, config,
                                     fold_results=True)  # fmt: skip
            path = tmp_path / attempt / f"{task.name}.json"
            P.write_result(path, record)
        texts.append([
            "".join(line for line in (tmp_path / attempt / f"{t.name}.json").open()
                    if '"created_at"' not in line)
            for t in tasks
        ])  # fmt: skip
    assert texts[0] == texts[1]
    assert '"q_stat"' in texts[0][0]
    other = P.probe_task(tasks[0], P.ProbeConfig(k_folds=4, seed=8))
    assert other.fold_scores != P.probe_task(tasks[0], config).fold_scores  # the seed matters


def _leak_data(rng, shifted_scale: float):
    """Train and English report rows of one distribution; a second report language whose
    informative feature has `shifted_scale` times the scale. The headline is the English
    score alone (Euro language), so the second language must not move it."""
    tx, ty = _classification(rng, 300)
    rx, ry = _classification(rng, 200)
    sx, sy = _classification(rng, 200)
    sx[:, 0] *= shifted_scale
    return tx, ty, {"en": rx, "xx": sx}, {"en": ry, "xx": sy}


def test_no_leakage_global_standardization_would_change_the_score():
    print("seed", SEED + 3)
    scores: dict[tuple, float] = {}
    for rules in ((), ("global_standardization",)):
        for shifted in (1.0, 100.0):
            tx, ty, rx, ry = _leak_data(np.random.default_rng(SEED + 3), shifted)
            task = P.ProbeTask("leak", P.CLASSIFICATION, "accuracy", tx, ty, rx, ry,
                               euro_languages=("en",))  # fmt: skip
            outcome = P.probe_task(task, P.ProbeConfig(k_folds=5, neuco_rules=rules))
            assert outcome.fold_languages[0].keys() == {"en", "xx"}
            scores[rules, shifted] = (outcome.mean_score, outcome.chosen)
    # ours: the English headline does not depend on the other rows at all
    assert scores[(), 1.0] == scores[(), 100.0]
    # NeuCo's global statistics see the shifted rows: the English score and the choice move
    glob = ("global_standardization",)
    assert scores[glob, 1.0][1] != scores[glob, 100.0][1]
    assert abs(scores[glob, 1.0][0] - scores[glob, 100.0][0]) > 0.001


def test_best_fold_score_rule_is_marked_and_reports_the_choosing_rows():
    rng = np.random.default_rng(SEED + 4)
    task = _class_task(rng)
    config = P.ProbeConfig(k_folds=3, seed=5, neuco_rules=("best_fold_score",))
    outcome = P.probe_task(task, config)
    splits = ShuffleSplit(3, test_size=0.1, random_state=5).split(task.train_x)
    for fold, (fit, held) in enumerate(splits):
        vals = []
        for c in P.C_GRID:
            pipe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
            pipe.fit(task.train_x[fit], task.train_y[fit])
            vals.append(accuracy_score(task.train_y[held], pipe.predict(task.train_x[held])))
        assert outcome.fold_scores[fold] == pytest.approx(max(vals), abs=1e-12)
    record = P.result_record(outcome, {"model": "m"}, config)
    assert record["protocol"]["on_protocol"] is False
    assert record["protocol"]["neuco_rules"] == ["best_fold_score"]
    assert "best_fold_score" in record["protocol"]["off_protocol_reasons"][0]
    assert "chose" in record["scored_on"]


def test_neuco_mode_without_report_split_scores_held_out_rows():
    rng = np.random.default_rng(SEED + 5)
    x, y = _regression(rng, 150)
    task = P.ProbeTask("r", P.REGRESSION, P.R2, x, y)
    outcome = P.probe_task(task, P.ProbeConfig(k_folds=4, normalize_labels=True))
    assert outcome.scored_on == "held-out rows of each fold"
    assert all(0.5 < s < 1.0 for s in outcome.fold_scores)  # a real linear signal
    assert outcome.n_report == {}


@pytest.mark.parametrize("kind", ["binary", "three classes", "regression"])
def test_load_probe_round_trip_predicts_identically(tmp_path, kind):
    rng = np.random.default_rng(SEED + 6)
    task = _regr_task(rng) if kind == "regression" else _class_task(
        rng, classes=2 if kind == "binary" else 3, metric="macro_f1")  # fmt: skip
    config = P.ProbeConfig(k_folds=3, normalize_labels=True)
    fitted = P.final_probe(task, config, P.probe_task(task, config))
    P.save_probe(tmp_path / "probe", fitted)
    assert [p.name for p in (tmp_path / "probe").iterdir()] == ["probe.json"]
    loaded, task_type = P.load_probe(tmp_path / "probe")
    assert task_type == task.task_type
    rows = task.report_x["en"]
    np.testing.assert_array_equal(loaded.predict(rows), fitted.predict(rows))
    strength = fitted.hyperparameters["alpha" if kind == "regression" else "C"]
    if kind == "regression":  # sklearn on the same rows agrees (to rounding)
        pipe = make_pipeline(StandardScaler(), Ridge(alpha=strength, solver="cholesky"))
        y = task.train_y
        pipe.fit(task.train_x, (y - y.min()) / (y.max() - y.min()))
        expected = pipe.predict(rows) * (y.max() - y.min()) + y.min()
        np.testing.assert_allclose(loaded.predict(rows), expected, rtol=1e-9, atol=1e-9)
    else:
        pipe = make_pipeline(StandardScaler(), LogisticRegression(C=strength, max_iter=2000))
        pipe.fit(task.train_x, task.train_y)
        np.testing.assert_array_equal(loaded.predict(rows), pipe.predict(rows))


def test_load_probe_refuses_missing_and_foreign_files(tmp_path):
    with pytest.raises(HarnessError, match="no stored probe"):
        P.load_probe(tmp_path)
    (tmp_path / "probe.json").write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(HarnessError, match="encoder-eval-stored-probe"):
        P.load_probe(tmp_path)
    rng = np.random.default_rng(SEED + 10)
    task = _class_task(rng, classes=3, metric="macro_f1")
    config = P.ProbeConfig(k_folds=2)
    stored = P.final_probe(task, config, P.probe_task(task, config)).to_dict()
    stored["classes"] = stored["classes"][:2]  # 3 rows of coefficients for 2 classes
    (tmp_path / "probe.json").write_text(json.dumps(stored))
    with pytest.raises(HarnessError, match="do not fit together"):
        P.load_probe(tmp_path)


def test_bad_input_errors_list_valid_names():
    rng = np.random.default_rng(SEED + 7)
    x, y = _classification(rng, 50)
    with pytest.raises(HarnessError) as exc:
        P.ProbeTask("t", "clasification", "accuracy", x, y)
    assert "Did you mean 'classification'?" in str(exc.value)
    assert "classification, regression" in str(exc.value)
    with pytest.raises(HarnessError) as exc:
        P.ProbeConfig(neuco_rules=("global_standardisation",))
    assert "best_fold_score, drop_incomplete_runs, global_standardization" in str(exc.value)
    with pytest.raises(HarnessError, match="2 or more"):
        P.ProbeConfig(k_folds=1)
    with pytest.raises(HarnessError, match=r"shape \(50, 8\) for 49 labels"):
        P.ProbeTask("t", P.CLASSIFICATION, "accuracy", x, y[:-1])
    with pytest.raises(HarnessError, match="report embeddings"):
        P.ProbeTask("t", P.CLASSIFICATION, "accuracy", x, y, {"en": x[:, :3]}, {"en": y})


def test_run_summary_aggregates_tasks():
    rng = np.random.default_rng(SEED + 8)
    config = P.ProbeConfig(k_folds=3)
    records = [P.result_record(P.probe_task(t, config), {"model": "m"}, config)
               for t in (_class_task(rng), _regr_task(rng))]  # fmt: skip
    summary = P.run_summary("m", records, config.to_dict())
    assert summary["task_q_scores"] == {"cls": records[0]["q_stat"], "reg": records[1]["q_stat"]}
    assert summary["overall_q_score"] == pytest.approx(
        (records[0]["q_stat"] + records[1]["q_stat"]) / 2)  # fmt: skip
    assert summary["overall_acc_score"] == pytest.approx(
        (records[0]["mean_score"] + records[1]["mean_score"]) / 2)  # fmt: skip
    assert summary["config"]["k_folds"] == 3 and summary["on_protocol"] is True


def test_task_from_registry_seam_reads_the_task_labels():
    """The extraction seam: arrays in the order of `load_task`'s splits. Here the embedding
    is the label plus noise, so the probe must find it; the row count is checked."""
    from encoder_eval.data.task_loading import load_task

    rng = np.random.default_rng(SEED + 9)
    train, _, test, _, _ = load_task("synthetic_sentiment")

    def embed(labels):
        labels = np.asarray(labels, dtype=float)
        return np.column_stack([labels + 0.3 * rng.normal(size=labels.size),
                                rng.normal(size=(labels.size, 3))])  # fmt: skip

    task = P.task_from_registry("synthetic_sentiment", embed(train["label"]),
                                {"en": embed(test["en"]["label"])})  # fmt: skip
    assert task.metric == "accuracy" and task.task_type == P.CLASSIFICATION
    outcome = P.probe_task(task, P.ProbeConfig(k_folds=3))
    assert outcome.mean_score > 0.9
    with pytest.raises(HarnessError, match="for 320 labels"):
        P.task_from_registry("synthetic_sentiment", embed(train["label"][:-1]),
                             {"en": embed(test["en"]["label"])})  # fmt: skip
    with pytest.raises(HarnessError, match="no report embeddings for language"):
        P.task_from_registry("synthetic_sentiment", embed(train["label"]), {})


def test_task_from_registry_multilingual_headline_is_the_euro_mean(small_mirror):
    """A multilingual task of the real data (small mirror slice): one report array per
    language, the headline the mean over the Euro languages, as in fine-tuning."""
    from encoder_eval.data.task_loading import load_task

    rng = np.random.default_rng(SEED + 11)
    train, _, test, num_labels, _ = load_task("amazon_reviews_multi", small_mirror)

    def embed(labels):
        onehot = np.eye(num_labels)[np.asarray(labels)]
        return onehot + 0.6 * rng.normal(size=onehot.shape)

    task = P.task_from_registry("amazon_reviews_multi", embed(train["label"]),
                                {lang: embed(s["label"]) for lang, s in test.items()},
                                small_mirror)  # fmt: skip
    outcome = P.probe_task(task, P.ProbeConfig(k_folds=3))
    assert set(outcome.fold_languages[0]) == set(test) and len(test) > 1
    for fold, per_lang in enumerate(outcome.fold_languages):
        euro = [per_lang[lang] for lang in per_lang if lang in task.euro_languages]
        assert outcome.fold_scores[fold] == pytest.approx(np.mean(euro), abs=1e-12)
    # the headline follows the task's Euro languages, not all languages scored
    narrow = P.probe_task(dataclasses.replace(task, euro_languages=("de", "en")),
                          P.ProbeConfig(k_folds=3))  # fmt: skip
    assert narrow.fold_languages == outcome.fold_languages
    for fold, per_lang in enumerate(narrow.fold_languages):
        expected = (per_lang["de"] + per_lang["en"]) / 2
        assert narrow.fold_scores[fold] == pytest.approx(expected, abs=1e-12)
    assert narrow.fold_scores != outcome.fold_scores
