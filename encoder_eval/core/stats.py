"""The statistics behind "is model A really better than model B?": intervals over seeds,
seed-level tests (Welch, ASO), example-level paired tests (permutation, McNemar), the
combined seed-and-test-set t-test the verdict rests on,
two-level bootstrap over seeds and examples, a multiple-comparison correction and the
verdict. How many seeds a comparison needs is in `power_analysis.py`.

Every test here calls scipy or statsmodels where they provide it; only the almost-stochastic-
order test (Dror et al. 2019) is written here, because its one maintained package (`deepsig`)
is GPL-3.0 (this project is Apache-2.0) and pulls in pandas, joblib, dill and psutil.
Scores are "higher is better" throughout; negate a lower-is-better metric before calling, or
pass `higher_is_better=False` to `verdict`. What each test assumes is in
EVALUATION_METHODOLOGY.md, "Comparing models: the statistics".
"""

from __future__ import annotations

import hashlib
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from encoder_eval.core.errors import HarnessError

A_BETTER = "A better"
B_BETTER = "B better"
NOT_DISTINGUISHABLE = "not distinguishable"
CORRECTIONS = ("holm", "fdr_bh")  # the first is the default


def task_seed(seed: int, task: str) -> int:
    """The resampling seed of one task: `seed` and the task key mixed by numpy's
    SeedSequence (the key as the first 8 bytes of its sha256, stable across processes and
    Python versions, unlike `hash()`). Each task draws its own stream, so a table's
    Monte-Carlo errors are independent across its tasks; every pair of one task still
    shares that task's draws."""
    key = int.from_bytes(hashlib.sha256(task.encode("utf-8")).digest()[:8], "little")
    state = np.random.SeedSequence([int(seed), key]).generate_state(1, dtype=np.uint64)
    return int(state[0])


class StatsInputError(HarnessError, ValueError):
    """Bad input to a statistic (empty, mismatched lengths, too few seeds, non-finite): a
    ValueError for library callers and a HarnessError so a command prints one `error:` line."""


@dataclass(frozen=True)
class Undefined:
    """What a statistic returns, in place of a number, when legal input leaves it undefined
    or out of reach (a difference of 0, no seed variance, a power no number of seeds
    reaches): never raised, so a command's row carries `reason` as a note and goes on.
    StatsInputError stays for bad input (wrong shapes, non-finite numbers)."""

    reason: str


@dataclass(frozen=True)
class TestResult:
    """One two-sample test: its statistic and p-value, the difference A - B it is about, and
    that difference's interval where the test defines one (else None)."""

    __test__ = False  # not a pytest test class

    test: str
    statistic: float
    pvalue: float
    diff: float
    low: float | None = None
    high: float | None = None
    df: float | None = None


@dataclass(frozen=True)
class AsoResult:
    """The almost-stochastic-order test of A over B: `eps_min` (the upper confidence bound on
    the violation ratio; below 0.5 means A is almost stochastically dominant), the observed
    `violation_ratio`, the bootstrap `sigma`, and the settings that produced them."""

    eps_min: float
    violation_ratio: float
    sigma: float
    confidence: float
    n_bootstrap: int
    seed: int


@dataclass(frozen=True)
class Correction:
    """Adjusted p-values and rejections (in the order given) of one multiple-comparison
    correction at level `alpha`."""

    method: str
    alpha: float
    pvalues: tuple[float, ...]
    reject: tuple[bool, ...]


def _scores(values: Sequence[float], name: str, min_n: int, why: str) -> np.ndarray:
    """`values` as a finite 1-D float array of at least `min_n` entries, else a clear error."""
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise StatsInputError(f"{name}: scores must be numbers, got {values!r:.80}") from None
    if arr.ndim != 1:
        raise StatsInputError(f"{name}: expected a flat list of scores, got shape {arr.shape}")
    if arr.size < min_n:
        raise StatsInputError(
            f"{name}: {why} needs at least {min_n} score(s), got {arr.size}; add seeds or examples"
        )
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise StatsInputError(
            f"{name}: scores must be finite numbers; {bad.size} are not (first at position "
            f"{bad[0]}: {arr[bad[0]]}); leave undefined scores out"
        )
    return arr


def _same_length(x: np.ndarray, y: np.ndarray, why: str) -> None:
    if x.size != y.size:
        raise StatsInputError(
            f"{why} pairs scores on the same examples, but A has {x.size} and B {y.size}; "
            "pass both models' scores on the same examples in the same order"
        )


def check_level(value: float, name: str) -> None:
    if not 0.0 < value < 1.0:
        raise StatsInputError(f"{name} must lie strictly between 0 and 1, got {value!r}")


def t_interval(
    scores: Sequence[float], confidence: float = 0.95
) -> tuple[float, float | None, float | None]:
    """Mean over seeds and its `confidence` interval with the Student-t quantile on n - 1
    degrees of freedom and the ddof=1 standard error (not the normal 1.96, which is too narrow
    for a handful of seeds). With one seed the interval is undefined: its bounds are None."""
    check_level(confidence, "confidence")
    x = _scores(scores, "scores", 1, "a mean")
    mean = float(np.mean(x))
    if x.size < 2:
        return mean, None, None
    from scipy import stats as sps  # scipy and statsmodels on use: `--help` stays light

    sem = float(sps.sem(x, ddof=1))
    if sem == 0.0:  # every seed scored the same; scipy refuses a zero scale
        return mean, mean, mean
    low, high = sps.t.interval(confidence, x.size - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> TestResult:
    """Welch's two-sided t-test of equal means over seeds (scipy `ttest_ind`, equal_var=False),
    with the difference of means A - B and its `confidence` interval on the Welch-Satterthwaite
    degrees of freedom (statsmodels `CompareMeans`). When neither model's seeds vary, the test
    is undefined: statistic and p-value are NaN, the interval None (and `verdict` says "not
    distinguishable"), rather than scipy's infinite t and p = 0."""
    check_level(confidence, "confidence")
    x = _scores(a, "a", 2, "Welch's t-test (a seed variance)")
    y = _scores(b, "b", 2, "Welch's t-test (a seed variance)")
    diff = float(np.mean(x) - np.mean(y))
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return TestResult(test="welch", statistic=math.nan, pvalue=math.nan, diff=diff)
    from scipy import stats as sps
    from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

    with warnings.catch_warnings():  # one model with identical seeds is exact, not imprecise
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        res = sps.ttest_ind(x, y, equal_var=False)
    means = CompareMeans(DescrStatsW(x), DescrStatsW(y))
    _, _, df = means.ttest_ind(usevar="unequal")
    low, high = means.tconfint_diff(alpha=1.0 - confidence, usevar="unequal")
    return TestResult(
        test="welch",
        statistic=float(res.statistic),
        pvalue=float(res.pvalue),
        diff=diff,
        low=float(low),
        high=float(high),
        df=float(df),
    )


def _quantile_grid(sorted_scores: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The empirical quantile function F_n^{-1}(t) = x_(ceil(n t)) of each row of
    `sorted_scores` (sorted along the last axis) at the points `grid` in (0, 1)."""
    n = sorted_scores.shape[-1]
    idx = np.clip(np.ceil(n * grid).astype(int) - 1, 0, n - 1)
    return sorted_scores[..., idx]


def _violation_ratios(qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """eps_W2(F, G) on a uniform grid (the last axis): the share of the squared 2-Wasserstein
    distance int (F^-1 - G^-1)^2 dt that lies on the violation set {t: F^-1(t) < G^-1(t)},
    where A is below B. 0.5 where the two quantile functions coincide (no order either way)."""
    sq = (qa - qb) ** 2
    w2 = sq.mean(axis=-1)  # the grid is uniform, so the mean is the integral over (0, 1)
    violation = np.where(qa < qb, sq, 0.0).mean(axis=-1)
    safe = np.where(w2 > 0, w2, 1.0)
    return np.where(w2 > 0, violation / safe, 0.5)


def violation_ratio(a: Sequence[float], b: Sequence[float], grid_size: int = 1000) -> float:
    """The violation ratio eps_W2 of A over B (del Barrio et al. 2018): 0 when A's quantiles
    are everywhere at least B's (A stochastically dominates B), 1 when B's dominate, 0.5 by
    symmetry for one distribution; eps(A, B) + eps(B, A) = 1 when the quantiles differ."""
    x = np.sort(_scores(a, "a", 1, "a violation ratio"))
    y = np.sort(_scores(b, "b", 1, "a violation ratio"))
    grid = (np.arange(grid_size) + 0.5) / grid_size
    return float(_violation_ratios(_quantile_grid(x, grid), _quantile_grid(y, grid)))


def aso(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    n_bootstrap: int = 1000,
    seed: int = 1234,
    grid_size: int = 1000,
) -> AsoResult:
    """Almost stochastic order of A over B (Dror, Shlomov and Reichart 2019, "Deep Dominance",
    built on del Barrio, Cuesta-Albertos and Matrán 2018), comparing whole seed-score
    distributions rather than means.

    Steps, as in the papers:
    1. the empirical quantile functions F_n^-1 (A) and G_m^-1 (B) on a midpoint grid of
       `grid_size` points in (0, 1);
    2. the violation ratio eps_W2(F_n, G_m): the part of the squared Wasserstein distance
       int_0^1 (F^-1 - G^-1)^2 dt on the violation set V = {t: F^-1(t) < G^-1(t)}, divided by
       the whole (del Barrio et al. 2018, the W2 index of disagreement with stochastic order;
       Dror et al. 2019, the definition of eps-almost stochastic dominance);
    3. sigma: the standard deviation of sqrt(nm/(n+m)) (eps_W2(F*_n, G*_m) - eps_W2(F_n, G_m))
       over `n_bootstrap` bootstrap resamples of both score lists (seeded by `seed`);
    4. eps_min = eps_W2(F_n, G_m) - sqrt((n+m)/(nm)) sigma Phi^-1(alpha), alpha = 1 -
       `confidence`, clipped to [0, 1]: the smallest eps for which H0 "eps_W2 >= eps" is
       rejected at level alpha (Dror et al. 2019, the minimal-epsilon form of the test).

    Decision rule: eps_min < 0.5 means A is almost stochastically dominant over B at this
    confidence (the smaller, the closer to full dominance; Ulmer et al. 2022 suggest 0.2 for a
    strict claim); eps_min >= 0.5 claims nothing, and `aso(b, a)` tests the other direction.
    For k comparisons at once, pass a Bonferroni-raised `confidence` (1 - (1 - c) / k).
    """
    check_level(confidence, "confidence")
    if n_bootstrap < 1 or grid_size < 1:
        raise StatsInputError(
            f"n_bootstrap and grid_size must be positive, got {n_bootstrap} and {grid_size}"
        )
    x = np.sort(_scores(a, "a", 2, "ASO (a bootstrap over seeds)"))
    y = np.sort(_scores(b, "b", 2, "ASO (a bootstrap over seeds)"))
    n, m = x.size, y.size
    grid = (np.arange(grid_size) + 0.5) / grid_size
    observed = float(_violation_ratios(_quantile_grid(x, grid), _quantile_grid(y, grid)))
    rng = np.random.default_rng(seed)
    xb = np.sort(x[rng.integers(0, n, size=(n_bootstrap, n))], axis=1)
    yb = np.sort(y[rng.integers(0, m, size=(n_bootstrap, m))], axis=1)
    boot = _violation_ratios(_quantile_grid(xb, grid), _quantile_grid(yb, grid))
    const = math.sqrt(n * m / (n + m))
    sigma = float(np.std(const * (boot - observed)))
    from scipy import stats as sps

    eps_min = observed - sigma / const * float(sps.norm.ppf(1.0 - confidence))
    return AsoResult(
        eps_min=float(np.clip(eps_min, 0.0, 1.0)),
        violation_ratio=observed,
        sigma=sigma,
        confidence=confidence,
        n_bootstrap=n_bootstrap,
        seed=seed,
    )


def paired_permutation(
    x: Sequence[float], y: Sequence[float], n_resamples: int = 9999, seed: int = 1234
) -> TestResult:
    """Two-sided paired permutation test of A's and B's per-example scores on the same
    examples (scipy `permutation_test`, permutation_type="samples": each example's two scores
    are swapped or not), on the mean difference A - B. Exact when 2^n <= `n_resamples`.
    It treats each model as fixed: pass per-example scores averaged over seeds, and never use
    it alone for a verdict (see `verdict`)."""
    a = _scores(x, "x", 1, "a paired test")
    b = _scores(y, "y", 1, "a paired test")
    _same_length(a, b, "the paired permutation test")
    if n_resamples < 1:
        raise StatsInputError(f"n_resamples must be positive, got {n_resamples}")

    def mean_diff(u: np.ndarray, v: np.ndarray, axis: int) -> np.ndarray:
        return np.mean(u - v, axis=axis)

    from scipy import stats as sps

    res = sps.permutation_test(
        (a, b),
        mean_diff,
        permutation_type="samples",
        alternative="two-sided",
        vectorized=True,
        n_resamples=n_resamples,
        batch=max(1, 4_000_000 // a.size),  # bounds memory on large test sets
        random_state=np.random.default_rng(seed),
    )
    diff = float(np.mean(a - b))
    return TestResult(
        test="paired permutation", statistic=diff, pvalue=float(res.pvalue), diff=diff
    )


RESAMPLE_ROWS = 2_000_000  # index entries drawn per batch of resamples: bounds memory


def paired_swap_permutation(
    a: np.ndarray,
    b: np.ndarray,
    statistic: Callable,
    n_resamples: int = 999,
    seed: int = 1234,
    *,
    vectorized: bool = False,
    on_swaps: bool = False,
) -> TestResult:
    """Two-sided paired permutation test on whole examples for any task score: `a` and `b`
    are (seeds, examples) prediction matrices of two models on the same examples, and
    `statistic(a, b)` is the score difference A - B (e.g. the seed-averaged task metric).
    Under the null an example's predictions are exchangeable between the models, so each
    resample swaps a random set of columns (all of an example's seeds at once) between A
    and B. This serves metrics that are not a mean over examples (F1, MCC, Spearman, a
    language mean). Both matrices need the same number of seeds (their rows are swapped
    pairwise).

    The swaps are scipy `permutation_test`'s (permutation_type="samples" on example
    indices, `random_state` default_rng(seed); exact enumeration when 2^n <= n_resamples),
    drawn here in batches, and so is its p-value; with `vectorized`, `statistic(x, y)`
    takes (resamples, n) column indices into the stacked matrix [a | b] (A's swapped
    matrix is its columns x, B's its columns y) and returns one difference per row, so a
    batch is scored at once; with `on_swaps`, `statistic(swap)` takes the (resamples, n)
    boolean swap matrix itself (True: that example's predictions exchanged; x is then
    j + n * swap[:, j]) and returns one difference per row. An undefined observed
    difference (NaN) gives a NaN p-value (scipy would count no resample as extreme and
    return about 2 / (n_resamples + 1))."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or a.shape != b.shape or a.size == 0:
        raise StatsInputError(
            f"paired_swap_permutation needs two non-empty (seeds, examples) matrices of one "
            f"shape, got {a.shape} and {b.shape}"
        )
    if n_resamples < 1:
        raise StatsInputError(f"n_resamples must be positive, got {n_resamples}")
    n = a.shape[1]
    stacked = np.concatenate([a, b], axis=1)
    own = np.arange(n)

    def batch_stat(swap: np.ndarray) -> np.ndarray:
        if on_swaps:
            return np.asarray(statistic(swap), dtype=float)
        x, y = own + n * swap, own + n * ~swap
        if vectorized:
            return np.asarray(statistic(x, y), dtype=float)
        return np.array(
            [statistic(stacked[:, xi], stacked[:, yi]) for xi, yi in zip(x, y, strict=True)]
        )

    observed = float(batch_stat(np.zeros((1, n), dtype=bool))[0])
    if math.isnan(observed) or n < 2:  # undefined, or nothing to swap
        return TestResult(
            test="paired permutation", statistic=observed, pvalue=math.nan, diff=observed
        )
    exact = n < 63 and 2**n <= n_resamples
    null_distribution = np.concatenate(
        [batch_stat(swap) for swap in _swaps(n, n_resamples, seed, exact)]
    )
    adjustment = 0 if exact else 1
    total = null_distribution.size + adjustment
    gamma = abs(np.finfo(float).eps * 100 * observed)  # scipy's tolerance for equal values
    less = (np.count_nonzero(null_distribution <= observed + gamma) + adjustment) / total
    greater = (np.count_nonzero(null_distribution >= observed - gamma) + adjustment) / total
    pvalue = float(np.clip(min(less, greater) * 2, 0.0, 1.0))
    return TestResult(test="paired permutation", statistic=observed, pvalue=pvalue, diff=observed)


def _swaps(n: int, n_resamples: int, seed: int, exact: bool):
    """Batches of (resamples, n) boolean matrices, True where example j's A and B are swapped:
    scipy `permutation_test`'s draws for permutation_type="samples" on two samples (every
    swap pattern in `itertools.product` order when exact; else `Generator.permuted` of
    [0, 1] per example, one after another). `permuted` shuffles a pair with one
    `next_uint32` and swaps it when the low bit is 0; `integers(0, 2**32, dtype=uint32)`
    reads the same `next_uint32` stream 25 times faster, so that is how it is drawn here
    (tests/test_stats_scale.py checks the two agree, and the p-values against scipy's)."""
    rows = max(1, RESAMPLE_ROWS // (2 * n))
    if exact:
        patterns = np.array(list(itertools.product((False, True), repeat=n)), dtype=bool)
        for start in range(0, patterns.shape[0], rows):
            yield patterns[start : start + rows]
        return
    rng = np.random.default_rng(seed)
    for start in range(0, n_resamples, rows):
        count = min(rows, n_resamples - start)
        bits = rng.integers(0, 2**32, size=count * n, dtype=np.uint32)
        yield ((bits & 1) == 0).reshape(count, n)


def two_level_bootstrap(
    score: Callable,
    n_seeds: Sequence[int],
    strata: Sequence,
    n_resamples: int = 1000,
    seed: int = 1234,
    confidence: float = 0.95,
    *,
    vectorized: bool = False,
) -> tuple[float, float, float]:
    """A percentile interval that carries both sources of variance: each replicate
    resamples, with replacement, the seeds of every model (`n_seeds[k]` of model k,
    independently) and the test examples (within each stratum, e.g. language, and the
    same examples for every model, so a difference stays paired), then evaluates
    `score(seed_indices_per_model, example_indices)`. Returns (point, low, high), the point
    being `score` on all seeds and examples; low and high are NaN (undefined) when a
    replicate's score is. With `vectorized`, `score` takes a batch: a (resamples, k) seed
    index matrix per model and a (resamples, examples) example index matrix, and returns
    one value per resample (the draws are the same either way)."""
    check_level(confidence, "confidence")
    if n_resamples < 1 or not n_seeds or min(n_seeds) < 1:
        raise StatsInputError(
            f"two_level_bootstrap needs n_resamples >= 1 and a seed per model, got "
            f"{n_resamples} and {list(n_seeds)}"
        )
    rng, members = _strata_members(strata, "two_level_bootstrap", seed)
    size = sum(m.size for m in members)
    every_seed = [np.arange(k) for k in n_seeds]
    if vectorized:
        point = float(score([s[None, :] for s in every_seed], np.arange(size)[None, :])[0])
    else:
        point = float(score(every_seed, np.arange(size)))
    values = np.concatenate(
        [
            np.asarray(score(seeds, examples), dtype=float)
            if vectorized
            else np.array([score([s[r] for s in seeds], examples[r]) for r in range(len(examples))])
            for seeds, examples in _draw_batches(rng, members, n_resamples, n_seeds)
        ]
    )
    return (point, *percentile_interval(values, confidence))


def two_level_draws(
    score_examples: Callable[[np.ndarray], np.ndarray],
    n_seeds: Sequence[int],
    strata: Sequence,
    n_resamples: int = 1000,
    seed: int = 1234,
) -> tuple[list[np.ndarray], np.ndarray]:
    """The draws of `two_level_bootstrap` (same arguments, same stream), kept for many
    statistics: per model slot its (resamples, k) seed index matrix, and
    `score_examples(example index matrix)` of every batch stacked, one row per resample
    (e.g. every seed's score of several models, each difference then `seed_mean`s of two
    of them). The draws depend only on `n_seeds`, the strata, `n_resamples` and `seed`, so
    a task's models are scored once for every pair of them."""
    if n_resamples < 1 or not n_seeds or min(n_seeds) < 1:
        raise StatsInputError(
            f"two_level_draws needs n_resamples >= 1 and a seed per model, got "
            f"{n_resamples} and {list(n_seeds)}"
        )
    rng, members = _strata_members(strata, "two_level_bootstrap", seed)
    seed_parts: list[list[np.ndarray]] = []
    scored = []
    for seeds, examples in _draw_batches(rng, members, n_resamples, n_seeds):
        seed_parts.append(seeds)
        scored.append(np.asarray(score_examples(examples), dtype=float))
    slots = [np.vstack([part[k] for part in seed_parts]) for k in range(len(n_seeds))]
    return slots, np.concatenate(scored)


def percentile_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The bootstrap percentile interval of `values` (one per replicate); NaN, NaN
    (undefined) when a replicate is."""
    check_level(confidence, "confidence")
    values = np.asarray(values, dtype=float)
    if np.isnan(values).any():
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _draw_batches(rng: np.random.Generator, members: list, n_resamples: int, n_seeds=()):
    """Batches of bootstrap draws: per resample, `rng.integers` for each model's seeds
    (`n_seeds`), then for each stratum's examples (`members`), in that order, one resample
    after another: the same draws as those calls one resample at a time, held a batch of
    about RESAMPLE_ROWS indices at once. Yields (seed index matrices, example index
    matrix), each with one row per resample.

    Bounded `integers` reads the generator's `next_uint32` stream one value (and, rarely,
    a rejected one) per draw, whatever the call it is in, so calls with the same bound in
    a row are made as one (`_same_bound_runs`): a batch of strata of one size is one call,
    not one per resample and stratum (tests/test_stats_scale.py checks the draws against
    the plain calls, and the generator's state after them)."""
    size = sum(m.size for m in members)
    rows = max(1, min(n_resamples, RESAMPLE_ROWS // max(1, size)))
    bounds = [*n_seeds, *(m.size for m in members)]
    width = sum(bounds)  # draws per resample
    n_head = sum(n_seeds)
    for start in range(0, n_resamples, rows):
        count = min(rows, n_resamples - start)
        drawn = np.empty(count * width, dtype=np.int64)
        at = 0
        for bound, length in _same_bound_runs(bounds, count):
            drawn[at : at + length] = rng.integers(0, bound, size=length)
            at += length
        drawn = drawn.reshape(count, width)
        seeds, at = [], 0
        for k in n_seeds:
            seeds.append(np.ascontiguousarray(drawn[:, at : at + k]))
            at += k
        examples = drawn[:, n_head:]
        for m in members:  # each stratum's draws are positions in it: its members
            part = examples[:, at - n_head : at - n_head + m.size]
            if m[-1] - m[0] == m.size - 1:  # a block of examples: an offset
                part += m[0]
            else:
                part[...] = m[part]
            at += m.size
        yield seeds, np.ascontiguousarray(examples)


def _same_bound_runs(bounds: list[int], count: int):
    """(bound, draws) of each run of one bound in `count` resamples that each draw
    `bounds[i]` values below `bounds[i]`, in order: the calls `_draw_batches` makes."""
    bound, length = None, 0
    for _ in range(count):
        for b in bounds:
            if b != bound:
                if length:
                    yield bound, length
                bound, length = b, 0
            length += b
    if length:
        yield bound, length


def example_variance(
    score: Callable[[np.ndarray], float],
    strata: Sequence,
    n_resamples: int = 999,
    seed: int = 1234,
) -> float:
    """The whole bootstrap variance of a score difference: the variance (ddof 1) of
    `score(example_indices)` over resamples of the examples, with replacement within each
    stratum (language) and the same examples for both models. For the seed-averaged score
    of trained models it also holds the per-example seed noise that the seed variance
    already carries; the verdict uses `shared_example_variance`, which removes it."""
    if n_resamples < 2:
        raise StatsInputError(f"example_variance needs n_resamples >= 2, got {n_resamples}")
    rng, members = _strata_members(strata, "example_variance", seed)
    values = np.array(
        [score(row) for _, batch in _draw_batches(rng, members, n_resamples) for row in batch]
    )
    if not np.all(np.isfinite(values)):
        return math.nan
    return float(np.var(values, ddof=1))


def _strata_members(strata: Sequence, who: str, seed: int):
    groups = np.asarray(strata)
    if groups.ndim != 1 or groups.size == 0:
        raise StatsInputError(f"{who} needs one stratum label per example")
    members = [np.flatnonzero(groups == g) for g in dict.fromkeys(groups.tolist())]
    return np.random.default_rng(seed), members


def example_replicates(
    seed_scores: Callable[[np.ndarray], np.ndarray],
    strata: Sequence,
    n_resamples: int = 999,
    seed: int = 1234,
    *,
    vectorized: bool = False,
) -> np.ndarray:
    """(resamples, seeds) bootstrap replicates of every seed's score: the examples are
    resampled with replacement within each stratum (language); `seed_scores(example
    indices)` returns every seed's score on them (with `vectorized`, a (resamples,
    examples) index matrix in, a (resamples, seeds) matrix out). The draws depend only on
    the strata, `n_resamples` and `seed`, so one model's replicates serve every pair it is
    in (`shared_example_part` of two models' replicates side by side)."""
    if n_resamples < 2:
        raise StatsInputError(f"example replicates need n_resamples >= 2, got {n_resamples}")
    rng, members = _strata_members(strata, "example_replicates", seed)
    rows = []
    for _, examples in _draw_batches(rng, members, n_resamples):
        if vectorized:
            rows.append(np.asarray(seed_scores(examples), dtype=float))
        else:
            rows.extend(np.asarray(seed_scores(row), dtype=float)[None, :] for row in examples)
    return np.vstack(rows)


def shared_example_part(replicates: np.ndarray, n_a: int) -> float:
    """The test-set variance of the difference of seed-mean scores A - B from bootstrap
    replicates of every seed's score (rows: resamples of the examples; columns: A's n_a seeds,
    then B's): mean covariance between distinct seeds of A, plus that of B, minus twice the
    mean covariance between a seed of A and one of B, clamped at 0. Only what the seeds of a
    model share counts, so the per-example seed noise (which the seed variance s²/n already
    holds) is not counted twice; for a mean-type score this is the whole bootstrap variance
    minus Σ_m mean_i Var_s(x_si) / (n_m N). NaN when a replicate is undefined."""
    x = np.asarray(replicates, dtype=float)
    n_b = x.shape[1] - n_a if x.ndim == 2 else 0
    if x.ndim != 2 or n_a < 2 or n_b < 2 or x.shape[0] < 2:
        raise StatsInputError(
            f"shared_example_part needs (resamples >= 2, seeds) replicates with at least 2 seeds per "
            f"model, got shape {x.shape} with {n_a} of A"
        )
    if not np.all(np.isfinite(x)):
        return math.nan
    cov = np.cov(x, rowvar=False, ddof=1)
    ca, cb, cab = cov[:n_a, :n_a], cov[n_a:, n_a:], cov[:n_a, n_a:]
    within_a = (ca.sum() - np.trace(ca)) / (n_a * (n_a - 1))
    within_b = (cb.sum() - np.trace(cb)) / (n_b * (n_b - 1))
    return float(max(0.0, within_a + within_b - 2.0 * cab.mean()))


def shared_example_variance(
    seed_scores: Callable[[np.ndarray], np.ndarray],
    n_a: int,
    strata: Sequence,
    n_resamples: int = 999,
    seed: int = 1234,
    *,
    vectorized: bool = False,
) -> float:
    """The test-set part V_ex of the variance of a seed-mean score difference A - B, the one
    `combined_test` adds to the seed variance: `seed_scores(example_indices)` returns every
    seed's score on those examples (A's n_a seeds first, then B's); the examples are resampled
    with replacement within each stratum (language), the same for both models
    (`example_replicates`), and `shared_example_part` keeps what the seeds share."""
    if n_resamples < 2:
        raise StatsInputError(f"shared_example_variance needs n_resamples >= 2, got {n_resamples}")
    replicates = example_replicates(seed_scores, strata, n_resamples, seed, vectorized=vectorized)
    return shared_example_part(replicates, n_a)


def combined_parts(
    var_a: float, var_b: float, n_a: int, n_b: int, example_var: float
) -> tuple[float, float]:
    """(variance, Satterthwaite df) of a difference of two seed means whose variance also
    carries a test-set part `example_var`, taken as known (infinite df): df =
    V^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1)), V = s_a^2/n_a + s_b^2/n_b + example_var."""
    ua, ub = var_a / n_a, var_b / n_b
    total = ua + ub + example_var
    denom = ua**2 / (n_a - 1) + ub**2 / (n_b - 1)
    return total, (math.inf if denom == 0 else total**2 / denom)


def combined_test(
    a: Sequence[float], b: Sequence[float], example_var: float, confidence: float = 0.95
) -> TestResult:
    """The verdict's test: two-sided t-test of the difference of seed means A - B, with a
    variance that adds the test-set variance `example_var` (`example_variance`) to Welch's
    seed variance, on Satterthwaite degrees of freedom (normal when no seed varies). It asks
    whether another seed AND another test sample would keep the difference: a seed-level
    test alone ignores the test sample, an example-level test alone the seeds."""
    check_level(confidence, "confidence")
    x = _scores(a, "a", 2, "the combined test (a seed variance)")
    y = _scores(b, "b", 2, "the combined test (a seed variance)")
    if not (math.isfinite(example_var) and example_var >= 0):
        raise StatsInputError(f"example_var must be finite and >= 0, got {example_var!r}")
    diff = float(np.mean(x) - np.mean(y))
    total, df = combined_parts(
        float(np.var(x, ddof=1)), float(np.var(y, ddof=1)), x.size, y.size, example_var
    )
    if total == 0:
        return TestResult(test="combined t", statistic=math.nan, pvalue=math.nan, diff=diff)
    se = math.sqrt(total)
    t = diff / se
    from scipy import stats as sps

    if math.isinf(df):
        quantile, tail = float(sps.norm.ppf(0.5 + confidence / 2)), float(sps.norm.sf(abs(t)))
    else:  # not a frozen sps.t(df): that costs more than the test itself
        quantile, tail = float(sps.t.ppf(0.5 + confidence / 2, df)), float(sps.t.sf(abs(t), df))
    half = quantile * se
    return TestResult(
        test="combined t",
        statistic=t,
        pvalue=2 * tail,
        diff=diff,
        low=diff - half,
        high=diff + half,
        df=df,
    )


def mcnemar(
    correct_a: Sequence[bool], correct_b: Sequence[bool], exact_below: int = 25
) -> TestResult:
    """McNemar's test of equal accuracy from two models' per-example correctness on the same
    examples (statsmodels `contingency_tables.mcnemar`): the exact binomial test when fewer
    than `exact_below` examples are discordant, else the continuity-corrected chi-square.
    `diff` is accuracy A - accuracy B."""
    a = _scores(correct_a, "correct_a", 1, "McNemar's test")
    b = _scores(correct_b, "correct_b", 1, "McNemar's test")
    _same_length(a, b, "McNemar's test")
    for name, arr in (("correct_a", a), ("correct_b", b)):
        if not np.all((arr == 0) | (arr == 1)):
            raise StatsInputError(f"{name}: McNemar's test needs 0/1 (or bool) correctness")
    a, b = a.astype(bool), b.astype(bool)
    table = [[int(np.sum(a & b)), int(np.sum(a & ~b))], [int(np.sum(~a & b)), int(np.sum(~a & ~b))]]
    exact = table[0][1] + table[1][0] < exact_below
    from statsmodels.stats.contingency_tables import mcnemar as _sm_mcnemar

    res = _sm_mcnemar(table, exact=exact, correction=True)
    return TestResult(
        test="mcnemar exact" if exact else "mcnemar chi2",
        statistic=float(res.statistic),
        pvalue=float(res.pvalue),
        diff=float(np.mean(a) - np.mean(b)),
    )


def correct(pvalues: Sequence[float], method: str = "holm", alpha: float = 0.05) -> Correction:
    """Adjust p-values of several comparisons (one per task): Holm (the default; controls the
    family-wise error rate; the step-down formula in numpy, equal to statsmodels'
    `multipletests`, which calls the garbage collector each time) or Benjamini-Hochberg
    "fdr_bh" (statsmodels; controls the false discovery rate, rejects more)."""
    if method not in CORRECTIONS:
        raise StatsInputError(
            f"unknown correction {method!r}; valid corrections: {', '.join(CORRECTIONS)}"
        )
    check_level(alpha, "alpha")
    p = _scores(pvalues, "pvalues", 1, "a correction")
    bad = np.flatnonzero((p < 0) | (p > 1))
    if bad.size:
        raise StatsInputError(f"p-values must lie in [0, 1]; position {bad[0]} is {p[bad[0]]}")
    if method == "holm":  # statsmodels' Holm runs gc.collect() on every call (~0.1 s)
        order = np.argsort(p, kind="stable")
        steps = np.maximum.accumulate((p.size - np.arange(p.size)) * p[order])
        adjusted = np.empty_like(p)
        adjusted[order] = np.minimum(steps, 1.0)
        reject = adjusted <= alpha
    else:
        from statsmodels.stats.multitest import multipletests

        reject, adjusted, _, _ = multipletests(p, alpha=alpha, method=method)
    return Correction(
        method=method,
        alpha=alpha,
        pvalues=tuple(float(v) for v in adjusted),
        reject=tuple(bool(v) for v in reject),
    )


def verdict(
    seed_pvalue: float,
    diff: float,
    alpha: float = 0.05,
    higher_is_better: bool = True,
    example_pvalue: float | None = None,
) -> str:
    """The verdict on A against B (A_BETTER, B_BETTER or NOT_DISTINGUISHABLE) from a p-value
    that carries the seed variance (already corrected across tasks) and the sign of the
    difference A - B. `compare` passes `combined_test`'s (seed and test-set variance), or
    Welch's when there are no predictions.

    Never an example-level p-value alone: such a test (paired permutation, McNemar) treats
    each model as one fixed predictor, so with enough examples it calls two seed sets of the
    same model different. `example_pvalue`, when given, is a further requirement, never a
    substitute. A NaN p-value (an undefined test) is "not distinguishable".
    """
    check_level(alpha, "alpha")
    pvalues = [seed_pvalue] + ([] if example_pvalue is None else [example_pvalue])
    if diff == 0 or not all(math.isfinite(p) and p <= alpha for p in pvalues):
        return NOT_DISTINGUISHABLE
    return A_BETTER if (diff > 0) == higher_is_better else B_BETTER
