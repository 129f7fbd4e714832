"""The scale benchmark's grid (`tests/scale_grid.py`), small, through the commands that publish
(issue 37, item 5): `summarize` with its default marks in every format, and `report`, give a
real table; and the power search the marks run cannot fail at the full table's family."""

from __future__ import annotations

import csv
import io
import json
from itertools import combinations

import numpy as np
import pytest
import scale_grid

from encoder_eval import report, summarize
from encoder_eval.core import power_analysis
from encoder_eval.core.errors import EXIT_OK
from encoder_eval.data.models import MODEL_REGISTRY
from encoder_eval.data.tasks import task_knobs

# 5 models x 4 tasks of four metrics (accuracy over XNLI's 15 languages, Spearman, F1, MCC),
# every LR key and seed of the protocol, report sets cut to 40 rows per language.
MODELS = tuple(MODEL_REGISTRY)[:5]
TASKS = ("xnli", "glue_stsb", "glue_mrpc", "glue_cola")
RESAMPLES = "9"  # the marks' permutations and bootstraps: few, to keep the test fast


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    size = scale_grid.GridSize(MODELS, TASKS, max_rows=40)
    return scale_grid.generate(tmp_path_factory.mktemp("scale"), size)


def test_grid_is_what_the_harness_writes(grid):
    """Every cell of the protocol's grid is there, and every report cell's predictions
    recompute its recorded scores with the project's metric code."""
    assert grid.select_results == len(MODELS) * len(TASKS) * 10 * 3
    assert grid.report_results == len(MODELS) * len(TASKS) * 5
    assert scale_grid.check_grid(grid) == grid.report_results
    pairs = json.loads(grid.selection.read_text(encoding="utf-8"))["pairs"]
    assert {(m, t) for m in pairs for t in pairs[m] if pairs[m][t]["lr_key"]} == {
        (m, t) for m in MODELS for t in TASKS
    }


def _summarize(grid, capsys, *extra: str) -> str:
    argv = ["--results-dir", str(grid.rep), "--resamples", RESAMPLES, *extra]
    assert summarize.main(argv) == EXIT_OK
    return capsys.readouterr().out


def test_summarize_marks_every_format(grid, capsys):
    """The default marks (the table family) in each format: every model has a row, and each
    task has its best model marked."""
    markdown = _summarize(grid, capsys)
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    for model in MODELS:
        assert any(line.startswith(f"| {model} |") for line in rows), model
    assert markdown.count("**") >= 2 * len(TASKS)  # a bold best per task column
    assert "Holm-corrected as one family" in markdown

    data = json.loads(_summarize(grid, capsys, "--format", "json"))
    text = json.dumps(data)
    assert all(model in text for model in MODELS)
    assert "best" in text

    table = list(csv.reader(io.StringIO(_summarize(grid, capsys, "--format", "csv"))))
    assert {model for model in MODELS} <= {cell for row in table for cell in row}

    latex = _summarize(grid, capsys, "--format", "latex")
    assert all(model in latex for model in MODELS)
    assert "\\textbf" in latex


def test_report_page_with_marks(grid, tmp_path):
    """`report` writes its page with the table, marks and verdicts for every model."""
    out = tmp_path / "report.html"
    argv = ["--results-dir", str(grid.rep), "--out", str(out), "--resamples", RESAMPLES]
    assert report.main(argv) == EXIT_OK
    page = out.read_text(encoding="utf-8")
    assert all(model in page for model in MODELS)
    assert all(task_knobs(task).label in page for task in TASKS)
    assert page.count('class="score best"') >= len(TASKS)  # each task's best, marked
    assert 'class="verdicts"' in page


def test_power_search_at_the_full_table_family():
    """The marks' power search, at the level the default family of the full table gives it
    (91 pairs x 17 tasks), for every pair of the generator's 14 models (their seed spreads
    differ more than 5x) and test-set variances from 75,000 rows to 56: never an exception."""
    traits = scale_grid.model_traits(tuple(MODEL_REGISTRY), np.random.default_rng(0))
    spreads = [spread for _, spread, _ in traits.values()]
    assert max(spreads) / min(spreads) > 5
    family = len(list(combinations(MODEL_REGISTRY, 2))) * len(scale_grid.SUITE_TASKS)
    level = power_analysis.family_alpha(0.05, family)
    for sd_a, sd_b in combinations(spreads, 2):
        for example_var in (1e-7, 1e-6, 1e-5, 1e-4, 1e-3):
            mdd = power_analysis.min_detectable_difference(
                sd_a, sd_b, n=5, alpha=level, power=0.8, example_var=example_var
            )
            assert not isinstance(mdd, float) or mdd > 0  # a size, or a typed 'not reachable'
