"""Preemption: a real SIGTERM to a running cell saves a resumable state and exits 75
(`train.EXIT_PREEMPTED`); the next run resumes, and its result equals an uninterrupted run
with the same seed exactly (on the CPU). Slurm modes pass `--requeue` when asked.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from fault_helpers import env as run_env
from fault_helpers import py, read_json, sh, wait_until_started
from result_helpers import make_selection
from test_cell import cell
from test_sweep import _lines, fake_slurm  # noqa: F401  (fake_slurm is a fixture)

from encoder_eval import sweep
from encoder_eval.cells import cell_result, train
from encoder_eval.cells.predictions import predictions_path
from encoder_eval.cells.train import EXIT_PREEMPTED
from encoder_eval.core.results import result_filename

MODEL, TASK, LR, SEED = "tiny", "glue_rte", "3.59e-05", 45
# 60 steps with a dev evaluation every 2: long enough that a SIGTERM sent after step 4
# always lands inside the training loop. fp32: no test here checks precision, and bf16
# autocast is emulated (slower) on a CPU without native bf16.
CELL = ["--task", TASK, "--lr", LR, "--seed", SEED, "--max-steps", "60", "--epoch-cap", "100",
        "--no-early-stop", "--max-seq-len", "128", "--device", "cpu",
        "--precision", "fp32"]  # fmt: skip
SAME = ("dev", "report")
SAME_TRAINING = ("final_loss", "steps", "best_step", "epochs", "dev_history", "diverged_at_step")


def _cell(tiny_models, mirror, out: Path, progress: str = "json") -> list[str]:
    return py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", MODEL,
              *CELL, "--data-dir", mirror, "--out-json", out, "--progress", progress)  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_models, small_mirror) -> dict:
    out = tmp_path_factory.mktemp("reference") / "cell.json"
    sh(_cell(tiny_models, small_mirror, out, "quiet"), out.parent)
    return read_json(out)


def _assert_same_as(result: dict, reference: dict) -> None:
    for key in SAME:
        assert result[key] == reference[key], key
    for key in SAME_TRAINING:
        assert result["training"][key] == reference["training"][key], key
    assert result["training"]["steps"] == 60


def _wait_for_step(proc: subprocess.Popen, step: int, timeout: float = 240) -> list[str]:
    """Read the cell's JSON progress lines until it reports `step` (training is running)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("{") and json.loads(line).get("step", 0) >= step:
            return seen
    raise AssertionError(f"the cell never reported step {step}:\n" + "".join(seen))


@pytest.mark.parametrize(
    ("signum", "code", "prefix"),
    [(signal.SIGTERM, EXIT_PREEMPTED, "preempted: "), (signal.SIGINT, 130, "interrupted: ")],
    ids=["sigterm", "sigint"],
)
def test_a_stop_signal_saves_state_exits_with_its_code_and_the_rerun_matches(
    tmp_path, tiny_models, small_mirror, uninterrupted, signum, code, prefix
):
    """SIGTERM (preemption, exit 75) and Ctrl-C (SIGINT, exit 130) both save the state."""
    out = tmp_path / "cell.json"
    resume = tmp_path / f".resume-{out.name}.pt"
    proc = subprocess.Popen(_cell(tiny_models, small_mirror, out), cwd=tmp_path,
                            env=run_env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for_step(proc, 4)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(prefix) and "run the cell again to resume" in last
    assert resume.exists() and not out.exists()  # state saved, nothing published
    again = sh(_cell(tiny_models, small_mirror, out, "quiet"), tmp_path)
    assert not resume.exists()
    result = read_json(out)
    assert result["status"] == "ok"
    _assert_same_as(result, uninterrupted)
    assert again.returncode == 0


def test_sigterm_to_a_warm_job_ends_it_at_once_and_the_rerun_resumes(
    tmp_path, tiny_models, small_mirror, uninterrupted
):
    """A warm Slurm job's process (`run --spec A --spec B`, `run.run_job`) preempted in its
    first unit saves that cell's state and exits 75 without starting the second; the
    requeued job resumes the cell (the same result as never stopped) and runs the second."""
    from encoder_eval import run as run_command
    from encoder_eval.cells.unit_spec import UnitSpec

    specs = []
    for name, seed in (("first", str(SEED)), ("second", "46")):
        argv = [str(a) for a in _cell(tiny_models, small_mirror, tmp_path / name / "cell.json")[3:]]
        argv[argv.index("--seed") + 1] = seed
        if name == "second":  # what it runs matters less than whether it runs
            argv[argv.index("--max-steps") + 1] = "3"
        spec = UnitSpec.from_args(run_command.build_parser().parse_args(argv))
        specs += ["--spec", str(spec.write(tmp_path / f"{name}.json"))]
    job = py("encoder_eval.run", *specs)
    proc = subprocess.Popen(job, cwd=tmp_path, env=run_env(PYTHONUNBUFFERED="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for_step(proc, 4)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "== unit 1 of 2" in out and "== unit 2" not in out, out
    assert (tmp_path / "first" / ".resume-cell.json.pt").exists()
    assert not (tmp_path / "second").exists()
    again = sh(job, tmp_path)
    assert "== unit 2 of 2" in again.stdout
    _assert_same_as(read_json(tmp_path / "first" / "cell.json"), uninterrupted)
    assert read_json(tmp_path / "second" / "cell.json")["status"] == "ok"


def test_sigterm_to_a_whole_run_all_sh_like_slurm_then_the_rerun_resumes(
    tmp_path, tiny_models, small_mirror, uninterrupted
):
    """Slurm signals every process of the job: the script and its cell process get SIGTERM."""
    rdir = tmp_path / "results"
    sh(py("encoder_eval.sweep", "--phase", "report", "--selection", _selection(tmp_path),
          "--model", f"{MODEL}={tiny_models['bert']}", "--tasks", TASK, "--seeds", str(SEED),
          "--max-steps", "60", "--max-seq-len", "128", "--device", "cpu", "--precision", "fp32",
          "--data-dir", small_mirror, "--extra-run-args", "--epoch-cap 100 --no-early-stop",
          "--out-dir", tmp_path / "runs", "--results-dir", rdir), tmp_path)  # fmt: skip
    script = tmp_path / "runs" / "run_all.sh"
    log = tmp_path / "runs" / "logs" / f"{MODEL}_{TASK}_lr06.log"
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=run_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        wait_until_started(log, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        deadline = time.monotonic() + 120  # the cell process may outlive the script briefly
        while "preempted: " not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = rdir / result_filename(MODEL, TASK, float(LR), SEED)
    assert (rdir / f".resume-{out.name}.pt").exists() and not out.exists()
    rerun = sh(["bash", str(script)], tmp_path)
    assert "[cells 1/1 done, units 1/1, failed 0] finished: 1 run" in rerun.stdout
    result = read_json(out)
    _assert_same_as(result, uninterrupted)
    # The report cell differs from the reference only in what the sweep adds (the recipe
    # flags are the same values), so the scores must match exactly.


def _selection(tmp_path: Path) -> Path:
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(make_selection({(MODEL, TASK): "lr06"})))
    return path


@pytest.mark.parametrize("mode", ["slurm", "slurm-array"])
@pytest.mark.parametrize("requeue", [True, False], ids=["requeue", "no-requeue"])
def test_slurm_modes_pass_requeue_only_when_asked(tmp_path, fake_slurm, mode, requeue):  # noqa: F811
    env, tpl = fake_slurm
    out = tmp_path / "runs"
    argv = ["--phase", "select", "--model", "a=org/a", "--tasks", TASK, "--lr-keys", "lr03",
            "--seeds", "42", "--mode", mode, "--slurm-template", str(tpl), "--out-dir", str(out),
            "--results-dir", str(tmp_path / "res")] + (["--requeue"] if requeue else [])  # fmt: skip
    assert sweep.main(argv) == 0
    proc = subprocess.run(["bash", str(out / "launch.sh")], env=env, capture_output=True,
                          text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (sub,) = _lines(env["FAKE_SUBMITS"])
    assert ("requeue" in sub["opts"]) is requeue
    assert len(_lines(env["FAKE_JOBS"])) == 1  # the job ran its cell


def test_requeue_is_refused_in_shell_mode(tmp_path, capsys):
    assert sweep.main(["--phase", "select", "--requeue", "--out-dir", str(tmp_path / "r"),
                       "--results-dir", str(tmp_path / "s")]) == 2  # fmt: skip
    assert "--requeue are for --mode slurm/slurm-array" in capsys.readouterr().err


# ----------------------------------------------------------------------------- no finished cell lost


def _sigterm_after_first_evaluation(monkeypatch) -> None:
    """Send this process a real SIGTERM right after the cell's first dev evaluation, so
    the stop lands mid-training whatever the machine's speed."""
    real = train._evaluate

    def evaluate(cell, st):
        monkeypatch.setattr(train, "_evaluate", real)  # once
        out = real(cell, st)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(train, "_evaluate", evaluate)


def test_a_failed_result_write_keeps_the_resume_state_and_the_rerun_resumes(
    tmp_path, tiny_models, small_mirror, monkeypatch, capsys
):
    """A preempted cell's rerun trains to the end and then cannot write its result (the
    disk is full when the result is written; a path that cannot take the result at all is
    refused before training): the resume state survives, and the next run resumes from it
    and writes what an uninterrupted run writes."""
    (tmp_path / "ref").mkdir()
    reference = train.run_cell(cell(tmp_path / "ref", tiny_models["bert"],
                                    data_dir=str(small_mirror)))  # fmt: skip
    cfg = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror))
    out = Path(cfg.out_json)
    resume = out.parent / f".resume-{out.name}.pt"
    _sigterm_after_first_evaluation(monkeypatch)
    with pytest.raises(train.Preempted, match="state saved"):
        train.run_cell(cfg)
    assert resume.exists() and not out.exists()
    stopped_at = torch.load(resume, weights_only=True)["loop"]["step"]
    assert 0 < stopped_at < reference["training"]["steps"]

    def disk_full(path, data):  # the result's write fails after the whole training
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with monkeypatch.context() as m:
        m.setattr(cell_result, "write_json_atomic", disk_full)
        with pytest.raises(OSError, match="No space left"):
            train.run_cell(cfg)
    assert f"resuming at step {stopped_at}" in capsys.readouterr().err
    assert resume.exists() and not out.exists()
    assert torch.load(resume, weights_only=True)["loop"]["step"] == stopped_at

    result = train.run_cell(cfg)
    assert f"resuming at step {stopped_at}" in capsys.readouterr().err
    assert not resume.exists() and read_json(out) == result
    for key in SAME:
        assert result[key] == reference[key], key
    for key in SAME_TRAINING:
        assert result["training"][key] == reference["training"][key], key
    assert predictions_path(out).exists()


def test_a_result_name_too_long_for_the_file_system_is_refused_before_training(
    tmp_path, tiny_models, small_mirror
):
    """The result name fits NAME_MAX but its resume state's temporary would not: `run`
    refuses with one `error:` line before any training, instead of failing at the write."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    key = "m" * (name_max - len(result_filename("", TASK, float(LR), SEED)) - 4)
    assert len(result_filename(key, TASK, float(LR), SEED)) < name_max
    rdir = tmp_path / "results"
    proc = subprocess.run(py("encoder_eval.run", "--model-path", tiny_models["bert"],
                             "--model-key", key, *CELL, "--data-dir", small_mirror,
                             "--results-dir", rdir, "--progress", "json"),
                          cwd=tmp_path, env=run_env(), capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "too long" in proc.stderr and f"allows {name_max}" in proc.stderr
    assert '"step"' not in proc.stderr and not rdir.exists()  # nothing trained or written
