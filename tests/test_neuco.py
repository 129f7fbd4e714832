"""NeuCo-Bench compatibility mode end to end on a hand-made annotation folder and submission."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import f1_score

from encoder_eval import neuco_bench
from encoder_eval.cells.probing import ProbeConfig, held_out_predictions, load_probe, probe_task
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK, HarnessError
from encoder_eval.reports import neuco
from encoder_eval.reports.plots import confusion_counts

SEED = 1201
N = 160
DIM = 6
EXCLUDED = ["s003", "s017", "s042"]

CONFIG = """\
k_folds: 4
probe_type: linear
probe_params:
  batch_size: 32
  epochs: 10
  learning_rate: 0.001
  device: cpu
embedding_dim: {dim}
standardize_embeddings: true
normalize_labels: true
enable_plots: false
output_fold_results: true
store_probes: true
update_leaderboard: {leaderboard}
"""


def _ids() -> list[str]:
    return [f"s{i:03d}" for i in range(N)]


def _annotations(folder: Path, seed: int = SEED) -> dict[str, np.ndarray]:
    """Two tasks whose labels are linear in a hidden signal; the good submission holds it."""
    rng = np.random.default_rng(seed)
    signal = rng.normal(size=(N, 2))
    folder.mkdir()
    labels = {
        "landcover": (signal[:, 0] + 0.4 * rng.normal(size=N) > 0).astype(int),
        "biomass": 3.0 * signal[:, 1] + 0.3 * rng.normal(size=N) + 50.0,
    }
    for task, kind in (("landcover", "classification"), ("biomass", "regression")):
        with open(folder / f"{task}__{kind}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", "label"])
            for i, ident in enumerate(_ids()):
                value = labels[task][i]
                # one row without a label is skipped, as NeuCo-Bench does
                writer.writerow([ident, "" if (task, i) == ("biomass", 5) else value])
    return signal


def _submission(path: Path, signal: np.ndarray | None, dim: int = DIM, seed: int = SEED) -> None:
    rng = np.random.default_rng(seed + 1)
    emb = rng.normal(size=(N, dim))
    if signal is not None:
        emb[:, :2] = signal + 0.1 * rng.normal(size=(N, 2))
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", *map(str, range(dim))])
        for ident, row in zip(_ids(), emb, strict=True):
            writer.writerow([ident, *(f"{v:.6f}" for v in row)])


@pytest.fixture
def bench(tmp_path: Path) -> dict[str, Path]:
    print("seed", SEED)
    signal = _annotations(tmp_path / "labels")
    _submission(tmp_path / "good.csv", signal)
    _submission(tmp_path / "random.csv", None)
    (tmp_path / "exclude.txt").write_text("\n".join([*EXCLUDED, "", "not-an-id"]) + "\n")
    (tmp_path / "config.yaml").write_text(CONFIG.format(dim=8, leaderboard="true"))
    return {"root": tmp_path, "labels": tmp_path / "labels", "config": tmp_path / "config.yaml"}


def _args(bench: dict, submission: str, *extra: str) -> list[str]:
    root = bench["root"]
    return ["--annotation-path", str(bench["labels"]), "--submission-file",
            str(root / submission), "--output-dir", str(root / "out"), "--config",
            str(bench["config"]), "--phase", "dev", "--exclude-file",
            str(root / "exclude.txt"), *extra]  # fmt: skip


def test_end_to_end_layout_results_probes_and_leaderboard(bench, capsys):
    root = bench["root"]
    assert neuco.main(_args(bench, "good.csv", "--method-name", "good")) == EXIT_OK
    run_dir = Path(capsys.readouterr().out.strip())
    assert run_dir.parent == root / "out" / "dev" and run_dir.name.startswith("good_")
    summary = json.loads((run_dir / "results_summary.json").read_text())
    assert set(summary["task_q_scores"]) == {"landcover", "biomass"}
    for key in ("overall_q_score", "overall_acc_score", "task_acc_scores", "config"):
        assert key in summary
    assert summary["config"]["k_folds"] == 4 and summary["on_protocol"] is True
    for task, kind, metric in (("landcover", "classification", "f1"),
                               ("biomass", "regression", "r2")):  # fmt: skip
        result = json.loads((run_dir / task / f"{task}_result.json").read_text())
        assert result["task_type"] == kind and result["metric"] == metric
        assert len(result["q_t"]) == 4 and result["mean_score"] > 0.8  # the signal is found
        assert result["scored_on"] == "held-out rows of each fold"
        # three ids excluded; biomass also lost its row without a label
        assert result["n"]["train"] == N - len(EXCLUDED) - (task == "biomass")
        assert result["probe_params_unused"]["epochs"] == 10
        probe, task_type = load_probe(run_dir / task / "probe")
        assert task_type == kind
        assert probe.coef.shape[1] == 8  # six columns zero-padded to embedding_dim 8
        assert probe.predict(np.zeros((2, 8))).shape == (2,)
    boards = list((root / "out" / "leaderboards" / "dev").glob("leaderboard_*.csv"))
    assert len(boards) == 1
    rows = list(csv.DictReader(boards[0].read_text().splitlines()))
    assert [r["method"] for r in rows] == ["good"]


def test_leaderboard_ranks_the_informative_embeddings_first(bench, capsys):
    root = bench["root"]
    assert neuco.main(_args(bench, "random.csv")) == EXIT_OK
    assert neuco.main(_args(bench, "good.csv")) == EXIT_OK
    boards = sorted((root / "out" / "leaderboards" / "dev").glob("leaderboard_*.csv"))
    rows = list(csv.DictReader(boards[-1].read_text().splitlines()))
    assert [r["method"] for r in rows] == ["good", "random"]
    assert [r["aggregated_rank"] for r in rows] == ["1", "2"]
    assert float(rows[0]["landcover_q"]) > float(rows[1]["landcover_q"])


def test_leaderboard_refuses_a_run_missing_a_task(bench, capsys):
    root = bench["root"]
    assert neuco.main(_args(bench, "good.csv")) == EXIT_OK
    partial = root / "partial.yaml"
    partial.write_text(CONFIG.format(dim=8, leaderboard="true") + "task_filter: [landcover]\n")
    args = _args(bench, "random.csv", "--method-name", "partial")
    args[args.index("--config") + 1] = str(partial)
    capsys.readouterr()
    assert neuco.main(args) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "leaderboard refused" in err and "lacks biomass" in err and "partial_" in err
    assert len(list((root / "out" / "dev").glob("partial_*/results_summary.json"))) == 1


def test_drop_incomplete_runs_rule_drops_and_says_so(bench):
    root = bench["root"]
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    config = neuco.read_config(bench["config"])
    rule = ("drop_incomplete_runs",)
    neuco.run_neuco(bench["labels"], root / "good.csv", config, root / "out", "good", "dev",
                    neuco_rules=rule, now=now)  # fmt: skip
    partial = neuco.NeucoConfig({**config.values, "task_filter": ["landcover"]})
    neuco.run_neuco(bench["labels"], root / "random.csv", partial, root / "out", "partial",
                    "dev", neuco_rules=rule, now=now)  # fmt: skip
    board = root / "out" / "leaderboards" / "dev" / "leaderboard_20260102_030405.csv"
    rows = list(csv.DictReader(board.read_text().splitlines()))
    assert rows[0]["method"] == "good" and rows[0]["aggregated_rank"] == "1"
    assert rows[1]["method"] == "partial" and "dropped" in rows[1]["aggregated_rank"]
    summary = json.loads((root / "out/dev/good_20260102_030405/results_summary.json").read_text())
    assert summary["neuco_rules"] == ["drop_incomplete_runs"] and summary["on_protocol"] is False


def test_too_long_embedding_is_refused_and_nothing_written(bench, capsys):
    root = bench["root"]
    from encoder_eval.cli import main as cli_main

    bench["config"].write_text(CONFIG.format(dim=4, leaderboard="true"))
    assert cli_main(["probe", *_args(bench, "good.csv")]) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1
    assert "6 dimensions, more than embedding_dim 4" in err
    assert not (root / "out").exists()


def test_reruns_give_identical_scores(bench):
    root = bench["root"]
    config = neuco.read_config(bench["config"])
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    dirs = [neuco.run_neuco(bench["labels"], root / "good.csv", config, root / "out", "g",
                            "dev", root / "exclude.txt", now=now) for _ in range(2)]  # fmt: skip
    assert dirs[1].name == dirs[0].name + "-1"  # same second: a new folder, none overwritten
    for task in ("landcover", "biomass"):
        a, b = (json.loads((d / task / f"{task}_result.json").read_text()) for d in dirs)
        for rec in (a, b):
            rec.pop("created_at")
        assert a == b


def test_config_errors_name_the_problem(tmp_path):
    path = tmp_path / "c.yaml"
    base = CONFIG.format(dim=8, leaderboard="true")
    path.write_text(base + "k_fold: 3\n")
    with pytest.raises(HarnessError, match="unknown config key 'k_fold'. Did you mean 'k_folds'"):
        neuco.read_config(path)
    path.write_text(base.replace("probe_type: linear", "probe_type: knn"))
    with pytest.raises(HarnessError, match="Valid probe_types: linear, svm"):
        neuco.read_config(path)
    path.write_text(base.replace("probe_type: linear", "probe_type: svm"))
    with pytest.raises(HarnessError, match="unknown svm probe_params key 'batch_size'"):
        neuco.read_config(path)
    path.write_text(base.replace("update_leaderboard: true\n", ""))
    with pytest.raises(HarnessError, match="required key.* missing: update_leaderboard"):
        neuco.read_config(path)
    path.write_text(base.replace("  epochs: 10\n", ""))
    with pytest.raises(HarnessError, match="probe_params lacks epochs"):
        neuco.read_config(path)
    path.write_text(base.replace("device: cpu", "device: tpu"))
    with pytest.raises(HarnessError, match="Valid probe_params devices: auto, cpu, gpu"):
        neuco.read_config(path)


def test_input_file_errors(bench, tmp_path):
    (bench["labels"] / "oops.csv").write_text("id,label\n")
    with pytest.raises(HarnessError, match="not named <task>__<type>.csv"):
        neuco.read_annotations(bench["labels"])
    (bench["labels"] / "oops.csv").unlink()
    (bench["labels"] / "oops__ranking.csv").write_text("id,label\n")
    with pytest.raises(HarnessError, match="Valid task types: classification, cls"):
        neuco.read_annotations(bench["labels"])
    bad = tmp_path / "bad.csv"
    bad.write_text("id,0,1\na,1.0,\n")
    with pytest.raises(HarnessError, match="line 2 .id 'a'.: an embedding value is missing"):
        neuco.read_submission(bad)
    bad.write_text("key,0,1\na,1.0,2.0\n")
    with pytest.raises(HarnessError, match="needs a column 'id'"):
        neuco.read_submission(bad)
    (bench["labels"] / "oops__ranking.csv").unlink()
    config = neuco.NeucoConfig({**neuco.read_config(bench["config"]).values,
                                "task_filter": ["landcovr"]})  # fmt: skip
    with pytest.raises(HarnessError, match="Did you mean 'landcover'"):
        neuco.run_neuco(bench["labels"], bench["root"] / "good.csv", config, tmp_path / "o")


def test_submission_reading_pads_excludes_and_strips_zarr(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("id,1,0\na.zarr,2.0,1.0\nb.zarr.zip,4.0,3.0\nc,6.0,5.0\n")
    ids, matrix = neuco.read_submission(path, embedding_dim=4, exclude={"c"})
    assert ids == ["a", "b"]
    np.testing.assert_array_equal(matrix, [[1.0, 2.0, 0.0, 0.0], [3.0, 4.0, 0.0, 0.0]])


def test_neuco_rules_are_applied_and_marked(bench):
    root = bench["root"]
    config = neuco.read_config(bench["config"])
    rules = ("best_fold_score", "global_standardization")
    run_dir = neuco.run_neuco(bench["labels"], root / "good.csv", config, root / "out", "g",
                              "rules", root / "exclude.txt", neuco_rules=rules)  # fmt: skip
    result = json.loads((run_dir / "landcover" / "landcover_result.json").read_text())
    assert result["protocol"]["on_protocol"] is False
    assert result["protocol"]["neuco_rules"] == list(rules)
    assert len(result["protocol"]["off_protocol_reasons"]) == 2
    assert "chose" in result["scored_on"]
    # global statistics: one mean and std over every value of every labelled row (padded)
    ids, matrix = neuco.read_submission(root / "good.csv", 8, neuco.read_exclude(
        root / "exclude.txt"))  # fmt: skip
    probe, _ = load_probe(run_dir / "landcover" / "probe")
    assert probe.shift.shape == () and probe.shift == pytest.approx(matrix.mean(), abs=1e-12)
    assert probe.scale == pytest.approx(matrix.std(), abs=1e-12)


def test_neuco_underscore_flags_are_accepted():
    args = neuco.build_parser().parse_args(
        ["--annotation_path", "a", "--submission_file", "s.csv", "--config", "c.yaml",
         "--method_name", "m", "--exclude_file", "x.txt", "--output_dir", "o"]
    )  # fmt: skip
    assert (args.annotation_path, args.submission_file, args.method_name) == ("a", "s.csv", "m")
    assert (args.exclude_file, args.output_dir, args.phase) == ("x.txt", "o", "results")


def test_q_in_neuco_mode_is_neuco_benchs_nanstd_ddof_0(bench, capsys):
    # NeuCo-Bench: mean_score = np.nanmean(q_t), std_dev = np.nanstd(q_t) (ddof 0),
    # q_stat = mean / (0.02 + std) * 2. Our probes keep ddof 1 (probe_model); NeuCo mode
    # follows NeuCo-Bench, and says so in the result's protocol.
    assert neuco.main(_args(bench, "good.csv", "--method-name", "good")) == EXIT_OK
    run_dir = Path(capsys.readouterr().out.strip())
    for task in ("landcover", "biomass"):
        result = json.loads((run_dir / task / f"{task}_result.json").read_text())
        q_t = np.asarray(result["q_t"])
        assert result["protocol"]["std_ddof"] == 0
        assert result["std_dev"] == pytest.approx(np.nanstd(q_t))
        assert result["q_stat"] == pytest.approx(np.nanmean(q_t) / (0.02 + np.nanstd(q_t)) * 2)


def _summary(root: Path, run: str, q: dict[str, float], **config) -> None:
    folder = root / "out" / "dev" / run
    folder.mkdir(parents=True)
    setup = {"k_folds": 4, "seed": 42, "standardize_embeddings": True, **config}
    (folder / "results_summary.json").write_text(json.dumps({
        "method": run, "task_q_scores": q, "overall_q_score": float(np.mean(list(q.values()))),
        "overall_acc_score": 0.5, "neuco_rules": [], "config": setup,
    }))  # fmt: skip


def test_leaderboard_ranks_ties_as_neuco_bench_does(tmp_path):
    # NeuCo-Bench's compute_leaderboard: per task scipy rankdata(-Q, method="min"), weights =
    # std of Q across runs (ddof 1) / their sum, weighted_score = Σ rank x weight, and
    # aggregated_rank = rankdata(weighted_score, method="min"). Runs a and b tie on t1.
    q = {"a": {"t1": 10.0, "t2": 1.0}, "b": {"t1": 10.0, "t2": 3.0}, "c": {"t1": 4.0, "t2": 2.0}}
    for run, scores in q.items():
        _summary(tmp_path, run, scores)
    path = neuco.summarize_runs(tmp_path / "out", "dev", now=datetime(2026, 1, 1, tzinfo=UTC))
    rows = {r["run"]: r for r in csv.DictReader(path.read_text().splitlines())}
    # by hand: t1 ranks (min) a 1, b 1, c 3; t2 ranks b 1, c 2, a 3
    s1, s2 = np.std([10, 10, 4], ddof=1), np.std([1, 3, 2], ddof=1)
    w1, w2 = s1 / (s1 + s2), s2 / (s1 + s2)
    expected = {"a": 1 * w1 + 3 * w2, "b": 1 * w1 + 1 * w2, "c": 3 * w1 + 2 * w2}
    for run, value in expected.items():
        assert float(rows[run]["weighted_score"]) == pytest.approx(value, rel=1e-5)
    assert {run: rows[run]["aggregated_rank"] for run in q} == {"b": "1", "a": "2", "c": "3"}


@pytest.mark.parametrize(("key", "value"), [("k_folds", 5), ("seed", 7),
                                            ("standardize_embeddings", False),
                                            ("probe_type", "svm")])  # fmt: skip
def test_leaderboard_refuses_runs_of_different_fold_setups(tmp_path, key, value):
    _summary(tmp_path, "a", {"t1": 10.0})
    _summary(tmp_path, "b", {"t1": 8.0}, **{key: value})
    with pytest.raises(neuco.LeaderboardRefused, match=f"differ in {key} .*: b$|{key}={value}: b;"):
        neuco.summarize_runs(tmp_path / "out", "dev")


def test_leaderboard_refuses_runs_of_different_embedding_dimensions_in_one_error(bench, capsys):
    """Two real runs, 6 and 8 dimensions (embedding_dim inferred), then a third under a NeuCo
    rule: one refusal names every difference and each run's value."""
    root = bench["root"]
    bench["config"].write_text(CONFIG.format(dim=8, leaderboard="true").replace(
        "embedding_dim: 8\n", ""))  # fmt: skip
    _submission(root / "wide.csv", None, dim=8)
    assert neuco.main(_args(bench, "good.csv", "--method-name", "narrow")) == EXIT_OK
    capsys.readouterr()
    assert neuco.main(_args(bench, "wide.csv", "--method-name", "wide")) == EXIT_INCOMPLETE
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert err.startswith("error: leaderboard refused:")
    assert "differ in embedding_dim " in err
    assert re.search(r"embedding_dim=6: narrow_\S+; embedding_dim=8: wide_", err), err
    summaries = sorted((root / "out" / "dev").glob("*/results_summary.json"))
    assert [json.loads(p.read_text())["embedding_dim"] for p in summaries] == [6, 8]
    assert neuco.main(_args(bench, "wide.csv", "--method-name", "wide2", "--neuco-rule",
                            "best_fold_score")) == EXIT_INCOMPLETE  # fmt: skip
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "differ in neuco_rules, embedding_dim " in err
    assert "neuco_rules=best_fold_score, embedding_dim=8: wide2_" in err


def test_config_defaults_to_config_yaml_in_the_working_directory(bench, monkeypatch, capsys):
    root = bench["root"]
    args = _args(bench, "good.csv")
    i = args.index("--config")
    del args[i : i + 2]
    monkeypatch.chdir(root)
    bench["config"].unlink()  # the fixture's root/config.yaml
    assert neuco.main(args) == EXIT_INPUT_ERROR  # no ./config.yaml
    err = capsys.readouterr().err.strip()
    assert err == "error: config file config.yaml does not exist; check --config"
    (root / "config.yaml").write_text(CONFIG.format(dim=8, leaderboard="false"))
    assert neuco.main(args) == EXIT_OK
    run_dir = Path(capsys.readouterr().out.strip())
    summary = json.loads((run_dir / "results_summary.json").read_text())
    assert summary["config"]["update_leaderboard"] is False  # ./config.yaml was read


def test_neuco_bench_console_script_takes_neuco_benchs_flags(bench, capsys):
    repo = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["neuco-bench"] == "encoder_eval.neuco_bench:main"
    root = bench["root"]
    argv = ["--annotation_path", str(bench["labels"]), "--submission_file",
            str(root / "good.csv"), "--output_dir", str(root / "out"), "--config",
            str(bench["config"]), "--method_name", "good", "--phase", "dev", "--exclude_file",
            str(root / "exclude.txt")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "encoder_eval.neuco_bench", *argv], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == EXIT_OK, run.stderr
    run_dir = Path(run.stdout.strip())
    assert run_dir.parent == root / "out" / "dev" and run_dir.name.startswith("good_")
    assert (run_dir / "landcover" / "landcover_result.json").is_file()
    assert len(list((root / "out" / "leaderboards" / "dev").glob("leaderboard_*.csv"))) == 1
    with pytest.raises(SystemExit):
        neuco_bench.main(["--help"])
    helped = capsys.readouterr().out
    assert helped.startswith("usage: neuco-bench")
    assert "--annotation_path" in helped and "--submission_file" in helped


SVM_CONFIG = """\
k_folds: 3
probe_type: svm
probe_params:
  C_start_end: [0.01, 10.0]
  kernel_degree_list: [1, 2]
  epsilon_list: [0.01, 0.1]
  opt_params:
    n_iter: 5
    n_initial_points: 3
    random_state: 11
standardize_embeddings: true
normalize_labels: true
enable_plots: true
output_fold_results: true
store_probes: true
update_leaderboard: true
"""


def test_svm_probe_end_to_end_with_plots_stored_probes_and_leaderboard(bench, capsys):
    root = bench["root"]
    bench["config"].write_text(SVM_CONFIG)
    assert neuco.main(_args(bench, "random.csv", "--method-name", "random")) == EXIT_OK
    assert neuco.main(_args(bench, "good.csv", "--method-name", "good")) == EXIT_OK
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    _, matrix = neuco.read_submission(root / "good.csv", None, set(EXCLUDED))
    for task, kind in (("landcover", "classification"), ("biomass", "regression")):
        result = json.loads((run_dir / task / f"{task}_result.json").read_text())
        assert result["mean_score"] > 0.8  # the SVM finds the signal
        hp = result["hyperparameters"]
        assert hp["name"] == "svm" and hp["search"]["n_iter"] == 5
        assert hp["search"]["degree"] == [1, 2] and hp["search"]["gamma"] == "scale"
        assert [len(t) for t in hp["trials"]] == [5, 5, 5]  # bounded: n_iter per fold
        for chosen in hp["per_fold"]:
            assert 0.01 <= chosen["C"] <= 10.0 and chosen["degree"] in (1, 2)
            assert ("epsilon" in chosen) == (kind == "regression")
        assert "probe_params_unused" not in result
        probe, task_type = load_probe(run_dir / task / "probe")
        assert task_type == kind and probe.support_vectors.shape[1] == DIM
        assert probe.predict(matrix[:3]).shape == (3,)
    scatter = run_dir / "biomass" / "regression_scatter" / "biomass_regression_scatter.png"
    confusion = run_dir / "landcover" / "confusion_matrices" / "landcover_confusion_matrix.png"
    for path in (scatter, confusion):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert not (run_dir / "landcover" / "regression_scatter").exists()
    assert not (run_dir / "biomass" / "confusion_matrices").exists()
    boards = sorted((root / "out" / "leaderboards" / "dev").glob("leaderboard_*.csv"))
    rows = list(csv.DictReader(boards[-1].read_text().splitlines()))
    assert [r["method"] for r in rows] == ["good", "random"]


def test_plots_show_each_folds_held_out_predictions(bench):
    """The confusion matrix counts each fold's held-out rows once (k x a tenth of the rows),
    and the informative embeddings put most of them on the diagonal."""
    root = bench["root"]
    annotations = neuco.read_annotations(bench["labels"])
    ids, matrix = neuco.read_submission(root / "good.csv")
    task = neuco.neuco_task(annotations["landcover"], ids, matrix, matrix)
    config = ProbeConfig(k_folds=4, seed=42, std_ddof=0)
    outcome = probe_task(task, config)
    folds = held_out_predictions(task, config, outcome)
    counts = np.asarray(confusion_counts(folds, [0, 1]))
    assert counts.sum() == 4 * 16  # ShuffleSplit holds out ceil(0.1 x 160) rows per fold
    assert np.trace(counts) / counts.sum() > 0.8
    # the fold scores are those of the same predictions
    for (labels, preds), fold_score in zip(folds, outcome.fold_scores, strict=True):
        assert f1_score(labels, preds) == pytest.approx(fold_score)
    written = neuco.write_task_plots(root / "plots", task, config, outcome)
    assert written == [root / "plots" / "confusion_matrices" / "landcover_confusion_matrix.png"]
