"""A probe cell and a fine-tune cell through the same code: one reader (`results.read_result`),
one "done" (`results.cell_state`, identity check included) and one comparability rule
(`comparability.cell_setup` / `setup_differences`), and the probe table built on them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from result_helpers import make_result

from encoder_eval.core.comparability import (
    cell_setup,
    receipt_setup,
    setup_differences,
    transformers_version,
)
from encoder_eval.core.receipt import TrackSetup
from encoder_eval.core.results import (
    CORRUPT,
    KEPT,
    MISSING,
    cell_state,
    probe_result_filename,
    read_result,
    result_filename,
)
from encoder_eval.core.schema import PROBE_SCHEMA_NAME, PROBE_SCHEMA_VERSION
from encoder_eval.reports.probe_table import probe_table


def probe_record(model="m", pooling="mean", task="glue_sst2", k_folds=3, seed=42,
                 standardize=True, precision="bf16", q_t=(0.5, 0.6, 0.7)) -> dict:  # fmt: skip
    """A probe cell's result in the shape `cells.probing.result_record` writes."""
    return {
        "schema": PROBE_SCHEMA_NAME, "schema_version": PROBE_SCHEMA_VERSION,
        "cell": {"model": model, "pooling": pooling, "task": task,
                 "method": f"{model}:{pooling}"},
        "task_type": "classification", "metric": "accuracy",
        "mean_score": sum(q_t) / len(q_t), "std_dev": 0.1, "q_stat": 10.0, "q_t": list(q_t),
        "protocol": {"k_folds": k_folds, "seed": seed, "standardize": standardize,
                     "on_protocol": True},
        "provenance": {"embedding": {"precision": precision, "pooling": pooling}},
    }  # fmt: skip


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def test_one_reader_and_one_done_for_both_kinds_of_cell(tmp_path):
    probe = write(tmp_path, probe_result_filename("m", "mean", "glue_sst2"), probe_record())
    data = make_result("m", "glue_sst2", "lr06", 45, "report")
    c = data["cell"]
    fine = write(tmp_path, result_filename(c["model"], c["task"], c["lr"], c["seed"]), data)
    for path, phase in ((probe, "probe"), (fine, "report")):
        state, record, why = cell_state(path, phase, model="m", task="glue_sst2")
        assert (state, why) == ("ok", None) and record == read_result(path)[0]
    # each kind's phase: a probe result does not make a report cell done, nor the reverse
    assert cell_state(probe, "report")[0] == CORRUPT
    assert cell_state(fine, "probe")[0] == CORRUPT
    # the identity check: a probe result of another model under this cell's name
    other = write(tmp_path, "x.json", probe_record(model="other"))
    other.rename(renamed := tmp_path / probe_result_filename("m", "mean", "sg_cb"))
    state, _, why = cell_state(renamed)
    assert state == CORRUPT and "disagrees with its filename" in why
    assert cell_state(tmp_path / probe_result_filename("z", "mean", "sg_cb"))[0] == MISSING


@pytest.mark.parametrize("damage", ["metric", "protocol", "cell.task", "protocol.k_folds"])
def test_a_probe_result_missing_what_readers_need_is_not_done(tmp_path, damage):
    record = probe_record()
    section, _, key = damage.rpartition(".")
    del (record[section] if section else record)[key]
    path = write(tmp_path, probe_result_filename("m", "mean", "glue_sst2"), record)
    state, data, why = cell_state(path, "probe")
    assert state == CORRUPT and data is None and "not a valid probe result" in why


def test_a_newer_probe_result_is_left_alone(tmp_path):
    record = {**probe_record(), "schema_version": PROBE_SCHEMA_VERSION + 1}
    path = write(tmp_path, probe_result_filename("m", "mean", "glue_sst2"), record)
    assert cell_state(path)[0] == KEPT


def test_comparability_names_what_differs_for_either_kind():
    a, b = probe_record(), probe_record(standardize=False, precision="fp32")
    assert cell_setup(a) == {"folds": {"k_folds": 3, "seed": 42, "standardize": True},
                             "precision": "bf16"}  # fmt: skip
    differ = setup_differences(cell_setup(b), cell_setup(a), "others have")
    assert len(differ) == 2 and any("standardize" in d for d in differ)
    fine = make_result("m", "glue_sst2", "lr06", 45, "report")
    other = copy.deepcopy(fine)
    other["recipe"]["weight_decay"] = 0.0
    differ = setup_differences(cell_setup(other), cell_setup(fine), "others have")
    assert differ == ["recipe weight_decay=0.0 (others have 0.1)"]


def test_the_table_version_rule_and_the_receipt_setup_live_in_comparability():
    """The transformers version a table's cells must share, and the entries two tracking
    receipts must share (all but where the LR came from), are comparability's."""
    fine = make_result("m", "glue_sst2", "lr06", 45, "report", transformers="4.57.0")
    assert transformers_version(fine) == "4.57.0"
    del fine["provenance"]["software"]
    assert transformers_version(fine) == "None"  # unrecorded: one group of its own
    a = TrackSetup("finetune", ("glue_rte",), lr_key="lr06", lr_source="--lr-key", seeds=(45,))
    b = TrackSetup("finetune", ("glue_rte",), lr_key="lr06", lr_source="sel.json", seeds=(45,))
    assert a.comparable() == b.comparable() == receipt_setup(a.to_dict())
    assert "lr_source" not in a.comparable() and a.comparable()["lr_key"] == "lr06"
    c = TrackSetup("finetune", ("glue_rte",), lr_key="lr07", lr_source="--lr-key", seeds=(45,))
    assert c.comparable() != a.comparable()


def test_the_probe_table_refuses_a_cell_of_another_fold_setup():
    """Before the one rule, only k_folds and seed were compared: a cell probed without
    standardisation passed into the table unnoticed."""
    records = [probe_record(task=t) for t in ("glue_sst2", "sg_cb")]
    records.append(probe_record(model="n", task="glue_sst2", standardize=False))
    records.append(probe_record(model="n", task="sg_cb"))
    table = probe_table(records)
    (problem,) = [p for p in table.problems if p.rule == "probe_setup"]
    assert problem.cells == ["n:mean/glue_sst2: folds {'k_folds': 3, 'seed': 42, "
                             "'standardize': False} (the table has {'k_folds': 3, 'seed': 42, "
                             "'standardize': True})"]  # fmt: skip
