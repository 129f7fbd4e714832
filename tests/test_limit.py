"""`--limit N` smoke runs: every split cut to N examples (seeded, stratified, whole queries
for ranking), recorded in the recipe, off-protocol, refused by `summarize` unless
`--allow-partial`, which names it in the footnote."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections import Counter

import pytest
from conftest import REPO, read_json
from result_helpers import make_result, make_selection, write_many
from spec_helpers import script_with_units

from encoder_eval import summarize
from encoder_eval.core.protocol import PHASE_SEEDS
from encoder_eval.data.limit import limit_data, limit_split
from encoder_eval.data.task_loading import load_task


def test_classification_splits_keep_label_shares_and_order() -> None:
    labels = [0] * 60 + [1] * 30 + [2] * 10
    split = {"text": [f"t{i}" for i in range(100)], "label": labels}
    cut = limit_split(split, 20, "single_label_classification")
    assert Counter(cut["label"]) == {0: 12, 1: 6, 2: 2}
    idx = [int(t[1:]) for t in cut["text"]]
    assert idx == sorted(idx) and [labels[i] for i in idx] == cut["label"]
    assert cut == limit_split(split, 20, "single_label_classification")  # seeded
    rare = limit_split({"text": list("abcdefghij"), "label": [0] * 9 + [1]}, 3, "x")
    assert Counter(rare["label"]) == {0: 2, 1: 1}  # every label kept while n allows
    assert limit_split(split, 500, "single_label_classification") is split


def test_ranking_keeps_whole_queries_and_regression_samples_rows() -> None:
    split = {"query_id": [q for q in "abcde" for _ in range(4)], "label": [1, 0, 0, 0] * 5,
             "text": [str(i) for i in range(20)]}  # fmt: skip
    cut = limit_split(split, 2, "ranking")
    assert len(cut["label"]) == 8 and len(set(cut["query_id"])) == 2
    assert all(cut["query_id"].count(q) == 4 for q in set(cut["query_id"]))
    reg = limit_split({"text": list(range(50)), "label": [i / 10 for i in range(50)]}, 7,
                      "regression")  # fmt: skip
    assert len(reg["label"]) == 7 and reg["text"] == sorted(reg["text"])


def test_real_task_data_is_cut_in_every_split() -> None:
    from mirror_helpers import shared_data

    data = load_task("glue_rte", str(shared_data()), with_test=True)
    train, dev, test, _, _ = limit_data(data, 24)
    assert len(train["label"]) == 24
    assert all(len(s["label"]) == 24 for s in (*dev.values(), *test.values()))
    full = Counter(data[0]["label"])
    share = full[1] / sum(full.values())
    assert abs(Counter(train["label"])[1] / 24 - share) <= 1 / 24 + 1e-9


def test_a_limited_cell_records_the_limit_and_is_off_protocol(tiny_models, small_mirror, tmp_path):
    out = tmp_path / "cell.json"
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval.run", "--model-path", str(tiny_models["bert"]),
         "--model-key", "tiny", "--task", "glue_rte", "--lr", "1e-4", "--seed", "45",
         "--limit", "16", "--max-seq-len", "64", "--data-dir", str(small_mirror), "--device",
         "cpu", "--out-json", str(out), "--progress", "quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert result["recipe"]["limit"] == 16
    assert result["training"]["train_examples"] == 16
    assert result["protocol"]["on_protocol"] is False
    assert any(
        r.startswith("limit=16: a smoke run") for r in result["protocol"]["off_protocol_reasons"]
    )
    preds = read_json(out.with_name("cell.predictions.json"))
    assert all(len(v["predictions"]) == 16 for v in preds["languages"].values())


@pytest.mark.parametrize("bad", ["1", "0", "-3"])
def test_a_useless_limit_is_refused(bad, tiny_models, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval.run", "--model-path", str(tiny_models["bert"]),
         "--task", "glue_rte", "--lr", "1e-4", "--seed", "45", "--limit", bad, "--out-json",
         str(tmp_path / "x.json")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --limit {bad} must be at least 2 (examples per split)"


def test_summarize_refuses_limited_cells_and_the_footnote_names_the_limit(tmp_path, capsys):
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(make_selection({("m", "glue_rte"): "lr06"})))
    rdir = tmp_path / "report"
    write_many(rdir, [make_result("m", "glue_rte", "lr06", s, "report", 0.6, recipe={"limit": 32})
                      for s in PHASE_SEEDS["report"]])  # fmt: skip
    args = ["--results-dir", str(rdir), "--selection", str(sel)]
    assert summarize.main(args) == 1
    err = capsys.readouterr().err
    assert "[off_protocol]" in err and "limit=32: a smoke run" in err
    assert summarize.main([*args, "--allow-partial"]) == 0
    out = capsys.readouterr().out
    assert "limit=32: a smoke run, every split cut to 32 examples" in out


def test_a_limited_sweep_with_trackers_runs_end_to_end(tiny_models, small_mirror, tmp_path):
    """`sweep --limit --report-to` puts both on every cell, says the sweep is shrunken, and
    records them in experiment.toml for the later phases."""
    from encoder_eval import sweep

    res, runs = tmp_path / "res", tmp_path / "runs"
    assert sweep.main([
        "--phase", "select", "--model", f"tiny={tiny_models['bert']}", "--tasks", "glue_rte",
        "--lr-keys", "lr06", "--seeds", "42", "--max-steps", "2", "--max-seq-len", "64",
        "--limit", "12", "--report-to", "tensorboard", "--data-dir", str(small_mirror),
        "--device", "cpu", "--results-dir", str(res), "--out-dir", str(runs),
    ]) == 0  # fmt: skip
    script = script_with_units(runs / "run_all.sh")
    assert "--limit 12" in script and "--report-to tensorboard" in script
    recorded = tomllib.loads((res / "experiment.toml").read_text())
    assert recorded["recipe"]["limit"] == 12  # typed, not an argv string
    proc = subprocess.run(["bash", str(runs / "run_all.sh")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [result] = [read_json(p) for p in res.glob("tiny_glue_rte_*.json")]
    assert result["recipe"]["limit"] == 12 and result["training"]["train_examples"] == 12
    assert list((res / "tracking" / "tensorboard").iterdir())


def test_sweep_names_the_limit_in_its_shrunken_note(tiny_models, small_mirror, tmp_path, capsys):
    from encoder_eval import sweep

    assert sweep.main([
        "--phase", "select", "--model", f"tiny={tiny_models['bert']}", "--tasks", "glue_rte",
        "--limit", "20", "--results-dir", str(tmp_path / "r"), "--out-dir", str(tmp_path / "o"),
    ]) == 0  # fmt: skip
    assert "limit 20: a smoke run" in capsys.readouterr().out


def test_probe_limit_marks_cells_and_summarize_refuses_them(tiny_models, small_mirror, tmp_path,
                                                             capsys):  # fmt: skip
    from encoder_eval import probe

    out = tmp_path / "probes"
    assert probe.main([
        "--model", f"tiny={tiny_models['bert']}", "--tasks", "glue_rte", "--data-dir",
        str(small_mirror), "--results-dir", str(out), "--k-folds", "2", "--max-seq-len", "32",
        "--device", "cpu", "--limit", "24", "--no-cache",
    ]) == 0  # fmt: skip
    [record] = [json.loads(p.read_text()) for p in out.glob("*.probe.json")]
    assert record["protocol"]["limit"] == 24 and record["protocol"]["on_protocol"] is False
    assert record["provenance"]["embedding"]["limit"] == 24
    capsys.readouterr()
    assert summarize.main(["--results-dir", str(out)]) == 1
    assert "smoke runs" in capsys.readouterr().err
