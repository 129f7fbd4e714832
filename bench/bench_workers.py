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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_sweep_arguments, n_cells, run_sweep, sweep_model, warm_token_cache  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_sweep_arguments(p, tasks="glue_rte,sg_cb", lr_keys="lr03,lr06", seeds="42,43")
    p.add_argument("--workers", type=int, default=2, help="K, the workers of the second run")
    p.add_argument("--gpu", default=None, help="a GPU index: bench --workers-per-gpu on it")
    args = p.parse_args()

    model = sweep_model(args)
    device = "cpu" if args.gpu is None else "cuda"
    root = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    warm_token_cache(args, model, device, root / "warm")  # outside every measurement

    if args.gpu is None:
        variants = {"one": ["--workers", "1"], "k": ["--workers", str(args.workers)]}
    else:
        # --workers-per-gpu 1: without it --gpus picks K from the card's memory
        variants = {"one": ["--gpus", args.gpu, "--workers-per-gpu", "1"],
                    "k": ["--gpus", args.gpu, "--workers-per-gpu", str(args.workers)]}  # fmt: skip
    out: dict = {"cells": n_cells(args), "device": device, "k": args.workers,
                 "load_average_before": os.getloadavg()[0]}  # fmt: skip
    for name, flags in variants.items():
        label = f"run_all.sh {' '.join(flags)}"
        seconds = run_sweep(args, model, device, "cell", root, name, flags, label)
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
