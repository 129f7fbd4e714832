"""The per-task score a checkpoint receipt carries (seed 002's `TaskResult`).

Shared by `track` (receipts written from harness cells) and `capability` (the synthetic
suite, scored in process), so both speak one record and one regression rule reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from encoder_eval.core.metrics import direction


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
        """+1 when a higher score is better, -1 otherwise (`metrics.direction`, the rule
        `metrics.sign` applies too): a score times its sign is higher-is-better. A receipt
        records its direction, since the synthetic suite's axes (perplexity) are no metric
        of the registry."""
        return direction(self.higher_is_better)
