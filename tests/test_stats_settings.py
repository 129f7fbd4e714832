"""The statistics settings as one object (`reports/stats_settings.py`, issue 51) changed no
number: `summarize`, `compare` and `leaderboard` print, byte for byte, the JSON the code
before it printed (`fixtures/issue51_tables/`, written at e0e0119 by the same calls on the
same grid) for a seeded 3-model x 2-task grid (`scale_grid.generate`, 60 report rows per
language), with the statistics flags at their defaults and changed. A change that moves a
number on purpose (and bumps `comparison_cache.STATS_VERSION`) rewrites the fixtures: run
this file with `EE_REWRITE_TABLES=1` and say why in the commit.

Also: each statistics flag is one `StatsSettings` field, and the statistics library never
sets the process's malloc options (the commands do, `table_loading.open_statistics`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import scale_grid

from encoder_eval import compare, leaderboard, report, summarize
from encoder_eval.core.errors import EXIT_OK
from encoder_eval.reports import verdicts
from encoder_eval.reports.stats_settings import DEFAULTS, StatsSettings

FIXTURES = Path(__file__).parent / "fixtures" / "issue51_tables"
MODELS = ("xlm-r-base", "xlm-r-large", "xlm-r-xl")
TASKS = ("glue_mrpc", "sg_cb")
R = ["--resamples", "199"]
RUNS = {
    "summarize.json": (summarize, ["--no-cache", "--format", "json", *R]),
    "summarize_ci.json": (
        summarize,
        ["--no-cache", "--format", "json", *R, "--ci", "bootstrap", "--marks-family", "task"],
    ),
    "compare.json": (compare, ["--no-cache", "--format", "json", *R]),
    "compare_ref.json": (
        compare,
        [
            "--no-cache",
            "--format",
            "json",
            *R,
            "--reference",
            "xlm-r-large",
            "--all-tests",
            "--family",
            "pair",
            "--correction",
            "fdr_bh",
            "--alpha",
            "0.1",
            "--seed",
            "7",
        ],
    ),  # fmt: skip
    "leaderboard.json": (leaderboard, ["--format", "json", "--bootstrap", "200"]),
}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    size = scale_grid.GridSize(MODELS, TASKS, max_rows=60)
    return scale_grid.generate(tmp_path_factory.mktemp("issue51"), size)


@pytest.mark.parametrize("name", list(RUNS))
def test_tables_are_byte_identical_to_before(grid, name, capsys):
    command, extra = RUNS[name]
    assert command.main(["--results-dir", str(grid.rep), *extra]) == EXIT_OK
    out = capsys.readouterr().out
    if os.environ.get("EE_REWRITE_TABLES") == "1":
        (FIXTURES / name).write_text(out, encoding="utf-8")
    assert out == (FIXTURES / name).read_text(encoding="utf-8")


def test_every_statistics_flag_is_one_settings_field():
    """report takes every entry but --ci: its parsed flags give the settings back."""
    args = report.build_parser().parse_args(
        ["--results-dir", "r", "--out", "o.html", "--no-marks", "--marks-family", "task",
         "--family", "pair", "--correction", "fdr_bh", "--alpha", "0.1", "--resamples", "9",
         "--seed", "3", "--jobs", "2", "--no-cache"]
    )  # fmt: skip
    settings = StatsSettings.from_args(args)
    assert settings == StatsSettings("t", False, "task", "pair", "fdr_bh", 0.1, 9, 3, 2, False)
    assert StatsSettings.from_args(report.build_parser().parse_args(
        ["--results-dir", "r", "--out", "o.html"])) == DEFAULTS  # fmt: skip
    assert {f.name for f in dataclasses.fields(StatsSettings)} >= set(StatsSettings.ROW_INPUTS)


def test_the_statistics_library_leaves_malloc_alone():
    assert not hasattr(verdicts, "heap")
