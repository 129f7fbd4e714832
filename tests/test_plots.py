"""The figures: LR-sensitivity plots, the final score chart and the write_plots convenience.

Result dicts are built here (valid under the result schema); training is tested elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from encoder_eval.core.protocol import LR_GRID, REPORT_SEEDS, SELECT_SEEDS
from encoder_eval.core.results import result_filename, validate_result, write_json_atomic
from encoder_eval.core.schema import CellId, CellResult, Protocol, ScoreSection, Training
from encoder_eval.plans import selection
from encoder_eval.reports import plots
from encoder_eval.reports.table import build_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SAMPLE_DIR = os.environ.get("PLOTS_SAMPLE_DIR")  # set to keep copies of the figures to look at


def make_result(
    model: str,
    task: str,
    lr_key: str,
    seed: int,
    phase: str = "select",
    score: float | None = 0.8,
    metric: str = "accuracy",
    report_split: str = "test",
) -> dict:
    """A schema-valid result dict; `score=None` makes a diverged cell."""
    lr = LR_GRID[lr_key]
    ok = score is not None
    scores = ScoreSection(per_language={"en": score}, mean=score, languages_in_mean=["en"])
    data = CellResult(
        cell=CellId(model=model, task=task, lr=lr, lr_key=lr_key, seed=seed, phase=phase),
        status="ok" if ok else "diverged",
        metric=metric,
        dev=scores if ok else None,
        report=dataclasses.replace(scores, split=report_split)
        if ok and phase == "report"
        else None,
        training=Training(diverged_at_step=None if ok else 17),
        recipe={"selection_split": "dev"},
        protocol=Protocol(on_protocol=True),
        provenance={"data": {"identity": f"hub:{task}@sha-a"}},
    ).to_dict()
    assert validate_result(data) == [], validate_result(data)
    return data


def sweep(models=("tiny-a", "tiny/b"), tasks=("glue_rte", "synthetic_parity"), diverge=True):
    """Select results over the whole grid: a hump-shaped curve, the top LRs diverging."""
    rng = random.Random(0)
    out = []
    for mi, model in enumerate(models):
        for ti, task in enumerate(tasks):
            best = 3 + mi + ti
            for i, key in enumerate(LR_GRID):
                for seed in SELECT_SEEDS:
                    diverged = diverge and (i >= 8 and seed != 42 or i == 9)
                    score = 0.85 - 0.012 * (i - best) ** 2 + rng.uniform(-0.02, 0.02)
                    out.append(make_result(model, task, key, seed, "select",
                                           None if diverged else score))  # fmt: skip
    return out


def selection_for(results: list[dict]) -> dict:
    """A selection in select.py's format: the best mean dev score per (model, task)."""
    means: dict = {}
    for d in results:
        if d["status"] == "ok":
            c = d["cell"]
            means.setdefault((c["model"], c["task"]), {}).setdefault(c["lr_key"], []).append(
                d["dev"]["mean"]
            )
    pairs: dict = {}
    for (model, task), by_lr in means.items():
        dev_mean = {k: sum(v) / len(v) for k, v in by_lr.items()}
        key = max(dev_mean, key=dev_mean.get)
        pairs.setdefault(model, {})[task] = {"lr_key": key, "lr": LR_GRID[key],
                                             "dev_mean_by_lr": dev_mean}  # fmt: skip
    return {"schema": "encoder-eval-selection", "version": selection.VERSION, "pairs": pairs}


def report_set(selection: dict, tasks=("glue_rte", "sg_cb", "xnli", "synthetic_parity")):
    """Report results at the selected LR (lr05 for pairs the selection lacks), plus strays."""
    out = []
    rng = random.Random(1)
    metrics = {"glue_rte": "accuracy", "sg_cb": "macro_f1", "xnli": "accuracy"}
    for mi, model in enumerate(("tiny-a", "tiny/b", "third-model")):
        for ti, task in enumerate(tasks):
            entry = selection["pairs"].get(model, {}).get(task)
            key = entry["lr_key"] if entry else "lr05"
            split = "validation" if task.startswith(("glue_", "sg_")) else "test"
            for seed in REPORT_SEEDS:
                score = 0.6 + 0.05 * mi + 0.04 * ti + rng.uniform(-0.03, 0.03)
                if model == "third-model" and task == "sg_cb" and seed == 45:
                    score = None  # one diverged report seed
                out.append(make_result(model, task, key, seed, "report", score,
                                       metrics.get(task, "accuracy"), split))  # fmt: skip
            if entry or (model, task) == ("third-model", "xnli"):
                # a stray result at another LR: dropped where the selection chose an LR,
                # averaged in (hatched bar) where it did not
                stray = "lr01" if key != "lr01" else "lr02"
                out.append(make_result(model, task, stray, 45, "report", 0.01,
                                       metrics.get(task, "accuracy"), split))  # fmt: skip
    return out


def full_selection(models=("tiny-a", "tiny/b"), tasks=("glue_rte", "sg_cb", "xnli",
                                                      "synthetic_parity")):  # fmt: skip
    return selection_for(sweep(models=models, tasks=tasks, diverge=False))


def check_png(path: Path, min_size=(400, 250)) -> np.ndarray:
    """Assert `path` is a real, non-trivial PNG; return its pixels."""
    import matplotlib.image as mpimg

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    img = mpimg.imread(path)
    height, width = img.shape[:2]
    assert width >= min_size[0] and height >= min_size[1], (width, height)
    assert width <= 6000 and height <= 4000, (width, height)
    assert float(img.std()) > 0.01
    rgb = (img[..., :3] * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert len(colours) > 20, f"{path}: only {len(colours)} distinct colours"
    if SAMPLE_DIR:
        Path(SAMPLE_DIR).mkdir(parents=True, exist_ok=True)
        (Path(SAMPLE_DIR) / f"{path.parent.name}_{path.name}").write_bytes(path.read_bytes())
    return img


def test_safe_filename_part():
    assert plots.safe_filename_part("org/model name:v1") == "org_model_name_v1"
    assert plots.safe_filename_part("ok-name_1.2") == "ok-name_1.2"
    # A name of only dots would name a directory: each dot becomes '_' (fileio's one rule).
    assert plots.safe_filename_part("..") == "__"
    assert plots.safe_filename_part(".") == plots.safe_filename_part("") == "_"


def test_lr_sensitivity_one_png_per_pair(tmp_path):
    results = sweep(models=("tiny/b",))
    selection = selection_for(results)
    paths = plots.plot_lr_sensitivity(results, selection, tmp_path / "lr")
    names = sorted(p.name for p in paths)
    assert names == ["lr_tiny_b_glue_rte.png", "lr_tiny_b_synthetic_parity.png"]
    for path in paths:
        img = check_png(path)
        # the diverged markers and the band are coloured: not a greyscale image
        assert np.abs(img[..., 0] - img[..., 2]).max() > 0.3


def test_many_pairs_get_one_lr_overview_per_task(tmp_path):
    """Past `max_lr_figures` (model, task) pairs, write_plots draws one figure per task with
    every model's curve (a 14-model report drew 238 figures); at or under it, one per pair."""
    select_dir = tmp_path / "select"
    select_dir.mkdir()
    results = sweep(models=("tiny-a", "tiny/b", "tiny-c"))
    for data in results:
        c = data["cell"]
        write_json_atomic(select_dir / result_filename(c["model"], c["task"], c["lr"], c["seed"]),
                          data)  # fmt: skip
    selection_path = tmp_path / "selection.json"
    selection_path.write_text(json.dumps(selection_for(results)), encoding="utf-8")
    few = plots.write_plots(select_dir, None, selection_path, tmp_path / "a", max_lr_figures=5)
    assert sorted(p.name for p in few) == ["lr_glue_rte.png", "lr_synthetic_parity.png"]
    for path in few:
        img = check_png(path)
        assert np.abs(img[..., 0] - img[..., 2]).max() > 0.3  # coloured model curves
    every = plots.write_plots(select_dir, None, selection_path, tmp_path / "b", max_lr_figures=6)
    assert len(every) == 6 and all(p.name.startswith("lr_tiny") for p in every)


def test_lr_sensitivity_without_selection_and_all_diverged(tmp_path):
    results = [make_result("m", "glue_stsb", "lr04", s, score=None) for s in SELECT_SEEDS]
    # a single LR with one seed that finished and one that diverged
    results += [make_result("solo", "sg_cb", "lr05", 42, score=0.7, metric="macro_f1")]
    results += [make_result("solo", "sg_cb", "lr05", 43, score=None, metric="macro_f1")]
    # a report-phase result: ignored by the LR plots
    results += [make_result("solo", "xnli", "lr05", 45, "report", 0.7)]
    paths = plots.plot_lr_sensitivity(results, None, tmp_path / "none")
    assert sorted(p.name for p in paths) == ["lr_m_glue_stsb.png", "lr_solo_sg_cb.png"]
    for path in paths:
        check_png(path, min_size=(400, 250))


def test_lr_sensitivity_plain_selection_dict_and_off_grid_choice(tmp_path):
    results = sweep(models=("m",), tasks=("glue_rte",), diverge=False)
    plain = {"m": {"glue_rte": {"lr_key": "lr02"}}}  # no "pairs" wrapper, no "lr"
    assert plots.selected_lr(plain, "m", "glue_rte") == ("lr02", LR_GRID["lr02"])
    assert plots.selected_lr({"pairs": {"m": {"glue_rte": "lr09"}}}, "m", "glue_rte") == (
        "lr09",
        LR_GRID["lr09"],
    )
    assert plots.selected_lr(plain, "m", "other") == (None, None)
    unselected = {"pairs": {"m": {"glue_rte": {"lr_key": None, "lr": None}}}}  # select.py: no LR
    assert plots.selected_lr(unselected, "m", "glue_rte") == (None, None)
    off_grid = {"m": {"glue_rte": {"lr": 2.5e-5}}}
    assert plots.selected_lr(off_grid, "m", "glue_rte") == ("lr2.5e-05", 2.5e-5)
    (path,) = plots.plot_lr_sensitivity(results, off_grid, tmp_path / "off")
    check_png(path)


def test_final_score_table_filters_to_the_selected_lr():
    selection = full_selection()
    table = plots.final_score_table(report_set(selection), selection)
    rte = table[("tiny-a", "glue_rte")]
    assert rte["lr_keys"] == [selection["pairs"]["tiny-a"]["glue_rte"]["lr_key"]]
    assert rte["n"] == len(REPORT_SEEDS) and rte["n_diverged"] == 0
    assert rte["metric"] == "accuracy" and rte["split"] == "validation"
    assert 0.55 < rte["mean"] < 0.7 and rte["std"] > 0
    cb = table[("third-model", "sg_cb")]  # not in the selection: its report results, lr05
    assert cb["lr_keys"] == ["lr05"] and cb["n"] == 4 and cb["n_diverged"] == 1
    assert cb["metric"] == "macro_f1" and not cb["selected"] and rte["selected"]
    assert table[("third-model", "xnli")]["lr_keys"] == ["lr01", "lr05"]
    # without a selection every report result counts
    unfiltered = plots.final_score_table(report_set(selection))
    assert unfiltered[("tiny-a", "glue_rte")]["n"] == len(REPORT_SEEDS) + 1
    one = plots.final_score_table([make_result("m", "xnli", "lr05", 45, "report", 0.5)])
    assert one[("m", "xnli")]["std"] is None and one[("m", "xnli")]["mean"] == 0.5
    assert one[("m", "xnli")]["low"] is None and one[("m", "xnli")]["high"] is None  # one seed
    assert rte["low"] < rte["mean"] < rte["high"]


def test_final_scores_with_selection(tmp_path):
    selection = full_selection()
    path = plots.plot_final_scores(report_set(selection), tmp_path, selection)
    assert path == tmp_path / "scores.png"
    img = check_png(path, min_size=(800, 400))
    assert img.shape[1] > img.shape[0]  # wider than tall: grows with the number of tasks


def test_final_scores_without_selection_one_seed_and_diverged(tmp_path):
    results = [make_result("a", "glue_cola", "lr05", 45, "report", 0.4, "mcc", "validation")]
    results += [make_result("b", "glue_cola", "lr05", s, "report", None, "mcc", "validation")
                for s in REPORT_SEEDS]  # fmt: skip
    results += [make_result("b", "xnli", "lr05", s, "report", 0.7 + s / 1000)
                for s in REPORT_SEEDS]  # fmt: skip
    path = plots.plot_final_scores(results, tmp_path)
    check_png(path)


def test_final_scores_many_tasks_gets_wider(tmp_path):
    from encoder_eval.data.tasks import TASK_KNOBS

    def width(tasks):
        res = [make_result("m", t, "lr05", 45, "report", 0.5, TASK_KNOBS[t].metric,
                           TASK_KNOBS[t].report_split) for t in tasks]  # fmt: skip
        out = tmp_path / str(len(tasks))
        import matplotlib.image as mpimg

        return mpimg.imread(plots.plot_final_scores(res, out)).shape[1]

    assert width(list(TASK_KNOBS)) > width(list(TASK_KNOBS)[:3])


def test_final_scores_empty_input(tmp_path):
    path = plots.plot_final_scores([], tmp_path)
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_write_plots_loads_dirs_skips_bad_files(tmp_path):
    select_dir, report_dir = tmp_path / "select", tmp_path / "report"
    select_dir.mkdir()
    report_dir.mkdir()
    select = sweep(models=("tiny-a",), tasks=("glue_rte",))
    selection = selection_for(select)
    for data in select:
        c = data["cell"]
        write_json_atomic(select_dir / result_filename(c["model"], c["task"], c["lr"], c["seed"]),
                          data)  # fmt: skip
    for data in report_set(selection, tasks=("glue_rte",)):
        c = data["cell"]
        write_json_atomic(report_dir / result_filename(c["model"], c["task"], c["lr"], c["seed"]),
                          data)  # fmt: skip
    (select_dir / "broken.json").write_text("{not json", encoding="utf-8")
    selection_path = tmp_path / "selection.json"
    selection_path.write_text(json.dumps(selection), encoding="utf-8")
    warnings = []
    out = tmp_path / "figs" / "nested"
    paths = plots.write_plots(select_dir, report_dir, selection_path, out, warn=warnings.append)
    assert sorted(p.name for p in paths) == ["lr_tiny-a_glue_rte.png", "scores.png"]
    for path in paths:
        assert path.parent == out
        check_png(path)
    assert len(warnings) == 1 and "broken.json" in warnings[0]


def test_write_plots_missing_selection_and_dirs(tmp_path):
    warnings = []
    paths = plots.write_plots(None, tmp_path / "absent", tmp_path / "nope.json", tmp_path / "o",
                              warn=warnings.append)  # fmt: skip
    assert paths == []
    assert (tmp_path / "o").is_dir()
    assert any("nope.json" in w for w in warnings)
    assert any("no report results" in w for w in warnings)


@pytest.mark.parametrize("module", ["encoder_eval.reports.plots"])
def test_import_is_cheap(module):
    code = f"import sys, {module}; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_score_chart_shows_the_numbers_of_the_table():
    """plots.final_score_table and table.build_table aggregate through one function, so
    for the same results every bar equals its table cell: mean, std and seed counts; its error
    bar is the 95 % t-interval over those seeds."""
    from result_helpers import make_result as table_result
    from result_helpers import make_selection
    from scipy import stats as sps

    from encoder_eval.core.results import LoadedResult
    from encoder_eval.core.stats import t_interval

    seed = random.randrange(2**32)
    print(f"random seed {seed}")
    rng = random.Random(seed)
    chosen = {("m1", "glue_rte"): "lr06", ("m1", "sg_cb"): "lr03", ("m2", "glue_rte"): "lr08"}
    data = []
    for (model, task), key in chosen.items():
        for s in REPORT_SEEDS:
            data.append(table_result(model, task, key, s, "report", rng.uniform(0.3, 0.9)))
        data.append(table_result(model, task, "lr01", 45, "report", 0.99))  # never averaged
    data.append(table_result("m1", "glue_rte", "lr06", 50, "report", None))  # undefined score
    data[0] = table_result("m1", "glue_rte", "lr06", 45, "report", status="diverged")
    selection = make_selection(chosen)
    loaded = [LoadedResult(Path(f"r{i}.json"), d) for i, d in enumerate(data)]
    table = build_table(loaded, selection)
    bars = plots.final_score_table(loaded, selection)
    assert set(bars) == set(table.cells) == set(chosen)
    for pair, stats in table.cells.items():
        bar = bars[pair]
        assert (bar["mean"], bar["std"], bar["n"]) == (stats.mean, stats.std, stats.n)
        # the error bar: the 95 % t-interval over the cell's seeds, as stats computes it, cut
        # to the metric's range [0, 1] as the table's
        _, low, high = t_interval(list(stats.scores.values()))
        assert (bar["low"], bar["high"]) == (max(low, 0.0), min(high, 1.0)) == stats.t_interval
        half = sps.t.ppf(0.975, stats.n - 1) * stats.std / math.sqrt(stats.n)
        expected = (max(stats.mean - half, 0.0), min(stats.mean + half, 1.0))
        assert (bar["low"], bar["high"]) == pytest.approx(expected)
        assert bar["n_diverged"] == len(stats.diverged)
        assert bar["lr_keys"] == [chosen[pair]]
    assert bars[("m1", "glue_rte")]["n"] == len(REPORT_SEEDS) - 1  # the diverged seed is out


def test_the_score_chart_is_on_the_tables_scale_and_carries_its_marks():
    """Bars are x100 as the table's cells; a bar over fewer seeds carries the table's `†`
    (avg@k, in a note), and off-protocol results make it say it is no protocol figure."""
    full = [make_result("a", "glue_rte", "lr05", s, "report", 0.6 + s / 1000) for s in REPORT_SEEDS]
    short = [make_result("b", "glue_rte", "lr05", s, "report", 0.7) for s in REPORT_SEEDS[:3]]
    fig = plots.score_figure(full + short)
    (ax,) = fig.axes
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == [round(100 * (0.6 + sum(REPORT_SEEDS) / 5000), 6), 70.0]
    assert "x100" in ax.get_ylabel()
    assert [t.get_text() for t in ax.texts] == ["†"]  # b's bar only
    notes = " ".join(t.get_text() for t in fig.texts)
    assert f"† avg@3 instead of avg@{len(REPORT_SEEDS)}: b/glue_rte" in notes
    assert "protocol" not in ax.get_title()
    assert len(plots.score_figure(short, expected_n=3).axes[0].texts) == 0  # the run's avg@3

    for r in short:
        r["protocol"] = {
            "on_protocol": False,
            "off_protocol_reasons": ["precision=fp32 (protocol: bf16-autocast)"],
        }
    fig = plots.score_figure(full + short)
    assert fig.axes[0].get_title().startswith("Not a protocol figure: off-protocol results")
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "off-protocol: precision=fp32 (protocol: bf16-autocast)" in notes


def test_the_score_chart_cuts_an_error_bar_at_the_metrics_range_and_says_so():
    """Issue 40 item 13: two seeds of a Spearman 0.80 and 0.94 have the t interval
    [-1.94, 175.94] (x100); the bar's error bar stops at 100 (the top of the metric's range)
    and a note says it was cut, as the table's footnote does."""
    from scipy import stats as sps

    pair = [make_result("m", "glue_stsb", "lr05", s, "report", v, "spearman")
            for s, v in ((45, 0.80), (46, 0.94))]  # fmt: skip
    [row] = plots.final_score_table(pair).values()
    low, high = sps.t.interval(0.95, 1, loc=0.87, scale=0.14 / 2)  # the standard error: 0.14 / 2
    assert high > 1.75 and low > -1
    assert (row["low"], row["high"], row["cut"]) == (pytest.approx(low), 1.0, True)
    fig = plots.score_figure(pair, expected_n=2)
    (ax,) = fig.axes
    [bars] = [c for c in ax.containers if hasattr(c, "has_yerr") and c.has_yerr]
    tops = [seg[:, 1].max() for seg in bars.lines[2][0].get_segments()]
    assert max(tops) == pytest.approx(100.0)
    assert ax.get_ylim()[1] < 120  # the axis is not stretched to 179
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "error bar cut at the metric's range (as in the table): m/glue_stsb" in notes
    inside = [
        make_result("m", "glue_rte", "lr05", s, "report", v) for s, v in ((45, 0.6), (46, 0.62))
    ]
    assert "cut" not in " ".join(t.get_text() for t in plots.score_figure(inside).texts)


def test_the_lr_plots_show_dev_scores_x100_as_the_table(tmp_path, monkeypatch):
    """Issue 40 item 15: the LR plot's y axis is the dev score x100, labelled as the score
    chart's ("as in the table"), not the raw 0.385-0.415."""
    figures = []
    monkeypatch.setattr(plots, "save_png", lambda fig, path, **kw: figures.append(fig))
    results = [make_result("m", "glue_rte", key, seed, "select", score)
               for key, base in (("lr03", 0.385), ("lr06", 0.41))
               for seed, score in zip(SELECT_SEEDS, (base, base + 0.005, base - 0.005), strict=True)]  # fmt: skip
    plots.plot_lr_sensitivity(results, selection_for(results), tmp_path)
    [fig] = figures
    ax = fig.axes[0]
    [mean_line] = [ln for ln in ax.get_lines() if ln.get_label() == "seed mean"]
    assert list(mean_line.get_ydata()) == pytest.approx([38.5, 41.0])
    low, high = ax.get_ylim()
    assert 30 < low < 38.0 and 41.5 < high < 50
    assert ax.get_ylabel() == "dev score x100 (accuracy), as in the table"
