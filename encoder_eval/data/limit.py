"""`--limit N`: a smoke run on at most N examples of every split.

A limited cell checks a new model or task end to end in a minute; its numbers mean nothing
about the model, so the recipe records the limit, the cell is off-protocol, and `summarize`
refuses it without `--allow-partial`. The subset is drawn with one fixed seed (the same for
every model, learning rate and cell seed, so limited cells at least compare with each other),
stratified by label for classification, by query for ranking (N queries with all their
candidates), and kept in the split's order.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

from encoder_eval.core.errors import HarnessError

LIMIT_SEED = 0


def check_limit(limit: int | None) -> None:
    """Refuse a limit that would leave nothing to train on."""
    if limit is not None and limit < 2:
        raise HarnessError(f"--limit {limit} must be at least 2 (examples per split)")


def _stratified(labels: list, n: int, rng: random.Random) -> list[int]:
    """`n` row indices with each label in proportion to its share (largest remainders), and
    at least one row of every label when n allows."""
    by_label: dict = defaultdict(list)
    for i, label in enumerate(labels):
        by_label[label].append(i)
    keys = sorted(by_label, key=str)
    ideal = {k: n * len(by_label[k]) / len(labels) for k in keys}
    quota = {k: math.floor(ideal[k]) for k in keys}
    for k in sorted(keys, key=lambda k: ideal[k] - quota[k], reverse=True)[
        : n - sum(quota.values())
    ]:
        quota[k] += 1
    if n >= len(keys):
        for k in keys:
            if quota[k] == 0:
                quota[max(keys, key=lambda j: quota[j])] -= 1
                quota[k] = 1
    return sorted(i for k in keys for i in rng.sample(by_label[k], quota[k]))


def limit_split(split: dict, n: int, problem: str, seed: int = LIMIT_SEED) -> dict:
    """The split (a dict of equal-length columns) cut to at most `n` units: rows, or for a
    ranking split, queries with all their rows."""
    rows = len(split.get("label", ()))
    rng = random.Random(seed)
    if problem == "ranking":
        queries = list(dict.fromkeys(split["query_id"]))
        if len(queries) <= n:
            return split
        keep = set(rng.sample(queries, n))
        idx = [i for i, q in enumerate(split["query_id"]) if q in keep]
    elif rows <= n:
        return split
    elif problem == "regression":
        idx = sorted(rng.sample(range(rows), n))
    else:
        idx = _stratified(list(split["label"]), n, rng)
    return {k: [v[i] for i in idx] if isinstance(v, list) else v for k, v in split.items()}


def limit_data(data: tuple, n: int | None) -> tuple:
    """`load_task`'s (train, dev per language, test per language, labels, problem) with every
    split limited to `n` units (unchanged when `n` is None)."""
    if n is None:
        return data
    train, dev, test, num_labels, problem = data
    return (
        limit_split(train, n, problem),
        {lang: limit_split(s, n, problem) for lang, s in dev.items()},
        {lang: limit_split(s, n, problem) for lang, s in test.items()},
        num_labels,
        problem,
    )
