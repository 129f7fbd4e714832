"""Shared by the statistics tests: the printed seed and the binomial band a simulated
rejection rate must fall in, so a correct test cannot fail by luck."""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

SEED = 20261201


def seeded_rng() -> np.random.Generator:
    """numpy's default generator at SEED, printed so a failure can be replayed."""
    print(f"seed={SEED}")
    return np.random.default_rng(SEED)


def band(n: int, p: float) -> tuple[float, float]:
    """The binomial 99.9 % band of a rejection rate over n independent comparisons."""
    low, high = sps.binom.interval(0.999, n, p)
    return low / n, high / n
