"""A valid results tree at the protocol's own size (14 models x 17 tasks), or a fraction of it.

Shared by the scale benchmark (`bench/bench_scale.py`, which puts this folder on `sys.path`)
and its test (`tests/test_scale.py`), so the test runs the very generator the figures come
from, and no test imports from `bench/`.

What it writes under ROOT, as a real protocol run leaves it:

- `sel/`: one select result per (model, task, LR key, select seed), with the experiment file
  that `encoder-eval sweep --phase select` writes there (the command itself is run);
- `selection.json`: written by `encoder-eval select` over `sel/` (the command itself);
- `rep/`: the experiment file of `sweep --phase report --selection selection.json` (the
  command), and per (model, task) at its selected LR one result per report seed, each with
  its `X.predictions.json` at the task's report-split size (`REPORT_ROWS`).

Every result is the real tiny-model cell of the test fixture (`TEMPLATE`: a cell the harness
ran and wrote) cloned and rewritten: its cell identity, the protocol recipe (so it is on
protocol), the model's loader and revision, the task's data identity, and its scores. A
report cell's scores are recomputed from its synthetic predictions with the project's own
metric code (`CellPredictions.scores`, which `check_against_result` uses), so the files
pass `validate_result`, `load_predictions` and `check_against_result`.

Quality is drawn from a seeded RNG: each model has an ability (some models share one, so
some pairs are tied) and a seed spread (they differ more than 5x between models, as real
models' do); a task turns abilities into scores, and a cell's predictions are right on the
examples easiest for it, so two models' predictions are correlated per example as real
models' are.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from encoder_eval.cells import predictions as preds_mod
from encoder_eval.core import metrics
from encoder_eval.core.protocol import (
    LR_GRID,
    PROTOCOL_RECIPE,
    REPORT_SEEDS,
    SELECT_SEEDS,
    Recipe,
    off_protocol_reasons,
)
from encoder_eval.core.results import result_filename
from encoder_eval.core.schema import validate_result
from encoder_eval.data.models import MODEL_REGISTRY, as_entry
from encoder_eval.data.tasks import task_knobs

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# A report cell the harness ran (a tiny real model on synthetic_sentiment): the clone source.
TEMPLATE = HERE / "fixtures" / "a4b0e90" / "rep" / "tiny_synthetic_sentiment_lr06_s45.json"

# The 17 tasks of the suite (`encoder-eval list tasks`, groups multilingual, glue and
# superglue), ordered so that every prefix mixes metrics and sizes: a fraction of the grid
# takes the first tasks (accuracy over 15 languages, Spearman, F1, MCC, macro-F1, ...).
SUITE_TASKS = (
    "xnli", "glue_stsb", "glue_mrpc", "glue_cola", "sg_cb", "glue_qqp", "massive_intent",
    "seahorse", "paws_x", "amazon_reviews_multi", "glue_mnli", "glue_qnli", "glue_rte",
    "glue_sst2", "sg_boolq", "sg_wic", "sg_wsc",
)  # fmt: skip

# Rows of each task's report split per language, at its real size. From the data mirror
# (/work/shared/data, SOURCES.md) where the mirror holds the official split: CoLA, SST-2,
# MRPC, STS-B, QNLI, RTE (GLUE dev), BoolQ, CB, WiC, WSC (SuperGLUE val) and the MARC test
# (Amazon, 5,000 per language). From the datasets' cards where the mirror holds a substitute
# or nothing: XNLI test 5,010 per language, PAWS-X test 2,000, MASSIVE test 2,974 per locale,
# QQP dev 40,430, MNLI dev-matched 9,815, SeaHorse test 18,330 (its paper; split evenly over
# its 6 languages here, the card gives no split by language).
REPORT_ROWS: dict[str, int] = {
    "xnli": 5010, "paws_x": 2000, "amazon_reviews_multi": 5000, "massive_intent": 2974,
    "seahorse": 3055, "glue_cola": 1043, "glue_sst2": 872, "glue_mrpc": 408,
    "glue_stsb": 1500, "glue_qqp": 40430, "glue_mnli": 9815, "glue_qnli": 5463,
    "glue_rte": 277, "sg_boolq": 3270, "sg_cb": 56, "sg_wic": 638, "sg_wsc": 104,
}  # fmt: skip

# Every registry model shares these (one harness, one data snapshot): a table needs them equal.
TRANSFORMERS = "4.56.2"
CREATED_AT = "2026-12-01T00:00:00+00:00"


@dataclass(frozen=True)
class GridSize:
    """Which part of the full grid to write: models, tasks, LR keys, and a cap on report rows
    per language (None: the real size)."""

    models: tuple[str, ...]
    tasks: tuple[str, ...]
    lr_keys: tuple[str, ...] = tuple(LR_GRID)
    max_rows: int | None = None

    @classmethod
    def fraction(cls, fraction: float, max_rows: int | None = None) -> GridSize:
        """The full grid (1.0), or about `fraction` of its cells with all LRs and seeds kept:
        sqrt(fraction) of the models and of the tasks (1/8: 5 models x 6 tasks, 30 of 238
        pairs), so that the cost of the pairwise marks, which grows with the square of the
        models, shows its growth beside the linear commands'."""
        side = math.sqrt(fraction)
        n_models = max(2, min(len(MODEL_REGISTRY), round(len(MODEL_REGISTRY) * side)))
        n_tasks = max(1, min(len(SUITE_TASKS), round(len(SUITE_TASKS) * side)))
        return cls(tuple(MODEL_REGISTRY)[:n_models], SUITE_TASKS[:n_tasks], max_rows=max_rows)

    def rows(self, task: str) -> int:
        n = REPORT_ROWS[task]
        return n if self.max_rows is None else min(n, self.max_rows)


@dataclass
class Grid:
    """What `generate` wrote: the folders, and counts of files, bytes and rows."""

    root: Path
    sel: Path
    rep: Path
    selection: Path
    select_results: int = 0
    report_results: int = 0
    prediction_rows: int = 0
    bytes_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- quality


def model_traits(models: tuple[str, ...], rng: np.random.Generator) -> dict[str, tuple]:
    """Per model: ability (a few shared, so some pairs tie), seed spread (0.002 to 0.03,
    log-uniform: more than 5x apart) and the LR index its dev curve peaks at."""
    levels = rng.permutation(np.linspace(0.0, 1.0, 10))
    out = {}
    for i, model in enumerate(models):
        ability = float(levels[i % len(levels)])  # models 11-14 repeat levels: tied pairs
        spread = float(np.exp(rng.uniform(np.log(0.002), np.log(0.03))))
        out[model] = (ability, spread, int(rng.integers(3, 8)))
    return out


def _task_traits(task: str, rng: np.random.Generator) -> tuple[float, float]:
    """(score of the weakest model, gain to the strongest) for a task's metric."""
    knobs = task_knobs(task)
    if knobs.metric in ("mcc", "spearman"):
        return float(rng.uniform(0.35, 0.6)), float(rng.uniform(0.1, 0.25))
    chance = 1.0 / max(knobs.num_labels, 2)
    low = float(rng.uniform(chance + 0.15, min(0.85, chance + 0.45)))
    return low, float(rng.uniform(0.05, min(0.15, 0.97 - low)))


def _labels(task: str, n: int, rng: np.random.Generator) -> np.ndarray:
    knobs = task_knobs(task)
    if knobs.num_labels == 1:
        if task == "seahorse":  # the share of "yes" answers
            return rng.choice([0.0, 1 / 3, 0.5, 2 / 3, 1.0], n)
        return np.round(rng.uniform(0.0, 5.0, n), 2)
    return rng.integers(0, knobs.num_labels, n)


def _predictions(
    task: str, labels: np.ndarray, difficulty: np.ndarray, target: float, rng
) -> np.ndarray:
    """A cell's predictions: right on the examples easiest for it, about `target` of them
    (classification), or the labels plus noise that shrinks with `target` (regression)."""
    knobs = task_knobs(task)
    if knobs.num_labels == 1:
        r = min(max(target, 0.05), 0.98)
        sigma = float(np.std(labels)) * math.sqrt(1.0 / r**2 - 1.0)
        noise = 0.6 * difficulty + 0.8 * rng.standard_normal(labels.size)
        return np.round(labels + sigma * noise, 4)
    if knobs.metric == "mcc":  # a correlation: the accuracy that gives it on balanced classes
        target = (1.0 + target) / 2.0
    hardness = 0.7 * difficulty + 0.3 * rng.uniform(size=labels.size)
    cut = np.quantile(hardness, min(max(target, 0.0), 1.0))
    wrong = hardness > cut
    shift = rng.integers(1, knobs.num_labels, labels.size)
    return np.where(wrong, (labels + shift) % knobs.num_labels, labels)


# ----------------------------------------------------------------------------- results


def _template() -> dict:
    return json.loads(TEMPLATE.read_text(encoding="utf-8"))


def _recipe(template: dict, model: str, task: str) -> tuple[dict, str, bool]:
    """The protocol recipe as a real cell records it, with the model's loader; plus its
    Hub path and whether it runs remote code."""
    entry = as_entry(MODEL_REGISTRY[model])
    recipe = {**template["recipe"], **PROTOCOL_RECIPE.to_dict()}
    recipe.update(mode=entry.mode, pair_format=task_knobs(task).pair_format, warmup_steps=1000)
    return recipe, entry.path, bool(entry.trust_remote_code)


def _score_section(per_language: dict[str, float | None], undefined: dict, task: str) -> dict:
    mean, langs = metrics.language_mean(per_language, task_knobs(task).euro_languages)
    return {
        "per_language": per_language,
        "mean": mean,
        "languages_in_mean": langs,
        "undefined": undefined,
    }


def _result(
    template: dict,
    model: str,
    task: str,
    lr_key: str,
    seed: int,
    phase: str,
    dev: dict[str, float] | None,
) -> dict:
    """The template cell rewritten as (model, task, lr_key, seed, phase); `dev` None: diverged."""
    data = copy.deepcopy(template)
    lr = LR_GRID[lr_key]
    recipe, path, trust = _recipe(template, model, task)
    fields_ = {k: recipe[k] for k in PROTOCOL_RECIPE.to_dict()}
    reasons = off_protocol_reasons(Recipe(**fields_), lr, seed, phase)
    knobs = task_knobs(task)
    data["cell"] = {"model": model, "task": task, "lr": lr, "lr_key": lr_key, "seed": seed,
                    "phase": phase}  # fmt: skip
    data["metric"] = knobs.metric
    data["recipe"] = recipe
    data["protocol"] = {"on_protocol": not reasons, "off_protocol_reasons": reasons}
    prov = data["provenance"]
    prov["software"]["transformers"] = TRANSFORMERS
    prov["model_revision"] = "sha-" + path.replace("/", "-")  # one pinned revision per model
    prov["model_path"] = path
    prov["model_source"] = "hub"
    prov["trust_remote_code"] = trust
    prov["data"] = {"source": "hub", "dataset": knobs.hf_path, "revision": "sha-scale",
                    "identity": f"hub:{knobs.hf_path}@sha-scale-{task}"}  # fmt: skip
    data["created_at"] = CREATED_AT
    training = data["training"]
    training.update(max_steps=PROTOCOL_RECIPE.max_steps, steps=4000, best_step=3000,
                    stopped_by="early_stop", early_stopped=True)  # fmt: skip
    if dev is None:
        data["status"] = "diverged"
        data["dev"] = None
        training.update(stopped_by="diverged", diverged_at_step=120, early_stopped=False)
    else:
        data["dev"] = _score_section(dev, {}, task)
        best = data["dev"]["mean"]
        training["dev_history"] = [  # 8 evaluations, the best at step 3,000 (of 4,000)
            {"step": 500 * (i + 1), "dev": best - 0.01 * (6 - i) if i < 6 else best - 0.005 * (i - 5),
             "loss": 0.7 / (i + 1)}
            for i in range(8)
        ]  # fmt: skip
    data["report"] = None
    return data


def _write_json(path: Path, data: dict) -> int:
    """Write `data` as the harness writes a result (`write_json_atomic`'s text, indent 2),
    without its fsync: a generator of thousands of files, not a cell. Returns bytes written."""
    errors = validate_result(data)
    if errors:
        raise AssertionError(f"{path.name}: {errors}")
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def _run(args: list[str], env: dict) -> None:
    """Run an encoder-eval command of this checkout; a failure stops the generator, naming it."""
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"encoder-eval {args[0]} failed ({proc.returncode}): {tail}")


def command_env() -> dict:
    """The environment the grid's commands run in: this checkout first on the path, offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def generate(root: str | os.PathLike, size: GridSize, seed: int = 0) -> Grid:
    """Write the grid of `size` under `root` (see the module docstring) and return its counts."""
    root = Path(root)
    grid = Grid(root, root / "sel", root / "rep", root / "selection.json")
    env = command_env()
    rng = np.random.default_rng(seed)
    template = _template()
    models, tasks, keys = size.models, size.tasks, size.lr_keys
    traits = model_traits(models, rng)
    task_traits = {t: _task_traits(t, rng) for t in tasks}
    common = ["--models", ",".join(models), "--tasks", ",".join(tasks), "--mode", "shell"]

    t0 = time.perf_counter()
    _run(["sweep", "--phase", "select", *common, "--lr-keys", ",".join(keys),
          "--results-dir", str(grid.sel), "--out-dir", str(root / "runs_select")], env)  # fmt: skip
    grid.seconds["sweep select"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    true_score: dict[tuple[str, str], float] = {}
    for task in tasks:
        low, gain = task_traits[task]
        langs = task_knobs(task).languages
        lang_offset = {lang: float(rng.normal(0, 0.02)) for lang in langs}
        for model in models:
            ability, spread, peak = traits[model]
            score = low + gain * ability + float(rng.normal(0, 0.004))
            true_score[(model, task)] = score
            for key in keys:
                lr_index = list(LR_GRID).index(key)
                for s in SELECT_SEEDS:
                    diverged = key == "lr10" and rng.uniform() < 0.03
                    at = score - 0.004 * (lr_index - peak) ** 2 + float(rng.normal(0, spread))
                    dev = None
                    if not diverged:
                        dev = {
                            lang: float(np.clip(at + lang_offset[lang], -1.0, 1.0))
                            for lang in langs
                        }
                    data = _result(template, model, task, key, s, "select", dev)
                    path = grid.sel / result_filename(model, task, LR_GRID[key], s)
                    grid.bytes_written += _write_json(path, data)
                    grid.select_results += 1
    grid.seconds["select results"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _run(["select", "--results-dir", str(grid.sel), "--out", str(grid.selection)], env)
    grid.seconds["select"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _run(["sweep", "--phase", "report", "--selection", str(grid.selection), "--mode", "shell",
          "--results-dir", str(grid.rep), "--out-dir", str(root / "runs_report")], env)  # fmt: skip
    grid.seconds["sweep report"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    chosen = json.loads(grid.selection.read_text(encoding="utf-8"))["pairs"]
    for task in tasks:
        knobs = task_knobs(task)
        n = size.rows(task)
        labels = {lang: _labels(task, n, rng) for lang in knobs.languages}
        difficulty = {lang: rng.uniform(size=n) for lang in knobs.languages}
        for model in models:
            ability, spread, _ = traits[model]
            key = chosen[model][task]["lr_key"]
            for s in REPORT_SEEDS:
                target = true_score[(model, task)] + float(rng.normal(0, spread))
                per_lang = {}
                for lang in knobs.languages:
                    preds = _predictions(task, labels[lang], difficulty[lang], target, rng)
                    per_lang[lang] = {"predictions": preds.tolist(),
                                      "labels": labels[lang].tolist()}  # fmt: skip
                dev_at = {lang: float(np.clip(target, -1.0, 1.0)) for lang in knobs.languages}
                data = _result(template, model, task, key, s, "report", dev_at)
                data["report"] = {"split": knobs.report_split}
                cell = preds_mod.from_cell(data, per_lang)
                scores = cell.scores()
                undefined = {
                    lang: metrics.undefined_reason(knobs.metric, p.predictions, p.labels)
                    for lang, p in cell.languages.items()
                    if scores[lang] is None
                }
                data["report"].update(_score_section(scores, undefined, task))
                path = grid.rep / result_filename(model, task, LR_GRID[key], s)
                pred_path = preds_mod.predictions_path(path)
                preds_mod.write_predictions(pred_path, cell)
                grid.bytes_written += _write_json(path, data) + pred_path.stat().st_size
                grid.report_results += 1
                grid.prediction_rows += n * len(knobs.languages)
    grid.seconds["report results"] = time.perf_counter() - t0
    return grid


def check_grid(grid: Grid) -> int:
    """Read every report cell back through the project's checks (`load_results`,
    `load_predictions`, `check_against_result`); AssertionError naming the first problem.
    Returns the number of report cells checked."""
    from encoder_eval.core.results import load_results

    problems: list[str] = []
    loaded = load_results(grid.rep, warn=problems.append)
    for r in loaded:
        preds = preds_mod.load_predictions(preds_mod.predictions_path(r.path))
        problems += [f"{r.path.name}: {p}" for p in preds_mod.check_against_result(preds, r.result)]
    if problems:
        raise AssertionError(problems[0])
    return len(loaded)
