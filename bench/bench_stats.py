"""The per-example statistics of one pair of models over the protocol's 17 tasks, at real
test-set sizes: the vectorised resampling (issue 37, item 2) against the loop it replaced
(`tests/stats_reference.py`), CPU seconds and peak resident memory of each, in one script.

Two workloads per pair, as `encoder_eval.reports.verdicts.compare_cells` runs them:
- marks: what `summarize`'s marks compute (`bootstrap=False, example_test=False, aso=False`):
  the test-set variance, 999 bootstrap resamples of every seed's score;
- compare: everything `compare` computes: also the swap permutation test (999) and the
  two-level bootstrap (999), and ASO both ways.

The predictions are synthesised (seeded): per task its metric, its languages and Euro
languages from the registry, and a test size per language (XNLI 15 x 5,010, MASSIVE 51 x
2,974, ...); per model 5 seeds that agree on most examples. The new path runs at
`--resamples` (999, the default of every command); the reference loop runs at
`--ref-resamples` and is scaled to `--resamples` (its cost is per resample), and the same
script checks that the new path gives the reference's numbers at that count. Each part
runs in its own process, so its peak RSS is its own.

    .venv/bin/python bench/bench_stats.py                 # the full 17 tasks
    .venv/bin/python bench/bench_stats.py --scale 0.1     # sizes x 0.1, a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's encoder_eval, installed or not
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))  # the reference loop lives with the tests
from common import peak_rss, print_json, rounded  # noqa: E402

# Report (test) rows per language, as the mirror holds them (GLUE/SuperGLUE: the split the
# harness reports on; RTE 3,000 and MNLI 9,815 as issue 37 names them).
SIZES = {
    "xnli": 5010,
    "paws_x": 2000,
    "amazon_reviews_multi": 5000,
    "massive_intent": 2974,
    "seahorse": 3000,
    "glue_cola": 1043,
    "glue_sst2": 1821,
    "glue_mrpc": 1725,
    "glue_stsb": 1379,
    "glue_qqp": 40430,
    "glue_mnli": 9815,
    "glue_qnli": 5463,
    "glue_rte": 3000,
    "sg_boolq": 3245,
    "sg_cb": 250,
    "sg_wic": 1400,
    "sg_wsc": 146,
}
MODELS = ("model_a", "model_b")
SEEDS = 5


def synthesise(scale: float, models: tuple[str, ...] = MODELS, seed: int = 20261201):
    """{(model, task): (Examples, None)} (`compare_cells`' cache of `load_examples`) and a
    duck-typed table of their seed scores."""
    import numpy as np

    from encoder_eval.core.metrics import resample_scorer
    from encoder_eval.data.tasks import task_knobs
    from encoder_eval.reports.verdicts import Examples

    rng = np.random.default_rng(seed)
    examples, cells = {}, {}
    for task, per_lang in SIZES.items():
        knobs = task_knobs(task)
        langs = knobs.languages or ("en",)
        n_lang = max(2, int(per_lang * scale))
        languages = np.repeat(np.asarray(langs), n_lang)
        n = languages.size
        if knobs.metric == "spearman":
            labels = np.round(rng.uniform(0, 5, n), 1)
        else:
            labels = rng.integers(0, max(2, knobs.num_labels), n).astype(float)
        ease = rng.normal(0, 1.5, n)  # shared by seeds and models: examples easy or hard
        for m, skill in zip(models, np.linspace(0.9, 0.7, len(models)), strict=True):
            if knobs.metric == "spearman":
                noise = rng.normal(0, 1, n) + rng.normal(0, 0.4, (SEEDS, n))
                matrix = labels + (1.5 - skill) * noise
            else:
                logit = (
                    skill + ease + rng.normal(0, 0.1, (SEEDS, 1)) + rng.normal(0, 0.5, (SEEDS, n))
                )
                right = rng.random((SEEDS, n)) < 1 / (1 + np.exp(-logit))
                wrong = (labels + rng.integers(1, max(2, knobs.num_labels), (SEEDS, n))) % max(
                    2, knobs.num_labels
                )
                matrix = np.where(right, labels, wrong).astype(float)
            ex = Examples(
                seeds=list(range(45, 45 + SEEDS)),
                matrix=matrix,
                labels=labels,
                languages=languages,
                data_identity="synthetic",
                ids=[(str(lang), i) for i, lang in enumerate(languages)],
            )
            examples[(m, task)] = (ex, None)
            scores = resample_scorer(knobs.metric, matrix, labels, languages, knobs.euro_languages)(
                np.arange(n)[None, :]
            )[0]
            cells[(m, task)] = SimpleNamespace(
                scores=dict(zip(ex.seeds, scores.tolist(), strict=True)), mean=float(scores.mean())
            )
    return examples, SimpleNamespace(cells=cells, tasks=list(SIZES))


def run_new(args, workload: str, resamples: int) -> dict:
    """`compare_cells` (the package) on every task; its rows' example statistics."""
    from encoder_eval.reports.verdicts import compare_cells

    examples, table = synthesise(args.scale)
    start = time.process_time()
    out = {}
    for task in SIZES:
        row = compare_cells(
            *MODELS, task, table, {}, n_resamples=resamples, seed=args.seed, examples=examples,
            bootstrap=workload == "compare", example_test=workload == "compare",
            aso=workload == "compare",
        )  # fmt: skip
        out[task] = [row.example_sd, row.p_example, row.boot_low, row.boot_high]
    return {"cpu_s": time.process_time() - start, "values": out}


def run_reference(args, workload: str, resamples: int) -> dict:
    """The loop before issue 37 (`tests/stats_reference.py`) on the same inputs."""
    import numpy as np
    import stats_reference as ref

    from encoder_eval.core import stats
    from encoder_eval.data.tasks import task_knobs

    examples, table = synthesise(args.scale)
    start = time.process_time()
    out = {}
    for task in SIZES:
        knobs = task_knobs(task)
        seed = stats.task_seed(args.seed, task)  # each task's own stream, as compare_cells
        ea, eb = examples[(MODELS[0], task)][0], examples[(MODELS[1], task)][0]
        a = [table.cells[(MODELS[0], task)].scores[s] for s in ea.seeds]
        b = [table.cells[(MODELS[1], task)].scores[s] for s in eb.seeds]
        stats.welch(a, b)
        p = low = high = None
        if workload == "compare":
            stats.aso(a, b, seed=seed), stats.aso(b, a, seed=seed)
            _, p, reps, low, high = ref.example_statistics(
                ea.matrix, eb.matrix, ea.labels, ea.languages, knobs.metric,
                knobs.euro_languages, 1.0, resamples, seed,
            )  # fmt: skip
        else:
            per_seed = ref.seed_scores(knobs.metric, knobs.euro_languages)
            both = np.concatenate([ea.matrix, eb.matrix])
            reps = ref.example_replicates(
                lambda cols, both=both, per_seed=per_seed, ea=ea: per_seed(
                    both, ea.labels, ea.languages, cols
                ),
                ea.languages, max(2, resamples), seed,
            )  # fmt: skip
        vex = stats.shared_example_part(reps, SEEDS)
        if not math.isnan(vex):
            stats.combined_test(a, b, vex)
        out[task] = [None if math.isnan(vex) else math.sqrt(vex), p, low, high]
    return {"cpu_s": time.process_time() - start, "values": out}


def run_power(args) -> dict:
    """`finish_rows` over summarize's default family at 14 models x 17 tasks (1,547 rows):
    the power search (seeds needed, MDD@5) at alpha 0.05 / 1,547."""
    import numpy as np

    from encoder_eval.reports import verdicts

    rng = np.random.default_rng(args.seed)
    rows = []
    for i in range(91 * 17):
        std_a = float(10 ** rng.uniform(-3, -1.5))
        rows.append(
            verdicts.Row(
                "a",
                "b",
                f"t{i}",
                "accuracy",
                5,
                5,
                0.6,
                0.58,
                diff=float(rng.normal(0, 0.02)),
                p_seed=float(rng.uniform()),
                std_a=std_a,
                std_b=std_a * float(10 ** rng.uniform(-1, 1)),
                example_sd=float(10 ** rng.uniform(-3, -1.5)),
                p_combined=float(rng.uniform()),
            )  # fmt: skip
        )
    start = time.process_time()
    verdicts.finish_rows(rows, 0.05, "holm", family_of=verdicts.family_key("table"))
    return {"cpu_s": time.process_time() - start, "values": {}}


def run_table(args) -> dict:
    """The marks of a whole table: 14 models, every pair on every task (91 x 17
    `compare_cells` as `best_marks` calls them, one shared cache) and `finish_rows` over
    the 1,547 rows in one family."""
    from encoder_eval.reports import verdicts

    models = tuple(f"model_{i:02d}" for i in range(14))
    examples, table = synthesise(args.scale, models)
    start = time.process_time()
    rows = [
        verdicts.compare_cells(
            a,
            b,
            task,
            table,
            {},
            n_resamples=args.resamples,
            seed=args.seed,
            examples=examples,
            bootstrap=False,
            example_test=False,
            aso=False,
        )  # fmt: skip
        for task in SIZES
        for i, a in enumerate(models)
        for b in models[i + 1 :]
    ]
    verdicts.finish_rows(rows, 0.05, "holm", family_of=verdicts.family_key("table"))
    return {"cpu_s": time.process_time() - start, "values": {}, "rows": len(rows)}


def part(args) -> None:
    """One measurement in this process: CPU seconds, peak RSS, the statistics."""
    kind, workload = args.part.split("-")
    if kind == "power":
        res = run_power(args)
    elif kind == "table":
        res = run_table(args)
    elif kind == "new":
        res = run_new(args, workload, args.resamples if args.at is None else args.at)
    else:
        res = run_reference(args, workload, args.ref_resamples)
    res["peak_rss_mb"] = peak_rss() / 2**20
    print_json(res)


def child(args, name: str, at: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--part", name, "--scale", str(args.scale),
           "--resamples", str(args.resamples), "--ref-resamples", str(args.ref_resamples),
           "--seed", str(args.seed)] + ([] if at is None else ["--at", str(at)])  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def max_gap(a: dict, b: dict) -> float:
    """The largest |a - b| over every task's statistics (None on both sides: equal)."""
    gap = 0.0
    for task, values in a.items():
        for x, y in zip(values, b[task], strict=True):
            if (x is None) != (y is None):
                return math.inf
            if x is not None:
                gap = max(gap, abs(x - y))
    return gap


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scale", type=float, default=1.0, help="test sizes x this (default 1)")
    ap.add_argument("--resamples", type=int, default=999, help="the new path's resamples")
    ap.add_argument("--ref-resamples", type=int, default=10,
                    help="the reference loop's resamples, scaled to --resamples (default 10)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--at", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--table", action="store_true",
                    help="also the marks of a whole 14-model table (91 pairs x 17 tasks)")  # fmt: skip
    args = ap.parse_args()
    if args.part:
        return part(args)
    print(f"one pair of models, {len(SIZES)} tasks, {SEEDS} seeds each, sizes x {args.scale}, "
          f"{args.resamples} resamples (reference: {args.ref_resamples}, scaled)")  # fmt: skip
    result = {"scale": args.scale, "resamples": args.resamples, "ref_resamples": args.ref_resamples}
    factor = args.resamples / args.ref_resamples
    print(f"{'workload':<9} {'new CPU s':>10} {'new RSS MB':>11} {'loop CPU s':>11} "
          f"{'loop RSS MB':>12} {'ratio':>7} {'max |new - loop|':>17}")  # fmt: skip
    for workload in ("marks", "compare"):
        new = child(args, f"new-{workload}")
        same = child(args, f"new-{workload}", at=args.ref_resamples)
        loop = child(args, f"ref-{workload}")
        loop_cpu = loop["cpu_s"] * factor
        gap = max_gap(same["values"], loop["values"])
        print(f"{workload:<9} {new['cpu_s']:>10.2f} {new['peak_rss_mb']:>11.0f} {loop_cpu:>11.1f} "
              f"{loop['peak_rss_mb']:>12.0f} {loop_cpu / new['cpu_s']:>6.0f}x {gap:>17.1e}")  # fmt: skip
        result[workload] = {"new_cpu_s": new["cpu_s"], "new_peak_rss_mb": new["peak_rss_mb"],
                            "loop_cpu_s_scaled": loop_cpu, "loop_peak_rss_mb": loop["peak_rss_mb"],
                            "ratio": loop_cpu / new["cpu_s"], "max_abs_gap": gap}  # fmt: skip
    power = child(args, "power-rows")
    print(f"power search, 1,547 rows at alpha 0.05/1547: {power['cpu_s']:.2f} CPU s")
    result["power_1547_rows_cpu_s"] = power["cpu_s"]
    if args.table:
        whole = child(args, "table-marks")
        print(f"marks of a 14-model table ({whole['rows']} comparisons and their power search): "
              f"{whole['cpu_s']:.1f} CPU s, peak RSS {whole['peak_rss_mb']:.0f} MB")  # fmt: skip
        result["table_marks"] = {"cpu_s": whole["cpu_s"], "peak_rss_mb": whole["peak_rss_mb"]}
    print_json(rounded(result))


if __name__ == "__main__":
    main()
