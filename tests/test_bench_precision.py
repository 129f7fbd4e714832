"""bench/bench_precision.py at toy size (issue 29 item 5): the script behind the timings per
CPU kind (docs/install.md) runs and prints both precisions, and that page cites it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_precision_times_both_precisions_and_the_readme_gives_both_cpu_kinds(
    tiny_models, tmp_path
):
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_precision.py"), "--model-path",
         str(tiny_models["bert"]), "--batch", "2", "--seq-len", "16", "--reps", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(out["cpu_native_bf16"], bool)
    for key in ("fp32_median_s", "bf16_median_s", "fp32_best_s", "bf16_best_s"):
        assert out[key] > 0
    assert out["bf16_over_fp32"] == round(out["bf16_median_s"] / out["fp32_median_s"], 2)
    page = (REPO / "docs" / "install.md").read_text()
    section = page.split("## Timings per CPU kind", 1)[1].split("\n#", 1)[0]
    assert "bench/bench_precision.py" in section
    assert "with native bf16" in section and "without native bf16" in section
