"""The demo pipeline end to end (sweep -> run_all.sh -> select -> report -> summarize + plots),
on a tiny local model so it stays fast; CI runs the real `make demo` on MiniLM as well."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


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
