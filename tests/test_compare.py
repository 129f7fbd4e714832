"""`encoder-eval compare` end to end on report directories whose cells carry predictions
files: each statistic against a direct scipy/statsmodels computation, the verdict, the
example-level test's calibration, and the refusals.

Random cases draw from numpy's default_rng seeded by SEED (printed); rates are asserted in
binomial 99.9 % bands, so a correct implementation cannot fail by luck."""

from __future__ import annotations

import json

import numpy as np
import pytest
from result_helpers import make_selection, write_cell_with_predictions
from scipy import stats as sps
from stats_helpers import SEED, band, seeded_rng
from statsmodels.stats.multitest import multipletests

from encoder_eval import compare
from encoder_eval.cells.predictions import predictions_path
from encoder_eval.core import power_analysis, stats
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.reports import verdicts

TASKS = ("glue_rte", "glue_mrpc")  # accuracy and F1
REPORT = range(45, 50)
N_EXAMPLES = 300


@pytest.fixture
def rng() -> np.random.Generator:
    return seeded_rng()


def write_models(directory, rng, skill: dict[str, float], seeds=REPORT, labels=None) -> dict:
    """Report cells of each model on TASKS: each seed is correct on an example with
    probability skill + a small seed shift. Returns the labels per task."""
    labels = labels or {t: rng.integers(0, 2, N_EXAMPLES).tolist() for t in TASKS}
    for model, p in skill.items():
        for task in TASKS:
            for seed in seeds:
                right = rng.random(N_EXAMPLES) < p + rng.normal(0, 0.01)
                preds = [y if ok else 1 - y for y, ok in zip(labels[task], right, strict=True)]
                write_cell_with_predictions(directory, model, task, "lr05", seed, preds,
                                            labels[task])  # fmt: skip
    selection = make_selection({(m, t): "lr05" for m in skill for t in TASKS})
    (directory / "selection.json").write_text(json.dumps(selection))
    return labels


def run(capsys, *args) -> tuple[int, str, str]:
    code = compare.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def rows_by(doc: dict) -> dict[tuple[str, str, str], dict]:
    return {(r["model_a"], r["model_b"], r["task"]): r for r in doc["rows"]}


def test_compare_calls_a_weaker_model_worse_and_a_twin_not_distinguishable(rng, tmp_path, capsys):
    rdir = tmp_path / "report"
    write_models(rdir, rng, {"strong": 0.8, "weak": 0.7, "twin": 0.8})
    code, out, err = run(capsys, "--results-dir", str(rdir), "--selection",
                         str(rdir / "selection.json"), "--format", "json")  # fmt: skip
    assert code == EXIT_OK, err
    assert "3 pair(s) x 2 task(s)" in err and "seed 1234" in err
    rows = rows_by(json.loads(out))
    for task in TASKS:
        assert rows[("strong", "weak", task)]["verdict"] == stats.A_BETTER
        assert rows[("weak", "twin", task)]["verdict"] == stats.B_BETTER
        assert rows[("strong", "twin", task)]["verdict"] == stats.NOT_DISTINGUISHABLE
    md = run(capsys, "--results-dir", str(rdir), "--selection", str(rdir / "selection.json"),
             "--reference", "weak")[1]  # fmt: skip
    assert "### A = weak, B = strong" in md and "### A = weak, B = twin" in md
    assert "### A = strong" not in md and "**B better**" in md and "Holm" in md
    csv_text = run(capsys, "--results-dir", str(rdir), "--selection",
                   str(rdir / "selection.json"), "--format", "csv")[1]  # fmt: skip
    assert csv_text.splitlines()[0].startswith("model_a,model_b,task,metric")
    assert len(csv_text.splitlines()) == 1 + 3 * len(TASKS)


def test_several_pairs_skip_the_permutation_test_and_aso_unless_all_tests(rng, tmp_path, capsys):
    """Over several pairs the diagnostics the verdict does not read are left out (and the
    output says so); --all-tests and a single pair run them, with the same verdicts."""
    rdir = tmp_path / "report"
    write_models(rdir, rng, {"strong": 0.8, "weak": 0.7, "twin": 0.8})
    base = ["--results-dir", str(rdir), "--selection", str(rdir / "selection.json"),
            "--format", "json", "--resamples", "99"]  # fmt: skip
    code, out, err = run(capsys, *base)
    assert code == EXIT_OK, err
    lean = json.loads(out)
    assert "no permutation test or ASO" in err
    assert any("--all-tests" in n for n in lean["footnotes"])
    assert all(r["p_example"] is None and r["aso_a_over_b"] is None for r in lean["rows"])
    assert all(r["boot_low"] is not None for r in lean["rows"])
    full = json.loads(run(capsys, *base, "--all-tests")[1])
    assert all(r["p_example"] is not None and r["aso_a_over_b"] is not None for r in full["rows"])
    assert not any("--all-tests" in n for n in full["footnotes"])
    for key, row in rows_by(full).items():
        assert rows_by(lean)[key]["verdict"] == row["verdict"]
        assert rows_by(lean)[key]["boot_low"] == row["boot_low"]
    one = json.loads(run(capsys, *base, "--models", "strong,weak")[1])
    assert all(r["p_example"] is not None for r in one["rows"])


def test_every_statistic_matches_a_direct_computation(rng, tmp_path, capsys):
    rdir = tmp_path / "report"
    write_models(rdir, rng, {"a": 0.78, "b": 0.74})
    doc = json.loads(run(capsys, "--results-dir", str(rdir), "--selection",
                         str(rdir / "selection.json"), "--format", "json",
                         "--correction", "fdr_bh")[1])  # fmt: skip
    assert doc["correction"] == "fdr_bh"
    rows = rows_by(doc)
    for task in TASKS:
        r = rows[("a", "b", task)]
        per_seed = {}
        for model in ("a", "b"):
            per_seed[model] = [
                json.loads((rdir / f"{model}_{task}_lr05_s{s}.json").read_text())["report"]["mean"]
                for s in REPORT
            ]  # fmt: skip
        direct = sps.ttest_ind(per_seed["a"], per_seed["b"], equal_var=False)
        assert r["p_seed"] == pytest.approx(direct.pvalue, rel=1e-12)
        assert r["diff"] == pytest.approx(np.mean(per_seed["a"]) - np.mean(per_seed["b"]))
        assert r["mean_a"] == pytest.approx(np.mean(per_seed["a"]))
        std_a, std_b = np.std(per_seed["a"], ddof=1), np.std(per_seed["b"], ddof=1)
        vex = r["example_sd"] ** 2
        if task == "glue_rte":  # accuracy: what the seeds share of a mean's bootstrap variance
            correct = {}
            for model in ("a", "b"):
                rows_ = []
                for s in REPORT:
                    pr = json.loads(predictions_path(rdir / f"{model}_{task}_lr05_s{s}.json")
                                    .read_text())["languages"]["en"]  # fmt: skip
                    rows_.append(np.equal(pr["predictions"], pr["labels"]))
                correct[model] = np.asarray(rows_, dtype=float)
            n = N_EXAMPLES
            cov = np.cov(np.vstack([correct["a"], correct["b"]]), ddof=0) / n
            ca, cb, cab = cov[:5, :5], cov[5:, 5:], cov[:5, 5:]
            shared = ((ca.sum() - np.trace(ca)) / 20 + (cb.sum() - np.trace(cb)) / 20
                      - 2 * cab.mean())  # fmt: skip
            d = correct["a"].mean(axis=0) - correct["b"].mean(axis=0)
            whole = np.var(d) / n  # the old V_ex: per-example seed noise counted again
            assert vex == pytest.approx(max(0.0, shared), abs=0.15 * whole)
            assert vex < 0.5 * whole  # these seeds share nothing but the labels' draw
        assert r["family_size"] == len(TASKS) and r["power_alpha"] == 0.05 / len(TASKS)
        ua, ub = std_a**2 / 5, std_b**2 / 5
        df = (ua + ub + vex) ** 2 / (ua**2 / 4 + ub**2 / 4)
        t = r["diff"] / np.sqrt(ua + ub + vex)
        assert r["p_combined"] == pytest.approx(2 * sps.t.sf(abs(t), df), rel=1e-9)
        needed = power_analysis.seeds_needed(r["diff"], std_a, std_b, alpha=0.05 / len(TASKS),
                                    example_var=vex)  # fmt: skip
        if isinstance(needed, stats.Undefined):  # the test set's noise alone hides the difference
            needed = None
            assert any("more test examples" in n for n in r["notes"])
        assert r["seeds_needed"] == needed
        assert r["mdd_5"] == pytest.approx(
            power_analysis.min_detectable_difference(std_a, std_b, n=5, alpha=0.05 / len(TASKS),
                                            example_var=vex)
        )  # fmt: skip
        aso = stats.aso(per_seed["a"], per_seed["b"], seed=stats.task_seed(1234, task))
        assert r["aso_a_over_b"] == aso.eps_min
    for raw, adj in (("p_seed", "p_seed_adj"), ("p_example", "p_example_adj"),
                     ("p_combined", "p_combined_adj")):  # fmt: skip
        p = [rows[("a", "b", t)][raw] for t in TASKS]
        want = multipletests(p, method="fdr_bh")[1]
        assert [rows[("a", "b", t)][adj] for t in TASKS] == pytest.approx(list(want))


def test_swap_permutation_equals_scipys_exact_paired_test_on_accuracy():
    # 8 examples: 2^8 = 256 <= n_resamples, so both tests enumerate every swap exactly.
    rng = np.random.default_rng(SEED)
    labels = rng.integers(0, 2, 8)
    a = np.where(rng.random((3, 8)) < 0.8, labels, 1 - labels)
    b = np.where(rng.random((3, 8)) < 0.5, labels, 1 - labels)

    def acc_diff(ma, mb):
        return float((ma == labels).mean() - (mb == labels).mean())

    mine = stats.paired_swap_permutation(a, b, acc_diff, n_resamples=999)
    direct = stats.paired_permutation((a == labels).mean(0), (b == labels).mean(0))
    assert mine.pvalue == pytest.approx(direct.pvalue)
    assert mine.diff == pytest.approx(direct.diff)


def test_swap_permutation_rejects_at_nominal_rate_under_the_null(rng):
    n_sim, n_examples = 1000, 40
    rejections = 0
    for i in range(n_sim):
        labels = rng.integers(0, 2, n_examples)
        ease = rng.random(n_examples)  # shared by both models: the pairing
        a = np.where(rng.random((2, n_examples)) < ease, labels, 1 - labels)
        b = np.where(rng.random((2, n_examples)) < ease, labels, 1 - labels)

        def diff(ma, mb, labels=labels):
            return float((ma == labels).mean() - (mb == labels).mean())

        rejections += stats.paired_swap_permutation(a, b, diff, 199, seed=i).pvalue <= 0.05
    low, high = band(n_sim, 0.05)
    assert low <= rejections / n_sim <= high, rejections / n_sim


def test_two_level_bootstrap_with_one_seed_is_scipys_percentile_bootstrap(rng):
    x = (rng.random(200) < 0.7).astype(float)
    point, low, high = stats.two_level_bootstrap(
        lambda seeds, cols: float(x[cols].mean()), [1], np.zeros(200), n_resamples=4000, seed=1
    )
    direct = sps.bootstrap((x,), np.mean, n_resamples=4000, method="percentile",
                           random_state=np.random.default_rng(2)).confidence_interval  # fmt: skip
    assert point == pytest.approx(x.mean())
    # Two Monte Carlo estimates of the same percentiles: equal within simulation error.
    assert low == pytest.approx(direct.low, abs=0.01)
    assert high == pytest.approx(direct.high, abs=0.01)


def test_the_bootstrap_interval_widens_with_seed_variance(rng):
    # Same examples, same mean; one model's seeds spread widely: its interval is wider.
    n = 400
    base = rng.random(n)

    def interval(spread):
        m = np.array([base + s for s in np.linspace(-spread, spread, 5)])
        return stats.two_level_bootstrap(
            lambda seeds, cols: float(m[seeds[0]][:, cols].mean()), [5], np.zeros(n), seed=3
        )

    _, lo_narrow, hi_narrow = interval(0.0)
    _, lo_wide, hi_wide = interval(0.2)
    assert hi_wide - lo_wide > 2 * (hi_narrow - lo_narrow)


def test_missing_or_stale_predictions_leave_a_seed_level_verdict_with_a_note(rng, tmp_path, capsys):
    rdir = tmp_path / "report"
    write_models(rdir, rng, {"a": 0.8, "b": 0.7})
    predictions_path(rdir / "a_glue_rte_lr05_s45.json").unlink()
    stale = predictions_path(rdir / "b_glue_mrpc_lr05_s46.json")
    obj = json.loads(stale.read_text())
    obj["languages"]["en"]["predictions"] = [1 - p for p in obj["languages"]["en"]["predictions"]]
    stale.write_text(json.dumps(obj))
    doc = json.loads(run(capsys, "--results-dir", str(rdir), "--selection",
                         str(rdir / "selection.json"), "--format", "json")[1])  # fmt: skip
    rows = rows_by(doc)
    rte, mrpc = rows[("a", "b", "glue_rte")], rows[("a", "b", "glue_mrpc")]
    assert rte["p_example"] is None and "no predictions file" in " ".join(rte["notes"])
    assert "out of step with its result" in " ".join(mrpc["notes"])
    # The notes name each file within the results folder, never the full (temporary) path,
    # in every format that prints them.
    assert "a_glue_rte_lr05_s45.predictions.json: no predictions file" in " ".join(rte["notes"])
    assert "b_glue_mrpc_lr05_s46.predictions.json: out of step" in " ".join(mrpc["notes"])
    for fmt in ("markdown", "json", "csv", "latex"):
        code, out, _ = run(capsys, "--results-dir", str(rdir), "--selection",
                           str(rdir / "selection.json"), "--format", fmt,
                           "--resamples", "20")  # fmt: skip
        assert code == 0 and "predictions.json" in out and str(tmp_path) not in out, fmt
    assert "verdict on the seed level only" in " ".join(rte["notes"])
    assert rte["verdict"] == stats.A_BETTER  # the seed level alone still decides, marked so


def test_models_from_two_report_directories(rng, tmp_path, capsys):
    first, second = tmp_path / "r1", tmp_path / "r2"
    labels = write_models(first, rng, {"base": 0.75})
    write_models(second, rng, {"new": 0.75}, seeds=range(50, 55), labels=labels)
    code, out, err = run(capsys, "--results-dir", str(first), "--results-dir", str(second),
                         "--format", "json")  # fmt: skip
    assert code == EXIT_INPUT_ERROR and "experiment file" in err  # no experiment file: say so
    # With experiment files absent, --selection is given once for all or once per folder.
    code, _, err = run(capsys, "--results-dir", str(first), "--results-dir", str(second),
                       *["--selection", str(first / "selection.json")] * 3)  # fmt: skip
    assert code == EXIT_INPUT_ERROR and "--selection is given 3 times" in err
    # Each directory's experiment file names its selection: one table over both.
    for d, seeds in ((first, REPORT), (second, range(50, 55))):
        (d / "experiment.toml").write_text(
            f'version = 1\nphase = "report"\n[seeds]\nreport = {list(seeds)}\n'
            f'[phases.report]\nresults_dir = "{d}"\nselection = "{d / "selection.json"}"\n'
        )
    code, out, err = run(capsys, "--results-dir", str(first), "--results-dir", str(second),
                         "--format", "json", "--allow-partial")  # fmt: skip
    assert code == EXIT_OK, err
    row = rows_by(json.loads(out))[("base", "new", "glue_rte")]
    assert (row["n_a"], row["n_b"]) == (5, 5) and row["p_example"] is not None
    code, _, err = run(capsys, "--results-dir", str(first), "--results-dir", str(first))
    assert code == EXIT_INPUT_ERROR and "name each folder once" in err


def test_refusals(rng, tmp_path, capsys):
    rdir = tmp_path / "report"
    write_models(rdir, rng, {"a": 0.8, "b": 0.7})
    sel = str(rdir / "selection.json")
    (rdir / "a_glue_rte_lr05_s49.json").unlink()  # a missing report seed
    code, _, err = run(capsys, "--results-dir", str(rdir), "--selection", sel)
    assert code == EXIT_INCOMPLETE and "compare refuses this table" in err
    assert "missing_seeds" in err
    code, out, _ = run(capsys, "--results-dir", str(rdir), "--selection", sel,
                       "--allow-partial")  # fmt: skip
    assert code == EXIT_OK and "Not a protocol table" in out and "(n=4)" in out
    for seed in (46, 47, 48, 49):  # b keeps one seed of MRPC: no test can run there
        (rdir / f"b_glue_mrpc_lr05_s{seed}.json").unlink()
    code, out, _ = run(capsys, "--results-dir", str(rdir), "--selection", sel,
                       "--allow-partial", "--format", "json")  # fmt: skip
    row = rows_by(json.loads(out))[("a", "b", "glue_mrpc")]
    assert row["verdict"] == verdicts.NOT_TESTED and "too few finished seeds" in row["notes"][0]
    code, _, err = run(capsys, "--results-dir", str(rdir), "--selection", sel,
                       "--allow-partial", "--reference", "zzz")  # fmt: skip
    assert code == EXIT_INPUT_ERROR and "--reference 'zzz' is not one of" in err
    code, _, err = run(capsys, "--results-dir", str(rdir), "--selection", sel,
                       "--allow-partial", "--models", "a")  # fmt: skip
    assert code == EXIT_INPUT_ERROR and "at least two models" in err
    code, _, err = run(capsys, "--results-dir", str(tmp_path / "nope"))
    assert code == EXIT_INPUT_ERROR and "is not a directory" in err


def test_summarize_marks_the_best_model_and_those_not_distinguishable_from_it(
    rng, tmp_path, capsys
):
    from encoder_eval import summarize

    rdir = tmp_path / "report"
    write_models(rdir, rng, {"strong": 0.8, "weak": 0.7, "twin": 0.8})
    args = ["--results-dir", str(rdir), "--selection", str(rdir / "selection.json")]
    assert summarize.main([*args, "--format", "json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    marks = {r["model"]: {t: c["mark"] for t, c in r["cells"].items()} for r in doc["rows"]}
    for task in TASKS:
        assert {marks["strong"][task], marks["twin"][task]} == {"best", "tied"}
        assert marks["weak"][task] is None
    assert summarize.main(args) == EXIT_OK
    md = capsys.readouterr().out
    weak_row = next(line for line in md.splitlines() if line.startswith("| weak |"))
    assert "**" not in weak_row and "≈" not in weak_row
    assert "Bold: the task's best model" in md
    assert "Every pair of models on every task is tested" in md  # the default family
    assert summarize.main([*args, "--marks-family", "task"]) == EXIT_OK
    assert "best only, --marks-family task" in capsys.readouterr().out
    assert summarize.main([*args, "--no-marks"]) == EXIT_OK
    assert "**" not in capsys.readouterr().out


def test_summarize_bootstrap_intervals_need_predictions(rng, tmp_path, capsys):
    from encoder_eval import summarize

    rdir = tmp_path / "report"
    write_models(rdir, rng, {"a": 0.8, "b": 0.7})
    args = ["--results-dir", str(rdir), "--selection", str(rdir / "selection.json"),
            "--format", "json", "--no-marks"]  # fmt: skip
    assert summarize.main([*args, "--ci", "bootstrap"]) == EXIT_OK
    boot = json.loads(capsys.readouterr().out)
    assert summarize.main(args) == EXIT_OK
    t = json.loads(capsys.readouterr().out)
    assert boot["ci_method"] == "bootstrap" and t["ci_method"] == "t"
    for rb, rt in zip(boot["rows"], t["rows"], strict=True):
        for task in TASKS:
            cb, ct = rb["cells"][task], rt["cells"][task]
            assert cb["ci"]["low"] < cb["mean"] < cb["ci"]["high"]
            # The t interval over seeds matches scipy directly.
            scores = list(ct["scores"].values())
            low, high = sps.t.interval(0.95, len(scores) - 1, loc=np.mean(scores),
                                       scale=sps.sem(scores))  # fmt: skip
            assert (ct["ci"]["low"], ct["ci"]["high"]) == pytest.approx((low, high))
    predictions_path(rdir / "a_glue_rte_lr05_s47.json").unlink()
    assert summarize.main([*args, "--ci", "bootstrap"]) == EXIT_INPUT_ERROR
    assert "a/glue_rte: " in capsys.readouterr().err


def test_task_seed_is_stable_and_differs_per_task_and_seed():
    # a fixed value: the derivation must not change between processes or Python versions
    assert stats.task_seed(1234, "glue_rte") == stats.task_seed(1234, "glue_rte")
    assert stats.task_seed(1234, "glue_rte") == 14029296523216661363
    seeds = {stats.task_seed(s, t) for s in (0, 1234) for t in ("glue_rte", "glue_sst2")}
    assert len(seeds) == 4


def test_each_task_draws_its_own_resamples(rng, tmp_path, capsys):
    """Two tasks with one metric and identical predictions: with one stream for the whole
    table their bootstrap intervals and p-values were equal (shared Monte-Carlo error);
    each task's stream is its own, so they differ, by Monte-Carlo error only."""
    from encoder_eval import summarize

    rdir = tmp_path / "report"
    tasks = ("glue_rte", "glue_sst2")  # both accuracy
    labels = rng.integers(0, 2, N_EXAMPLES).tolist()
    for model, p in (("a", 0.8), ("b", 0.75)):
        for seed in REPORT:
            right = rng.random(N_EXAMPLES) < p + rng.normal(0, 0.01)
            preds = [y if ok else 1 - y for y, ok in zip(labels, right, strict=True)]
            for task in tasks:
                write_cell_with_predictions(rdir, model, task, "lr05", seed, preds, labels)
    selection = make_selection({(m, t): "lr05" for m in "ab" for t in tasks})
    (rdir / "selection.json").write_text(json.dumps(selection))
    base = ["--results-dir", str(rdir), "--selection", str(rdir / "selection.json"),
            "--format", "json", "--resamples", "199"]  # fmt: skip
    code, out, err = run(capsys, *base, "--all-tests")
    assert code == EXIT_OK, err
    rows = rows_by(json.loads(out))
    one, two = rows[("a", "b", "glue_rte")], rows[("a", "b", "glue_sst2")]
    assert one["diff"] == two["diff"] and one["p_seed"] == two["p_seed"]  # same data
    assert (one["boot_low"], one["boot_high"]) != (two["boot_low"], two["boot_high"])
    assert one["example_sd"] != two["example_sd"]
    assert one["boot_low"] == pytest.approx(two["boot_low"], abs=0.02)  # Monte-Carlo error only
    assert summarize.main([*base[:-2], "--no-marks", "--ci", "bootstrap"]) == EXIT_OK
    cells = json.loads(capsys.readouterr().out)["rows"][0]["cells"]
    assert cells["glue_rte"]["mean"] == cells["glue_sst2"]["mean"]
    assert cells["glue_rte"]["ci"] != cells["glue_sst2"]["ci"]


# -- sizing and family-wise control ---------------------------------------------------


def _row(task: str, diff: float, p_seed: float | None, p_combined: float | None = None, *,
         a: str = "a", b: str = "b", std: float | None = None) -> verdicts.Row:  # fmt: skip
    return verdicts.Row(a, b, task, "accuracy", 5, 5, 0.5 + diff, 0.5, diff=diff, p_seed=p_seed,
                       p_combined=p_combined, std_a=std, std_b=std)  # fmt: skip


def test_a_seeds_needed_note_shows_scores_x100_as_the_table_does():
    # Δ 0.01562 hidden by a test-set sd of 0.072: the note reads 1.562 and 7.2, on the
    # table's scale, not the fractions the statistics compute on
    row = _row("glue_rte", 0.01562, 0.3, 0.5, std=0.01)
    row.example_sd = 0.072
    verdicts._power(row, 0.05)
    (note,) = [n for n in row.notes if n.startswith("seeds needed:")]
    assert "detects 1.562: the test set's own noise (sd 7.2) hides it" in note, note
    assert "0.01562" not in note and "0.072" not in note


@pytest.mark.parametrize(("alpha", "n_tasks", "expected"), [(0.01, 1, 26), (0.05, 17, 32),
                                                             (0.01, 17, None)])  # fmt: skip
def test_seeds_needed_gives_80_percent_power_at_the_applied_alpha_and_correction(
    rng, alpha, n_tasks, expected
):
    # The case: Δ 0.01, seed stds 0.01. The verdict is Holm over the pair's tasks at
    # --alpha, so seeds needed is sized at alpha / tasks (Holm's first step): 26 at alpha 0.01
    # for one task, 32 for 17 tasks at 0.05; the old sizing (0.05, uncorrected) asked for 17
    # seeds whatever the alpha and tasks, whose real power at 17 tasks is about 40 %.
    diff, std = 0.01, 0.01
    rows = [_row(f"t{i}", diff, 0.5, std=std) for i in range(n_tasks)]
    verdicts.finish_rows(rows, alpha, "holm")
    n = rows[0].seeds_needed
    assert rows[0].family_size == n_tasks and rows[0].power_alpha == pytest.approx(alpha / n_tasks)
    if expected is not None:
        assert n == expected
    # the real verdict at n seeds: task 0 differs by Δ, the others not; Welch per task,
    # Holm across the tasks at alpha, "A better" counted
    n_sim = 2000
    a = rng.normal(0.0, std, size=(n_sim, n_tasks, n))
    a[:, 0] += diff
    b = rng.normal(0.0, std, size=(n_sim, n_tasks, n))
    p = sps.ttest_ind(a, b, axis=2, equal_var=False).pvalue
    wins = sum(stats.correct(p[i], "holm", alpha).reject[0] and a[i, 0].mean() > b[i, 0].mean()
               for i in range(n_sim))  # fmt: skip
    print(f"n={n} seeds, alpha {alpha}, {n_tasks} task(s): simulated power {wins / n_sim:.3f}")
    assert abs(wins / n_sim - 0.8) <= 0.05
    mdd = rows[0].mdd_5
    assert mdd == pytest.approx(
        power_analysis.min_detectable_difference(std, std, n=5, alpha=alpha / n_tasks)
    )  # fmt: skip


def test_verdicts_with_and_without_predictions_are_corrected_in_one_family():
    rows = [_row("glue_rte", 0.02, 0.03, 0.01), _row("glue_mrpc", 0.02, 0.02)]
    verdicts.finish_rows(rows, 0.05, "holm", power=False)
    want = multipletests([0.01, 0.02], method="holm")[1]
    assert [r.p_verdict_adj for r in rows] == pytest.approx(list(want))
    assert [r.verdict_test for r in rows] == ["combined", "welch"]
    assert rows[0].p_combined_adj == pytest.approx(want[0])
    assert all(r.family_size == 2 and r.verdict == stats.A_BETTER for r in rows)
    # the seed-level diagnostic is corrected on its own
    assert rows[1].p_seed_adj == pytest.approx(multipletests([0.03, 0.02], method="holm")[1][1])


def _identical_tables(rng, n_sim: int, k: int, n_tasks: int):
    """Seed scores (tables, models, tasks, 5 seeds) of k identical models, and every pair's
    Welch p-value per table and task."""
    scores = rng.normal(0.7, 0.01, size=(n_sim, k, n_tasks, 5))
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    p = {(i, j): sps.ttest_ind(scores[:, i], scores[:, j], axis=2, equal_var=False).pvalue
         for i, j in pairs}  # fmt: skip
    return scores, p


@pytest.mark.parametrize("k", [3, 5])
def test_family_table_bounds_any_false_better_in_a_table_of_identical_models(rng, k):
    # k identical models, 3 tasks, every pair compared (k = 5: 10 pairs x 3 tasks): with the
    # correction per pair the share of tables with at least one false "better" grows with
    # the pairs (about 1 - 0.95^10 at k = 5); with --family table (compare's default) it is
    # at most alpha.
    n_sim, n_tasks = 1000, 3
    scores, p = _identical_tables(rng, n_sim, k, n_tasks)
    means = scores.mean(axis=3)
    rate = {}
    for family in verdicts.FAMILIES:
        key = verdicts.family_key(family)
        false = 0
        for s in range(n_sim):
            rows = [_row(f"t{t}", means[s, i, t] - means[s, j, t], p[(i, j)][s, t],
                         a=f"m{i}", b=f"m{j}") for (i, j) in p for t in range(n_tasks)]  # fmt: skip
            verdicts.finish_rows(rows, 0.05, "holm", family_of=key, power=False)
            false += any(r.verdict != stats.NOT_DISTINGUISHABLE for r in rows)
        rate[family] = false / n_sim
    print(f"tables with a false 'better' (k={k}, {n_tasks} tasks, n={n_sim}): {rate}")
    assert rate["table"] <= band(n_sim, 0.05)[1]
    assert rate["pair"] > band(n_sim, 0.05)[1]  # what the per-pair correction leaves


def test_marks_family_table_bounds_false_marks_although_the_best_is_picked_by_its_mean(rng):
    # summarize's marks: the best model by mean, ≈ for those not distinguishable from it.
    # Among identical models the seed's rule (Holm over the best's k - 1 comparisons of a
    # task) takes some model's ≈ away far more often than alpha over a table; the default
    # family (every pair on every task, one Holm family) keeps it at most alpha.
    n_sim, k, n_tasks = 1000, 5, 3
    scores, p = _identical_tables(rng, n_sim, k, n_tasks)
    means = scores.mean(axis=3)
    rate = {}
    for family in verdicts.MARK_FAMILIES:
        key = verdicts.mark_family_key(family)
        lost = 0
        for s in range(n_sim):
            rows, shown = [], []
            for t in range(n_tasks):
                ordered = sorted(range(k), key=lambda m: -means[s, m, t])
                for x, y in verdicts.mark_pairs(ordered, family):
                    pv = p[(min(x, y), max(x, y))][s, t]
                    rows.append(_row(f"t{t}", means[s, x, t] - means[s, y, t], pv,
                                     a=f"m{x}", b=f"m{y}"))  # fmt: skip
                    if x == ordered[0]:
                        shown.append(rows[-1])
            verdicts.finish_rows(rows, 0.05, "holm", family_of=key, power=False)
            lost += any(r.verdict != stats.NOT_DISTINGUISHABLE for r in shown)
        rate[family] = lost / n_sim
    print(f"tables where an identical model loses its ≈ (k={k}, {n_tasks} tasks): {rate}")
    assert rate["table"] <= band(n_sim, 0.05)[1]
    assert rate["task"] > band(n_sim, 0.05)[1]
