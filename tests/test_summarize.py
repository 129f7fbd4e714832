"""summarize.py: aggregation math, one test per refusal rule, and --allow-partial's footnote."""

from __future__ import annotations

import csv
import io
import json
import statistics

import pytest
from result_helpers import make_result, write_many, write_result

from encoder_eval import summarize
from encoder_eval.protocol import REPORT_SEEDS

SEL = {
    "schema": "encoder-eval-selection",
    "version": 1,
    "pairs": {
        "alpha": {
            "glue_rte": {"lr_key": "lr06", "lr": 3.59e-05},
            "glue_sst2": {"lr_key": "lr03", "lr": 1.67e-05},
            "sg_cb": {"lr_key": "lr06", "lr": 3.59e-05},
        },
        "beta": {
            "glue_rte": {"lr_key": "lr08", "lr": 5.99e-05},
            "glue_sst2": {"lr_key": "lr06", "lr": 3.59e-05},
            "sg_cb": {"lr_key": "lr10", "lr": 1e-4},
        },
    },
}
SCORES = {  # (model, task) -> five report scores, one per report seed
    ("alpha", "glue_rte"): [0.61, 0.64, 0.58, 0.66, 0.60],
    ("alpha", "glue_sst2"): [0.90, 0.91, 0.89, 0.92, 0.905],
    ("alpha", "sg_cb"): [0.70, 0.75, 0.72, 0.71, 0.69],
    ("beta", "glue_rte"): [0.55, 0.57, 0.59, 0.52, 0.56],
    ("beta", "glue_sst2"): [0.88, 0.87, 0.90, 0.86, 0.89],
    ("beta", "sg_cb"): [0.60, 0.65, 0.62, 0.61, 0.66],
}


def full_results(**kw) -> list[dict]:
    out = []
    for (model, task), scores in SCORES.items():
        key = SEL["pairs"][model][task]["lr_key"]
        for seed, s in zip(REPORT_SEEDS, scores, strict=True):
            out.append(make_result(model, task, key, seed, "report", s, **kw))
    return out


@pytest.fixture
def setup(tmp_path):
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(SEL))
    rdir = tmp_path / "report"
    rdir.mkdir()

    def run(results, *extra):
        write_many(rdir, results)
        return summarize.main(["--results-dir", str(rdir), "--selection", str(sel), *extra])

    run.rdir = rdir
    return run


def cell_text(scores: list[float]) -> str:
    return f"{100 * statistics.mean(scores):.2f} ± {100 * statistics.stdev(scores):.2f}"


def test_markdown_table_equals_recomputed_mean_and_sample_std(setup, capsys):
    assert setup(full_results()) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (
        "| Model | SST-2* (acc) | RTE* (acc) | CB* (macro-F1) | GLUE | SuperGLUE | Average |"
    )
    for model in ("alpha", "beta"):
        row = next(line for line in lines if line.startswith(f"| {model} |"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        assert cols[1] == cell_text(SCORES[(model, "glue_sst2")])
        assert cols[2] == cell_text(SCORES[(model, "glue_rte")])
        assert cols[3] == cell_text(SCORES[(model, "sg_cb")])
        means = {t: statistics.mean(SCORES[(model, t)]) for t in ("glue_sst2", "glue_rte", "sg_cb")}
        glue = (means["glue_sst2"] + means["glue_rte"]) / 2
        assert cols[4] == f"{100 * glue:.2f}"
        assert cols[5] == f"{100 * means['sg_cb']:.2f}"
        assert cols[6] == f"{100 * statistics.mean(means.values()):.2f}"
    assert "ddof=1" in out and "avg@5" in out and "45-49" in out
    assert "* reported on the dev (validation) split" in out
    assert "†" not in out


def test_json_and_csv_formats_carry_the_raw_numbers(setup, capsys):
    assert setup(full_results(), "--format", "json") == 0
    data = json.loads(capsys.readouterr().out)
    row = next(r for r in data["rows"] if r["model"] == "beta")
    cell = row["cells"]["sg_cb"]
    assert cell["mean"] == pytest.approx(statistics.mean(SCORES[("beta", "sg_cb")]))
    assert cell["std"] == pytest.approx(statistics.stdev(SCORES[("beta", "sg_cb")]))
    assert cell["n"] == 5 and cell["lr_key"] == "lr10" and cell["metric"] == "macro_f1"
    assert data["problems"] == [] and data["std"].startswith("sample")
    assert {t["task"]: t["dev_reported"] for t in data["tasks"]}["glue_rte"] is True

    assert setup(full_results(), "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    rte = next(r for r in rows if r["model"] == "alpha" and r["task"] == "glue_rte")
    assert float(rte["mean"]) == pytest.approx(statistics.mean(SCORES[("alpha", "glue_rte")]))
    assert rte["n"] == "5" and rte["seeds"] == "45 46 47 48 49"
    assert any(r["kind"] == "average" for r in rows)


def test_multilingual_bucket_and_unstarred_test_split(tmp_path, capsys):
    sel = {"schema": "encoder-eval-selection", "version": 1,
           "pairs": {"m": {"xnli": {"lr_key": "lr06", "lr": 3.59e-05}}}}  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps(sel))
    rdir = tmp_path / "r"
    write_many(rdir, [make_result("m", "xnli", "lr06", s, "report", 0.7) for s in REPORT_SEEDS])
    assert (
        summarize.main(["--results-dir", str(rdir), "--selection", str(tmp_path / "s.json")]) == 0
    )
    out = capsys.readouterr().out
    assert "| Model | XNLI (acc) | Multilingual | Average |" in out
    assert "70.00 ± 0.00" in out and "dev (validation)" not in out


def refused(setup, capsys, results, rule: str, *needles: str) -> str:
    assert setup(results) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed on stdout when refused
    assert f"[{rule}]" in captured.err
    for needle in needles:
        assert needle in captured.err
    return captured.err


def test_refuses_missing_report_seeds(setup, capsys):
    results = [r for r in full_results() if not (r["cell"]["model"] == "beta"
               and r["cell"]["task"] == "sg_cb" and r["cell"]["seed"] in (48, 49))]  # fmt: skip
    refused(setup, capsys, results, "missing_seeds", "beta_sg_cb_lr10_s48.json",
            "beta_sg_cb_lr10_s49.json")  # fmt: skip


def test_refuses_a_result_at_another_lr(setup, capsys):
    results = full_results() + [make_result("alpha", "glue_rte", "lr01", 45, "report", 0.99)]
    err = refused(setup, capsys, results, "wrong_lr", "alpha_glue_rte_lr01_s45.json")
    assert "selected lr06" in err


def test_refuses_off_protocol_cells(setup, capsys):
    results = full_results()
    results[0] = make_result("alpha", "glue_rte", "lr06", 45, "report", 0.61,
                             recipe={"max_steps": 4})  # fmt: skip
    refused(setup, capsys, results, "off_protocol", "alpha_glue_rte_lr06_s45.json",
            "max_steps=4")  # fmt: skip


def test_refuses_a_diverged_report_seed(setup, capsys):
    results = full_results()
    results[1] = make_result("alpha", "glue_rte", "lr06", 46, "report", None, status="diverged")
    refused(setup, capsys, results, "diverged", "alpha_glue_rte_lr06_s46.json")


def test_refuses_recipe_disagreement(setup, capsys):
    # batching is not a Recipe field (so the cell stays on-protocol) but must match.
    results = full_results()
    results[2] = make_result("alpha", "glue_rte", "lr06", 47, "report", 0.58,
                             recipe={"batching": "random"})  # fmt: skip
    refused(setup, capsys, results, "recipe", "alpha_glue_rte_lr06_s47.json", "batching=random")


def test_refuses_precision_disagreement(setup, capsys):
    results = full_results()
    results[3] = make_result("alpha", "glue_rte", "lr06", 48, "report", 0.66,
                             recipe={"precision": "fp32"}, on_protocol=True)  # fmt: skip
    refused(setup, capsys, results, "precision", "alpha_glue_rte_lr06_s48.json", "fp32")


def test_refuses_transformers_disagreement(setup, capsys):
    results = full_results()
    results[7] = make_result("alpha", "glue_sst2", "lr03", 47, "report", 0.89,
                             transformers="4.57.0")  # fmt: skip
    refused(setup, capsys, results, "transformers", "alpha_glue_sst2_lr03_s47.json", "4.57.0")


def test_refuses_two_revisions_of_one_model(setup, capsys):
    results = full_results()
    results[-1] = make_result("beta", "sg_cb", "lr10", 49, "report", 0.66, revision="rev-b")
    err = refused(setup, capsys, results, "model_revision", "beta_sg_cb_lr10_s49.json", "rev-b")
    assert "beta's model revision" in err


def test_different_models_may_have_different_revisions(setup):
    results = [make_result(r["cell"]["model"], r["cell"]["task"], r["cell"]["lr_key"],
                           r["cell"]["seed"], "report", r["report"]["mean"],
                           revision=f"rev-{r['cell']['model']}") for r in full_results()]  # fmt: skip
    assert setup(results) == 0


def test_refuses_a_pair_without_selection(setup, capsys):
    results = full_results() + [make_result("gamma", "glue_rte", "lr06", 45, "report", 0.5)]
    refused(setup, capsys, results, "no_selection", "gamma/glue_rte")


def test_allow_partial_footnote_gives_the_real_seed_counts(setup, capsys):
    results = [r for r in full_results() if not (r["cell"]["model"] == "alpha"
               and r["cell"]["task"] == "glue_rte" and r["cell"]["seed"] > 46)]  # fmt: skip
    assert setup(results, "--allow-partial") == 0
    out = capsys.readouterr().out
    scores = SCORES[("alpha", "glue_rte")][:2]
    assert f"| alpha | {cell_text(SCORES[('alpha', 'glue_sst2')])} | {cell_text(scores)} †" in out
    assert "† avg@2 instead of avg@5: alpha/glue_rte." in out
    assert "[missing_seeds]" in out  # every problem becomes a footnote


def test_allow_partial_never_averages_wrong_lr_or_diverged(setup, capsys):
    results = full_results()
    results[0] = make_result("alpha", "glue_rte", "lr06", 45, "report", None, status="diverged")
    results.append(make_result("alpha", "glue_rte", "lr01", 45, "report", 0.0))
    assert setup(results, "--allow-partial", "--format", "json") == 0
    data = json.loads(capsys.readouterr().out)
    cell = next(r for r in data["rows"] if r["model"] == "alpha")["cells"]["glue_rte"]
    assert cell["n"] == 4 and cell["diverged_seeds"] == [45]
    assert cell["mean"] == pytest.approx(statistics.mean(SCORES[("alpha", "glue_rte")][1:]))
    assert {p["rule"] for p in data["problems"]} == {"diverged", "wrong_lr"}


def test_one_seed_shows_no_std(setup, capsys):
    results = [r for r in full_results() if r["cell"]["seed"] == 45]
    assert setup(results, "--allow-partial") == 0
    assert "61.00 ± n/a †" in capsys.readouterr().out


def test_unparseable_file_is_skipped_with_a_warning(setup, capsys):
    (setup.rdir / "alpha_glue_rte_lr06_s45.json").write_text("{")
    write_result(setup.rdir, make_result("x", "glue_rte", "lr06", 45, "report", 0.5))
    (setup.rdir / "x_glue_rte_lr06_s45.json").rename(setup.rdir / "wrong-name.json")
    results = [r for r in full_results() if r["cell"]["seed"] != 45 or r["cell"]["task"] != "glue_rte"
               or r["cell"]["model"] != "alpha"]  # fmt: skip
    assert setup(results) == 1
    err = capsys.readouterr().err
    assert "warning: skipping" in err and "alpha_glue_rte_lr06_s45.json" in err
    assert "wrong-name.json" in err and "[missing_seeds]" in err


def test_models_and_tasks_restrict_the_table(setup, capsys):
    assert setup(full_results(), "--models", "beta", "--tasks", "glue_rte") == 0
    out = capsys.readouterr().out
    assert "| beta |" in out and "alpha" not in out and "SST-2" not in out


def test_input_errors_exit_2(setup, tmp_path, capsys):
    assert setup(full_results(), "--tasks", "glue_rtx") == 2
    assert "Did you mean 'glue_rte'" in capsys.readouterr().err
    assert summarize.main(["--results-dir", str(setup.rdir), "--selection",
                           str(tmp_path / "none.json")]) == 2  # fmt: skip


def test_out_file(setup, tmp_path, capsys):
    out = tmp_path / "table.md"
    assert setup(full_results(), "--out", str(out)) == 0
    assert out.read_text().startswith("| Model |")
