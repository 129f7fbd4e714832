"""`--report-to`: real cells send their curves to TensorBoard, MLflow (a real SQLite tracking
store) and W&B (offline mode), and each is read back with that library's own reader; a
failing or hanging tracker never fails or holds up a cell."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, read_json

from encoder_eval.cells.trackers import Reporter, RunInfo, parse_report_to
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.results import result_filename

LRS = (1e-4, 5.99e-05)


def test_report_to_names_are_checked() -> None:
    assert parse_report_to("none") == ()
    assert parse_report_to("") == ()
    assert parse_report_to("wandb, tensorboard,wandb") == ("wandb", "tensorboard")
    with pytest.raises(HarnessError, match="Did you mean 'mlflow'.*Valid"):
        parse_report_to("mlflw")


@pytest.fixture(scope="module")
def tracked_sweep(tiny_models, small_mirror, tmp_path_factory) -> dict:
    """Two learning rates of one tiny cell in one `run` process, sent to all three trackers."""
    tmp = tmp_path_factory.mktemp("tracked")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
           "MLFLOW_EXPERIMENT_NAME": "tiny-sweep", "WANDB_MODE": "offline",
           "WANDB_PROJECT": "tiny-sweep", "WANDB_SILENT": "true"}  # fmt: skip
    env.pop("WANDB_API_KEY", None)
    results = tmp / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval.run", "--model-path", str(tiny_models["bert"]),
         "--model-key", "tiny", "--task", "glue_rte", "--lr", ",".join(map(str, LRS)),
         "--seed", "42", "--max-steps", "4", "--max-seq-len", "64", "--phase", "select",
         "--data-dir", str(small_mirror), "--device", "cpu", "--progress", "quiet",
         "--results-dir", str(results), "--report-to", "tensorboard,mlflow,wandb"],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--report-to" not in proc.stderr, proc.stderr  # no tracker failed
    cells = {lr: read_json(results / result_filename("tiny", "glue_rte", lr, 42)) for lr in LRS}
    return {"tmp": tmp, "results": results, "cells": cells, "env": env}


def test_tensorboard_event_files_hold_every_step_and_evaluation(tracked_sweep) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for lr, result in tracked_sweep["cells"].items():
        run = result["cell"]
        name = f"tiny_glue_rte_{run['lr_key']}_s42_select"
        acc = EventAccumulator(str(tracked_sweep["results"] / "tracking" / "tensorboard" / name))
        acc.Reload()
        loss = acc.Scalars("train/loss")
        assert [e.step for e in loss] == list(range(1, result["training"]["steps"] + 1))
        assert loss[-1].value == pytest.approx(result["training"]["final_loss"], rel=1e-5)
        lrs = [e.value for e in acc.Scalars("train/lr")]
        assert max(lrs) <= lr * (1 + 1e-6)
        dev = {e.step: e.value for e in acc.Scalars("dev/mean")}
        history = {h["step"]: h["dev"] for h in result["training"]["dev_history"]}
        assert dev == pytest.approx(history)
        assert any(t.startswith("identity") for t in acc.Tags()["tensors"]), acc.Tags()


def test_mlflow_sqlite_store_finds_every_cell_with_its_metrics(tracked_sweep) -> None:
    os.environ["MLFLOW_TRACKING_URI"] = tracked_sweep["env"]["MLFLOW_TRACKING_URI"]
    try:
        import mlflow

        runs = mlflow.search_runs(experiment_names=["tiny-sweep"], output_format="list")
        client = mlflow.MlflowClient()
        assert len(runs) == len(LRS)
        by_key = {r.data.params["lr_key"]: r for r in runs}
        for result in tracked_sweep["cells"].values():
            cell = result["cell"]
            run = by_key[cell["lr_key"]]
            assert run.info.status == "FINISHED"
            assert run.data.params["model"] == "tiny" and run.data.params["seed"] == "42"
            assert run.data.tags["phase"] == "select" and run.data.tags["task"] == "glue_rte"
            assert run.data.params["recipe.max_steps"] == "4"
            assert run.data.metrics["final/dev/mean"] == pytest.approx(result["dev"]["mean"])
            loss = client.get_metric_history(run.info.run_id, "train/loss")
            assert sorted(m.step for m in loss) == list(range(1, result["training"]["steps"] + 1))
        # one recipe, one signature: the sweep's cells group together
        assert len({r.data.tags["recipe_signature"] for r in runs}) == 1
        key = tracked_sweep["cells"][LRS[0]]["cell"]["lr_key"]
        filtered = mlflow.search_runs(experiment_names=["tiny-sweep"], output_format="list",
                                      filter_string=f"params.lr_key = '{key}'")  # fmt: skip
        assert [r.data.params["lr_key"] for r in filtered] == [key]
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI", None)


def _wandb_records(run_dir: Path) -> list:
    """The records of an offline W&B run file, parsed with wandb's own protobuf `Record`.

    wandb 0.31 has no Python reader of its run files any more (its Go core writes them), so
    the container is read here: a 7-byte header (`:W&B`, magic, version), then LevelDB log
    blocks of 32 KiB whose chunks (crc32, length, type FULL/FIRST/MIDDLE/LAST) hold the
    serialised records."""
    from wandb.proto import wandb_internal_pb2

    [path] = run_dir.glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, partial = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or kind == 0:  # block trailer or zero padding
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        else:
            chunks.append(partial + chunk)
    records = []
    for chunk in chunks:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(chunk)
        records.append(rec)
    return records


def _items(items) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def test_wandb_offline_run_folders_hold_the_history(tracked_sweep) -> None:
    runs = sorted((tracked_sweep["results"] / "tracking" / "wandb").glob("offline-run-*"))
    assert len(runs) == len(LRS)
    by_key = {r["cell"]["lr_key"]: r for r in tracked_sweep["cells"].values()}
    seen = set()
    for run_dir in runs:
        records = _wandb_records(run_dir)
        kinds = [r.WhichOneof("record_type") for r in records]
        rows = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
        config = {}
        for r in records:
            if r.WhichOneof("record_type") == "run":
                config.update(_items(r.run.config.update))
            elif r.WhichOneof("record_type") == "config":
                config.update(_items(r.config.update))
        lr_key = config["lr_key"]
        seen.add(lr_key)
        result = by_key[lr_key]
        assert [r["_step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]
        losses = [r["train/loss"] for r in rows if "train/loss" in r]
        assert losses[-1] == pytest.approx(result["training"]["final_loss"], rel=1e-5)
        assert config["task"] == "glue_rte" and config["seed"] == 42
        assert "exit" in kinds  # the run was finished, not abandoned
    assert seen == set(by_key)


class _Blocking:
    """A tracker whose every call waits until the test lets it go (a hung server)."""

    release = threading.Event()
    entered = threading.Event()

    def __init__(self, info) -> None:
        pass

    def log(self, step, metrics) -> None:
        type(self).entered.set()
        type(self).release.wait(60)

    def finish(self, summary, status) -> None:
        type(self).release.wait(60)


class _Broken:
    def __init__(self, info) -> None:
        raise ConnectionError("tracking server unreachable\nsecond line")


def test_a_hanging_tracker_never_holds_the_cell(tmp_path) -> None:
    warnings: list[str] = []
    info = RunInfo("m/t/lr04/s1/select", {}, {}, str(tmp_path))
    rep = Reporter(["mlflow"], info, warnings.append, backends={"mlflow": _Blocking})
    rep.log(1, {"train/loss": 1.0})
    assert _Blocking.entered.wait(30)
    for step in range(2, 200):  # the tracker is stuck in its first call: none of these waits
        rep.log(step, {"train/loss": 1.0})
    assert not _Blocking.release.is_set()
    rep.finish({"dev/mean": 0.5}, timeout=0.2)
    assert not _Blocking.release.is_set()  # finish returned while the tracker still hangs
    assert len(warnings) == 1 and "did not finish within" in warnings[0]
    _Blocking.release.set()


def test_a_broken_tracker_warns_once_in_one_line_and_the_others_go_on(tmp_path) -> None:
    warnings: list[str] = []
    got: list = []

    class Recorder:
        def __init__(self, info) -> None:
            pass

        def log(self, step, metrics) -> None:
            got.append((step, metrics))

        def finish(self, summary, status) -> None:
            got.append(("finish", summary, status))

    info = RunInfo("m/t/lr04/s1/select", {}, {}, str(tmp_path))
    rep = Reporter(["wandb", "tensorboard"], info, warnings.append,
                   backends={"wandb": _Broken, "tensorboard": Recorder})  # fmt: skip
    rep.log(1, {"train/loss": 2.0, "dev/mean": None})
    rep.finish({"dev/mean": 0.25})
    assert got == [(1, {"train/loss": 2.0}), ("finish", {"dev/mean": 0.25}, "ok")]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "--report-to wandb failed" in warnings[0] and "unreachable" in warnings[0]


def test_an_uninstalled_or_failing_tracker_does_not_fail_a_real_cell(
    tiny_models, small_mirror, tmp_path
) -> None:
    """W&B online with no login and no terminal fails inside wandb; the cell still writes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="online", WANDB_API_KEY="", WANDB_BASE_URL="http://127.0.0.1:9",
               HOME=str(tmp_path), WANDB_INIT_TIMEOUT="5")  # fmt: skip
    out = tmp_path / "cell.json"
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval.run", "--model-path", str(tiny_models["bert"]),
         "--model-key", "tiny", "--task", "glue_rte", "--lr", "1e-4", "--seed", "42",
         "--max-steps", "2", "--max-seq-len", "64", "--phase", "select", "--data-dir",
         str(small_mirror), "--device", "cpu", "--progress", "quiet", "--out-json", str(out),
         "--report-to", "wandb"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_json(out)["status"] == "ok"
    lines = [ln for ln in proc.stderr.splitlines() if "--report-to wandb failed" in ln]
    assert len(lines) == 1, proc.stderr


def test_an_unknown_tracker_is_refused_before_any_work(tiny_models, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval.run", "--model-path", str(tiny_models["bert"]),
         "--task", "glue_rte", "--lr", "1e-4", "--seed", "45", "--out-json",
         str(tmp_path / "x.json"), "--report-to", "tensorbord"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown tracker 'tensorbord'. Did you mean 'tensorboard'? --report-to takes a "
        "comma-separated list. Valid trackers: mlflow, none, tensorboard, wandb"
    ]


# Issue 40 item 3: a cell's 30 s cap interrupted MLflow creating a new SQLite store (51 s on
# a loaded machine), which broke the store for every later cell; and a failed tracker was
# retried (and warned about) by every cell of the process.
_TIMED_OUT_CELL = """
import sys
from encoder_eval.cells.trackers import Reporter, RunInfo
info = RunInfo("m/t/lr04/s1/select", {"seed": 1}, {"phase": "select"}, sys.argv[1])
rep = Reporter(["mlflow"], info)
rep.log(1, {"train/loss": 1.0})
rep.finish({"dev/mean": 0.5}, timeout=0.0)  # the cap passes at once; the process exits
"""

_READ_STORE = """
import mlflow
client = mlflow.MlflowClient()
exp = client.get_experiment_by_name("capped")
run = client.create_run(exp.experiment_id, run_name="later-cell")
client.log_metric(run.info.run_id, "x", 1.0)
print(len(client.search_runs([exp.experiment_id])))
"""


def test_a_cell_whose_trackers_time_out_leaves_a_whole_mlflow_store(tmp_path) -> None:
    """The store is created before training, outside the cap: a cell process that gives
    its trackers no time at all still leaves a store the next process (and MLflow) uses."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "MLFLOW_EXPERIMENT_NAME": "capped"}  # fmt: skip
    first = subprocess.run([sys.executable, "-c", _TIMED_OUT_CELL, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "did not finish within 0 s" in first.stderr
    assert "INFO" not in first.stderr  # no migration log lines
    later = subprocess.run([sys.executable, "-c", _READ_STORE], env=env, capture_output=True,
                           text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert later.returncode == 0, later.stderr[-2000:]
    assert int(later.stdout.split()[-1]) >= 1


@pytest.fixture
def fresh_trackers(monkeypatch):
    """The process's tracker registry (prepared, dropped), empty for one test."""
    from encoder_eval.cells import trackers

    monkeypatch.setattr(trackers, "_PREPARED", set(), raising=False)
    monkeypatch.setattr(trackers, "DROPPED", {}, raising=False)
    return trackers


def test_a_tracker_that_fails_once_is_off_for_the_rest_of_the_process(
    tmp_path, monkeypatch, fresh_trackers
) -> None:
    """Real MLflow on a store that is not a database: the first cell warns in one line and
    drops it; the next cells of the process neither try it again nor warn again."""
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"not a database, a teammate's notes" * 100)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    warnings: list[str] = []
    reporters = []
    for lr_key in ("lr03", "lr04", "lr05"):
        info = RunInfo(f"m/t/{lr_key}/s1/select", {}, {}, str(tmp_path))
        rep = Reporter(["mlflow"], info, warnings.append)
        rep.log(1, {"train/loss": 1.0})
        rep.finish({"dev/mean": 0.5}, timeout=60)
        reporters.append(rep)
    assert len(warnings) == 1, warnings
    assert "--report-to mlflow failed and is off for the rest of this process" in warnings[0]
    assert "\n" not in warnings[0]
    assert [r.names for r in reporters[1:]] == [(), ()]
    assert "mlflow" in fresh_trackers.DROPPED
