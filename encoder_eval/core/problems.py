"""Problem types: what a task asks of a model, named once for every layer.

`SINGLE_LABEL`, `REGRESSION` and `RANKING` are the values a task row, a result and a cell
kind carry (the first two are `transformers`' own `problem_type` values). Task files,
probes and NeuCo-Bench configurations name problems by the short names of
`PROBLEM_NAMES`.
"""

from __future__ import annotations

SINGLE_LABEL = "single_label_classification"
REGRESSION = "regression"
RANKING = "ranking"  # (query, candidate) pairs scored by one logit, metrics per query
PROBLEM_TYPES = (SINGLE_LABEL, REGRESSION, RANKING)

CLASSIFICATION = "classification"
PROBLEM_NAMES: dict[str, str] = {
    CLASSIFICATION: SINGLE_LABEL,
    REGRESSION: REGRESSION,
    RANKING: RANKING,
}


def short_name(problem: str) -> str:
    """The short name (`classification`, `regression`, `ranking`) of a problem type."""
    return {v: k for k, v in PROBLEM_NAMES.items()}[problem]
