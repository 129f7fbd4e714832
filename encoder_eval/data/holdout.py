"""The strict selection split: a fixed, label-stratified slice of train held out for LR
selection and early stopping, so that the official dev split is untouched until the report.

Under the specification's default (`selection_split = "dev"`) GLUE and SuperGLUE pick the
learning rate, early-stop and restore the best checkpoint on the very dev split they
report, so their number is a maximum over evaluations. `--selection-split holdout` moves
all of that onto this slice; EVALUATION_METHODOLOGY.md (section 6) measures the difference.

The slice depends only on the task's training data (never on the cell's seed), so every
cell of a (model, task) selects on the same examples.
"""

from __future__ import annotations

import random
from collections import defaultdict

from encoder_eval.core.problems import REGRESSION
from encoder_eval.core.protocol import SELECTION_SPLITS
from encoder_eval.data.splits import LoaderResult, Split

HOLDOUT_FRACTION = 0.10  # of the train split...
HOLDOUT_MIN = 100  # ...but at least this many examples...
HOLDOUT_MAX = 2000  # ...at most this many (dev is scored often during training)...
HOLDOUT_MAX_SHARE = 0.20  # ...and never more than this share of train (small tasks: CB)
HOLDOUT_SEED = 20241201  # fixed: the slice is the same for every cell
HOLDOUT_KEY = "holdout"  # the "language" the slice's dev scores are recorded under
REGRESSION_BINS = 10  # regression targets are stratified by quantile bin


def holdout_size(n_train: int) -> int:
    """How many train examples the slice takes (see the constants above)."""
    n = max(round(HOLDOUT_FRACTION * n_train), HOLDOUT_MIN)
    return max(1, min(n, HOLDOUT_MAX, int(HOLDOUT_MAX_SHARE * n_train)))


def _strata(labels: list, problem: str) -> list:
    """The stratum of each example: its class, or its quantile bin for a regression target."""
    if problem != REGRESSION:
        return list(labels)
    order = sorted(range(len(labels)), key=lambda i: (labels[i], i))
    bins = [0] * len(labels)
    for rank, i in enumerate(order):
        bins[i] = rank * REGRESSION_BINS // len(labels)
    return bins


def holdout_indices(labels: list, problem: str, seed: int = HOLDOUT_SEED) -> list[int]:
    """Indices of the held-out examples: each stratum contributes its share of the slice
    (largest remainders), drawn at random with a fixed seed; sorted."""
    size = holdout_size(len(labels))
    by_stratum: dict = defaultdict(list)
    for i, stratum in enumerate(_strata(labels, problem)):
        by_stratum[stratum].append(i)
    keys = sorted(by_stratum, key=repr)
    exact = {k: size * len(by_stratum[k]) / len(labels) for k in keys}
    take = {k: int(exact[k]) for k in keys}
    by_remainder = sorted(keys, key=lambda k: (-(exact[k] - take[k]), repr(k)))
    for k in by_remainder[: size - sum(take.values())]:
        take[k] += 1
    rng = random.Random(seed)
    chosen: list[int] = []
    for k in keys:
        members = list(by_stratum[k])
        rng.shuffle(members)
        chosen += members[: take[k]]
    return sorted(chosen)


def _subset(split: Split, idx: list[int]) -> Split:
    return {name: [column[i] for i in idx] for name, column in split.items()}


def apply_selection_split(loaded: LoaderResult, selection_split: str) -> LoaderResult:
    """Turn a loader's result into what a cell trains, selects and reports on.

    "dev" returns it unchanged. "holdout" trains on train minus the slice, uses the slice
    in place of dev (recorded under the language key "holdout"), and keeps the report
    split as the loader gave it: for dev-reported tasks, the official dev split.
    """
    if selection_split not in SELECTION_SPLITS:
        raise ValueError(f"selection split {selection_split!r} not in {SELECTION_SPLITS}")
    if selection_split == "dev":
        return loaded
    train, _dev, report, num_labels, problem = loaded
    held = holdout_indices(train["label"], problem)
    held_set = set(held)
    kept = [i for i in range(len(train["label"])) if i not in held_set]
    return _subset(train, kept), {HOLDOUT_KEY: _subset(train, held)}, report, num_labels, problem
