"""The per-task score a checkpoint receipt carries (seed 002's `TaskResult`).

Shared by `track` (receipts written from harness cells) and `capability` (the synthetic
suite, scored in process), so both speak one record and one regression rule reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TaskResult:
    """One task's score on one checkpoint, with its direction and its noise in `details`
    (`std`, `n`: the spread the noise rule uses, over seeds, folds or examples)."""

    name: str
    score: float
    higher_is_better: bool
    n_examples: int | None
    details: dict = field(default_factory=dict)

    @property
    def sign(self) -> float:
        """+1 when a higher score is better, -1 otherwise (as `metrics.sign`): a score times
        its sign is higher-is-better. A receipt records its direction, since the synthetic
        suite's axes (perplexity) are no metric of the registry."""
        return 1.0 if self.higher_is_better else -1.0
