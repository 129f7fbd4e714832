"""The fast paths of a two-model `compare` (issue 37, item 4: within 30 CPU s at 14 x 17)
against the plain computation they replace, on fixed seeds (printed):

- `stats._draw_batches` makes one `rng.integers` call per run of one bound: the same draws
  as one call per resample, model and stratum, and the same generator state after;
- `metrics.language_blocks`: languages already in blocks are read in place, not gathered:
  the same scores as the same examples interleaved;
- `metrics._spearman_swap` (the permutation test's swapped Spearman from one sort per
  seed) and `metrics._spearman_batch` (the bootstrap's ranks in each seed's sorted order)
  against the scalar loop of `tests/stats_reference.py`, with no ties, some, and many;
- `stats.paired_swap_permutation(on_swaps=True)` against its index-matrix form.
"""

from __future__ import annotations

import numpy as np
import pytest
import stats_reference as ref
from stats_helpers import seeded_rng

from encoder_eval.core import metrics, stats

CLASSIFICATION = ("accuracy", "f1", "macro_f1", "mcc")
POINTWISE = (*CLASSIFICATION, "spearman")


@pytest.fixture
def rng() -> np.random.Generator:
    return seeded_rng()


def _same(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=0, atol=1e-12)


def _plain_draws(seed: int, members: list, n_resamples: int, n_seeds: tuple) -> tuple:
    """The draws as they were made before: every model's seeds, then every stratum, one
    call each, one resample after another; and the generator after them."""
    g = np.random.default_rng(seed)
    seeds = [np.empty((n_resamples, k), dtype=np.int64) for k in n_seeds]
    rows = []
    for r in range(n_resamples):
        for drawn, k in zip(seeds, n_seeds, strict=True):
            drawn[r] = g.integers(0, k, size=k)
        rows.append(np.concatenate([m[g.integers(0, m.size, size=m.size)] for m in members]))
    return seeds, np.vstack(rows), g


LAYOUTS = {
    # equal strata in blocks (XNLI, MASSIVE): one call per batch, or two per resample
    "equal-blocks": ([40] * 5, "blocks", (5, 5)),
    "equal-blocks-no-seeds": ([40] * 5, "blocks", ()),
    # unequal strata interleaved, a stratum of one example, unequal seed counts
    "unequal-interleaved": ([30, 1, 17, 30], "interleaved", (3, 4)),
    "one-stratum": ([57], "blocks", (2,)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch_rows", [None, 7])
def test_draw_batches_are_the_plain_calls(rng, monkeypatch, layout, batch_rows):
    sizes, arrangement, n_seeds = LAYOUTS[layout]
    strata = np.repeat([f"l{i}" for i in range(len(sizes))], sizes)
    if arrangement == "interleaved":
        strata = strata[rng.permutation(strata.size)]
    members = [np.flatnonzero(strata == g) for g in dict.fromkeys(strata.tolist())]
    if batch_rows:  # batches cut between resamples: runs of one bound end at a batch's end
        monkeypatch.setattr(stats, "RESAMPLE_ROWS", batch_rows * strata.size)
    seed = int(rng.integers(0, 2**31))
    print("draw seed", seed)
    g = np.random.default_rng(seed)
    batches = list(stats._draw_batches(g, members, 50, n_seeds))
    want_seeds, want_examples, want_g = _plain_draws(seed, members, 50, n_seeds)
    assert np.array_equal(np.vstack([ex for _, ex in batches]), want_examples)
    for k in range(len(n_seeds)):
        assert np.array_equal(np.vstack([s[k] for s, _ in batches]), want_seeds[k])
    assert g.integers(0, 2**40, 8).tolist() == want_g.integers(0, 2**40, 8).tolist()


def test_merged_calls_of_one_bound_read_the_same_stream():
    # what `_draw_batches` rests on, at bounds where Lemire's rejection is frequent too
    for bound in (2, 5, 2974, 40430, 2**31 + 1, 3 * 2**30):
        for size in (1, 3, 1001):
            one, two = np.random.default_rng(bound), np.random.default_rng(bound)
            apart = np.concatenate([one.integers(0, bound, size) for _ in range(3)])
            assert np.array_equal(apart, two.integers(0, bound, 3 * size)), (bound, size)
            assert one.integers(0, 7, 5).tolist() == two.integers(0, 7, 5).tolist()


def _predictions(rng, metric: str, n_seeds: int, n: int, ties: str = "some"):
    """(labels, a, b): two models' (seeds, n) predictions. Spearman's `ties`: none
    (continuous values), some (one decimal) or many (a handful of values)."""
    if metric == "spearman":
        labels = rng.integers(0, 6, n).astype(float)
        a, b = (labels + rng.normal(0, 2, (n_seeds, n)) for _ in range(2))
        if ties == "some":
            a, b = a.round(1), b.round(1)
        elif ties == "many":
            a, b = a.round(0) % 4, b.round(0) % 4
        return labels, a, b
    k = 2 if metric in ("f1", "mcc") else 3
    labels = rng.integers(0, k, n).astype(float)
    a, b = (
        np.where(rng.random((n_seeds, n)) < 0.6, labels, rng.integers(0, k, (n_seeds, n)))
        for _ in range(2)
    )
    return labels, a.astype(float), b.astype(float)


@pytest.mark.parametrize("metric", POINTWISE)
def test_languages_in_blocks_score_as_interleaved(rng, metric):
    # the same examples twice: languages as blocks (not in code order) and interleaved
    sizes = {"th": 30, "de": 45, "sw": 3, "en": 25}
    labels, a, b = _predictions(rng, metric, 3, sum(sizes.values()))
    langs = np.repeat(list(sizes), list(sizes.values()))
    mix = rng.permutation(labels.size)  # interleaved example i is block example mix[i]
    _, codes = np.unique(langs, return_inverse=True)
    assert metrics.language_blocks(codes, 4)[0] is None
    assert metrics.language_blocks(codes[mix], 4)[0] is not None
    euro = ("de", "en")
    blocks = metrics.resample_scorer(metric, a, labels, langs, euro)
    mixed = metrics.resample_scorer(metric, a[:, mix], labels[mix], langs[mix], euro)
    where = np.empty_like(mix)
    where[mix] = np.arange(mix.size)  # block example j sits at where[j] when interleaved
    index = rng.integers(0, labels.size, (40, labels.size))
    assert np.array_equal(blocks(index), mixed(where[index]), equal_nan=True)
    swap = rng.integers(0, 2, (40, labels.size)).astype(bool)
    got = metrics.swap_scorer(metric, a, b, labels, langs, euro)(swap)
    want = metrics.swap_scorer(metric, a[:, mix], b[:, mix], labels[mix], langs[mix], euro)(
        swap[:, mix]
    )
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w, equal_nan=True)


@pytest.mark.parametrize("ties", ["none", "some", "many"])
@pytest.mark.parametrize("arrangement", ["blocks", "interleaved"])
def test_spearman_swap_equals_the_loop(rng, ties, arrangement):
    sizes = {"de": 60, "sw": 41, "en": 2}  # en: two examples, often a constant seed there
    labels, a, b = _predictions(rng, "spearman", 3, sum(sizes.values()), ties)
    a[1, :60] = b[1, :60] = 1.5  # a seed constant on one language: undefined scores
    langs = np.repeat(list(sizes), list(sizes.values()))
    if arrangement == "interleaved":
        mix = rng.permutation(labels.size)
        labels, a, b, langs = labels[mix], a[:, mix], b[:, mix], langs[mix]
    euro = ("de", "sw")
    swap = rng.integers(0, 2, (30, labels.size)).astype(bool)
    got_a, got_b = metrics.swap_scorer("spearman", a, b, labels, langs, euro)(swap)
    per_seed = ref.seed_scores("spearman", euro)
    every = np.arange(labels.size)
    for r, row in enumerate(swap):
        _same(got_a[r], per_seed(np.where(row, b, a), labels, langs, every))
        _same(got_b[r], per_seed(np.where(row, a, b), labels, langs, every))
    assert np.isnan(got_a).any()  # the cases cover undefined scores


@pytest.mark.parametrize("ties", ["none", "some", "many"])
def test_spearman_bootstrap_equals_the_loop(rng, ties):
    sizes = {"de": 70, "en": 3, "sw": 40}
    labels, a, _ = _predictions(rng, "spearman", 4, sum(sizes.values()), ties)
    langs = np.repeat(list(sizes), list(sizes.values()))
    members = [np.flatnonzero(langs == g) for g in sizes]
    stratified = np.array(
        [np.concatenate([m[rng.integers(0, m.size, m.size)] for m in members]) for _ in range(40)]
    )
    anywhere = rng.integers(0, labels.size, (20, 60))  # languages missing, counts uneven
    scorer = metrics.resample_scorer("spearman", a, labels, langs, ("de", "en"))
    per_seed = ref.seed_scores("spearman", ("de", "en"))
    for index in (stratified, anywhere):
        want = np.vstack([per_seed(a, labels, langs, cols) for cols in index])
        _same(scorer(index), want)


@pytest.mark.parametrize("metric", POINTWISE)
@pytest.mark.parametrize("n", [7, 120])  # 2^7 <= 999: every swap enumerated
def test_permutation_on_swaps_equals_the_index_form(rng, metric, n):
    labels, a, b = _predictions(rng, metric, 3, n)
    langs = np.array(["de", "en"])[rng.integers(0, 2, n)]
    langs[:2] = ["de", "en"]
    swap = metrics.swap_scorer(metric, a, b, labels, langs, ())
    stacked = metrics.resample_scorer(
        metric,
        np.concatenate([a, b], axis=1),
        np.concatenate([labels, labels]),
        np.concatenate([langs, langs]),
        (),
    )

    def on_swaps(swapped: np.ndarray) -> np.ndarray:
        sa, sb = swap(swapped)
        return sa.mean(axis=1) - sb.mean(axis=1)

    def on_index(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return stacked(x).mean(axis=1) - stacked(y).mean(axis=1)

    fast = stats.paired_swap_permutation(a, b, on_swaps, 999, seed=5, on_swaps=True)
    plain = stats.paired_swap_permutation(a, b, on_index, 999, seed=5, vectorized=True)
    _same([fast.diff, fast.pvalue], [plain.diff, plain.pvalue])  # NaN: undefined on both
