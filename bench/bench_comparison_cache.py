"""Benchmark: what the comparison cache saves (`reports/comparison_cache.py`, issue 37 item 3).

Writes a report folder of valid result and predictions files without training (K models x
the tasks, five report seeds, N examples each, `tests/result_helpers.py`), then runs the
commands a user runs over it, each as its own `python -m encoder_eval ...` process, and
prints each one's CPU seconds (user + system of the child), wall seconds and the ratio
against (a), the reference run in the same script:

  (a) summarize --no-cache                   every mark's comparison computed, nothing kept
  (b) summarize                              the same, the rows written to the cache
  (c) summarize --format json                a second render: every row read back
  (d) report                                 after summarize: compare's rows computed, the marks' read
  (e) report                                 again: every row read back
  (f) compare --format json --no-cache --jobs J   compare's rows over J processes (wall)
  (g) compare --format json --no-cache       the same on one process

The cache is a fresh one in the temporary folder (`$ENCODER_EVAL_CACHE_DIR/comparisons/`),
never the user's. The last line is one JSON object. Nothing here runs under pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, print_json, rounded  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from result_helpers import make_selection, write_cell_with_predictions  # noqa: E402


def write_folder(out: Path, models: int, tasks: list[str], examples: int, seed: int) -> None:
    """Report cells of `models` models of rising skill on `tasks` (0/1 labels)."""
    rng = np.random.default_rng(seed)
    names = [f"m{i:02d}" for i in range(models)]
    for task in tasks:
        labels = rng.integers(0, 2, examples).tolist()
        for i, model in enumerate(names):
            skill = 0.65 + 0.2 * i / max(1, models - 1)
            for s in range(45, 50):
                right = rng.random(examples) < skill + rng.normal(0, 0.01)
                preds = [y if ok else 1 - y for y, ok in zip(labels, right, strict=True)]
                write_cell_with_predictions(out, model, task, "lr05", s, preds, labels)
    selection = make_selection({(m, t): "lr05" for m in names for t in tasks})
    (out.parent / "selection.json").write_text(json.dumps(selection))


def timed(argv: list[str]) -> dict:
    """Run `python -m encoder_eval <argv>`; its CPU and wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval", *argv],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=5)
    p.add_argument("--tasks", default="glue_rte,glue_mrpc,glue_cola")
    p.add_argument("--examples", type=int, default=300)
    p.add_argument("--resamples", type=int, default=199)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    tasks = args.tasks.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        rdir = Path(tmp) / "report"
        os.environ["ENCODER_EVAL_CACHE_DIR"] = str(Path(tmp) / "user-cache")  # the children's
        write_folder(rdir, args.models, tasks, args.examples, args.seed)
        common = ["--results-dir", str(rdir), "--selection", str(Path(tmp) / "selection.json"),
                  "--resamples", str(args.resamples)]  # fmt: skip
        page = str(Path(tmp) / "page.html")
        steps = [
            ("a", "summarize --no-cache", ["summarize", *common, "--no-cache"]),
            ("b", "summarize (writes the cache)", ["summarize", *common]),
            (
                "c",
                "summarize --format json (second render)",
                ["summarize", *common, "--format", "json"],
            ),  # fmt: skip
            ("d", "report after summarize", ["report", *common, "--out", page]),
            ("e", "report again", ["report", *common, "--out", page]),
            (
                "f",
                f"compare --no-cache --jobs {args.jobs}",
                ["compare", *common, "--format", "json", "--no-cache", "--jobs", str(args.jobs)],
            ),  # fmt: skip
            (
                "g",
                "compare --no-cache --jobs 1",
                ["compare", *common, "--format", "json", "--no-cache"],
            ),  # fmt: skip
        ]
        runs = {}
        print(f"{args.models} models x {len(tasks)} tasks ({', '.join(tasks)}), 5 seeds, "
              f"{args.examples} examples, {args.resamples} resamples")  # fmt: skip
        print(f"{'':3} {'command':44} {'CPU s':>8} {'wall s':>8} {'CPU / (a)':>10}")
        for name, label, argv in steps:
            runs[name] = {"command": label, **timed(argv)}
            r = runs[name]
            ratio = r["cpu_s"] / runs["a"]["cpu_s"]
            print(f"({name}) {label:44} {r['cpu_s']:8.1f} {r['wall_s']:8.1f} {ratio:10.3f}")
        entries = len(list((Path(tmp) / "user-cache" / "comparisons").glob("*.json")))
        print(f"cache entries: {entries}; compare wall (g)/(f): "
              f"{runs['g']['wall_s'] / runs['f']['wall_s']:.2f}")  # fmt: skip
    print_json(rounded({"config": vars(args), "runs": runs, "cache_entries": entries}))


if __name__ == "__main__":
    main()
