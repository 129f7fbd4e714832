"""The demo pipeline end to end (sweep -> run_all.sh -> select -> report -> summarize + plots),
on a tiny local model so it stays fast; CI runs the real `make demo` on MiniLM as well."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from encoder_eval import run as run_command
from encoder_eval.cells import runner


def test_demo_pipeline_end_to_end_on_a_tiny_model(tiny_models, tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "encoder_eval.demo", "--out", str(out),
           "--model-path", str(tiny_models["bert"]), "--model-key", "tiny-bert",
           "--lr-keys", "lr06", "--select-seeds", "42", "--report-seeds", "45,46",
           "--max-steps", "3", "--max-seq-len", "128"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "table.md").read_text()
    for task in ("synthetic_sentiment", "synthetic_nli", "synthetic_rating"):
        assert task in table
    assert "tiny-bert" in table and "±" in table
    assert "avg@2 instead of avg@5" in table  # the shrunken run says so
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert "scores.png" in plots
    assert sum(name.startswith("lr_") for name in plots) == 3
    assert all((out / "plots" / name).stat().st_size > 5000 for name in plots)
    # A second run reuses every finished cell.
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0
    assert "0 to run" in again.stdout + again.stderr


def test_make_smoke_paws_writes_a_result_name_the_readers_accept(tmp_path, capsys):
    """The Makefile's smoke cell must land where select, summarize and status look."""
    import shlex

    from encoder_eval.core.results import result_filename

    dry = subprocess.run(["make", "-n", "-s", "smoke-paws", "PY=python"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    line = next(ln for ln in dry.replace("\\\n", " ").splitlines() if "encoder_eval.run" in ln)
    argv = shlex.split(line.split("encoder_eval.run", 1)[1].split("#", 1)[0])
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        cells = runner.plan_cells(run_command.build_parser().parse_args(argv))
    finally:
        os.chdir(cwd)
    (cfg,) = cells
    assert os.path.basename(cfg.out_json) == result_filename(cfg.model_key, cfg.task, cfg.lr,
                                                             cfg.seed)  # fmt: skip
    runner._note_unreadable_name(cells)
    assert capsys.readouterr().err == ""
    cfg.out_json = str(tmp_path / "xlm-r_paws_lr06_s45.json")  # the name the Makefile used
    runner._note_unreadable_name(cells)
    assert "they will skip" in capsys.readouterr().err


# A step that, like a cell, takes a while to save its state after Ctrl-C and then exits 130.
SLOW_SAVER = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def saved(signum, frame):
    time.sleep(2)  # longer than the 0.25 s subprocess.run grants a child before killing it
    (out / "saved").write_text("state")
    sys.exit(130)
signal.signal(signal.SIGINT, saved)
(out / "ready").write_text("")
while True:
    time.sleep(0.05)
"""

DEMO_STEP = """
import sys
from encoder_eval import demo
from encoder_eval.core import errors
sys.exit(errors.report_errors(demo._run)([sys.executable, "-c", sys.argv[1], sys.argv[2]], print))
"""


def test_ctrl_c_waits_for_the_running_step_to_save_before_the_demo_returns(tmp_path):
    """`make demo` and Ctrl-C: the terminal sends SIGINT to the whole process group; the demo
    returns only after its step has saved (the step is never killed)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", DEMO_STEP, SLOW_SAVER, str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    for _ in range(600):  # the step is up and handles SIGINT (a wait for readiness, no timing)
        if (tmp_path / "ready").exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert (tmp_path / "ready").exists(), proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    out, err = proc.communicate(timeout=60)
    assert (tmp_path / "saved").read_text() == "state"  # the step finished saving first
    assert proc.returncode == 130, err
    assert "waiting for the running step to save its state" in err
    assert err.strip().endswith("interrupted: Ctrl-C; run the same command again to continue")


# A step that, like run_all.sh with its cells, saves its state on SIGTERM (taking a while)
# and exits 75; it counts the SIGTERMs it got.
SLOW_TERM_SAVER = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
got = []
def saved(signum, frame):
    got.append(signum)
    if len(got) == 1:
        time.sleep(2)  # saving takes a while
        (out / "saved").write_text(str(len(got)))
        sys.exit(75)
signal.signal(signal.SIGTERM, saved)
(out / "ready").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""

# The demo's own `main` (its SIGTERM handling) around one such step.
DEMO_MAIN = """
import sys
from encoder_eval import demo
step, out = sys.argv[1], sys.argv[2]
demo.run_demo = lambda args, log=print: demo._run([sys.executable, "-c", step, out], log)
sys.exit(demo.main(["--out", out]))
"""


@pytest.mark.parametrize("to", ["the demo alone", "its process group"])
def test_sigterm_waits_for_the_running_step_to_save_then_exits_75(tmp_path, to):
    """Issue 40 item 11: SIGTERM to the demo (a scheduler or `kill`: the demo alone;
    `timeout` or `make`: its whole group) is handled as Ctrl-C is: the step gets SIGTERM once,
    saves its state, and only then does the demo exit 75 (it used to die at once, leaving the
    cell running on as an orphan that a second `make demo` then met)."""
    import contextlib
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", DEMO_MAIN, SLOW_TERM_SAVER, str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    for _ in range(600):  # the step is up and handles SIGTERM (a wait for readiness, no timing)
        if (tmp_path / "ready").exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert (tmp_path / "ready").exists(), proc.communicate()
    try:
        if to == "the demo alone":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:  # a step the demo left running (the bug: it never saves) must not outlive the test
        if not (tmp_path / "saved").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "ready").read_text()), signal.SIGKILL)
    assert (tmp_path / "saved").read_text() == "1"  # saved before the demo returned; once
    assert proc.returncode == 75, err
    assert "SIGTERM: waiting for the running step to save its state" in err
    assert err.strip().endswith("run the same command again to continue")
    assert "Traceback" not in err


def test_the_demo_runs_one_cell_process_per_task_with_a_share_of_the_cpus(tmp_path, monkeypatch):
    """Issue 40 item 17: both run_all.sh steps run the tasks' units at once (`--workers`,
    at least 2: several workers wait for their cells on SIGTERM), each process with an
    equal share of the CPUs as threads (OMP_NUM_THREADS, unless the user set it)."""
    from encoder_eval import demo
    from encoder_eval.core.errors import HarnessError

    assert demo.plan_workers(3, 2) == (3, 1)  # the default demo on 2 cores
    assert demo.plan_workers(3, 8) == (3, 2)
    assert demo.plan_workers(8, 2) == (3, 1)  # at most the CPUs + 1
    assert demo.plan_workers(1, 2) == (2, 1)
    assert demo.plan_workers(3, 2, requested=1) == (2, 1)
    with pytest.raises(HarnessError, match="--workers 0 must be at least 1"):
        demo.plan_workers(3, 2, requested=0)

    steps = []

    def record(cmd, log, env=None):
        steps.append((cmd, env))
        if len(steps) == 2:
            raise HarnessError("stopped by the test")

    monkeypatch.setattr(demo, "_run", record)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    args = demo.build_parser().parse_args(["--out", str(tmp_path), "--model-path", "m"])
    with pytest.raises(HarnessError, match="stopped by the test"):
        demo.run_demo(args, log=lambda m: None)
    cmd, env = steps[1]
    assert cmd[:2] == ["bash", str(tmp_path / "runs" / "select" / "run_all.sh")]
    assert cmd[2:] == ["--workers", "3"] and env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's choice wins
    steps.clear()
    with pytest.raises(HarnessError, match="stopped by the test"):
        demo.run_demo(args, log=lambda m: None)
    assert steps[1][1]["OMP_NUM_THREADS"] == "4"


@pytest.mark.parametrize(("native", "word", "said"), [
    (True, "auto", "precision: bf16 (--precision auto; the protocol's)"),
    (False, "auto", "precision: fp32 (--precision auto; off-protocol"),
    (False, "bf16", "precision: bf16 (--precision bf16; the protocol's)"),
])  # fmt: skip
def test_the_demo_says_which_precision_it_chose(tmp_path, monkeypatch, native, word, said):
    """Issue 50: nothing said which precision the demo ran; its first lines now do."""
    from encoder_eval import demo
    from encoder_eval.core import cpu
    from encoder_eval.core.errors import HarnessError

    def stop(cmd, log, env=None):
        raise HarnessError("stopped by the test")

    monkeypatch.setattr(demo, "_run", stop)
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: native)
    args = demo.build_parser().parse_args(["--out", str(tmp_path), "--model-path", "m",
                                           "--precision", word])  # fmt: skip
    lines: list[str] = []
    with pytest.raises(HarnessError, match="stopped by the test"):
        demo.run_demo(args, log=lines.append)
    assert any(line.startswith(said) for line in lines), lines
