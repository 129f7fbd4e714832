"""select.py: the LR-selection policy, stated in its docstring, rule by rule."""

from __future__ import annotations

import json

import pytest
from result_helpers import make_result, write_many

from encoder_eval import select
from encoder_eval.core import comparability
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import load_results
from encoder_eval.plans import selection

KEYS = ["lr03", "lr06"]
SEEDS = [42, 43]


def grid(scores: dict[str, list[float]], model="m", task="glue_rte", seeds=SEEDS) -> list[dict]:
    """Select cells: scores[lr_key][i] is seed seeds[i]'s dev mean (None: diverged)."""
    out = []
    for key, row in scores.items():
        for seed, s in zip(seeds, row, strict=True):
            status = "diverged" if s is None else "ok"
            out.append(make_result(model, task, key, seed, "select", s, status=status))
    return out


def run_cli(tmp_path, results, *extra, shrink=True):
    rdir = tmp_path / "res"
    rdir.mkdir(exist_ok=True)
    write_many(rdir, results)
    out = tmp_path / "selection.json"
    args = ["--results-dir", str(rdir), "--out", str(out)]
    if shrink:
        args += ["--lr-keys", ",".join(KEYS), "--seeds", ",".join(map(str, SEEDS))]
    rc = select.main(args + list(extra))
    return rc, out


def test_best_seed_averaged_mean_wins(tmp_path, capsys):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.8], "lr06": [0.75, 0.7]}))
    assert rc == 0
    sel = selection.load_selection(out)
    e = sel["pairs"]["m"]["glue_rte"]
    assert e["lr_key"] == "lr06" and e["lr"] == LR_GRID["lr06"] == 3.59e-05
    assert e["dev_mean_by_lr"] == {"lr03": pytest.approx(0.7), "lr06": pytest.approx(0.725)}
    assert e["seeds_by_lr"] == {"lr03": [42, 43], "lr06": [42, 43]}
    assert e["diverged_by_lr"] == {} and not e["partial"]
    assert sel["policy"]["lr_keys"] == KEYS and sel["policy"]["seeds"] == SEEDS
    assert "lr06" in capsys.readouterr().out


def test_tie_goes_to_the_smaller_lr(tmp_path):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.5, 0.7], "lr06": [0.7, 0.5]}))
    assert rc == 0
    assert selection.load_selection(out)["pairs"]["m"]["glue_rte"]["lr_key"] == "lr03"


def test_a_lower_is_better_metric_selects_the_lowest_dev_mean(tmp_path, monkeypatch):
    from encoder_eval.core import metrics

    spec = metrics.MetricSpec("error_rate", lambda p, y: 0.0, False, "pointwise", "err")
    monkeypatch.setitem(metrics.METRIC_SPECS, "error_rate", spec)
    results = grid({"lr03": [0.2, 0.4], "lr06": [0.1, 0.2]})
    for r in results:
        r["metric"] = "error_rate"
    rc, out = run_cli(tmp_path, results)
    assert rc == 0
    assert selection.load_selection(out)["pairs"]["m"]["glue_rte"]["lr_key"] == "lr06"
    for r in results:  # the same numbers read as higher-is-better pick the other LR
        r["metric"] = "accuracy"
    (tmp_path / "acc").mkdir()
    rc, out = run_cli(tmp_path / "acc", results)
    assert rc == 0 and selection.load_selection(out)["pairs"]["m"]["glue_rte"]["lr_key"] == "lr03"


def test_diverged_seed_makes_its_lr_ineligible(tmp_path):
    # lr06 has the better mean over its finished seed, but one seed diverged.
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.6], "lr06": [0.9, None]}))
    assert rc == 0
    e = selection.load_selection(out)["pairs"]["m"]["glue_rte"]
    assert e["lr_key"] == "lr03"
    assert e["diverged_by_lr"] == {"lr06": [43]}
    assert e["dev_mean_by_lr"]["lr06"] is None
    assert e["seeds_by_lr"]["lr06"] == [42]


def test_diverged_stays_ineligible_with_allow_partial(tmp_path):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.6], "lr06": [0.9, None]}), "--allow-partial")
    assert rc == 0
    assert selection.load_selection(out)["pairs"]["m"]["glue_rte"]["lr_key"] == "lr03"


def test_all_lrs_diverged_means_no_selection_and_exit_1(tmp_path, capsys):
    rc, out = run_cli(tmp_path, grid({"lr03": [None, 0.6], "lr06": [0.9, None]}))
    assert rc == 1
    err = capsys.readouterr().err
    assert "m/glue_rte" in err and "no eligible LR" in err
    e = selection.load_selection(out)["pairs"]["m"]["glue_rte"]  # written, for inspection
    assert e["lr_key"] is None and e["lr"] is None
    assert e["diverged_by_lr"] == {"lr03": [42], "lr06": [43]}
    assert selection.unselected_pairs(selection.load_selection(out))


def test_missing_seed_refuses_and_writes_nothing(tmp_path, capsys):
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.9, 0.9]})
    results = [
        r for r in results if not (r["cell"]["lr_key"] == "lr06" and r["cell"]["seed"] == 43)
    ]
    rc, out = run_cli(tmp_path, results)
    assert rc == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "m/glue_rte/lr06/s43: missing (m_glue_rte_lr06_s43.json)" in err
    assert "--allow-partial" in err


def test_allow_partial_uses_the_seeds_it_has(tmp_path):
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.9, 0.9]})
    results = [
        r for r in results if not (r["cell"]["lr_key"] == "lr06" and r["cell"]["seed"] == 43)
    ]
    rc, out = run_cli(tmp_path, results, "--allow-partial")
    assert rc == 0
    sel = selection.load_selection(out)
    e = sel["pairs"]["m"]["glue_rte"]
    assert e["lr_key"] == "lr06" and e["partial"]
    assert e["seeds_by_lr"]["lr06"] == [42] and e["missing_by_lr"] == {"lr06": [43]}
    assert sel["on_protocol"] is False


def test_default_expects_the_whole_grid_and_select_seeds(tmp_path, capsys):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.6]}), shrink=False)
    assert rc == 1 and not out.exists()
    err = capsys.readouterr().err
    # 10 LRs x 3 seeds expected, 2 present
    assert "28 select cell(s) are missing" in err
    assert "m/glue_rte/lr01/s42" in err and "m/glue_rte/lr03/s44" in err


def test_full_protocol_grid_is_on_protocol(tmp_path):
    scores = {k: [0.5 + i / 100] * 3 for i, k in enumerate(LR_GRID)}
    results = grid(scores, seeds=[42, 43, 44])
    rdir = tmp_path / "res"
    write_many(rdir, results)
    sel = selection.select_pairs(load_results(rdir))
    assert sel["on_protocol"] is True
    assert sel["pairs"]["m"]["glue_rte"]["lr_key"] == "lr10"


def test_recipe_mismatch_within_a_pair_is_refused(tmp_path, capsys):
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.9, 0.9]})
    results[-1] = make_result("m", "glue_rte", "lr06", 43, "select", 0.9,
                              recipe={"weight_decay": 0.0})  # fmt: skip
    rc, out = run_cli(tmp_path, results)
    assert rc == 1 and not out.exists()
    assert "disagree on their setup" in capsys.readouterr().err


def test_pairs_are_independent_and_listed(tmp_path):
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]}, model="a")
    results += grid({"lr03": [0.1, 0.1], "lr06": [0.2, 0.2]}, model="b", task="glue_sst2")
    rc, out = run_cli(tmp_path, results)
    assert rc == 0
    pairs = selection.load_selection(out)["pairs"]
    assert pairs["a"]["glue_rte"]["lr_key"] == "lr03"
    assert pairs["b"]["glue_sst2"]["lr_key"] == "lr06"


def test_models_and_tasks_make_absent_pairs_missing(tmp_path, capsys):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]}),
                      "--models", "m,other", "--tasks", "glue_rte")  # fmt: skip
    assert rc == 1 and not out.exists()
    assert "other/glue_rte/lr03/s42" in capsys.readouterr().err


def test_unparseable_file_is_skipped_with_a_warning(tmp_path, capsys):
    rdir = tmp_path / "res"
    rdir.mkdir()
    (rdir / "broken.json").write_text("{not json")
    rc, _ = run_cli(tmp_path, grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]}))
    assert rc == 0
    assert "broken.json" in capsys.readouterr().err


def test_input_errors_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert select.main(["--results-dir", str(tmp_path / "nope"), "--out", str(out)]) == 2
    (tmp_path / "empty").mkdir()
    assert select.main(["--results-dir", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert select.main(["--results-dir", str(tmp_path / "empty"), "--out", str(out),
                        "--lr-keys", "lr99"]) == 2  # fmt: skip
    assert select.main(["--results-dir", str(tmp_path / "empty"), "--out", str(out),
                        "--tasks", "glue_rtee"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "Did you mean 'glue_rte'" in err
    assert all(line.startswith(("error:", "  ")) for line in err.strip().splitlines())
    assert not out.exists()


def test_load_selection_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(HarnessError, match="not a selection file"):
        selection.load_selection(bad)
    with pytest.raises(HarnessError, match="does not exist"):
        selection.load_selection(tmp_path / "missing.json")
    bad.write_text(json.dumps({"schema": selection.SCHEMA, "version": selection.VERSION,
                               "pairs": {"m": {"t": {"lr_key": "lr06", "lr": 1.0}}}}))  # fmt: skip
    with pytest.raises(HarnessError, match="not a grid entry"):
        selection.load_selection(bad)


def test_undefined_dev_mean_makes_its_lr_ineligible(tmp_path):
    # lr06 has the better mean over its defined seed, but seed 43 predicted a constant.
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.9, 0.9]})
    results[-1] = make_result("m", "glue_rte", "lr06", 43, "select", None)
    rc, out = run_cli(tmp_path, results, "--allow-partial")
    assert rc == 0
    e = selection.load_selection(out)["pairs"]["m"]["glue_rte"]
    assert e["lr_key"] == "lr03"
    assert e["undefined_by_lr"] == {"lr06": [43]} and e["dev_mean_by_lr"]["lr06"] is None
    assert e["missing_by_lr"] == {} and not e["partial"]


def test_every_lr_undefined_means_no_selection_with_the_reason(tmp_path, capsys):
    results = [make_result("m", "glue_rte", k, s, "select", None) for k in KEYS for s in SEEDS]
    rc, _ = run_cli(tmp_path, results)
    assert rc == 1
    assert "lr06 undefined on seeds [42, 43]" in capsys.readouterr().err


def test_each_pair_records_what_its_select_cells_used(tmp_path):
    kw = {"revision": "rev-z", "mode": "liquid-bidir", "trust_remote_code": True,
          "data_identity": "mirror-sha256:abc", "selection_split": "holdout"}  # fmt: skip
    results = [make_result("m", "glue_rte", k, s, "select", 0.5, **kw) for k in KEYS for s in SEEDS]
    rc, out = run_cli(tmp_path, results)
    assert rc == 0
    sel = selection.load_selection(out)
    assert sel["version"] == 3 and sel["experiment"] is None  # results without experiment.toml
    setup = sel["pairs"]["m"]["glue_rte"]["select_setup"]
    assert setup == comparability.cell_setup(results[0])
    assert setup["model_revision"] == "rev-z" and setup["mode"] == "liquid-bidir"
    assert setup["trust_remote_code"] is True and setup["data_identity"] == "mirror-sha256:abc"
    assert setup["selection_split"] == "holdout" and setup["recipe"]["weight_decay"] == 0.1


@pytest.mark.parametrize(
    "odd, named",
    [
        ({"revision": "rev-b"}, "model_revision rev-b"),
        ({"mode": "liquid-bidir"}, "mode liquid-bidir"),
        ({"trust_remote_code": True}, "trust_remote_code True"),
        ({"data_identity": "mirror-sha256:abc"}, "data_identity mirror-sha256:abc"),
        ({"selection_split": "holdout"}, "selection_split holdout"),
        ({"recipe": {"weight_decay": 0.0}}, "recipe weight_decay=0.0"),
    ],
    ids=["revision", "mode", "trust", "data", "selection-split", "recipe"],
)
def test_select_cells_of_a_pair_must_agree_on_their_setup(tmp_path, capsys, odd, named):
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.9, 0.9]})
    results[-1] = make_result("m", "glue_rte", "lr06", 43, "select", 0.9, **odd)
    rc, out = run_cli(tmp_path, results)
    assert rc == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "m/glue_rte" in err and named in err and "m_glue_rte_lr06_s43.json" in err


def test_a_selection_of_the_previous_version_must_be_regenerated(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": selection.SCHEMA, "version": 1, "pairs": {}}))
    with pytest.raises(HarnessError, match=r"version 1.*regenerate it with encoder-eval select"):  # fmt: skip
        selection.load_selection(old)


def test_a_shrunken_sweep_is_named_with_the_flags_that_fit_it(tmp_path, capsys):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]}), shrink=False)
    assert rc == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "this looks like a shrunken sweep that ran lr keys lr03,lr06 and seeds 42,43; " \
           "pass --lr-keys lr03,lr06 --seeds 42,43" in err  # fmt: skip


def test_a_shrunken_sweep_on_other_seeds_is_named_with_the_flags_that_fit_it(tmp_path, capsys):
    """Seeds outside 42-44 used to leave nothing to go on ("finish the sweep")."""
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]}, seeds=[1, 2])
    results += grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]}, model="n", seeds=[1, 2])
    rc, out = run_cli(tmp_path, results, shrink=False)
    assert rc == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "pass --lr-keys lr03,lr06 --seeds 1,2 (a sweep of this harness records them in " \
           "the experiment.toml it writes into the results directory" in err  # fmt: skip
    assert "finish the sweep (re-run its script)" not in err


def test_a_selection_of_version_2_is_still_read(tmp_path):
    rc, out = run_cli(tmp_path, grid({"lr03": [0.6, 0.8], "lr06": [0.75, 0.7]}))
    assert rc == 0
    data = json.loads(out.read_text())
    data["version"] = 2
    del data["experiment"]
    out.write_text(json.dumps(data))
    assert selection.load_selection(out)["pairs"]["m"]["glue_rte"]["lr_key"] == "lr06"


def test_a_partly_run_sweep_is_not_called_shrunken(tmp_path, capsys):
    results = grid({"lr03": [0.6, 0.6], "lr06": [0.5, 0.5]})[:-1]  # lr06/s43 missing
    rc, _ = run_cli(tmp_path, results, shrink=False)
    assert rc == 1
    err = capsys.readouterr().err
    assert "shrunken" not in err and "finish the sweep" in err
