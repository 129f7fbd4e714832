"""`encoder-eval estimate`: step caps from the protocol, step costs from measured cells."""

from __future__ import annotations

import json

import pytest
from result_helpers import make_result, write_many

from encoder_eval import estimate
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import PROTOCOL_RECIPE
from encoder_eval.data.tasks import TASK_KNOBS, group_tasks


def _measured(model: str, task: str, seed: int, steps: int, cap: int, seconds: float, gpu=None,
              on_protocol=True):  # fmt: skip
    r = make_result(model, task, "lr06", seed, "select", on_protocol=on_protocol)
    r["training"].update(steps=steps, max_steps=cap, train_time_s=seconds)
    r["provenance"]["hardware"] = {"cpu": "Test CPU", "gpu": gpu}
    return r


def test_every_suite_task_has_a_step_cap():
    assert all(TASK_KNOBS[t].train_rows is not None for t in group_tasks("all"))
    assert estimate.cell_step_cap("xnli") == PROTOCOL_RECIPE.max_steps
    assert estimate.cell_step_cap("glue_rte") == 20 * 78  # 2,490 rows: 78 steps an epoch
    assert estimate.cell_step_cap("sg_cb") == 20 * 8
    with pytest.raises(HarnessError, match="no full-data size"):
        estimate.cell_step_cap("synthetic_nli")


def test_cost_is_measured_seconds_per_step_times_the_protocol_budget(tmp_path):
    write_many(tmp_path, [
        _measured("m", "glue_rte", 42, steps=100, cap=400, seconds=40.0),
        _measured("m", "glue_rte", 43, steps=300, cap=400, seconds=160.0),
        _measured("m", "glue_rte", 44, steps=50, cap=50, seconds=25.0, on_protocol=False),
        _measured("fast", "glue_rte", 42, steps=200, cap=200, seconds=20.0, gpu="Test GPU"),
        _measured("shrunk", "glue_rte", 42, steps=40, cap=40, seconds=4.0, on_protocol=False),
    ])  # fmt: skip
    costs = {c.model: c for c in estimate.measure([str(tmp_path)])}
    m = costs["m"]
    assert m.cells == 3 and m.seconds_per_step == pytest.approx(225 / 450)
    # the share of the step cap comes from on-protocol cells only (a shrunken cap is no cap)
    assert m.budget_share == pytest.approx(0.5) and m.device == "CPU (Test CPU)"
    upper, expected = m.hours(["glue_rte"])
    assert upper == pytest.approx(35 * 1560 * 0.5 / 3600)
    assert expected == pytest.approx(upper / 2)
    assert costs["fast"].device == "Test GPU" and costs["fast"].budget_share == 1.0
    assert costs["shrunk"].budget_share is None and costs["shrunk"].hours(["glue_rte"])[1] is None
    assert "| n/a |" in estimate.render([costs["shrunk"]], ["glue_rte"])


def test_cli_prints_json_and_refuses_an_empty_directory(tmp_path, capsys):
    write_many(tmp_path / "r", [_measured("m", "glue_rte", 42, 10, 20, 5.0)])
    assert estimate.main(["--results-dir", str(tmp_path / "r"), "--tasks", "glue",
                          "--format", "json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == group_tasks("glue") and out["cells_per_pair"] == 35
    assert out["models"][0]["seconds_per_step"] == 0.5
    (tmp_path / "empty").mkdir()
    assert estimate.main(["--results-dir", str(tmp_path / "empty")]) == 1
    assert "no finished cell" in capsys.readouterr().err
    assert estimate.main(["--results-dir", str(tmp_path / "nope")]) == 2


def test_estimate_says_when_its_cells_are_not_the_protocol_recipe(tmp_path, capsys):
    """Cells run in fp32 with a shrunken step cap (a CPU smoke run) time another step than
    the protocol's: estimate names the reasons, as the cells' results record them."""
    shrunk = {"precision": "fp32", "max_steps": 40}
    cells = [make_result("m", "glue_rte", "lr06", seed, "select", recipe=shrunk)
             for seed in (42, 43)]  # fmt: skip
    cells.append(make_result("m", "glue_rte", "lr06", 44, "select"))  # on protocol
    for r in cells:
        r["training"].update(steps=40, max_steps=40, train_time_s=20.0)
        r["provenance"]["hardware"] = {"cpu": "Test CPU", "gpu": None}
    write_many(tmp_path, cells)
    (cost,) = estimate.measure([str(tmp_path)])
    assert cost.off_protocol == 2
    assert cost.off_reasons == ("max_steps=40 (protocol: 10000)",
                                "precision=fp32 (protocol: bf16-autocast)")  # fmt: skip
    assert estimate.main(["--results-dir", str(tmp_path), "--tasks", "glue_rte"]) == 0
    out = capsys.readouterr().out
    assert ("not the protocol recipe: 2 of m's 3 measured cell(s) on CPU (Test CPU) are "
            "off-protocol (max_steps=40 (protocol: 10000); precision=fp32 (protocol: "
            "bf16-autocast))") in out  # fmt: skip
    assert estimate.main(["--results-dir", str(tmp_path), "--tasks", "glue_rte",
                          "--format", "json"]) == 0  # fmt: skip
    (row,) = json.loads(capsys.readouterr().out)["models"]
    assert row["off_protocol_cells"] == 2 and len(row["off_protocol_reasons"]) == 2
