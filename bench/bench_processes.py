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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_sweep_arguments, n_cells, run_sweep, sweep_model, warm_token_cache  # noqa: E402

GROUPS = ("cell", "lr", "pair")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_sweep_arguments(p, tasks="sg_cb,glue_rte", lr_keys="lr03,lr06,lr09", seeds="42,43,44")
    args = p.parse_args()

    model = sweep_model(args)
    root = Path(tempfile.mkdtemp(prefix="bench-processes-"))
    warm_token_cache(args, model, "cpu", root / "warm")  # outside every measurement

    out: dict = {"cells": n_cells(args), "load_average_before": os.getloadavg()[0]}
    for group in GROUPS:
        seconds = run_sweep(args, model, "cpu", group, root, group, [], f"--group {group}")
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
