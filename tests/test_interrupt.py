"""Ctrl-C on `run_all.sh`: the terminal sends SIGINT to the script and its cell's process;
the cell saves its state and exits 130, and the script stops there (no next unit), says
how to resume and exits 130 itself. A real tiny cell, a real signal to the process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from fault_helpers import env, py, sh

from encoder_eval.protocol import LR_GRID
from encoder_eval.results import result_filename

MODEL, TASK = "tiny", "glue_rte"


def test_ctrl_c_stops_run_all_at_the_running_unit_and_says_how_to_resume(
    tmp_path, tiny_models, small_mirror
):
    rdir, runs = tmp_path / "results", tmp_path / "runs"
    # Two units (one per LR); 60 steps with a dev evaluation every 2 keep the first running.
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", "lr03,lr06", "--seeds", "42", "--group", "lr",
          "--max-steps", "60", "--max-seq-len", "128", "--device", "cpu", "--data-dir",
          small_mirror, "--extra-run-args", "--epoch-cap 100 --no-early-stop",
          "--out-dir", runs, "--results-dir", rdir), tmp_path)  # fmt: skip
    script = runs / "run_all.sh"
    first, second = (runs / "logs" / f"{MODEL}_{TASK}_{key}.log" for key in ("lr03", "lr06"))
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while '"step": 4' not in (first.read_text() if first.exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, "the cell never started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does to the foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert not second.exists() and f"starting {MODEL}_{TASK}_lr06" not in out  # no next unit
    assert "finished" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted during {MODEL}_{TASK}_lr03: ")
    assert f"run bash {script} again" in last
    assert "interrupted: " in first.read_text()  # the cell's own line, in its log
    name = result_filename(MODEL, TASK, LR_GRID["lr03"], 42)
    assert (rdir / f".resume-{name}.pt").exists() and not (rdir / name).exists()
