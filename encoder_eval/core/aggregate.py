"""Seed aggregation, defined once: what a seed contributes, and mean ± std over seeds.

The results table (`summarize`) and the figures (`plots`) both aggregate through here, so a
bar always shows the number its table cell does. A finished seed contributes its score; a
seed whose score is undefined (a null mean, e.g. constant predictions) and a diverged seed
contribute nothing and are counted apart: never averaged, never read as 0. Learning rates
are told apart by their grid key (`cell.lr_key`), never by comparing floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from encoder_eval.core.schema import CellResult

FINISHED, UNDEFINED, DIVERGED = "finished", "undefined", "diverged"


def seed_mean(values: Iterable[float]) -> float | None:
    """The mean over seeds (None for no seed)."""
    values = list(values)
    return math.fsum(values) / len(values) if values else None


def seed_std(values: Iterable[float]) -> float | None:
    """The sample standard deviation over seeds (ddof=1); None for fewer than two seeds."""
    values = list(values)
    if len(values) < 2:
        return None
    m = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((x - m) ** 2 for x in values) / (len(values) - 1))


def seed_interval(values: Iterable[float], metric: str) -> tuple[float, float, bool] | None:
    """The 95 % t-interval of the mean over seeds (`stats.t_interval`), cut to the range
    `metric`'s scores lie in (`MetricSpec.score_range`), and whether it was cut; None for
    fewer than two seeds. With two seeds the t interval is 12.7 std wide and reaches past
    the range (a Spearman of 1.79): a bound no score can take says nothing."""
    from encoder_eval.core.metrics import METRIC_SPECS
    from encoder_eval.core.stats import t_interval  # scipy: on use only

    values = list(values)
    if len(values) < 2:
        return None
    _, low, high = t_interval(values)
    spec = METRIC_SPECS.get(metric)
    if spec is None or spec.score_range is None:
        return low, high, False
    lo, hi = spec.score_range
    return max(low, lo), min(high, hi), low < lo or high > hi


def seed_outcome(result: CellResult, section: str) -> tuple[str, float | None]:
    """What one seed's result contributes to an aggregate of its `section` ('dev' or
    'report') scores: (FINISHED, score), (UNDEFINED, None) or (DIVERGED, None)."""
    if not result.ok:
        return DIVERGED, None
    score = result.score(section)
    return (UNDEFINED, None) if score is None else (FINISHED, score)


@dataclass
class SeedScores:
    """The seeds of one group of results (one (model, task, lr_key) in a protocol table)."""

    finished: list[tuple[int, float]] = field(default_factory=list)  # (seed, score)
    diverged: list[int] = field(default_factory=list)
    undefined: list[int] = field(default_factory=list)

    def add(self, result: CellResult, section: str) -> str:
        """Count one result in, by `seed_outcome`; returns its outcome."""
        outcome, score = seed_outcome(result, section)
        if outcome == FINISHED:
            self.finished.append((result.cell.seed, score))
        elif outcome == UNDEFINED:
            self.undefined.append(result.cell.seed)
        else:
            self.diverged.append(result.cell.seed)
        return outcome

    @property
    def values(self) -> list[float]:
        return [score for _, score in self.finished]

    @property
    def n(self) -> int:
        return len(self.finished)

    @property
    def mean(self) -> float | None:
        return seed_mean(self.values)

    @property
    def std(self) -> float | None:
        return seed_std(self.values)


def group_by_lr_key(
    results: Iterable[CellResult], section: str
) -> dict[tuple[str, str, str], SeedScores]:
    """{(model, task, lr_key): its SeedScores} over `results`, in the order first seen."""
    groups: dict[tuple[str, str, str], SeedScores] = {}
    for result in results:
        cell = result.cell
        groups.setdefault((cell.model, cell.task, cell.lr_key), SeedScores()).add(result, section)
    return groups
