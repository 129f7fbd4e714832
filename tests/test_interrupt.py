"""Ctrl-C on `run_all.sh`: the terminal sends SIGINT to the script and its cell's process;
the cell saves its state and exits 130, and the script stops there (no next unit), says
how to resume and exits 130 itself. A real tiny cell, a real signal to the process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest
from fault_helpers import env, py, sh, wait_until_started

from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import cell_lock, result_filename

MODEL, TASK = "tiny", "glue_rte"


def test_ctrl_c_stops_run_all_at_the_running_unit_and_says_how_to_resume(
    tmp_path, tiny_models, small_mirror
):
    rdir, runs = tmp_path / "results", tmp_path / "runs"
    # Two units (one per LR); a million steps with a dev evaluation every 2 keep the first
    # running until the signal, on any machine.
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", "lr03,lr06", "--seeds", "42", "--group", "lr",
          "--max-steps", "1000000", "--max-seq-len", "128", "--device", "cpu", "--data-dir",
          small_mirror, "--extra-run-args", "--epoch-cap 1000000 --no-early-stop",
          "--out-dir", runs, "--results-dir", rdir), tmp_path)  # fmt: skip
    script = runs / "run_all.sh"
    first, second = (runs / "logs" / f"{MODEL}_{TASK}_{key}.log" for key in ("lr03", "lr06"))
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        wait_until_started(first, proc)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does to the foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    # The cell's acknowledgement reaches the terminal through run_all.sh, before its end.
    assert "stopping: Ctrl-C (SIGINT) received; saving state at the next step" in err
    assert not second.exists() and f"starting {MODEL}_{TASK}_lr06" not in out  # no next unit
    assert "finished" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted during {MODEL}_{TASK}_lr03: ")
    assert f"run bash {script} again" in last
    assert "interrupted: " in first.read_text()  # the cell's own line, in its log
    name = result_filename(MODEL, TASK, LR_GRID["lr03"], 42)
    assert (rdir / f".resume-{name}.pt").exists() and not (rdir / name).exists()


def test_the_first_stop_signal_is_acknowledged_at_once_and_only_once(capfd):
    """A slow step may take minutes to end: the first signal is answered on stderr when it
    arrives, not when the state is saved; a second one adds nothing."""
    from encoder_eval.cells.resume import stop_requests

    with stop_requests() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # a real signal to this process's handler
        assert stop.signal == signal.SIGINT
        assert capfd.readouterr().err == (
            "stopping: Ctrl-C (SIGINT) received; saving state at the next step... (the running "
            "step ends first, which may take a while; no need to send it again)\n"
        )
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == signal.SIGINT and capfd.readouterr().err == ""


# A cell that cannot finish within any test: a stop signal sent after a progress line of it
# always lands mid-training, however slow or fast the machine (it ends only by the signal).
ENDLESS = ["--max-steps", "1000000", "--epoch-cap", "1000000", "--no-early-stop",
           "--max-seq-len", "128", "--device", "cpu"]  # fmt: skip


def _read_until(proc: subprocess.Popen, wanted: str | None, stop_if: str, timeout: float) -> str:
    """The process's stderr up to the first line holding `wanted` (None: to its end); fails at
    once on a line holding `stop_if` (killing the process), or after `timeout` seconds."""
    seen, deadline = [], time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "".join(seen)[-3000:]
        line = proc.stderr.readline()
        seen.append(line)
        if stop_if in line:
            proc.kill()
            raise AssertionError(f"{stop_if!r} appeared:\n" + "".join(seen)[-3000:])
        if not line or (wanted is not None and wanted in line):
            return "".join(seen)


@pytest.mark.parametrize(
    ("signum", "code", "prefix"),
    [(signal.SIGTERM, 75, "preempted: "), (signal.SIGINT, 130, "interrupted: ")],
    ids=["sigterm", "sigint"],
)
def test_a_signal_wins_over_a_failed_save_and_no_further_cell_starts(
    tmp_path, tiny_models, small_mirror, signum, code, prefix
):
    """A directory where the first cell's resume state goes makes saving it fail after the
    signal (a real failure): the process still exits with the signal's code, says in one
    line that the cell could not be saved and why, and the second cell of the process never starts."""
    rdir = tmp_path / "results"
    first = result_filename(MODEL, TASK, LR_GRID["lr06"], 45)
    rdir.mkdir()
    (rdir / f".resume-{first}.pt").mkdir()
    proc = subprocess.Popen(py("encoder_eval.run", "--model-path", tiny_models["bert"],
                               "--model-key", MODEL, "--task", TASK, "--lr", "3.59e-05",
                               "--seed", "45,46", *ENDLESS, "--data-dir", small_mirror,
                               "--results-dir", rdir, "--progress", "json"),
                            cwd=tmp_path, env=env(PYTHONUNBUFFERED="1"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    second = f'"cell": "{MODEL}/{TASK}/lr06/s46"'
    try:
        _read_until(proc, '"step": 4', second, timeout=240)
        proc.send_signal(signum)
        err = _read_until(proc, None, second, timeout=120)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(prefix) and "could not be saved (IsADirectoryError" in last, last
    assert "FAILED" not in err and second not in err
    assert [p.name for p in rdir.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("signum", "code", "prefix"),
    [(signal.SIGTERM, 75, "preempted: "), (signal.SIGINT, 130, "interrupted: ")],
    ids=["sigterm", "sigint"],
)
def test_a_signal_between_cells_exits_with_its_code(
    tmp_path, tiny_models, small_mirror, signum, code, prefix
):
    """A process waiting for a cell another runner holds (a real lock, held here) is
    stopped by SIGTERM with 75 and by Ctrl-C with 130, one line each, running nothing."""
    rdir = tmp_path / "results"
    rdir.mkdir()
    out = rdir / result_filename(MODEL, TASK, LR_GRID["lr06"], 45)
    with cell_lock(out) as mine:
        assert mine
        proc = subprocess.Popen(py("encoder_eval.run", "--model-path", tiny_models["bert"],
                                   "--model-key", MODEL, "--task", TASK, "--lr", "3.59e-05",
                                   "--seed", "45", *ENDLESS, "--data-dir", small_mirror,
                                   "--results-dir", rdir, "--progress", "json"),
                                cwd=tmp_path, env=env(PYTHONUNBUFFERED="1"), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            line = proc.stdout.readline()  # waiting for the lock from here on
            assert "another runner is running this cell" in line, line
            time.sleep(0.5)  # into the blocking wait (a signal before it is handled alike)
            proc.send_signal(signum)
            out_text, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == code, err[-3000:]
    assert err.startswith(prefix) and err.count("\n") == 1, err
    assert "run the same command again" in err and '"step"' not in err


def _cell_processes(pid: int) -> list[psutil.Process]:
    """The `encoder_eval.run` processes under `pid`. The script's short-lived helpers (a
    subshell, `date`) can end between the listing and the reading of their command line:
    those are skipped, not an error (psutil raises ZombieProcess or NoSuchProcess)."""
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "encoder_eval.run" in p.cmdline():
                found.append(p)
        except psutil.NoSuchProcess:  # ZombieProcess is one
            continue
    return found


def test_sigterm_to_the_cell_process_alone_stops_run_all(tmp_path, tiny_models, small_mirror):
    """SIGTERM to a unit's process only (not to the script, e.g. `kill PID`): the cell
    saves its state and exits 75, and `run_all.sh` stops there with 75 instead of
    counting a failed unit and starting the next one."""
    rdir, runs = tmp_path / "results", tmp_path / "runs"
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", "lr03,lr06", "--seeds", "42", "--group", "lr",
          "--max-steps", "1000000", "--max-seq-len", "128", "--device", "cpu", "--data-dir",
          small_mirror, "--extra-run-args", "--epoch-cap 1000000 --no-early-stop",
          "--out-dir", runs, "--results-dir", rdir), tmp_path)  # fmt: skip
    script = runs / "run_all.sh"
    first, second = (runs / "logs" / f"{MODEL}_{TASK}_{key}.log" for key in ("lr03", "lr06"))
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        wait_until_started(first, proc)
        (cell,) = _cell_processes(proc.pid)
        cell.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 120
        while proc.poll() is None:
            assert not second.exists(), "the next unit started after SIGTERM"
            assert time.monotonic() < deadline, "run_all.sh did not stop"
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 75, out + err
    assert not second.exists() and "FAILED" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"preempted during {MODEL}_{TASK}_lr03: ") and "again" in last, last
    assert "preempted: " in first.read_text()  # the cell's own line: its state is saved
    name = result_filename(MODEL, TASK, LR_GRID["lr03"], 42)
    assert (rdir / f".resume-{name}.pt").exists()
