"""Probing a model on registered tasks end to end: `python -m encoder_eval.probe --model`,
its result files, reruns, and `summarize` / `leaderboard` reading them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from encoder_eval import leaderboard, probe, summarize
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.reports import probe_table

TASKS = "glue_sst2,glue_stsb,sg_cb"


def _probe(tiny_models, mirror, out, *extra: str) -> int:
    return probe.main([
        "--model", f"tiny={tiny_models['bert']}", "--model", f"tiny2={tiny_models['xlm-roberta']}",
        "--pooling", "mean,first", "--tasks", TASKS, "--data-dir", str(mirror),
        "--results-dir", str(out), "--k-folds", "3", "--max-seq-len", "64", "--device", "cpu",
        *extra,
    ])  # fmt: skip


@pytest.fixture(scope="module")
def probed(tiny_models, small_mirror, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe_results")
    assert _probe(tiny_models, small_mirror, out, "--no-cache") == EXIT_OK
    return out


def test_one_result_per_model_pooling_task_with_q_from_q_t(probed):
    files = sorted(p.name for p in probed.glob("*.probe.json"))
    assert len(files) == 2 * 2 * 3
    record = json.loads((probed / "tiny_first_glue_stsb.probe.json").read_text())
    assert record["schema"] == "encoder-eval-probe"
    assert record["cell"] == {"model": "tiny", "model_path": record["cell"]["model_path"],
                              "pooling": "first", "method": "tiny:first", "task": "glue_stsb"}  # fmt: skip
    assert record["metric"] == "spearman" and record["task_type"] == "regression"
    assert record["n"] == {"train": 64, "report": {"en": 32}}
    q_t = np.asarray(record["q_t"])
    assert len(q_t) == 3
    assert record["mean_score"] == pytest.approx(q_t.mean())
    assert record["std_dev"] == pytest.approx(q_t.std(ddof=1))
    assert record["q_stat"] == pytest.approx(2 * q_t.mean() / (0.02 + q_t.std(ddof=1)))
    prov = record["provenance"]
    assert prov["model"]["revision"].startswith("sha256:")
    assert prov["data"]["source"] == "mirror" or "identity" in prov["data"]
    assert prov["embedding"]["pooling"] == "first" and prov["embedding"]["dim"] == 32
    summary = json.loads((probed / "tiny_first.probe-summary.json").read_text())
    assert set(summary["task_q_scores"]) == set(TASKS.split(","))
    assert summary["overall_q_score"] == pytest.approx(
        np.mean(list(summary["task_q_scores"].values()))
    )


def test_rerun_skips_done_cells_and_force_reproduces_scores_exactly(probed, tiny_models,
                                                                   small_mirror, capsys):  # fmt: skip
    path = probed / "tiny2_mean_sg_cb.probe.json"
    before = json.loads(path.read_text())
    mtime = path.stat().st_mtime_ns
    assert _probe(tiny_models, small_mirror, probed, "--no-cache") == EXIT_OK
    assert path.stat().st_mtime_ns == mtime
    assert "12 already done, 0 to run" in capsys.readouterr().err
    assert _probe(tiny_models, small_mirror, probed, "--no-cache", "--force") == EXIT_OK
    after = json.loads(path.read_text())
    for key in ("q_t", "q_stat", "mean_score", "std_dev", "hyperparameters", "secondary"):
        assert after[key] == before[key], key


def test_summarize_and_leaderboard_read_probe_results(probed, capsys):
    assert summarize.main(["--results-dir", str(probed), "--format", "json"]) == EXIT_OK
    table = json.loads(capsys.readouterr().out)
    assert table["kind"] == "probe"
    assert {r["model"] for r in table["rows"]} == {"tiny:mean", "tiny:first", "tiny2:mean",
                                                   "tiny2:first"}  # fmt: skip
    record = json.loads((probed / "tiny_mean_glue_sst2.probe.json").read_text())
    row = next(r for r in table["rows"] if r["model"] == "tiny:mean")
    assert row["cells"]["glue_sst2"]["mean"] == pytest.approx(record["mean_score"])
    assert row["cells"]["glue_sst2"]["n"] == 3
    assert leaderboard.main(["--results-dir", str(probed), "--format", "json",
                             "--bootstrap", "50"]) == EXIT_OK  # fmt: skip
    board = json.loads(capsys.readouterr().out)
    assert len(board["rows"]) == 4


def test_leaderboard_refuses_a_method_missing_a_task(probed, tmp_path, capsys):
    import shutil

    for path in probed.glob("*.probe.json"):
        if path.name != "tiny_first_sg_cb.probe.json":
            shutil.copy(path, tmp_path / path.name)
    assert leaderboard.main(["--results-dir", str(tmp_path)]) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "tiny:first" in err and "sg_cb" in err
    assert leaderboard.main(["--results-dir", str(tmp_path), "--allow-partial",
                             "--bootstrap", "20"]) == EXIT_OK  # fmt: skip
    assert "tiny:first" in capsys.readouterr().out  # named under the table as dropped


def test_a_corrupt_probe_result_is_skipped_with_a_warning(probed, tmp_path, capsys):
    import shutil

    for path in probed.glob("*.probe.json"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "tiny_mean_sg_cb.probe.json").write_text('{"schema": "encoder-eval-pro')
    assert summarize.main(["--results-dir", str(tmp_path), "--allow-partial"]) == EXIT_OK
    captured = capsys.readouterr()
    assert "skipping" in captured.err and "tiny_mean_sg_cb" in captured.err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pooling", "cls"], "Valid poolings: first, last, mean"),
        (["--tasks", "glue_sst3"], "unknown task 'glue_sst3'"),
        (["--tasks", "glue_mnli"], "glue_mnli"),  # not in the small mirror: refused up front
    ],
)
def test_bad_input_is_one_error_line_before_any_model_work(tiny_models, small_mirror, tmp_path,
                                                           capsys, flags, message):  # fmt: skip
    argv = ["--model", f"tiny={tiny_models['bert']}", "--tasks", "glue_sst2",
            "--data-dir", str(small_mirror), "--results-dir", str(tmp_path / "out"),
            "--device", "cpu", *flags]  # fmt: skip
    assert probe.main(argv) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0]
    assert not list(tmp_path.glob("out/*.probe.json"))
    assert "loaded" not in err


def test_probe_table_cells_are_the_folds(probed):
    records = probe_table.load_probe_results(probed)
    table = probe_table.probe_table(records, models=["tiny:mean"], tasks=["glue_sst2"])
    cell = table.cells[("tiny:mean", "glue_sst2")]
    assert table.expected_seeds == [0, 1, 2] and cell.n == 3 and cell.lr is None


def test_an_undefined_fold_is_refused_not_averaged_away(probed, tmp_path, capsys):
    # A cell whose folds are partly undefined has `mean_score: null`; the table once averaged
    # the surviving folds (q_t [0.50, 0.52, None] -> 0.51 over n = 2) with no problem
    # recorded. Now it is refused, as summarize refuses an undefined report score, and
    # --allow-partial prints it with the problem and the avg@2 dagger.
    import shutil

    for path in probed.glob("*.probe.json"):
        shutil.copy(path, tmp_path / path.name)
    cell = tmp_path / "tiny_mean_glue_sst2.probe.json"
    record = json.loads(cell.read_text())
    record["q_t"] = [0.50, 0.52, None]
    record["mean_score"] = record["std_dev"] = record["q_stat"] = None
    record["undefined"] = "accuracy undefined on 1 fold(s)"
    cell.write_text(json.dumps(record))
    table = probe_table.probe_table(probe_table.load_probe_results(tmp_path))
    (problem,) = [p for p in table.problems if p.rule == "undefined_metric"]
    assert problem.cells == ["tiny:mean/glue_sst2: fold(s) 2 of 3 undefined (accuracy "
                             "undefined on 1 fold(s))"]  # fmt: skip
    assert summarize.main(["--results-dir", str(tmp_path)]) == EXIT_INCOMPLETE
    assert "[undefined_metric]" in capsys.readouterr().err
    assert summarize.main(["--results-dir", str(tmp_path), "--allow-partial"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "have a fold whose score is undefined" in out
    assert "† avg@2 instead of avg@3: tiny:mean/glue_sst2" in out
    assert leaderboard.main(["--results-dir", str(tmp_path)]) == EXIT_INCOMPLETE
    assert "undefined_metric" in capsys.readouterr().err


def test_probe_table_refuses_bf16_beside_fp32_rows_and_footnotes_them(
    probed, tiny_models, small_mirror, tmp_path, capsys
):
    """Issue 29 item 4: a probe run in fp32 beside bf16 ones is a problem of the table."""
    import shutil

    for path in probed.glob("*.probe.json"):
        shutil.copy(path, tmp_path / path.name)
    assert probe.main([
        "--model", f"tiny3={tiny_models['bert']}", "--pooling", "mean", "--tasks", "glue_sst2",
        "--data-dir", str(small_mirror), "--results-dir", str(tmp_path), "--k-folds", "3",
        "--max-seq-len", "64", "--device", "cpu", "--precision", "fp32", "--no-cache",
    ]) == EXIT_OK  # fmt: skip
    table = probe_table.probe_table(probe_table.load_probe_results(tmp_path))
    [problem] = [p for p in table.problems if p.rule == "precision"]
    assert problem.message == ("probe cells disagree on the embeddings' precision: bf16 in 12 "
                               "cell(s); fp32 in 1 cell(s)")  # fmt: skip
    assert "tiny3:mean/glue_sst2 (precision fp32)" in problem.cells
    capsys.readouterr()
    assert summarize.main(["--results-dir", str(tmp_path)]) == EXIT_INCOMPLETE
    assert "disagree on the embeddings' precision" in capsys.readouterr().err
    assert summarize.main(["--results-dir", str(tmp_path), "--allow-partial"]) == EXIT_OK
    assert "disagree on the embeddings' precision: bf16 in 12" in capsys.readouterr().out
    # one precision throughout: no such problem
    one = probe_table.probe_table(probe_table.load_probe_results(probed))
    assert not [p for p in one.problems if p.rule == "precision"]
