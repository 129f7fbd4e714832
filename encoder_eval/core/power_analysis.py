"""Power analysis for "is model A really better than model B?": how many seeds per model
a comparison needs to detect a difference, and the smallest difference five seeds detect,
for the verdict's tests in `stats.py` (Welch's two-sample t-test; with a test-set variance,
`stats.combined_test`), at the level the verdict's correction family applies
(`family_alpha`). The noncentral t comes from `scipy.special`; legal input without an
answer gives `stats.Undefined`, never an exception. EVALUATION_METHODOLOGY.md, "Comparing
models: the statistics", says what each assumes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from encoder_eval.core.stats import StatsInputError, Undefined, check_level, combined_parts


def _combined_power(
    diff: float, std_a: float, std_b: float, n: int, example_var: float, alpha: float
) -> float:
    """The power of `combined_test` with n seeds per model against a true difference `diff`
    (noncentral t on the Satterthwaite df of the given stds)."""
    total, df = combined_parts(std_a**2, std_b**2, n, n, example_var)
    return _t_power(abs(diff) / math.sqrt(total), df, alpha)


def _t_power(ncp: float, df: float, alpha: float) -> float:
    """The power of a two-sided t-test at level `alpha` on `df` degrees of freedom (normal
    when infinite) against noncentrality `ncp` >= 0. scipy.special's functions, not the
    `sps.t` / `sps.nct` objects (30x the cost per call, and a table's power search calls
    this some 10^4 times); the critical value from the lower tail (`stdtrit` at alpha/2),
    which stays finite at the tiny levels of a large family where 1 - alpha/2 rounds to 1."""
    from scipy import special as sps_special

    if math.isinf(df):
        crit = -float(sps_special.ndtri(alpha / 2))
        return float(sps_special.ndtr(ncp - crit) + sps_special.ndtr(-crit - ncp))
    crit = -float(sps_special.stdtrit(df, alpha / 2))
    # The lower tail P(T < -crit) is at most min(alpha / 2, Phi(-ncp)) (T < -crit needs
    # Z + ncp < 0): skipped when that cannot move the sum; boost's noncentral t gives NaN
    # there at small alpha, which the first version read as power 1 (5 seeds "enough" at a
    # power below 1e-6).
    skip_lower = min(alpha / 2, 0.5 * math.erfc(ncp / math.sqrt(2))) < 1e-17
    with warnings.catch_warnings():  # boost's "Error in function cdf(...)": handled below
        warnings.simplefilter("ignore", RuntimeWarning)
        upper = 1.0 - float(sps_special.nctdtr(df, ncp, crit)) if df >= 2 else math.nan
        lower = 0.0 if skip_lower else float(sps_special.nctdtr(df, ncp, -crit))
    if not 0.0 <= upper <= 1.0:  # boost is NaN, or below 2 df silently wrong, far in the
        upper = _nct_sf(crit, df, ncp)  # tail (tiny alpha): integrate over chi2 instead
    return min(1.0, upper + (lower if 0.0 <= lower <= 1.0 else 0.0))


def _nct_sf(crit: float, df: float, ncp: float) -> float:
    """P(T > crit) for noncentral t on `df` degrees of freedom: the integral over u in
    (0, 1) of Phi(ncp - crit sqrt(V_u / df)), V_u the u-quantile of chi2(df) (bounded and
    monotone in u, so quadrature holds where boost's series do not), split where Phi's
    argument crosses 0. Within 1e-7 of boost where both hold near the power searched for
    (0.8); a power of 1e-6 or less may come out several times too small, which leaves it
    below any power asked for, all the search needs."""
    from scipy import integrate  # heavy: only where boost's noncentral t fails
    from scipy import special as sps_special

    def integrand(u: float) -> float:
        v = 2.0 * float(sps_special.gammaincinv(df / 2, u))
        return float(sps_special.ndtr(ncp - crit * math.sqrt(v / df)))

    cross = float(sps_special.gammainc(df / 2, df * (ncp / crit) ** 2 / 2)) if crit > 0 else 1.0
    with warnings.catch_warnings():  # quadpack's accuracy notes; the sum is clipped below
        warnings.simplefilter("ignore")
        value = sum(
            integrate.quad(integrand, lo, hi, limit=200, epsabs=1e-13)[0]
            for lo, hi in ((0.0, cross), (cross, 1.0))
            if hi > lo
        )
    return float(min(1.0, max(0.0, value)))


def _equal_n_power(effect: float, n: int, alpha: float) -> float:
    """The power of the two-sided two-sample t-test with n seeds per model against effect
    size `effect` (difference / pooled std): statsmodels `TTestIndPower.power`'s formula
    (df 2n - 2, noncentrality effect * sqrt(n / 2)), whose solver, not this, fails at small
    alpha (at n = 5, alpha 0.05/1547 it returned an effect with 16 % power, silently)."""
    return _t_power(effect * math.sqrt(n / 2.0), 2.0 * n - 2.0, alpha)


def _fewest_seeds(enough: Callable[[int], bool], cap: int, guess: float = 2.0) -> int | None:
    """The smallest n in [2, cap] with `enough(n)` (power rises with n), or None: from
    `guess` (the normal approximation, which the t-test needs at least as many seeds as),
    steps growing twofold until enough, then bisection."""
    low = int(min(max(2.0, guess), cap)) if math.isfinite(guess) else 2
    if enough(low):
        if low == 2:
            return 2
        low = 2  # the guess was already enough: search from the bottom
        if enough(low):
            return 2
    step, high = 1, low + 1
    while not enough(high):
        if high >= cap:
            return None
        low, step = high, 2 * step
        high = min(low + step, cap)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


MAX_SEEDS = 100_000  # seeds_needed gives up beyond this


def _pooled_std(std_a: float, std_b: float) -> float:
    """sqrt((std_a^2 + std_b^2) / 2): the pooled seed std of two equal-sized groups, the
    effect-size denominator (Cohen's d) of the power analysis."""
    if std_a < 0 or std_b < 0 or not (math.isfinite(std_a) and math.isfinite(std_b)):
        raise StatsInputError(f"seed stds must be finite and >= 0, got {std_a!r} and {std_b!r}")
    return math.sqrt((std_a**2 + std_b**2) / 2.0)


def seeds_needed(
    diff: float,
    std_a: float,
    std_b: float,
    alpha: float = 0.05,
    power: float = 0.8,
    example_var: float = 0.0,
    *,
    scale: float = 1.0,
) -> int | Undefined:
    """Seeds per model a two-sided two-sample t-test needs to detect a true difference `diff`
    at level `alpha` with probability `power` (the power of statsmodels `TTestIndPower`,
    equal group sizes, effect size |diff| / pooled std with pooled std = sqrt((std_a^2 +
    std_b^2) / 2)); at least 2, the fewest a t-test can use. With a test-set variance
    `example_var` > 0 it is the power of `combined_test` instead, which more seeds cannot
    push past the test set's own noise. `Undefined` (with the reason) when no number of
    seeds reaches that power, the difference is 0 or no seed varies; its reason shows
    scores times `scale` (the tables' x100: 100)."""
    check_level(alpha, "alpha")
    check_level(power, "power")
    pooled = _pooled_std(std_a, std_b)
    if not math.isfinite(diff) or not math.isfinite(example_var) or example_var < 0:
        raise StatsInputError(
            f"seeds_needed needs a finite difference and test-set variance >= 0, got "
            f"{diff!r} and {example_var!r}"
        )
    if diff == 0:
        return Undefined(f"no number of seeds detects a difference of {diff!r}")
    if example_var > 0:
        room = (diff / _z_sum(alpha, power)) ** 2 - example_var  # what the seeds may add
        n = _fewest_seeds(
            lambda k: _combined_power(diff, std_a, std_b, k, example_var, alpha) >= power,
            MAX_SEEDS,
            2 * pooled**2 / room if room > 0 else 2.0,
        )
        if n is None:
            return Undefined(
                f"no number of seeds detects {scale * abs(diff):.4g}: the test set's own "
                f"noise (sd {scale * math.sqrt(example_var):.3g}) hides it; it needs more test "
                "examples"
            )
        return n
    if pooled == 0:
        return Undefined("both seed stds are 0: the seed variance gives no power estimate")
    effect = abs(diff) / pooled
    n = _fewest_seeds(
        lambda k: _equal_n_power(effect, k, alpha) >= power,
        2**62,
        2 * (_z_sum(alpha, power) / effect) ** 2,
    )
    if n is None:  # not reached: the effect is below what any count of doubles can resolve
        return Undefined(f"no number of seeds detects {scale * abs(diff):.4g} at alpha {alpha:.3g}")
    return n


def _z_sum(alpha: float, power: float) -> float:
    """z_(1 - alpha/2) + z_power: the normal approximation's noncentrality for `power`."""
    from scipy import special as sps_special

    return float(-sps_special.ndtri(alpha / 2) + sps_special.ndtri(power))


def _root(f: Callable[[float], float], scale: float) -> float | None:
    """The root of an increasing `f` on (0, inf), starting from the bracket
    [1e-12, 20] x `scale` and widening its top tenfold until f changes sign (up to 1e12 x
    `scale`); None when it never does."""
    low, high = 1e-12 * scale, 20.0 * scale
    if f(low) >= 0:
        return low
    while f(high) < 0:
        if high > 1e12 * scale:
            return None
        low, high = high, 10.0 * high
    from scipy import optimize as sps_optimize

    return float(sps_optimize.brentq(f, low, high, xtol=1e-14 * scale, rtol=1e-12))


def min_detectable_difference(
    std_a: float,
    std_b: float,
    n: int = 5,
    alpha: float = 0.05,
    power: float = 0.8,
    example_var: float = 0.0,
) -> float | Undefined:
    """The smallest true difference `n` seeds per model detect with probability `power` at
    level `alpha` (two-sided two-sample t-test, statsmodels `TTestIndPower`'s power): the
    detectable effect size times the pooled std sqrt((std_a^2 + std_b^2) / 2). With a
    test-set variance `example_var` > 0: the difference at which `combined_test` has that
    power. The search widens its bracket until it holds the answer, so a large family's
    tiny alpha is reached; `Undefined` when no seed varies and there is no test-set
    variance, or when no difference reaches the power (numerically out of reach)."""
    check_level(alpha, "alpha")
    check_level(power, "power")
    if n < 2:
        raise StatsInputError(f"a t-test needs at least 2 seeds per model, got n={n}")
    pooled = _pooled_std(std_a, std_b)
    if not math.isfinite(example_var) or example_var < 0:
        raise StatsInputError(f"example_var must be finite and >= 0, got {example_var!r}")
    if example_var > 0:
        scale = math.sqrt(pooled**2 * 2 / n + example_var)
        mdd = _root(
            lambda d: _combined_power(d, std_a, std_b, n, example_var, alpha) - power, scale
        )
    elif pooled == 0:
        return Undefined("both seed stds are 0 and no test-set variance: nothing to size")
    else:
        effect = _root(lambda e: _equal_n_power(e, n, alpha) - power, 1.0)
        mdd = None if effect is None else effect * pooled
    if mdd is None:
        return Undefined(f"no difference reaches {power:.0%} power at alpha {alpha:.3g}")
    return mdd


def family_alpha(alpha: float, n_tests: int) -> float:
    """The level a comparison is sized at when it is corrected within a family of `n_tests`:
    alpha / n_tests, Holm's (and Bonferroni's) first step, and Benjamini-Hochberg's too when
    one difference is real and the rest are not; so seeds needed and the smallest detectable
    difference are sized for the verdict actually applied, not for an uncorrected alpha."""
    check_level(alpha, "alpha")
    if n_tests < 1:
        raise StatsInputError(f"a family holds at least one test, got {n_tests}")
    return alpha / n_tests
