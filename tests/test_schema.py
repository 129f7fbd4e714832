"""The result schema (encoder_eval/core/schema.py): real results round-trip unchanged, the
validator's rules and messages, older files refused as before, typed reading."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from result_helpers import make_result, write_result

from encoder_eval.cells import cell_config, train
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import (
    CORRUPT,
    LoadedResult,
    cell_state,
    load_results,
    read_cell_result,
    read_result,
    result_filename,
)
from encoder_eval.core.schema import (
    SCHEMA_VERSION,
    CellId,
    CellResult,
    ScoreSection,
    Training,
    validate_result,
)


@pytest.fixture(scope="module", params=["select", "report"])
def real_result(request, tiny_models, small_mirror, tmp_path_factory):
    """The file a real (tiny) cell wrote, as text: a select cell and a report cell."""
    out = tmp_path_factory.mktemp("cell") / result_filename("tiny", "glue_rte", 1e-4, 45)
    cfg = cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4, seed=45, model_key="tiny",
        recipe=Recipe(max_steps=4, patience=3, max_seq_len=128), device="cpu", progress="quiet",
        data_dir=str(small_mirror), phase=request.param, out_json=str(out),
    )  # fmt: skip
    train.run_cell(cfg)
    return out


def test_a_real_result_round_trips_through_the_schema_byte_for_byte(real_result):
    text = real_result.read_text(encoding="utf-8")
    data = json.loads(text)
    result = CellResult.from_dict(data)
    assert result.to_dict() == data
    # Same keys in the same order at every level: the written file is reproduced exactly.
    assert json.dumps(result.to_dict(), indent=2) + "\n" == text
    assert not result.extra and not result.training.extra  # the schema names every key
    assert isinstance(result.cell, CellId) and result.cell.model == "tiny"
    assert isinstance(result.training, Training) and result.training.steps == 4
    assert isinstance(result.dev, ScoreSection) and result.dev.split is None
    if result.cell.phase == "report":
        assert result.report.split == "validation"
        assert result.score("report") == data["report"]["mean"]
    else:
        assert result.report is None


def test_the_writer_can_build_a_result_from_typed_parts(real_result):
    data = json.loads(real_result.read_text(encoding="utf-8"))
    rebuilt = CellResult(
        cell=CellId(**data["cell"]),
        status=data["status"],
        metric=data["metric"],
        dev=ScoreSection(**data["dev"]),
        report=None if data["report"] is None else ScoreSection(**data["report"]),
        training=Training(**data["training"]),
        recipe=data["recipe"],
        protocol=CellResult.from_dict(data).protocol,
        provenance=data["provenance"],
        created_at=data["created_at"],
    )
    assert json.dumps(rebuilt.to_dict()) == json.dumps(data)


def test_loaded_results_give_typed_access_and_keep_the_raw_data(tmp_path):
    path = write_result(tmp_path, make_result("m", "glue_rte", "lr06", 45, "report", 0.7))
    (loaded,) = load_results(tmp_path)
    assert isinstance(loaded, LoadedResult)
    assert loaded.result.cell.seed == 45 and loaded.result.score("report") == 0.7
    assert loaded.cell["seed"] == 45 and loaded.data == json.loads(path.read_text())
    assert loaded.ok and loaded.result.ok
    typed, why = read_cell_result(path)
    assert why is None and typed == loaded.result
    assert read_cell_result(tmp_path / "absent.json") == (None, "unreadable (FileNotFoundError)")


def test_unknown_keys_are_kept_in_place_after_the_known_ones():
    data = make_result("m", "glue_rte", "lr06", 45, "report", 0.7)
    data["future_section"] = {"a": 1}
    data["training"]["new_counter"] = 3
    data["report"]["ci95"] = [0.6, 0.8]
    out = CellResult.from_dict(copy.deepcopy(data)).to_dict()
    assert json.dumps(out) == json.dumps(data)


def test_a_sparse_but_valid_result_reads_with_defaults():
    data = make_result("m", "glue_rte", "lr06", 45, "select", 0.7)
    data["training"] = {"diverged_at_step": None}
    del data["dev"]["languages_in_mean"]
    result = CellResult.from_dict(data)
    assert result.training.steps is None and result.training.dev_history == []
    assert result.dev.languages_in_mean == [] and result.dev.mean == 0.7


def test_a_result_from_before_the_out_of_memory_record_reads_and_writes_back_unchanged():
    data = make_result("m", "glue_rte", "lr06", 45, "report", 0.7)
    for key in ("oom_retries", "micro_batch_used", "grad_accumulation_used", "eval_oom_retries",
                "eval_batch_used"):  # fmt: skip
        data["training"].pop(key, None)
    result = CellResult.from_dict(copy.deepcopy(data))
    assert result.training.oom_retries is None and result.training.micro_batch_used is None
    assert json.dumps(result.to_dict()) == json.dumps(data)
    recorded = dataclasses.replace(result.training, oom_retries=2, micro_batch_used=8)
    assert recorded.to_dict()["oom_retries"] == 2 and "eval_batch_used" not in recorded.to_dict()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("oom_retries", -1, "training.oom_retries is -1, not null or an integer of at least 0"),
    ("micro_batch_used", 0, "training.micro_batch_used is 0, not null or an integer of at least 1"),
    ("eval_batch_used", "4", "training.eval_batch_used is '4', not null or an integer of at "
     "least 1"),
    ("grad_accumulation_used", True, "training.grad_accumulation_used is True, not null or an "
     "integer of at least 1"),
])  # fmt: skip
def test_the_out_of_memory_record_is_typed(key, value, message):
    data = make_result("m", "glue_rte", "lr06", 45, "report", 0.7)
    data["training"][key] = value
    assert validate_result(data) == [message]


def _broken(mutate) -> dict:
    data = make_result("m", "glue_rte", "lr06", 45, "report", 0.7)
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema_version=1), "written by an older harness (schema_version 1, "
         f"this one reads {SCHEMA_VERSION}); re-run the cell"),
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1),
         f"schema_version is {SCHEMA_VERSION + 1}, expected {SCHEMA_VERSION}"),
        (lambda d: d.update(schema="other"), "schema is 'other', expected 'encoder-eval-result'"),
        (lambda d: d.pop("cell"), "missing 'cell'"),
        (lambda d: d["cell"].pop("model"), "cell.model missing or not a str"),
        (lambda d: d["cell"].update(lr_key=6), "cell.lr_key missing or not a str"),
        (lambda d: d["cell"].update(lr=-1.0), "cell.lr missing or not a positive number"),
        (lambda d: d["cell"].update(seed="45"), "cell.seed missing or not an integer"),
        (lambda d: d["cell"].update(phase="train"), "cell.phase is 'train', expected select or report"),
        (lambda d: d.update(status="crashed"), "status is 'crashed', expected one of ('ok', 'diverged')"),
        (lambda d: d.pop("metric"), "metric missing"),
        (lambda d: d.update(training=None), "missing section 'training'"),
        (lambda d: d.update(report=None), "status ok but report scores are missing"),
        (lambda d: d["dev"].pop("per_language"), "dev.per_language missing"),
        (lambda d: d["report"].update(mean=None, undefined={}),
         "report.mean is missing or not finite, and no report.undefined says why"),
        (lambda d: d.update(status="diverged"), "diverged cell without training.diverged_at_step"),
        (lambda d: d["protocol"].pop("on_protocol"), "protocol.on_protocol missing"),
        (lambda d: d["recipe"].update(selection_split="test"),
         "recipe.selection_split is 'test', expected one of ('dev', 'holdout')"),
        (lambda d: d["provenance"].pop("data"),
         "provenance.data.identity missing (the data source the cell read)"),
    ],
)  # fmt: skip
def test_each_rule_of_the_schema_names_what_is_wrong(mutate, message):
    data = _broken(mutate)
    assert message in validate_result(data)
    with pytest.raises(ValueError, match="not a valid result"):
        CellResult.from_dict(data)


def test_a_select_cell_must_not_hold_a_report_score():
    data = make_result("m", "glue_rte", "lr06", 42, "select", 0.7)
    data["report"] = copy.deepcopy(data["dev"])
    assert validate_result(data) == ["a select cell must not hold a report score"]
    assert validate_result([1, 2]) == ["not a JSON object"]


def test_a_file_from_the_previous_harness_is_refused_with_the_older_harness_message(tmp_path):
    old = make_result("m", "glue_rte", "lr06", 45, "report", 0.7)
    old["schema_version"] = 1
    path = write_result(tmp_path, old)
    data, why = read_result(path)
    assert data is None
    assert why == ("not a valid result: written by an older harness (schema_version 1, this "
                   f"one reads {SCHEMA_VERSION}); re-run the cell")  # fmt: skip
    assert cell_state(path) == (CORRUPT, None, why)
    warnings: list[str] = []
    assert load_results(tmp_path, warn=warnings.append) == []
    assert warnings == [f"skipping {path}: {why}"]
