"""Per-example predictions: every report cell writes them by default, validated and in step
with its result, so `compare` can pair models on the same examples."""

from __future__ import annotations

import json

import pytest
from conftest import read_json
from test_cell import SHORT, cell

from encoder_eval.cells import predictions, train
from encoder_eval.cells.predictions import (
    PredictionsError,
    check_against_result,
    load_predictions,
    predictions_path,
)
from encoder_eval.core.schema import CellResult
from encoder_eval.data.task_loading import load_task


def test_a_report_cell_writes_predictions_that_recompute_its_scores(
    tiny_models, small_mirror, tmp_path
):
    cfg = cell(tmp_path, tiny_models["bert"], task="amazon_reviews_multi",
               data_dir=str(small_mirror))  # fmt: skip
    result = CellResult.from_dict(train.run_cell(cfg))
    preds = load_predictions(predictions_path(cfg.out_json))
    assert check_against_result(preds, result) == []
    assert preds.cell == result.cell and preds.data_identity == result.data_identity
    # One entry per report example of each language, ids in report-split order, and the
    # labels are the gold labels the loader read.
    _, _, test, _, _ = load_task("amazon_reviews_multi", str(small_mirror))
    assert set(preds.languages) == set(test) == {"de", "en", "es", "fr"}
    for lang, split in test.items():
        p = preds.languages[lang]
        assert p.ids == list(range(len(split["label"])))
        assert p.labels == split["label"]
        assert all(isinstance(x, int) and 0 <= x < 5 for x in p.predictions)
    # Compact: no indentation in a file that is data.
    assert "\n " not in predictions_path(cfg.out_json).read_text()


def test_regression_predictions_are_the_scores(tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models["bert"], task="glue_stsb", data_dir=str(small_mirror))
    result = CellResult.from_dict(train.run_cell(cfg))
    preds = load_predictions(predictions_path(cfg.out_json))
    assert check_against_result(preds, result) == []
    assert all(isinstance(x, float) for x in preds.languages["en"].predictions)


def test_select_cells_and_turned_off_predictions_write_none_and_drop_a_stale_file(
    tiny_models, small_mirror, tmp_path
):
    select = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror), phase="select",
                  seed=42)  # fmt: skip
    train.run_cell(select)
    assert not predictions_path(select.out_json).exists()

    report = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror))
    train.run_cell(report)
    assert predictions_path(report.out_json).exists()
    off = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror), save_predictions=False)
    train.run_cell(off)  # the same cell again: the old file would describe the other run
    assert not predictions_path(off.out_json).exists()


def test_a_stale_or_tampered_predictions_file_is_caught(tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models["bert"], task="sg_cb", data_dir=str(small_mirror),
               recipe=SHORT)  # fmt: skip
    result = CellResult.from_dict(train.run_cell(cfg))
    path = predictions_path(cfg.out_json)
    obj = read_json(path)
    en = obj["languages"]["en"]
    en["predictions"] = [(p + 1) % 3 for p in en["predictions"]]  # every prediction changed
    path.write_text(json.dumps(obj))
    problems = check_against_result(load_predictions(path), result)
    assert len(problems) == 1 and problems[0].startswith("en: predictions score")

    obj["cell"]["seed"] = 46
    path.write_text(json.dumps(obj))
    assert "belongs to cell" in check_against_result(load_predictions(path), result)[0]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda o: o.update(schema="x"), "schema is 'x'"),
        (lambda o: o["languages"]["en"]["ids"].pop(), "differ in length"),
        (lambda o: o["languages"]["en"].update(ids=[0, 0, 1]), "ids repeat"),
        (lambda o: o["languages"]["en"]["labels"].__setitem__(0, "a"), "finite number"),
        (lambda o: o.update(metric="bleu"), "metric 'bleu' is not one of"),
        (lambda o: o.update(languages={}), "languages: not a non-empty object"),
    ],
)
def test_invalid_predictions_files_are_refused_with_the_reason(change, message, tmp_path):
    obj = {
        "schema": predictions.SCHEMA_NAME,
        "schema_version": predictions.SCHEMA_VERSION,
        "cell": {
            "model": "m",
            "task": "sg_cb",
            "lr": 1e-4,
            "lr_key": "lr",
            "seed": 45,
            "phase": "report",
        },  # fmt: skip
        "metric": "accuracy",
        "split": "validation",
        "data_identity": "mirror:x",
        "languages": {"en": {"ids": [0, 1, 2], "predictions": [0, 1, 2], "labels": [0, 1, 1]}},
    }
    path = tmp_path / "x.predictions.json"
    path.write_text(json.dumps(obj))
    assert load_predictions(path).languages["en"].labels == [0, 1, 1]
    change(obj)
    path.write_text(json.dumps(obj))
    with pytest.raises(PredictionsError, match=message):
        load_predictions(path)
    path.write_text("{not json")
    with pytest.raises(PredictionsError, match="unreadable predictions file"):
        load_predictions(path)
    with pytest.raises(PredictionsError, match="no predictions file"):
        load_predictions(tmp_path / "absent.predictions.json")
