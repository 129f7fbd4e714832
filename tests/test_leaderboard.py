"""leaderboard.py: the four aggregates recomputed by hand, refusals and --allow-partial, the
bootstrap interval on the position, Friedman/Nemenyi against scipy and Demšar's table, and the
critical-difference plot, end to end through `main` on real result files."""

from __future__ import annotations

import csv
import io
import json
import math
import random
import statistics

import numpy as np
import pytest
from result_helpers import make_result, make_selection, write_many
from scipy import stats as sps
from test_plots import check_png

from encoder_eval import leaderboard
from encoder_eval.core.protocol import REPORT_SEEDS
from encoder_eval.reports import ranking

TASKS = ("glue_rte", "glue_sst2", "sg_cb")
# Task means by hand; every cell's five seeds are the mean + these offsets (mean exact).
MEANS = {
    "a": {"glue_rte": 0.70, "glue_sst2": 0.90, "sg_cb": 0.60},
    "b": {"glue_rte": 0.65, "glue_sst2": 0.92, "sg_cb": 0.60},
    "c": {"glue_rte": 0.60, "glue_sst2": 0.88, "sg_cb": 0.50},
}
OFFSETS = (-0.02, -0.01, 0.0, 0.01, 0.02)
LR_KEY = "lr06"


def results_for(means=MEANS, offsets=OFFSETS) -> list[dict]:
    out = []
    for model, by_task in means.items():
        for task, mean in by_task.items():
            for seed, off in zip(REPORT_SEEDS, offsets, strict=True):
                out.append(make_result(model, task, LR_KEY, seed, "report", mean + off))
    return out


def selection_for(means=MEANS) -> dict:
    return make_selection({(m, t): LR_KEY for m, by_task in means.items() for t in by_task})


@pytest.fixture
def board(tmp_path, capsys):
    """Run `leaderboard.main` on result files written to a fresh directory; returns
    (exit code, stdout, stderr)."""

    def run(results, *extra, selection=None):
        rdir = tmp_path / "report"
        rdir.mkdir(exist_ok=True)
        write_many(rdir, results)
        sel = tmp_path / "selection.json"
        sel.write_text(json.dumps(selection or selection_for()))
        code = leaderboard.main(["--results-dir", str(rdir), "--selection", str(sel), *extra])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    run.tmp = tmp_path
    return run


def by_model(doc: dict) -> dict:
    return {row["model"]: row for row in doc["rows"]}


def test_the_four_aggregates_recompute_by_hand(board):
    code, out, err = board(results_for(), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    rows = by_model(doc)
    # Ranks per task, 1 = best, by hand: RTE a > b > c; SST-2 b > a > c; CB a = b > c.
    ranks = {"a": (1, 2, 1.5), "b": (2, 1, 1.5), "c": (3, 3, 3)}
    for m in MEANS:
        assert [rows[m]["task_ranks"][t] for t in TASKS] == list(ranks[m])
    # Mean score: the mean of the three task means.
    assert rows["a"]["mean_score"]["value"] == pytest.approx((0.70 + 0.90 + 0.60) / 3)
    assert rows["b"]["mean_score"]["value"] == pytest.approx((0.65 + 0.92 + 0.60) / 3)
    assert rows["c"]["mean_score"]["value"] == pytest.approx((0.60 + 0.88 + 0.50) / 3)
    assert [rows[m]["mean_score"]["position"] for m in "abc"] == [1, 2, 3]
    # Mean rank: a and b tie at 1.5, so they share position 1.5.
    assert [rows[m]["mean_rank"]["value"] for m in "abc"] == pytest.approx([1.5, 1.5, 3.0])
    assert [rows[m]["mean_rank"]["position"] for m in "abc"] == [1.5, 1.5, 3]
    # Borda: models beaten per task, a tie 0.5. a: 2 (RTE) + 1 (SST-2) + 1.5 (CB: c, tie b).
    assert [rows[m]["borda"]["value"] for m in "abc"] == [4.5, 4.5, 0.0]
    assert [rows[m]["borda"]["position"] for m in "abc"] == [1.5, 1.5, 3]
    # NeuCo: weights = std of each task's means across models / their sum.
    stds = [statistics.pstdev(MEANS[m][t] for m in MEANS) for t in TASKS]
    weights = [s / sum(stds) for s in stds]
    assert [doc["neuco_weights"][t] for t in TASKS] == pytest.approx(weights)
    assert weights == pytest.approx([0.3914, 0.1566, 0.4520], abs=1e-4)  # by hand
    for m in MEANS:
        expected = sum(r * w for r, w in zip(ranks[m], weights, strict=True))
        assert rows[m]["neuco_rank"]["value"] == pytest.approx(expected)
    assert rows["a"]["neuco_rank"]["value"] == pytest.approx(1.3826, abs=1e-4)
    assert rows["b"]["neuco_rank"]["value"] == pytest.approx(1.6174, abs=1e-4)
    assert [rows[m]["neuco_rank"]["position"] for m in "abc"] == [1, 2, 3]


def test_borda_counts_pairwise_wins_on_random_tables():
    """Borda by its definition (pairwise wins, ties 0.5) equals the implementation's, and mean
    rank equals the mean of scipy's average ranks, on seeded random tables with ties."""
    seed = random.randrange(2**32)
    print(f"random seed {seed}")
    rng = np.random.default_rng(seed)
    for _ in range(50):
        k, n = rng.integers(2, 7), rng.integers(1, 8)
        means = rng.integers(0, 4, size=(k, n)) / 4  # coarse: many ties
        got = ranking.aggregates(means)
        borda = [sum((means[i, t] > means[j, t]) + 0.5 * (means[i, t] == means[j, t])
                     for t in range(n) for j in range(k) if j != i) for i in range(k)]  # fmt: skip
        assert got["borda"] == pytest.approx(borda)
        assert got["mean_rank"] == pytest.approx(
            np.mean([sps.rankdata(-means[:, t]) for t in range(n)], axis=0)
        )


def test_markdown_table_and_notes(board):
    code, out, err = board(results_for())
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "| Model | Mean score | Mean rank | Borda | NeuCo weighted rank |"
    row_a = next(line for line in lines if line.startswith("| a |"))
    assert "73.33 (1;" in row_a and "1.50 (1.5;" in row_a and "4.50 (1.5;" in row_a
    assert "Bootstrap: 1000 replicates, seed 0" in out
    assert "bootstrap: 1000 replicates, seed 0" in err  # the seed is printed
    assert "Friedman χ²" in out and "Nemenyi CD" in out
    assert "Dropped" not in out and "Not a protocol table" not in out


def test_csv_has_one_row_per_model_and_aggregate(board):
    code, out, _ = board(results_for(), "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 * 4
    c_borda = next(r for r in rows if r["model"] == "c" and r["aggregate"] == "borda")
    assert float(c_borda["value"]) == 0.0 and float(c_borda["position"]) == 3


def without(results, model, task):
    return [r for r in results if (r["cell"]["model"], r["cell"]["task"]) != (model, task)]


def test_a_missing_cell_is_refused_with_its_name(board):
    sel = selection_for()
    del sel["pairs"]["c"]["sg_cb"]
    code, out, err = board(without(results_for(), "c", "sg_cb"), selection=sel)
    assert code == 1 and out == ""
    assert "1 model(s) miss a task" in err
    assert "  c: sg_cb (no cell (no selected LR))" in err
    assert "[no_selection]" in err  # the table's own refusal, as summarize words it


def test_a_cell_without_a_finished_seed_is_missing(board):
    results = without(results_for(), "b", "glue_rte")
    results += [make_result("b", "glue_rte", LR_KEY, s, "report", status="diverged")
                for s in REPORT_SEEDS]  # fmt: skip
    code, _, err = board(results)
    assert code == 1
    assert "b: glue_rte (no finished report seed)" in err and "[diverged]" in err


def test_a_selected_cell_without_results_is_missing(board):
    code, _, err = board(without(results_for(), "a", "glue_sst2"))
    assert code == 1
    assert "  a: glue_sst2 (no report result)" in err and "[missing_seeds]" in err
    assert "a_glue_sst2_lr06_s45.json" in err  # summarize's list of the missing files


def test_allow_partial_drops_the_model_and_says_so(board):
    sel = selection_for()
    del sel["pairs"]["c"]["sg_cb"]
    code, out, err = board(without(results_for(), "c", "sg_cb"), "--allow-partial",
                           "--format", "json", selection=sel)  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert [r["model"] for r in doc["rows"]] == ["a", "b"]
    assert doc["dropped"] == {"c": ["sg_cb (no cell (no selected LR))"]}
    assert any(n.startswith("Dropped (--allow-partial): c, missing sg_cb") for n in doc["notes"])
    assert any("[no_selection]" in p for p in doc["problems"])
    # Two models left: no Friedman test, and the reason is given.
    assert doc["critical_difference"] is None
    assert any("three models or more, got 2" in n for n in doc["notes"])
    code, out, _ = board(without(results_for(), "c", "sg_cb"), "--allow-partial", selection=sel)
    assert "Dropped (--allow-partial): c, missing sg_cb" in out.split("\n\n", 1)[1]


def test_allow_partial_refuses_when_no_model_is_complete(board):
    results = [r for r in results_for() if r["cell"]["task"] != "sg_cb"]
    code, out, err = board(results, "--allow-partial")
    assert code == 1 and out == ""
    assert "no model has a score on every task" in err and "a: sg_cb" in err


def test_a_table_problem_is_refused_as_summarize_refuses_it(board):
    results = results_for()
    results[0] = make_result("a", "glue_rte", LR_KEY, 45, "report", 0.68, on_protocol=False)
    code, out, err = board(results)
    assert code == 1 and out == ""
    assert "[off_protocol]" in err and "a_glue_rte_lr06_s45.json" in err
    code, out, _ = board(results, "--allow-partial")
    assert code == 0
    assert (
        "Not a protocol table: 1 result(s) are off-protocol (forced off-protocol for a "
        "test) [off_protocol]."
    ) in out


def test_input_errors_exit_2(board, tmp_path, capsys):
    assert leaderboard.main(["--results-dir", str(tmp_path / "nope"), "--selection", "x"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    code, _, err = board(results_for(), "--bootstrap", "0")
    assert code == 2 and err.startswith("error: --bootstrap 0")
    code, _, err = board(results_for(), "--tasks", "glue_rtee")
    assert code == 2 and "Did you mean 'glue_rte'" in err


def test_bootstrap_intervals_contain_the_point_and_repeat_for_a_seed(board):
    seed = random.randrange(2**31)
    print(f"bootstrap seed {seed}")
    rng = random.Random(seed)
    means = {m: {t: rng.uniform(0.5, 0.9) for t in TASKS} for m in ("a", "b", "c", "d")}
    offsets = [rng.uniform(-0.05, 0.05) for _ in REPORT_SEEDS]
    results, sel = results_for(means, offsets), selection_for(means)
    args = ("--format", "json", "--seed", str(seed), "--bootstrap", "300")
    first = board(results, *args, selection=sel)[1]
    first = first[first.index("{") :]  # capsys also caught the seed printed above
    again = board(results, *args, selection=sel)[1]
    assert first == again  # one seed, one answer
    doc = json.loads(first)
    assert doc["bootstrap"] == {"replicates": 300, "seed": seed, "confidence": 0.95}
    for row in doc["rows"]:
        for name in ranking.AGGREGATES:
            agg = row[name]
            assert 1 <= agg["low"] <= agg["position"] <= agg["high"] <= 4, (row["model"], name)


def test_a_model_best_everywhere_has_a_degenerate_interval(board):
    """A model better on every task with every seed stays first under any resample; the
    others' intervals widen because their order changes with the seeds and tasks."""
    means = {"top": {t: 0.95 for t in TASKS},
             "x": {"glue_rte": 0.70, "glue_sst2": 0.60, "sg_cb": 0.65},
             "y": {"glue_rte": 0.60, "glue_sst2": 0.70, "sg_cb": 0.66}}  # fmt: skip
    code, out, _ = board(results_for(means), "--format", "json", selection=selection_for(means))
    rows = by_model(json.loads(out))
    for name in ranking.AGGREGATES:
        assert (rows["top"][name]["low"], rows["top"][name]["high"]) == (1, 1)
    assert rows["x"]["mean_rank"]["low"] < rows["x"]["mean_rank"]["high"]


def test_friedman_equals_scipys_direct_call():
    seed = random.randrange(2**32)
    print(f"random seed {seed}")
    rng = np.random.default_rng(seed)
    for k, n in ((3, 2), (4, 6), (6, 12)):
        means = rng.normal(0.7, 0.05, size=(k, n)) + np.linspace(0, 0.05, k)[:, None]
        models = [f"m{i}" for i in range(k)]
        cd = ranking.critical_difference(means, models)
        direct = sps.friedmanchisquare(*means)
        assert cd.statistic == pytest.approx(direct.statistic, rel=1e-12)
        assert cd.pvalue == pytest.approx(direct.pvalue, rel=1e-12)
        ranks = np.mean([sps.rankdata(-means[:, t]) for t in range(n)], axis=0)
        assert cd.mean_ranks == pytest.approx(ranks)
        assert cd.cd == pytest.approx(cd.q_alpha * math.sqrt(k * (k + 1) / (6 * n)))


@pytest.mark.parametrize(
    "k,q",  # Demšar (2006), table 5(a): the two-tailed Nemenyi q_0.05
    [(2, 1.960), (3, 2.343), (4, 2.569), (5, 2.728), (6, 2.850), (7, 2.949), (8, 3.031),
     (9, 3.102), (10, 3.164)],
)  # fmt: skip
def test_nemenyi_q_matches_demsars_table(k, q):
    assert ranking.nemenyi_q(k) == pytest.approx(q, abs=1e-3)


def test_cliques_join_models_closer_than_the_critical_difference():
    # a > b > c > d on each of 10 tasks: mean ranks 1..4, CD = 2.569 * sqrt(20/60) = 1.483.
    means = np.array([[0.9] * 10, [0.8] * 10, [0.7] * 10, [0.6] * 10])
    cd = ranking.critical_difference(means, ["a", "b", "c", "d"])
    assert cd.mean_ranks == [1, 2, 3, 4] and cd.rejected and cd.pvalue < 1e-5
    assert cd.cd == pytest.approx(2.569 * math.sqrt(20 / 60), abs=1e-3)
    assert cd.cliques == [["a", "b"], ["b", "c"], ["c", "d"]]
    # Without a rejection no pair is called different: one group of every model.
    weak = ranking.critical_difference(np.array([[0.9, 0.6], [0.8, 0.7], [0.7, 0.8]]),
                                           ["a", "b", "c"])  # fmt: skip
    assert not weak.rejected and weak.cliques == [["a", "b", "c"]]


def test_friedman_needs_three_models_and_two_tasks():
    with pytest.raises(leaderboard.HarnessError, match="three models"):
        ranking.critical_difference(np.ones((2, 5)), ["a", "b"])
    with pytest.raises(leaderboard.HarnessError, match="two tasks"):
        ranking.critical_difference(np.ones((3, 1)), ["a", "b", "c"])


def test_the_cd_plot_is_a_png(board):
    out_dir = board.tmp / "plots"
    code, _, err = board(results_for(), "--plot", str(out_dir))
    assert code == 0, err
    assert f"wrote {out_dir / 'cd.png'}" in err
    check_png(out_dir / "cd.png", min_size=(400, 150))
    assert [p.name for p in out_dir.iterdir()] == ["cd.png"]  # no temporary left behind


def test_no_cd_plot_below_three_models(board):
    means = {m: MEANS[m] for m in ("a", "b")}
    out_dir = board.tmp / "plots"
    code, out, err = board(results_for(means), "--plot", str(out_dir),
                           selection=selection_for(means))  # fmt: skip
    assert code == 0
    assert "note: no cd.png: no critical-difference test: the Friedman test needs three " \
           "models or more, got 2" in err  # fmt: skip
    assert not (out_dir / "cd.png").exists()
    assert "No critical-difference test" in out


def test_encoder_eval_leaderboard_is_this_command(board, capsys):
    from encoder_eval import cli

    assert cli.COMMANDS["leaderboard"].module == "encoder_eval.leaderboard"
    with pytest.raises(SystemExit) as exc:
        cli.main(["leaderboard", "--help"])
    assert exc.value.code == 0 and "--allow-partial" in capsys.readouterr().out
