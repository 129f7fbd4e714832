"""The warm worker's reset contract (`core/process_state.py`, `encoder_eval.run.serve`): a
sequence of units run by one warm worker gives each unit a fresh process's result, bit for
bit, with a fresh process's log lines and an honest peak memory.

The sequence is the hostile one: a model whose trusted remote code replaces torch's gelu at
import, then a plain tiny BERT (same gelu name, so a leaked patch changes its loss), a user
task, two units whose tracker fails, a unit naming the user task without its task file,
and a `--deterministic` unit. The worker is driven through its own request protocol (the one
`run_all.sh --warm` speaks), then as one job of several units (`run --spec A --spec B ...`,
what a warm Slurm job runs), and every unit is also run as a fresh `python -m encoder_eval.run`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fault_helpers import REPO, SHRINK, env

from encoder_eval import run as run_command
from encoder_eval.cells.unit_spec import UnitSpec

pytestmark = pytest.mark.slow

# Appended to the remote-code model's modeling file: at import, the process's gelu becomes
# another function (twice the input: the tanh approximation alone changes no bit of a tiny
# model's loss), for every model built afterwards in that process.
GELU_PATCH = """

import torch.nn.functional as _F

_exact_gelu = _F.gelu
_F.gelu = lambda x, approximate="none": _exact_gelu(2 * x, approximate=approximate)
"""


def _remote_model_that_patches_gelu(tiny_models, tmp_path: Path) -> Path:
    path = tmp_path / "gelu_patcher"
    shutil.copytree(tiny_models["tinyenc"], path)
    modeling = path / "modeling_tinyenc.py"
    modeling.write_text(modeling.read_text() + GELU_PATCH)
    return path


def _user_task_file(small_mirror: Path, tmp_path: Path) -> Path:
    path = tmp_path / "tasks" / "my_rte.toml"
    path.parent.mkdir()
    path.write_text(
        "[tasks.my_rte]\n"
        'inputs = ["sentence1", "sentence2"]\nlabel_field = "label"\n'
        'labels = ["entailment", "not_entailment"]\nproblem = "classification"\n'
        'metric = "accuracy"\nreport_split = "validation"\n'
        f'data_dir = "{small_mirror / "glue_rte"}"\n'
    )
    return path


def _units(tiny_models, small_mirror: Path, tmp_path: Path) -> list[tuple[str, list[str]]]:
    """(name, `run` arguments) of each unit, in the worker's order."""
    results = tmp_path / "results"
    common = ["--lr", "1e-4", "--seed", "42", "--phase", "select", "--data-dir",
              str(small_mirror), *SHRINK, "--precision", "fp32", "--progress", "json"]  # fmt: skip
    tiny = ["--model-path", str(tiny_models["bert"]), "--model-key", "tiny"]
    tracked = ["--report-to", "mlflow", "--tracking-dir", str(tmp_path / "tracking")]
    task_file = ["--tasks-file", str(_user_task_file(small_mirror, tmp_path))]
    remote = _remote_model_that_patches_gelu(tiny_models, tmp_path)

    def out(name: str) -> list[str]:
        return ["--out-json", str(results / name / "cell.json")]

    return [
        (
            "remote",
            [
                "--model-path",
                str(remote),
                "--model-key",
                "remote",
                "--trust-remote-code",
                "--task",
                "glue_rte",
                *common,
                *out("remote"),
            ],
        ),  # fmt: skip
        ("plain", [*tiny, "--task", "glue_rte", *common, *out("plain")]),
        ("user_task", [*tiny, "--task", "my_rte", *task_file, *common, *out("user_task")]),
        ("tracker_1", [*tiny, "--task", "glue_rte", *common, *tracked, *out("tracker_1")]),
        ("tracker_2", [*tiny, "--task", "glue_stsb", *common, *tracked, *out("tracker_2")]),
        ("no_task_file", [*tiny, "--task", "my_rte", *common, *out("no_task_file")]),
        (
            "deterministic",
            [*tiny, "--task", "glue_rte", *common, "--deterministic", *out("deterministic")],
        ),  # fmt: skip
    ]


def _environment(tmp_path: Path) -> dict[str, str]:
    """One environment for the worker and the fresh processes: MLflow at a store that is
    not a database, so the tracker fails in every unit that asks for it."""
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"not a database, a teammate's notes" * 100)
    return env(MLFLOW_TRACKING_URI=f"sqlite:///{store}")


def _fresh(argv: list[str], log: Path, environment: dict) -> int:
    with open(log, "w") as f:
        return subprocess.run([sys.executable, "-m", "encoder_eval.run", *argv], cwd=REPO,
                              env=environment, stdout=f, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=600).returncode  # fmt: skip


def _warm(units: list[tuple[str, list[str]]], logs: Path, environment: dict) -> list[int]:
    """Run the units in one warm worker through its request protocol (one spec file per
    unit, as run_all.sh sends them); their exit codes."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "encoder_eval.run", "--warm-worker"], cwd=REPO, env=environment,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    codes = []
    try:
        for name, argv in units:
            log = str(logs / f"{name}.log")
            spec = UnitSpec.from_args(run_command.build_parser().parse_args(argv))
            fields = [log, log, str(spec.write(logs / f"{name}.spec.json"))]
            worker.stdin.write(b"".join(os.fsencode(f) + b"\0" for f in fields))
            worker.stdin.flush()
            codes.append(int(worker.stdout.readline()))
        worker.stdin.close()
        assert worker.wait(timeout=120) == 0, worker.stderr.read().decode()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    return codes


def _job(units: list[tuple[str, list[str]]], logs: Path, environment: dict) -> tuple[int, dict]:
    """Run the units as one job of several units (`run --spec A --spec B ...`, what a warm
    Slurm job runs); its exit code and each unit's part of its one log, by name."""
    specs = []
    for name, argv in units:
        spec = UnitSpec.from_args(run_command.build_parser().parse_args(argv))
        specs += ["--spec", str(spec.write(logs / f"{name}.spec.json"))]
    code = _fresh(specs, logs / "job.log", environment)
    text = (logs / "job.log").read_text()
    parts = text.split("== unit ")[1:]
    assert len(parts) == len(units), text[-3000:]
    return code, {name: part for (name, _), part in zip(units, parts, strict=True)}


def _what_training_produced(path: Path) -> dict:
    """Everything a result says about training and scores, to the last bit (no timings)."""
    r = json.loads(path.read_text())
    t = r["training"]
    keys = ("steps", "best_step", "final_loss", "dev_history", "stopped_by", "train_examples")
    return {"status": r["status"], "dev": r["dev"], "report": r["report"],
            "recipe": r["recipe"], **{k: t[k] for k in keys}}  # fmt: skip


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def test_a_warm_worker_gives_every_unit_a_fresh_processs_result(
    tiny_models, small_mirror, tmp_path
):
    units = _units(tiny_models, small_mirror, tmp_path)
    environment = _environment(tmp_path)
    fresh_units = [(n, [a.replace(str(tmp_path / "results"), str(tmp_path / "fresh"))
                        for a in argv]) for n, argv in units]  # fmt: skip
    (tmp_path / "fresh-logs").mkdir()
    (tmp_path / "warm-logs").mkdir()
    fresh_codes = [_fresh(argv, tmp_path / "fresh-logs" / f"{n}.log", environment)
                   for n, argv in fresh_units]  # fmt: skip
    warm_codes = _warm(units, tmp_path / "warm-logs", environment)
    names = [n for n, _ in units]
    assert warm_codes == fresh_codes == [0, 0, 0, 0, 0, 2, 0], (warm_codes, fresh_codes)
    logs = {n: (tmp_path / "warm-logs" / f"{n}.log").read_text() for n in names}

    # The gelu patch is real: the remote model's code changed this process's gelu, so the
    # plain model after it would train differently here.
    warm = {n: tmp_path / "results" / n / "cell.json" for n in names if n != "no_task_file"}
    fresh = {n: tmp_path / "fresh" / n / "cell.json" for n in warm}
    for name in warm:
        assert _what_training_produced(warm[name]) == _what_training_produced(fresh[name]), name

    # The worker really ran them: one process id, and each unit's number in its process; a
    # unit that brings other remote code or another deterministic setting starts it afresh.
    records = {n: json.loads(warm[n].read_text())["training"] for n in warm}
    assert len({r["process_id"] for r in records.values()}) == 1, records
    assert {n: r["warm_unit"] for n, r in records.items()} == {
        "remote": 1, "plain": 1, "user_task": 2, "tracker_1": 3, "tracker_2": 4,
        "deterministic": 1,
    }  # fmt: skip
    fresh_records = {n: json.loads(fresh[n].read_text())["training"] for n in fresh}
    assert all("warm_unit" not in r for r in fresh_records.values())
    _assert_logs_of_a_warm_process(logs)
    assert json.loads(warm["deterministic"].read_text())["recipe"]["deterministic"] is True

    # The same units as one job of several units (a warm Slurm job) follow the same rules.
    job_units = [(n, [a.replace(str(tmp_path / "results"), str(tmp_path / "job"))
                      for a in argv]) for n, argv in units]  # fmt: skip
    (tmp_path / "job-logs").mkdir()
    job_code, job_logs = _job(job_units, tmp_path / "job-logs", environment)
    assert job_code == 2  # the first unit that failed: the task named without its file
    job = {n: tmp_path / "job" / n / "cell.json" for n in warm}
    for name in job:
        assert _what_training_produced(job[name]) == _what_training_produced(fresh[name]), name
    job_records = {n: json.loads(job[n].read_text())["training"] for n in job}
    assert {n: r["warm_unit"] for n, r in job_records.items()} == {
        n: r["warm_unit"] for n, r in records.items()
    }
    assert len({r["process_id"] for r in job_records.values()}) == 1, job_records
    _assert_logs_of_a_warm_process(job_logs)

    # Peak memory is the cell's own where Linux lets the peak be reset.
    scope = "cell" if _clear_refs_works() else "process"
    for name in warm:
        w, f = records[name], fresh_records[name]
        assert w["peak_memory_scope"] == f["peak_memory_scope"] == scope
        if scope == "cell":
            assert w["peak_memory_bytes"] <= 1.5 * f["peak_memory_bytes"], (name, w, f)


def _assert_logs_of_a_warm_process(logs: dict[str, str]) -> None:
    """Each unit's log says what a fresh process's would, and which units started afresh."""
    for name in ("plain", "deterministic"):
        assert "note: warm worker: this unit runs in a fresh process" in logs[name], logs[name]
    assert "fresh process" not in logs["user_task"] + logs["tracker_1"] + logs["tracker_2"]
    # Each unit whose tracker fails says so in its own log, as a fresh process does.
    for name in ("tracker_1", "tracker_2"):
        assert "--report-to mlflow failed" in logs[name], logs[name][-2000:]
    # The user task is gone once its unit is over: named without its file, it is refused.
    assert "unknown task 'my_rte'" in logs["no_task_file"], logs["no_task_file"][-2000:]


def test_the_resets_put_back_what_a_unit_changed(monkeypatch):
    """In process: flip torch's switches, register a user task, fail a tracker, warn once;
    `reset_all` puts each back and its checks find nothing left."""
    import torch

    from encoder_eval.cells import devices, trackers
    from encoder_eval.core import cpu, process_state
    from encoder_eval.data import tasks

    # What this test process has now is its "fresh" state (other tests may have changed it).
    fresh = devices.backend_switches()
    monkeypatch.setattr(devices, "_FRESH_SWITCHES", fresh)
    monkeypatch.setattr(tasks, "_BUILTIN_KNOBS", dict(tasks.TASK_KNOBS))
    process_state.snapshot_environment()
    knobs = tasks.TASK_KNOBS["glue_rte"]
    try:
        torch.set_default_dtype(torch.float64)
        torch.set_float32_matmul_precision("medium")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        torch.set_num_threads(torch.get_num_threads() + 1)
        if hasattr(torch.backends.cuda, "enable_math_sdp"):
            torch.backends.cuda.enable_math_sdp(False)
        tasks.add_user_task("someone_elses_task", knobs)
        trackers.DROPPED["mlflow"] = "failed once"
        cpu._WARNED.add("cpu")
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        changed = devices.backend_switches()
        assert {k for k in fresh if changed[k] != fresh[k]} >= {
            "default dtype", "float32 matmul precision", "deterministic algorithms",
            "cuDNN benchmark", "intra-op threads",
        }  # fmt: skip
        assert process_state.reset_all() == []
        assert devices.backend_switches() == fresh
        assert "someone_elses_task" not in tasks.TASK_KNOBS and "glue_rte" in tasks.TASK_KNOBS
        assert trackers.DROPPED == {} and cpu._WARNED == set()
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    finally:
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(False)
        process_state.reset_all()
    names = process_state.registered()
    assert "torch backend switches (cells/devices.py)" in names
    assert "user tasks in the task registry (data/tasks.py)" in names


def test_a_reset_that_does_not_take_is_a_problem_not_a_silence():
    from encoder_eval.core import process_state

    state = {"value": 1}
    process_state.register(
        "test: a stuck value",
        lambda: None,  # a reset that cannot put it back
        lambda: None if state["value"] == 0 else f"value {state['value']}",
    )
    try:
        assert process_state.reset_all() == ["test: a stuck value: value 1"]
        state["value"] = 0
        assert process_state.reset_all() == []
    finally:
        process_state._REGISTRY.pop("test: a stuck value")


def test_peak_memory_is_counted_from_the_cells_start():
    """A large block freed before the cell's start is not the cell's peak (Linux)."""
    import torch

    from encoder_eval.cells import devices

    cpu = torch.device("cpu")
    block = bytearray(400 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    del block
    before = devices.peak_memory(cpu)
    scope = devices.reset_peak_memory(cpu)
    if not _clear_refs_works():
        assert scope == "process"
        return
    assert scope == "cell"
    assert devices.peak_memory(cpu) < before - 200 * 2**20
