"""summarize.py: aggregation math, one test per refusal rule, and --allow-partial's footnote."""

from __future__ import annotations

import csv
import io
import json
import statistics

import pytest
from result_helpers import make_result, make_selection, write_many, write_result
from scipy import stats as sps

from encoder_eval import summarize
from encoder_eval.core.protocol import REPORT_SEEDS

SEL = make_selection({
    ("alpha", "glue_rte"): "lr06", ("alpha", "glue_sst2"): "lr03", ("alpha", "sg_cb"): "lr06",
    ("beta", "glue_rte"): "lr08", ("beta", "glue_sst2"): "lr06", ("beta", "sg_cb"): "lr10",
})  # fmt: skip
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

    def run(results, *extra, selection=None):
        if selection is not None:
            sel.write_text(json.dumps(selection))
        write_many(rdir, results)
        return summarize.main(["--results-dir", str(rdir), "--selection", str(sel), *extra])

    run.rdir = rdir
    return run


def cell_text(scores: list[float]) -> str:
    """mean ± std [95 % t interval], x100, recomputed with scipy."""
    mean, std = statistics.mean(scores), statistics.stdev(scores)
    low, high = sps.t.interval(0.95, len(scores) - 1, loc=mean, scale=std / len(scores) ** 0.5)
    return f"{100 * mean:.2f} ± {100 * std:.2f} [{100 * low:.2f}, {100 * high:.2f}]"


def plain(col: str) -> str:
    """A table cell without its best (bold) or not-distinguishable (≈) mark."""
    return col.replace("**", "").replace(" ≈", "")


def test_markdown_table_equals_recomputed_mean_and_sample_std(setup, capsys):
    assert setup(full_results()) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # No "SuperGLUE" column over CB alone: it would repeat CB's and read like the SuperGLUE
    # score; GLUE, over two tasks here, has its column.
    assert lines[0] == "| Model | SST-2* (acc) | RTE* (acc) | CB* (macro-F1) | GLUE | Average |"
    for model in ("alpha", "beta"):
        row = next(line for line in lines if line.startswith(f"| {model} |"))
        cols = [plain(c.strip()) for c in row.strip("|").split("|")]
        assert cols[1] == cell_text(SCORES[(model, "glue_sst2")])
        assert cols[2] == cell_text(SCORES[(model, "glue_rte")])
        assert cols[3] == cell_text(SCORES[(model, "sg_cb")])
        means = {t: statistics.mean(SCORES[(model, t)]) for t in ("glue_sst2", "glue_rte", "sg_cb")}
        glue = (means["glue_sst2"] + means["glue_rte"]) / 2
        assert cols[4] == f"{100 * glue:.2f}"
        assert cols[5] == f"{100 * statistics.mean(means.values()):.2f}"
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
    sel = make_selection({("m", "xnli"): "lr06"})
    (tmp_path / "s.json").write_text(json.dumps(sel))
    rdir = tmp_path / "r"
    write_many(rdir, [make_result("m", "xnli", "lr06", s, "report", 0.7) for s in REPORT_SEEDS])
    assert (
        summarize.main(["--results-dir", str(rdir), "--selection", str(tmp_path / "s.json")]) == 0
    )
    out = capsys.readouterr().out
    assert "| Model | XNLI (acc) | Average |" in out  # no bucket column over one task
    assert "70.00 ± 0.00" in out and "dev (validation)" not in out


def refused(setup, capsys, results, rule: str, *needles: str, selection=None) -> str:
    assert setup(results, selection=selection) == 1
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
    sel = json.loads(json.dumps(SEL))
    for model, by_task in sel["pairs"].items():
        for entry in by_task.values():
            entry["select_setup"]["model_revision"] = f"rev-{model}"
    assert setup(results, selection=sel) == 0


def test_refuses_a_pair_without_selection(setup, capsys):
    results = full_results() + [make_result("gamma", "glue_rte", "lr06", 45, "report", 0.5)]
    refused(setup, capsys, results, "no_selection", "gamma/glue_rte")


def test_allow_partial_footnote_gives_the_real_seed_counts(setup, capsys):
    results = [r for r in full_results() if not (r["cell"]["model"] == "alpha"
               and r["cell"]["task"] == "glue_rte" and r["cell"]["seed"] > 46)]  # fmt: skip
    assert setup(results, "--allow-partial") == 0
    out = plain(capsys.readouterr().out)
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
    assert "61.00 ± n/a †" in plain(capsys.readouterr().out)  # no interval from one seed


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


def test_refuses_an_undefined_report_metric_and_never_averages_it(setup, capsys):
    results = full_results()
    results[2] = make_result("alpha", "glue_rte", "lr06", 47, "report", None)
    refused(setup, capsys, results, "undefined_metric", "alpha_glue_rte_lr06_s47.json",
            "en: constant predictions")  # fmt: skip
    assert setup(results, "--allow-partial", "--format", "json") == 0
    cell = json.loads(capsys.readouterr().out)["rows"][0]["cells"]["glue_rte"]
    kept = [s for i, s in enumerate(SCORES[("alpha", "glue_rte")]) if i != 2]
    assert cell["n"] == 4 and cell["undefined_seeds"] == [47] and cell["missing_seeds"] == []
    assert cell["mean"] == pytest.approx(statistics.mean(kept))


@pytest.mark.parametrize(
    "odd, needle",
    [({"mode": "liquid-bidir"}, "mode=liquid-bidir"),
     ({"trust_remote_code": True}, "trust_remote_code=True")],
    ids=["mode", "trust"],
)  # fmt: skip
def test_refuses_one_model_run_with_two_loaders(setup, capsys, odd, needle):
    results = full_results()
    results[-1] = make_result("beta", "sg_cb", "lr10", 49, "report", 0.66, **odd)
    err = refused(setup, capsys, results, "loader", "beta_sg_cb_lr10_s49.json", needle)
    assert "beta's loader" in err


def test_different_models_may_have_different_loaders(setup):
    results = [r for r in full_results() if r["cell"]["model"] == "alpha"]
    results += [make_result("beta", t, SEL["pairs"]["beta"][t]["lr_key"], seed, "report", s,
                            mode="liquid-bidir", trust_remote_code=True)
                for (m, t), scores in SCORES.items() if m == "beta"
                for seed, s in zip(REPORT_SEEDS, scores, strict=True)]  # fmt: skip
    sel = json.loads(json.dumps(SEL))
    for entry in sel["pairs"]["beta"].values():
        entry["select_setup"].update(mode="liquid-bidir", trust_remote_code=True)
    assert setup(results, selection=sel) == 0


def test_refuses_one_task_read_from_two_data_sources(setup, capsys):
    results = full_results()
    results[-1] = make_result("beta", "sg_cb", "lr10", 49, "report", 0.66,
                              data_identity="mirror-sha256:abc")  # fmt: skip
    err = refused(setup, capsys, results, "data_identity", "beta_sg_cb_lr10_s49.json",
                  "mirror-sha256:abc")  # fmt: skip
    assert "sg_cb's data" in err


def test_refuses_a_table_that_mixes_selection_splits(setup, capsys):
    results = [r for r in full_results() if r["cell"]["model"] == "alpha"]
    results += [make_result("beta", t, SEL["pairs"]["beta"][t]["lr_key"], seed, "report", s,
                            selection_split="holdout")
                for (m, t), scores in SCORES.items() if m == "beta"
                for seed, s in zip(REPORT_SEEDS, scores, strict=True)]  # fmt: skip
    sel = json.loads(json.dumps(SEL))
    for entry in sel["pairs"]["beta"].values():
        entry["select_setup"]["selection_split"] = "holdout"
        entry["select_setup"]["recipe"]["selection_split"] = "holdout"
    err = refused(setup, capsys, results, "selection_split", "beta_sg_cb_lr10_s49.json",
                  "selection split holdout", selection=sel)  # fmt: skip
    assert "[recipe]" not in err  # named once, as the variant it is


@pytest.mark.parametrize(
    "split, label",
    [("dev", "LR selection and early stopping on the official dev split (the specification's "
              "default; for dev-reported tasks the score is a maximum over evaluations)"),
     ("holdout", "LR selection and early stopping on a held-out slice of train (strict")],
    ids=["dev", "holdout"],
)  # fmt: skip
def test_the_table_names_its_selection_split(setup, capsys, split, label):
    results = [make_result(r["cell"]["model"], r["cell"]["task"], r["cell"]["lr_key"],
                           r["cell"]["seed"], "report", r["report"]["mean"],
                           selection_split=split) for r in full_results()]  # fmt: skip
    sel = make_selection({(m, t): SEL["pairs"][m][t]["lr_key"] for m, t in SCORES},
                         selection_split=split)  # fmt: skip
    assert setup(results, selection=sel) == 0
    assert label in capsys.readouterr().out
    assert setup(results, "--format", "json", selection=sel) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selection_split"] == split and any(label in n for n in data["footnotes"])


def test_refuses_an_off_protocol_selection(setup, capsys):
    sel = json.loads(json.dumps(SEL))
    sel["on_protocol"] = False
    sel["policy"].update(lr_keys=["lr03", "lr06"], seeds=[42, 43])
    sel["pairs"]["beta"]["sg_cb"]["on_protocol"] = False
    err = refused(setup, capsys, full_results(), "selection_off_protocol", "lr03,lr06",
                  "42,43", "beta/sg_cb", selection=sel)  # fmt: skip
    assert setup(full_results(), "--allow-partial", selection=sel) == 0
    assert "[selection_off_protocol]" in capsys.readouterr().out
    assert err


def test_refuses_a_selection_made_over_missing_select_seeds(setup, capsys):
    sel = json.loads(json.dumps(SEL))
    sel["pairs"]["alpha"]["sg_cb"].update(partial=True, missing_by_lr={"lr06": [44]})
    refused(setup, capsys, full_results(), "selection_partial", "alpha/sg_cb", "lr06",
            selection=sel)  # fmt: skip


@pytest.mark.parametrize(
    "field, value, needle",
    [("model_revision", "rev-old", "model_revision rev-a (its select cells have rev-old)"),
     ("mode", "liquid-bidir", "mode auto (its select cells have liquid-bidir)"),
     ("trust_remote_code", True, "trust_remote_code False (its select cells have True)"),
     ("data_identity", "mirror-sha256:abc", "(its select cells have mirror-sha256:abc)"),
     ("selection_split", "holdout", "selection_split dev (its select cells have holdout)"),
     ("recipe", {"weight_decay": 0.0}, "recipe weight_decay=0.1 (its select cells have 0.0)")],
    ids=["revision", "mode", "trust", "data", "selection-split", "recipe"],
)  # fmt: skip
def test_refuses_report_cells_that_ran_otherwise_than_their_select_cells(
    setup, capsys, field, value, needle
):
    sel = json.loads(json.dumps(SEL))
    setup_ = sel["pairs"]["alpha"]["glue_rte"]["select_setup"]
    if field == "recipe":
        setup_["recipe"].update(value)
    else:
        setup_[field] = value
    err = refused(setup, capsys, full_results(), "select_report_mismatch",
                  "alpha_glue_rte_lr06_s45.json", "alpha_glue_rte_lr06_s49.json", needle,
                  selection=sel)  # fmt: skip
    assert "alpha_glue_sst2" not in err


def test_refuses_a_selection_that_does_not_record_its_select_cells(setup, capsys):
    sel = json.loads(json.dumps(SEL))
    del sel["pairs"]["beta"]["glue_rte"]["select_setup"]
    refused(setup, capsys, full_results(), "select_report_mismatch", "beta/glue_rte",
            "regenerate", selection=sel)  # fmt: skip


def test_refuses_a_selection_of_the_previous_version(setup, capsys):
    sel = json.loads(json.dumps(SEL))
    sel["version"] = 1
    assert setup(full_results(), selection=sel) == 2
    assert "regenerate it with encoder-eval select" in capsys.readouterr().err


def test_seed_aggregation_is_the_mean_and_sample_std_and_never_counts_undefined():
    from encoder_eval.core import aggregate
    from encoder_eval.core.schema import CellResult

    values = [0.5, 0.7, 0.65]
    assert aggregate.seed_mean(values) == pytest.approx(statistics.fmean(values))
    assert aggregate.seed_std(values) == pytest.approx(statistics.stdev(values))  # ddof=1
    assert aggregate.seed_std([0.5]) is None and aggregate.seed_mean([]) is None
    seeds = aggregate.SeedScores()
    outcomes = [
        seeds.add(CellResult.from_dict(make_result("m", "glue_rte", "lr06", s, "report", v)),
                  "report")
        for s, v in ((45, 0.5), (46, None), (47, 0.7))
    ]  # fmt: skip
    diverged = make_result("m", "glue_rte", "lr06", 48, "report", status="diverged")
    outcomes.append(seeds.add(CellResult.from_dict(diverged), "report"))
    assert outcomes == [aggregate.FINISHED, aggregate.UNDEFINED, aggregate.FINISHED,
                        aggregate.DIVERGED]  # fmt: skip
    assert (seeds.n, seeds.undefined, seeds.diverged) == (2, [46], [48])
    assert seeds.mean == pytest.approx(0.6)
    groups = aggregate.group_by_lr_key(
        [CellResult.from_dict(make_result("m", "glue_rte", k, 45, "report", 0.5))
         for k in ("lr06", "lr07")], "report")  # fmt: skip
    assert list(groups) == [("m", "glue_rte", "lr06"), ("m", "glue_rte", "lr07")]


# Recipe entries results recorded before the Recipe held every comparability fact, and the
# keys that version's select_setup kept (derived ones, since dropped from the signature).
NEW_RECIPE_ENTRIES = ("eval_every_max", "min_evals_when_capped", "eval_batch_size")
OLD_SIGNATURE_KEYS = {"effective_batch": 32, "optimizer": "AdamW",
                      "schedule": "linear warmup, linear decay"}  # fmt: skip


def test_results_and_selection_written_before_the_recipe_change_still_make_a_table(setup, capsys):
    old = full_results()
    for r in old:
        for key in NEW_RECIPE_ENTRIES:
            del r["recipe"][key]
    selection = json.loads(json.dumps(SEL))
    for by_task in selection["pairs"].values():
        for entry in by_task.values():
            recipe = entry["select_setup"]["recipe"]
            for key in NEW_RECIPE_ENTRIES:
                recipe.pop(key, None)
            recipe.update(OLD_SIGNATURE_KEYS)
    assert setup(old, selection=selection) == 0, capsys.readouterr().err
    assert cell_text(SCORES[("alpha", "glue_rte")]) in plain(capsys.readouterr().out)


def test_glue_and_superglue_scores_and_a_ranking_column_outside_the_average(tmp_path, capsys):
    from encoder_eval.data.tasks import BENCHMARK_SCORES

    glue, superglue = BENCHMARK_SCORES["glue_score"], BENCHMARK_SCORES["superglue_score"]
    assert "sg_record" not in superglue and len(glue) == 8 and len(superglue) == 4
    tasks = [*glue, *superglue, "ms_marco"]
    scores = {t: [0.3 + 0.04 * i + 0.013 * j for j in range(len(REPORT_SEEDS))]
              for i, t in enumerate(tasks)}  # fmt: skip
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(make_selection({("m", t): "lr05" for t in tasks})))
    rdir = tmp_path / "report"
    rdir.mkdir()
    write_many(rdir, [make_result("m", t, "lr05", seed, "report", s)
                      for t in tasks for seed, s in zip(REPORT_SEEDS, scores[t], strict=True)])  # fmt: skip
    means = {t: statistics.mean(v) for t, v in scores.items()}
    want_glue = sum(means[t] for t in glue) / 8
    want_sg = sum(means[t] for t in superglue) / 4
    want_avg = sum(means[t] for t in [*glue, *superglue]) / 12  # ms_marco left out
    args = ["--results-dir", str(rdir), "--selection", str(sel), "--no-marks"]

    assert summarize.main([*args, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = data["rows"][0]
    assert row["benchmark_scores"]["glue_score"] == pytest.approx(want_glue)
    assert row["benchmark_scores"]["superglue_score"] == pytest.approx(want_sg)
    assert row["average"] == pytest.approx(want_avg)
    assert row["buckets"]["ranking"] == pytest.approx(means["ms_marco"])
    assert data["benchmark_scores"]["superglue_score"]["tasks"] == list(superglue)

    assert summarize.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    # no Ranking column over ms_marco alone
    assert head[-5:] == ["GLUE", "SuperGLUE", "GLUE score", "SuperGLUE score", "Average"]
    assert "MS-MARCO* (MRR@10)" in head
    cols = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cols[-3:] == [f"{100 * want_glue:.2f}", f"{100 * want_sg:.2f}", f"{100 * want_avg:.2f}"]

    assert summarize.main([*args, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    bench = {r["task"]: float(r["mean"]) for r in rows if r["kind"] == "benchmark"}
    assert bench == pytest.approx({"glue_score": want_glue, "superglue_score": want_sg})

    # Without one GLUE task there is no GLUE score (a partial average is another number).
    assert summarize.main([*args, "--format", "json", "--tasks",
                           ",".join(t for t in tasks if t != "glue_cola")]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert "glue_score" not in data["rows"][0]["benchmark_scores"]
    assert data["rows"][0]["benchmark_scores"]["superglue_score"] == pytest.approx(want_sg)


def test_a_t_interval_past_the_metrics_range_is_cut_to_it_and_noted(tmp_path, capsys):
    """Issue 40 item 13: two report seeds make the t interval 12.7 std wide, past any score
    (CB macro-F1 [-34.02, 109.47], Spearman [-4.76, 178.75]); it is cut to the metric's
    range, [0, 100] or [-100, 100], in every format, and a footnote names the cut cells."""
    scores = {("alpha", "sg_cb"): [0.70, 0.95], ("alpha", "glue_stsb"): [0.80, 0.94],
              ("alpha", "glue_rte"): [0.60, 0.62]}  # fmt: skip
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(make_selection(dict.fromkeys(scores, "lr06"))))
    results = [make_result(m, t, "lr06", seed, "report", s)
               for (m, t), pair in scores.items() for seed, s in zip((45, 46), pair, strict=True)]  # fmt: skip
    write_many(tmp_path / "r", results)
    argv = ["--results-dir", str(tmp_path / "r"), "--selection", str(sel), "--allow-partial"]
    assert summarize.main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cells = data["rows"][0]["cells"]
    cut = {"sg_cb": (0.0, 1.0), "glue_stsb": (-1.0, 1.0)}
    for task, (lo, hi) in cut.items():
        mean, std = (
            statistics.mean(scores[("alpha", task)]),
            statistics.stdev(scores[("alpha", task)]),
        )
        low, high = sps.t.interval(0.95, 1, loc=mean, scale=std / 2**0.5)
        assert low < lo or high > hi  # the uncut interval reaches past the range
        assert (cells[task]["ci"]["low"], cells[task]["ci"]["high"]) == (
            pytest.approx(max(low, lo)), pytest.approx(min(high, hi)))  # fmt: skip
    rte = scores[("alpha", "glue_rte")]  # inside [0, 1]: untouched
    assert (cells["glue_rte"]["ci"]["low"], cells["glue_rte"]["ci"]["high"]) == pytest.approx(
        sps.t.interval(0.95, 1, loc=statistics.mean(rte), scale=statistics.stdev(rte) / 2**0.5)
    )
    assert summarize.main(argv) == 0
    out = capsys.readouterr().out
    assert "82.50 ± 17.68 [0.00, 100.00]" in plain(out)  # not [-76.33, 241.33]
    assert "-76.33" not in out and "241.33" not in out
    note = ("Intervals cut at the metric's range (Spearman [-100.00, 100.00]; macro-F1 [0.00, "
            "100.00]), which the t interval of so few seeds reaches past: alpha/glue_stsb, "
            "alpha/sg_cb.")  # fmt: skip
    assert note in out.splitlines()
