"""Issue 37, items 1 and 2: the statistics at the protocol's size.

Item 1: nothing on the default path raises on legal input at any size (the power search of a
1,547-test family, seed spreads 100x apart, zero variances, undefined scores); what legal
input leaves undefined comes back as `stats.Undefined` with a reason, and the row notes it.
Item 2: the vectorised resampling (`metrics.resample_scorer` and the batched bootstraps and
permutation test of `core/stats.py`) gives the numbers of the loop it replaced
(`tests/stats_reference.py`) to 1e-12 on fixed seeds, on every pointwise metric, with
several languages and undefined resamples.

Random cases draw from numpy's default_rng seeded by SEED (printed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import stats_reference as ref
from result_helpers import make_selection, write_cell_with_predictions
from stats_helpers import seeded_rng
from statsmodels.stats.power import TTestIndPower

from encoder_eval.core import metrics, power_analysis, stats
from encoder_eval.reports import verdicts
from encoder_eval.reports.stats_settings import StatsSettings
from encoder_eval.reports.table_loading import load_table

FULL_FAMILY = 91 * 17  # every pair of 14 models on 17 tasks: summarize's default marks


@pytest.fixture
def rng() -> np.random.Generator:
    return seeded_rng()


# -- item 1: the power search at any level --------------------------------------------


def test_the_issue_case_is_found_by_widening_the_bracket():
    # raised "f(a) and f(b) must have different signs" from brentq before issue 37
    alpha = power_analysis.family_alpha(0.05, FULL_FAMILY)
    mdd = power_analysis.min_detectable_difference(0.01, 0.05, n=5, alpha=alpha, power=0.8,
                                          example_var=1e-6)  # fmt: skip
    assert isinstance(mdd, float) and mdd > 0
    assert power_analysis._combined_power(mdd, 0.01, 0.05, 5, 1e-6, alpha) == pytest.approx(
        0.8, abs=1e-9
    )
    # statsmodels' solver returned an effect with 16 % power here, silently; the power of
    # the answer now is 80 % by statsmodels' own power function
    mdd_t = power_analysis.min_detectable_difference(0.01, 0.05, n=5, alpha=alpha)
    pooled = math.sqrt((0.01**2 + 0.05**2) / 2)
    power = TTestIndPower().power(effect_size=mdd_t / pooled, nobs1=5, alpha=alpha)
    assert power == pytest.approx(0.8, abs=1e-9)


def test_seeds_needed_is_the_fewest_seeds_with_the_power_at_a_tiny_alpha():
    # by statsmodels' power function, scanned one seed count at a time
    alpha = power_analysis.family_alpha(0.05, FULL_FAMILY)
    n = power_analysis.seeds_needed(0.01, 0.01, 0.05, alpha=alpha)
    pooled = math.sqrt((0.01**2 + 0.05**2) / 2)

    def power(k: int) -> float:
        return TTestIndPower().power(effect_size=0.01 / pooled, nobs1=k, alpha=alpha)

    assert power(n) >= 0.8 > power(n - 1)  # statsmodels' solve_power said 388, power 0.38
    assert n == 654


def test_the_full_table_family_through_finish_rows(rng):
    # 91 pairs x 17 tasks in one family (summarize's default marks), seed spreads up to 100x
    # apart, test-set sds from 0 to large, differences from 0: no exception; each row has
    # its MDD and seeds needed or a note saying why not
    rows = []
    for i in range(FULL_FAMILY):
        std_a = float(10 ** rng.uniform(-4, -1))
        std_b = std_a * float(10 ** rng.uniform(-2, 2))
        diff = float(rng.choice([0.0, 1e-4, 0.01, 0.1]))
        sd = float(rng.choice([0.0, 1e-4, 0.01, 0.1]))
        row = verdicts.Row(f"m{i % 14}", f"n{i % 13}", f"t{i % 17}", "accuracy", 5, 5, 0.5 + diff,
                           0.5, diff=diff, p_seed=float(rng.uniform()), std_a=std_a, std_b=std_b,
                           example_sd=sd, p_combined=float(rng.uniform()))  # fmt: skip
        rows.append(row)
    verdicts.finish_rows(rows, 0.05, "holm", family_of=verdicts.family_key("table"))
    for r in rows:
        assert r.family_size == FULL_FAMILY
        assert r.power_alpha == pytest.approx(0.05 / FULL_FAMILY)
        assert (r.mdd_5 is not None and r.mdd_5 > 0) or any("MDD@5" in n for n in r.notes)
        assert (r.seeds_needed is not None and r.seeds_needed >= 2) or any(
            n.startswith("seeds needed:") for n in r.notes
        )
        if r.diff == 0:
            assert r.seeds_needed is None
    print(f"{sum(r.seeds_needed is None for r in rows)} of {len(rows)} rows without seeds needed")


def test_power_search_property(rng):
    # seeded random seed spreads (up to 100x ratios), test-set variances (0 to large),
    # differences and family sizes 1..1547: never an exception; an MDD is positive and has
    # the power asked for, a seeds-needed count is the fewest with that power
    for _ in range(400):
        std_a = float(10 ** rng.uniform(-4, 0))
        std_b = std_a * float(10 ** rng.uniform(-2, 2)) * float(rng.random() > 0.05)
        vex = float(rng.choice([0.0, 10 ** rng.uniform(-10, 0)]))
        diff = float(rng.choice([-1, 1]) * 10 ** rng.uniform(-5, 0))
        alpha = power_analysis.family_alpha(0.05, int(rng.integers(1, FULL_FAMILY + 1)))
        n = int(rng.choice([2, 3, 5, 10]))
        case = dict(std_a=std_a, std_b=std_b, alpha=alpha, example_var=vex)

        def power(k: int, d: float, case=case) -> float:
            sa, sb, v, level = case["std_a"], case["std_b"], case["example_var"], case["alpha"]
            if v > 0:
                return power_analysis._combined_power(d, sa, sb, k, v, level)
            return power_analysis._equal_n_power(abs(d) / math.sqrt((sa**2 + sb**2) / 2), k, level)

        mdd = power_analysis.min_detectable_difference(n=n, **case)
        if isinstance(mdd, stats.Undefined):
            assert std_a == std_b == 0 and vex == 0, (case, mdd)
        else:
            assert mdd > 0 and math.isfinite(mdd), case
            assert power(n, mdd) == pytest.approx(0.8, abs=1e-6), case
        needed = power_analysis.seeds_needed(diff, **case)
        if isinstance(needed, stats.Undefined):
            assert needed.reason, case
            if vex > 0:  # the test set's noise: even the cap of seeds falls short
                assert power(power_analysis.MAX_SEEDS, diff) < 0.8, case
        else:
            assert needed >= 2 and power(needed, diff) >= 0.8, case
            assert needed == 2 or power(needed - 1, diff) < 0.8, case


def test_undefined_scores_give_notes_not_numbers(rng):
    # one model predicts one class on every example: MCC is undefined on every resample;
    # the permutation p-value, the test-set variance and the bootstrap interval are
    # undefined, each noted, and the verdict falls back to the seed level
    n = 60
    labels = rng.integers(0, 2, n).astype(float)
    langs = np.array(["en"] * n)
    constant = np.zeros((3, n))
    other = np.where(rng.random((3, n)) < 0.8, labels, 1 - labels)
    scorer = metrics.resample_scorer("mcc", constant, labels, langs, ("en",))
    assert np.isnan(scorer(np.arange(n)[None, :])).all()
    swapped = metrics.resample_scorer("mcc", np.concatenate([constant, other], axis=1),
                                      np.concatenate([labels, labels]),
                                      np.concatenate([langs, langs]), ("en",))  # fmt: skip
    res = stats.paired_swap_permutation(
        constant, other,
        lambda x, y: verdicts.seed_mean(swapped(x)) - verdicts.seed_mean(swapped(y)),
        n_resamples=99, vectorized=True,
    )  # fmt: skip
    assert math.isnan(res.pvalue)  # scipy's count would have said p = 0.02
    _, low, high = stats.two_level_bootstrap(
        lambda s, cols: verdicts.seed_mean(scorer(cols), s[0]), [3], langs, n_resamples=20,
        vectorized=True,
    )  # fmt: skip
    assert math.isnan(low) and math.isnan(high)


# -- item 2: the vectorised scorer against the loop ----------------------------------------

METRICS = ("accuracy", "f1", "macro_f1", "mcc", "spearman")
LANGS = ("de", "en", "sw", "th")  # de and en Euro, sw and th not


def _predictions(rng, metric: str, n_seeds: int, sizes: dict[str, int], noise: float = 0.3):
    """(matrix, labels, languages): a (seeds, examples) prediction matrix; tiny languages
    and a constant seed make some resamples undefined."""
    n = sum(sizes.values())
    langs = np.concatenate([[lang] * k for lang, k in sizes.items()])
    if metric == "spearman":
        labels = rng.integers(0, 6, n).astype(float)  # ties in the targets
        matrix = np.round(labels + rng.normal(0, 2, (n_seeds, n)), 1)  # and in predictions
    else:
        k = 2 if metric == "f1" else 3
        labels = rng.integers(0, k, n).astype(float)
        matrix = np.where(rng.random((n_seeds, n)) < 1 - noise, labels,
                          rng.integers(0, k, (n_seeds, n))).astype(float)  # fmt: skip
    first = langs == langs[0]
    matrix[-1, first] = matrix[-1, first][0]  # one seed constant on one language
    return matrix, labels, langs


def _loop_scores(metric, matrix, labels, langs, euro, index):
    per_seed = ref.seed_scores(metric, euro)
    return np.vstack([per_seed(matrix, labels, langs, cols) for cols in index])


def _same(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=0, atol=1e-12)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("euro", [("de", "en"), ("fr",)], ids=["euro", "no-euro"])
def test_resample_scorer_equals_the_loop(rng, metric, euro):
    sizes = {"de": 40, "en": 3, "sw": 25, "th": 2}  # en and th tiny: undefined resamples
    matrix, labels, langs = _predictions(rng, metric, 3, sizes)
    members = [np.flatnonzero(langs == g) for g in sizes]
    stratified = np.array([np.concatenate([m[rng.integers(0, m.size, m.size)] for m in members])
                           for _ in range(60)])  # fmt: skip
    anywhere = rng.integers(0, labels.size, (30, 50))  # languages may be missing or reordered
    scorer = metrics.resample_scorer(metric, matrix, labels, langs, euro)
    for index in (stratified, anywhere, np.arange(labels.size)[None, :]):
        want = _loop_scores(metric, matrix, labels, langs, euro, index)
        _same(scorer(index), want)
    undefined = _loop_scores(metric, matrix, labels, langs, euro, stratified)
    if metric in ("mcc", "spearman"):
        assert np.isnan(undefined).any()  # the cases cover undefined resamples


def test_resample_scorer_batches_give_the_same_scores(rng, monkeypatch):
    matrix, labels, langs = _predictions(rng, "macro_f1", 4, {"de": 50, "sw": 30})
    index = rng.integers(0, labels.size, (23, 80))
    whole = metrics.resample_scorer("macro_f1", matrix, labels, langs, ("de",))(index)
    monkeypatch.setattr(metrics, "RESAMPLE_BATCH", 4 * 80 * 3)  # 3 resamples a batch
    _same(metrics.resample_scorer("macro_f1", matrix, labels, langs, ("de",))(index), whole)


def test_resample_scorer_refuses_a_grouped_metric():
    with pytest.raises(ValueError, match="per-query"):
        metrics.resample_scorer("mrr_at_10", np.zeros((1, 3)), np.zeros(3), np.zeros(3), ())


def _new_statistics(ma, mb, labels, langs, metric, euro, direction, n_resamples, seed):
    """What `compare_cells` computes now, from the same building blocks."""
    k = min(len(ma), len(mb))
    swapped = metrics.resample_scorer(metric, np.concatenate([ma[:k], mb[:k]], axis=1),
                                      np.concatenate([labels, labels]),
                                      np.concatenate([langs, langs]), euro)  # fmt: skip
    res = stats.paired_swap_permutation(
        ma[:k], mb[:k],
        lambda x, y: direction * (verdicts.seed_mean(swapped(x)) - verdicts.seed_mean(swapped(y))),
        n_resamples=n_resamples, seed=seed, vectorized=True,
    )  # fmt: skip
    sa = metrics.resample_scorer(metric, ma, labels, langs, euro)
    sb = metrics.resample_scorer(metric, mb, labels, langs, euro)
    reps = np.hstack([stats.example_replicates(s, langs, max(2, n_resamples), seed, vectorized=True)
                      for s in (sa, sb)])  # fmt: skip
    _, low, high = stats.two_level_bootstrap(
        lambda s, cols: verdicts.seed_mean(sa(cols), s[0]) - verdicts.seed_mean(sb(cols), s[1]),
        [len(ma), len(mb)], langs, n_resamples, seed, vectorized=True,
    )  # fmt: skip
    return res.diff, res.pvalue, reps, low, high


@pytest.mark.parametrize("metric", METRICS)
def test_compare_statistics_equal_the_loop_on_a_fixed_seed(rng, metric):
    # two models with 3 and 4 seeds (the permutation pairs the first 3), three languages
    # (A's last seed is constant on sw, not a deciding language: the observed Δ is defined)
    sizes = {"sw": 20, "de": 30, "th": 12}
    ma, labels, langs = _predictions(rng, metric, 3, sizes, noise=0.25)
    mb = np.empty((4, labels.size))
    if metric == "spearman":  # the same targets for both models
        mb = np.round(labels + rng.normal(0, 3, mb.shape), 1)
    else:
        k = 2 if metric == "f1" else 3
        mb = np.where(rng.random(mb.shape) < 0.55, labels, rng.integers(0, k, mb.shape))
    args = (labels, langs, metric, ("de", "th"), 1.0, 99, 7)
    want = ref.example_statistics(ma, mb.astype(float), *args)
    got = _new_statistics(ma, mb.astype(float), *args)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    assert stats.shared_example_part(got[2], 3) == stats.shared_example_part(want[2], 3) or (
        math.isnan(stats.shared_example_part(want[2], 3))
    )


@pytest.mark.parametrize("n", [1, 7, 1001])
def test_swaps_are_generator_permuted_s_draws(n, monkeypatch):
    # scipy draws the swaps with Generator.permuted of [0, 1] per example; `_swaps` reads
    # the same next_uint32 stream, in batches of any size (here 7 resamples)
    monkeypatch.setattr(stats, "RESAMPLE_ROWS", 2 * n * 7)
    want = np.random.default_rng(5).permuted(np.tile(np.arange(2), (300, n, 1)), axis=-1)
    got = np.concatenate(list(stats._swaps(n, 300, 5, exact=False)))
    assert np.array_equal(got, want[:, :, 0])


def test_swap_permutation_equals_scipy_exactly_when_it_enumerates(rng):
    # 8 examples: 2^8 = 256 <= 999 resamples, so both enumerate every swap
    labels = rng.integers(0, 2, 8).astype(float)
    a = np.where(rng.random((3, 8)) < 0.8, labels, 1 - labels)
    b = np.where(rng.random((3, 8)) < 0.5, labels, 1 - labels)
    acc = metrics.resample_scorer("accuracy", np.concatenate([a, b], axis=1),
                                  np.concatenate([labels, labels]), np.zeros(16), ())  # fmt: skip

    def diff(ma, mb):
        return float((ma == labels).mean() - (mb == labels).mean())

    want = ref.paired_swap_permutation(a, b, diff, 999, 3)
    got = stats.paired_swap_permutation(
        a, b, lambda x, y: verdicts.seed_mean(acc(x)) - verdicts.seed_mean(acc(y)),
        n_resamples=999, seed=3, vectorized=True,
    )  # fmt: skip
    assert got.pvalue == pytest.approx(want[1], abs=1e-12)
    assert stats.paired_swap_permutation(a, b, diff, 999, seed=3).pvalue == pytest.approx(
        want[1], abs=1e-12
    )


def test_compare_cells_equals_the_loop_end_to_end(rng, tmp_path):
    # the real path: report cells with predictions files on disk, `compare_table` over three
    # models (three pairs: each model's replicates are drawn once and serve both its pairs)
    # on accuracy (RTE) and F1 (MRPC); every example-level number equals the loop's
    rdir = tmp_path / "report"
    tasks, n = ("glue_rte", "glue_mrpc"), 120
    labels = {t: rng.integers(0, 2, n).tolist() for t in tasks}
    for model, p in (("a", 0.8), ("b", 0.72), ("c", 0.75)):
        for task in tasks:
            for seed in range(45, 50):
                right = rng.random(n) < p + rng.normal(0, 0.02)
                preds = [y if ok else 1 - y for y, ok in zip(labels[task], right, strict=True)]
                write_cell_with_predictions(rdir, model, task, "lr05", seed, preds, labels[task])
    selection = make_selection({(m, t): "lr05" for m in "abc" for t in tasks})
    (rdir / "selection.json").write_text(json.dumps(selection))
    loaded = load_table(rdir, str(rdir / "selection.json"), warn=lambda *_: None)
    table, results = loaded.table, loaded.results
    cmp = verdicts.compare_table(table, results, StatsSettings(n_resamples=99, seed=11))
    cells = verdicts.included_cells(table, results)
    assert len(cmp.rows) == 3 * len(tasks)
    for row in cmp.rows:
        ea, _ = verdicts.load_examples(cells[(row.model_a, row.task)])
        eb, _ = verdicts.load_examples(cells[(row.model_b, row.task)])
        metric = row.metric
        seed = stats.task_seed(11, row.task)  # each task's own stream
        diff, p, reps, low, high = ref.example_statistics(
            ea.matrix, eb.matrix, ea.labels, ea.languages, metric, ("en",), 1.0, 99, seed
        )
        assert row.p_example == pytest.approx(p, abs=1e-12)
        assert row.example_sd**2 == pytest.approx(stats.shared_example_part(reps, 5), abs=1e-12)
        assert (row.boot_low, row.boot_high) == pytest.approx((low, high), abs=1e-12)
        assert row.aso_a_over_b is not None  # compare reads ASO; the marks skip it
    lean = verdicts.compare_cells("a", "b", "glue_rte", table, cells, n_resamples=99, seed=11,
                                  bootstrap=False, example_test=False, aso=False)  # fmt: skip
    assert lean.aso_a_over_b is None and lean.p_example is None and lean.boot_low is None
    full = next(r for r in cmp.rows if r.task == "glue_rte" and r.model_b == "b")
    assert lean.example_sd == pytest.approx(full.example_sd, abs=1e-15)


def test_all_numbers_is_is_number_of_every_entry():
    """The array-speed check answers as the per-entry rule on every kind of entry."""
    from encoder_eval.core.schema import all_ints, all_numbers, is_number

    cases = [[1, 2.5], [True], [1, "2"], [10**400], [2**1000], [float("nan")],
             [float("inf"), 1], [], [None], [1.0] * 3, [0, -3]]  # fmt: skip
    for values in cases:
        assert all_numbers(values) == all(is_number(x) for x in values), values
        assert all_ints(values) == all(
            isinstance(x, int) and not isinstance(x, bool) for x in values
        ), values


@pytest.mark.parametrize("metric", ["accuracy", "f1", "macro_f1", "mcc", "spearman"])
@pytest.mark.parametrize("n_langs", [1, 4])
def test_swap_scorer_equals_the_stacked_index_scorer(metric, n_langs):
    """`metrics.swap_scorer` (the permutation test's counts as one product per language)
    gives exactly the scores of `resample_scorer` on [a | b] with the swapped columns."""
    import numpy as np

    from encoder_eval.core import metrics

    seed = 20261204
    print("seed", seed)
    rng = np.random.default_rng(seed)
    n, k = 300, 3
    if metric == "spearman":
        labels, a, b = (rng.normal(size=s).round(1) for s in (n, (k, n), (k, n)))
    else:
        classes = 2 if metric in ("f1", "mcc") else 3
        labels, a, b = (rng.integers(0, classes, s).astype(float) for s in (n, (k, n), (k, n)))
    langs = np.array([f"l{i % n_langs}" for i in rng.permutation(n)])
    euro = ("l1",)
    stacked = metrics.resample_scorer(metric, np.concatenate([a, b], axis=1),
                                      np.concatenate([labels, labels]),
                                      np.concatenate([langs, langs]), euro)  # fmt: skip
    swap = rng.integers(0, 2, (50, n))
    got_a, got_b = metrics.swap_scorer(metric, a, b, labels, langs, euro)(swap)
    own = np.arange(n)
    assert np.array_equal(got_a, stacked(own + n * swap), equal_nan=True)
    assert np.array_equal(got_b, stacked(own + n * (1 - swap)), equal_nan=True)
    # The permutation test passes booleans; examples sorted by language make each
    # language's columns one slice (no gather): the same scores.
    bool_a, bool_b = metrics.swap_scorer(metric, a, b, labels, langs, euro)(swap.astype(bool))
    assert np.array_equal(bool_a, got_a, equal_nan=True)
    assert np.array_equal(bool_b, got_b, equal_nan=True)
    by_lang = np.argsort(langs, kind="stable")
    a, b, labels, langs = a[:, by_lang], b[:, by_lang], labels[by_lang], langs[by_lang]
    stacked = metrics.resample_scorer(metric, np.concatenate([a, b], axis=1),
                                      np.concatenate([labels, labels]),
                                      np.concatenate([langs, langs]), euro)  # fmt: skip
    got_a, got_b = metrics.swap_scorer(metric, a, b, labels, langs, euro)(swap.astype(bool))
    assert np.array_equal(got_a, stacked(own + n * swap), equal_nan=True)
    assert np.array_equal(got_b, stacked(own + n * (1 - swap)), equal_nan=True)


@pytest.mark.parametrize("n", [8, 200])  # 2^8 <= 999: exact enumeration; 200: drawn swaps
def test_permutation_on_swaps_equals_the_index_form(n):
    """`paired_swap_permutation(on_swaps=True)` hands the statistic the swap matrix instead
    of two index matrices: the same null distribution, so the same p-value, exact or
    drawn."""
    import numpy as np

    from encoder_eval.core import metrics, stats

    seed = 20261204
    print("seed", seed)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    a, b = rng.integers(0, 2, (3, n)), rng.integers(0, 2, (3, n))
    langs = np.array(["en"] * n)
    swap = metrics.swap_scorer("mcc", a, b, labels, langs, ())
    stacked = metrics.resample_scorer("mcc", np.concatenate([a, b], axis=1),
                                      np.concatenate([labels, labels]),
                                      np.concatenate([langs, langs]), ())  # fmt: skip

    def by_index(x, y):
        return np.nanmean(stacked(x), axis=1) - np.nanmean(stacked(y), axis=1)

    def by_swaps(swapped):
        got_a, got_b = swap(swapped)
        return np.nanmean(got_a, axis=1) - np.nanmean(got_b, axis=1)

    want = stats.paired_swap_permutation(a, b, by_index, 999, seed=3, vectorized=True)
    got = stats.paired_swap_permutation(a, b, by_swaps, 999, seed=3, on_swaps=True)
    assert got == want


def test_bootstrap_draws_of_consecutive_strata_equal_the_gathered_draws():
    """`_draw_batches` adds a consecutive stratum's first index to the draw instead of
    gathering it: the same example indices as indexing the stratum's members."""
    import numpy as np

    from encoder_eval.core import stats

    members = [np.arange(0, 7), np.arange(7, 20), np.array([20, 22, 25])]
    got = list(stats._draw_batches(np.random.default_rng(5), members, 30, n_seeds=(3,)))
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(30):
        rng.integers(0, 3, size=3)
        rows.append(np.concatenate([m[rng.integers(0, m.size, size=m.size)] for m in members]))
    assert np.array_equal(np.concatenate([e for _, e in got]), np.array(rows))
