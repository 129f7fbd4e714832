"""Benchmark: N small cells run by `run_all.sh` one process per unit, against its warm worker.

Writes the same select sweep twice with `python -m encoder_eval.sweep --mode shell --group
cell` (one unit per cell) and runs:

  (a) `bash run_all.sh`         one `python -m encoder_eval.run` process per unit (the
                                reference: today's default);
  (b) `bash run_all.sh --warm`  one long-lived `python -m encoder_eval.run --warm-worker`
                                process that runs every unit in turn.

For each: wall seconds and CPU seconds (user + system of every process the run started,
writing the sweep included: the same for both), the median start-up of a cell (its
`training.process_start_to_first_step_s`, to the end of its first step: from the process's
start in (a), from the unit's arrival in (b)) and what (b) saved each cell of it, then the
ratios (a)/(b). Each variant runs `--repeats` times, alternating, and the medians are
compared; the token cache is warmed first so neither pays for tokenising. The results of (a) and (b) are checked equal (the
dev scores and final training loss of every cell) on the CPU; on a GPU, where a rerun of
one cell differs in low bits, the largest differences are printed beside those between two
runs of (a) (`--repeats 2`). Default: all-MiniLM-L6-v2 on glue_rte from ../shared/data,
2 learning rates x 3 seeds, 2 steps per cell, `--limit 64` (every split cut to 64
examples, so a cell's own work is short, as on a GPU; `--limit 0` for the whole splits),
`--precision auto` (fp32 on a CPU without native bf16), CPU. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_sweep_arguments, n_cells, run_sweep, sweep_model, warm_token_cache  # noqa: E402


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _dev_scores(results: Path) -> dict[str, object]:
    """Each cell's dev scores and final training loss: the loss shows low-bit differences
    that seldom flip a dev prediction."""
    out: dict[str, object] = {}
    for path in sorted(results.glob("*.json")):
        r = json.loads(path.read_text())
        out[path.name] = {**r["dev"], "final_loss": r["training"]["final_loss"]}
    return out


def _startups(results: Path) -> dict[str, float]:
    """Each cell's `training.process_start_to_first_step_s` (to the end of its first step):
    from its process's start, or in a warm worker from its unit's arrival (what that unit
    paid)."""
    out = {}
    for path in sorted(results.glob("*.json")):
        value = json.loads(path.read_text())["training"]["process_start_to_first_step_s"]
        if value is not None:
            out[path.name] = value
    return out


def _differences(a: dict[str, object], b: dict[str, object]) -> dict[str, float]:
    """Largest absolute difference of each figure between two runs of the same cells."""
    out: dict[str, float] = {}
    for cell, dev in a.items():
        for key, value in dev.items() if isinstance(dev, dict) else ():
            other = b.get(cell, {}).get(key) if isinstance(b.get(cell), dict) else None
            if isinstance(value, (int, float)) and isinstance(other, (int, float)):
                out[key] = max(out.get(key, 0.0), abs(value - other))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_sweep_arguments(p, tasks="glue_rte", lr_keys="lr03,lr06", seeds="42,43,44")
    p.set_defaults(max_steps=2)
    p.add_argument("--precision", default="auto")
    p.add_argument("--limit", type=int, default=64, help="0: the whole splits")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()

    model = sweep_model(args)
    root = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    warm_token_cache(args, model, args.device, root / "warm-cache")  # outside every measurement
    flags = ("--precision", args.precision) + (("--limit", str(args.limit)) if args.limit else ())
    runs: dict[str, list[tuple[float, float]]] = {"per_unit": [], "warm": []}
    startups: dict[str, list[dict[str, float]]] = {"per_unit": [], "warm": []}
    load_before = os.getloadavg()[0]
    scores: dict[str, list[dict[str, object]]] = {"per_unit": [], "warm": []}
    for i in range(args.repeats):
        for name, run_all_flags in (("per_unit", []), ("warm", ["--warm"])):
            cpu0 = _children_cpu()
            wall = run_sweep(args, model, args.device, "cell", root, f"{name}{i}",
                             run_all_flags, name, flags)  # fmt: skip
            runs[name].append((wall, _children_cpu() - cpu0))
            scores[name].append(_dev_scores(root / f"{name}{i}"))
            startups[name].append(_startups(root / f"{name}{i}"))
    same = scores["per_unit"][0] == scores["warm"][0]
    out: dict = {"cells": n_cells(args), "max_steps": args.max_steps, "limit": args.limit,
                 "device": args.device}  # fmt: skip
    for name, values in runs.items():
        out[name] = {
            "wall_s": [round(w, 1) for w, _ in values],
            "cpu_s": [round(c, 1) for _, c in values],
            "wall_median_s": round(statistics.median(w for w, _ in values), 1),
            "cpu_median_s": round(statistics.median(c for _, c in values), 1),
            "startup_s": startups[name],
            "startup_median_s": round(
                statistics.median(v for run in startups[name] for v in run.values()), 2
            ),
        }
    for kind in ("wall", "cpu"):
        out[f"ratio_{kind}_per_unit_over_warm"] = round(
            out["per_unit"][f"{kind}_median_s"] / out["warm"][f"{kind}_median_s"], 2
        )
    # The same cell's start-up in both (first runs): what the warm worker saved it. The
    # worker's first unit pays the imports like a fresh process; every later one is spared.
    saved = sorted(
        a - startups["warm"][0][cell]
        for cell, a in startups["per_unit"][0].items()
        if cell in startups["warm"][0]
    )
    out["startup_saved_s"] = [round(v, 2) for v in saved]
    out["same_dev_scores"] = same
    if not same:  # on a GPU a rerun differs in low bits: compare with a rerun of the reference
        out["dev_score_differences"] = {
            "warm_vs_per_unit": _differences(scores["per_unit"][0], scores["warm"][0]),
            "per_unit_rerun": _differences(scores["per_unit"][0], scores["per_unit"][-1]),
        }
    out["load_average_before_after"] = [load_before, os.getloadavg()[0]]
    out["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for name in runs:
        v = out[name]
        print(f"{name:9s} {out['cells']} cells: wall {v['wall_median_s']:7.1f} s, "
              f"CPU {v['cpu_median_s']:7.1f} s, a cell's start-up to its first step "
              f"{v['startup_median_s']:.2f} s (median)")  # fmt: skip
    print(f"start-up saved per cell by the warm worker (sorted): {out['startup_saved_s']} s")
    print(f"one process per unit / warm worker: wall {out['ratio_wall_per_unit_over_warm']}x, "
          f"CPU {out['ratio_cpu_per_unit_over_warm']}x "
          f"({'same' if same else 'different'} dev scores)")  # fmt: skip
    print(json.dumps(out))
    if not same and args.device == "cpu":  # a cell is a function of its seed on the CPU
        print("the warm worker's dev scores differ from one process per unit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
