"""Our NeuCo-Bench run summary, field by field against what NeuCo-Bench writes and reads.

NeuCo-Bench (embed2scale/NeuCo-Bench, commit a89ba063cca71aab7d86660081f0bf02e41fdd12):
- `benchmark/evaluation/evaluation.py`, `evaluate`: the run folder is
  `<output_dir>/<phase>/<experiment_name>` with `experiment_name = f"{method_name}_{timestamp}"`
  (timestamp `%Y%m%d_%H%M%S`), and `save_results(experiment_name=experiment_name, ...)`.
- `benchmark/evaluation/results.py`, `save_results`: `results_summary.json` holds
  `experiment` (str), `overall_q_score` and `overall_acc_score` (np.mean over tasks: floats),
  `task_q_scores` and `task_acc_scores` (task name -> float) and, when given, `config` (the
  YAML's dict).
- same file, `aggregate_results`: for every `<phase>/*/results_summary.json` it takes
  `data["experiment"]` (a KeyError without it), then, since `task_q_scores` is there,
  `overall_q_score`, `overall_acc_score` and one column per entry of the two task dicts;
  `summarize_runs` merges the leaderboard back onto those rows on `experiment`, so two runs
  of a phase must not share one.
Where a task's Q is undefined NeuCo-Bench writes NaN (np.nanmean of nothing) and we write
null; its reader makes both a missing value.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from test_neuco import CONFIG, _annotations, _submission

from encoder_eval.cells import probing
from encoder_eval.reports import neuco

# Each field NeuCo-Bench's save_results writes, with its JSON type.
NEUCO_SUMMARY_FIELDS = {
    "experiment": str,
    "overall_q_score": float,
    "overall_acc_score": float,
    "task_q_scores": dict,
    "task_acc_scores": dict,
    "config": dict,
}
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def read_like_neuco_bench(output_dir: Path, phase: str) -> list[dict]:
    """One row per run summary of the phase, built from the fields and in the way NeuCo-
    Bench's aggregate_results reads them (the `q::` and `acc::` columns are its names)."""
    rows = []
    for run_dir in sorted(Path(output_dir, phase).iterdir()):
        for path in run_dir.glob("results_summary.json"):
            data = json.loads(path.read_text())
            row = {"experiment": data["experiment"]}
            assert "task_q_scores" in data  # the reader's current format, not its old one
            row["overall_q_score"] = data.get("overall_q_score")
            row["overall_acc_score"] = data.get("overall_acc_score")
            row |= {f"q::{k}": v for k, v in data.get("task_q_scores", {}).items()}
            row |= {f"acc::{k}": v for k, v in data.get("task_acc_scores", {}).items()}
            rows.append(row)
    return rows


def test_our_summary_has_every_field_neuco_bench_writes_with_its_type(tmp_path):
    signal = _annotations(tmp_path / "labels")
    _submission(tmp_path / "good.csv", signal)
    (tmp_path / "config.yaml").write_text(CONFIG.format(dim=6, leaderboard="false"))
    config = neuco.read_config(tmp_path / "config.yaml")
    run_dirs = [
        neuco.run_neuco(
            tmp_path / "labels",
            tmp_path / "good.csv",
            config,
            tmp_path / "out",
            "good",
            "dev",
            now=NOW,
        )  # fmt: skip
        for _ in range(2)  # the second run in the same second gets a folder of its own
    ]
    assert [d.name for d in run_dirs] == ["good_20260102_030405", "good_20260102_030405-1"]
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "results_summary.json").read_text())
        for name, kind in NEUCO_SUMMARY_FIELDS.items():
            assert type(summary.get(name)) is kind, (name, summary.get(name))
        # experiment: the run folder's name, `<method>_<timestamp>` as NeuCo-Bench names it
        assert summary["experiment"] == run_dir.name
        assert summary["experiment"].startswith(f"good_{NOW.strftime('%Y%m%d_%H%M%S')}")
        for name in ("task_q_scores", "task_acc_scores"):
            assert set(summary[name]) == {"landcover", "biomass"}
            assert all(type(v) is float for v in summary[name].values()), summary[name]
        assert summary["overall_q_score"] == np.mean(list(summary["task_q_scores"].values()))
        assert summary["config"]["k_folds"] == 4
    rows = read_like_neuco_bench(tmp_path / "out", "dev")
    assert [r["experiment"] for r in rows] == [d.name for d in run_dirs]  # unique merge keys
    first = json.loads((run_dirs[0] / "results_summary.json").read_text())
    assert rows[0]["q::landcover"] == first["task_q_scores"]["landcover"]
    assert rows[0]["acc::biomass"] == first["task_acc_scores"]["biomass"]


def test_a_probe_cell_summary_in_no_run_folder_names_its_method():
    summary = probing.run_summary("minilm:mean", [], {"k_folds": 5})
    assert summary["experiment"] == "minilm:mean" == summary["method"]
