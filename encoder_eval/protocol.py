"""The fixed protocol: learning-rate grid, seed sets and the shared optimiser recipe.

Everything a cell must share with every other cell of a table lives here, so that
`run`, `sweep`, `select` and `summarize` agree on one definition.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from .errors import HarnessError

# Ten log-spaced learning rates from 1e-5 to 1e-4, rounded to three significant
# digits; the rounded value is the canonical one (it is what goes on command lines).
LR_GRID: dict[str, float] = {
    f"lr{i + 1:02d}": float(f"{v:.3g}") for i, v in enumerate(np.logspace(-5, -4, 10))
}
SELECT_SEEDS: tuple[int, ...] = (42, 43, 44)
REPORT_SEEDS: tuple[int, ...] = (45, 46, 47, 48, 49)
PHASE_SEEDS: dict[str, tuple[int, ...]] = {"select": SELECT_SEEDS, "report": REPORT_SEEDS}
# numpy's legacy seeding (and so every RNG a cell seeds) takes 0 .. 2**32 - 1.
MAX_SEED = 2**32 - 1

# Which split picks the learning rate and the early-stopping checkpoint. "dev" is the
# specification's default (the official dev split; for GLUE and SuperGLUE also the reported
# split, so their number is a maximum over evaluations); "holdout" is the strict variant: a
# fixed, label-stratified slice of train, the official dev split untouched until the report
# score (EVALUATION_METHODOLOGY.md, section 6). A variant, not a departure from the protocol.
SELECTION_SPLITS: tuple[str, ...] = ("dev", "holdout")
# The training loss of a ranking cell: softmax cross-entropy over each query's group
# (the protocol's), or binary cross-entropy per (query, candidate) pair (an ablation).
RANK_OBJECTIVES: tuple[str, ...] = ("listwise", "pointwise")


# How far a recipe entry must agree between cells that share a table (its `scope`):
TABLE = "table"  # every cell of a table (and of a selection)
MODEL = "model"  # every cell of one model (the loader: a property of how a model is read)
CELL = "cell"  # free per cell: how the arithmetic is laid out, not what is computed
SCOPES = (TABLE, MODEL, CELL)


def _entry(default, scope: str = TABLE, checked: bool = True):
    """A recipe entry: its default, its comparability scope, and whether a value other than
    the protocol's marks a cell off-protocol (`checked`)."""
    return field(default=default, metadata={"scope": scope, "checked": checked})


@dataclass(frozen=True)
class Recipe:
    """Everything that makes two cells comparable: the shared fine-tuning recipe (EuroBERT card
    settings, applied to every model), how batches are formed, how often dev is scored, which
    split selects, and how the model is loaded. `signature` derives comparability from it."""

    weight_decay: float = _entry(0.1)
    adam_beta1: float = _entry(0.9)
    adam_beta2: float = _entry(0.95)
    adam_eps: float = _entry(1e-8)
    warmup_ratio: float = _entry(0.1)
    batch_size: int = _entry(32)  # the effective batch (see micro_batch)
    max_steps: int = _entry(10_000)
    epoch_cap: int = _entry(20)
    patience: int = _entry(3)
    early_stop: bool = _entry(True)
    max_seq_len: int = _entry(256)
    precision: str = _entry("bf16-autocast")
    # A variant, not a departure: see SELECTION_SPLITS.
    selection_split: str = _entry("dev", checked=False)
    batching: str = _entry("length-grouped")  # or "random" (an ablation)
    # Dev evaluation cadence: once an epoch, at least every `eval_every_max` steps, and at
    # least `min_evals_when_capped` times when max_steps ends training early.
    eval_every_max: int = _entry(500)
    min_evals_when_capped: int = _entry(4)
    # The evaluation batch asked for; None: by device (EVAL_BATCH_SIZE in train.py). A
    # different value changes predictions by bf16 rounding only, yet tables never mix them.
    eval_batch_size: int | None = _entry(None, checked=False)
    # Ranking cells: the objective (RANK_OBJECTIVES) and the group per query, one relevant
    # candidate plus sampled negatives (the seed's 36); other cells ignore them.
    rank_objective: str = _entry("listwise")
    rank_group_size: int = _entry(36)
    # How many first-stage candidates each query re-ranks: the seed re-ranks BM25's top
    # 1,000. A cell whose data holds another depth is off-protocol (kinds._ranking_record).
    rank_depth: int = _entry(1000)
    mode: str = _entry("auto", scope=MODEL, checked=False)  # the loader (models.MODES)
    # The decoder-adapted loader's settings (models.loader_settings); None for other modes.
    attention: str | None = _entry(None, scope=MODEL, checked=False)  # bidirectional | causal
    pooling: str | None = _entry(None, scope=MODEL, checked=False)  # models.HEAD_POOLINGS
    head_dropout: float | None = _entry(None, scope=MODEL, checked=False)
    # A smoke run (`--limit N`, encoder_eval/limit.py): every split cut to N examples.
    limit: int | None = _entry(None)
    # Gradient accumulation when the effective batch does not fit: the same update.
    micro_batch: int | None = _entry(None, scope=CELL, checked=False)

    def to_dict(self) -> dict:
        return asdict(self)


PROTOCOL_RECIPE = Recipe()
# Recipe fields that name a protocol variant rather than a departure from it: a table may
# use either value, but never mixes them (summarize labels the table with the value).
VARIANT_FIELDS: tuple[str, ...] = ("selection_split",)


def recipe_fields(scope: str) -> tuple[str, ...]:
    """The recipe entries whose values must agree at `scope` (table, model or cell)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; valid: {', '.join(SCOPES)}")
    return tuple(f.name for f in fields(Recipe) if f.metadata["scope"] == scope)


def signature(recipe: dict, scope: str = TABLE) -> dict:
    """The comparability signature of a recorded recipe at `scope`: its entries of that scope,
    sorted. An entry a result predates reads as the value that was then in effect (the
    default), so results written before an entry was recorded stay comparable."""
    defaults = PROTOCOL_RECIPE.to_dict()
    return {name: recipe.get(name, defaults[name]) for name in sorted(recipe_fields(scope))}


def loader_label(recipe: dict) -> str:
    """How a recorded recipe loaded its model, as one comparable string: the mode, followed by
    the decoder-adapted settings when it has them (`decoder-adapted (attention=causal, ...)`),
    so that every check that compares loaders compares those too."""
    sig = signature(recipe, MODEL)
    extra = ", ".join(f"{k}={v}" for k, v in sig.items() if k != "mode" and v is not None)
    return f"{sig['mode']} ({extra})" if extra else str(sig["mode"])


def step_budget(n_train: int, recipe: Recipe = PROTOCOL_RECIPE) -> tuple[int, int]:
    """(steps per epoch, step cap) of a cell on `n_train` training examples: training runs
    min(max_steps, epoch_cap epochs) optimizer steps unless early stopping ends it first."""
    steps_per_epoch = math.ceil(n_train / recipe.batch_size)
    return steps_per_epoch, min(recipe.max_steps, recipe.epoch_cap * steps_per_epoch)


def check_seed(seed: int, flag: str = "--seed") -> int:
    """`seed` if every random generator a cell seeds accepts it (0 .. MAX_SEED), else a
    HarnessError now, instead of a crash inside each cell."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise HarnessError(f"{flag} {seed!r} must be an integer from 0 to {MAX_SEED} (2**32 - 1)")
    return seed


def seed_arg(text: str) -> int:
    """argparse `type=` for one seed: an integer from 0 to MAX_SEED."""
    try:
        return check_seed(int(text))
    except (ValueError, HarnessError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed (an integer from 0 to {MAX_SEED})"
        ) from None


def lr_key_for(lr: float) -> str | None:
    """Return the grid key of `lr` (relative tolerance 0.5 %), or None when it is off the grid."""
    for key, value in LR_GRID.items():
        if abs(lr - value) <= 5e-3 * value:
            return key
    return None


def lr_for_key(key: str) -> float:
    """Return the learning rate of a grid key such as 'lr06'."""
    try:
        return LR_GRID[key]
    except KeyError:
        raise HarnessError(
            f"unknown learning-rate key {key!r}; valid keys: {', '.join(LR_GRID)}"
        ) from None


def off_protocol_reasons(recipe: Recipe, lr: float, seed: int, phase: str) -> list[str]:
    """List every way a cell departs from the protocol (empty list: on protocol)."""
    reasons = []
    for entry in fields(Recipe):
        expected, got = getattr(PROTOCOL_RECIPE, entry.name), getattr(recipe, entry.name)
        if entry.name == "limit" and got is not None:
            reasons.append(f"limit={got}: a smoke run, every split cut to {got} examples")
        elif entry.metadata["checked"] and got != expected:
            reasons.append(f"{entry.name}={got} (protocol: {expected})")
    if lr_key_for(lr) is None:
        reasons.append(f"lr={lr:g} is not on the grid")
    if phase in PHASE_SEEDS and seed not in PHASE_SEEDS[phase]:
        reasons.append(f"seed {seed} is not a {phase} seed {list(PHASE_SEEDS[phase])}")
    return reasons


def name_reasons(reasons: Iterable[str], most: int = 4) -> str:
    """The distinct off-protocol reasons of several cells (`off_protocol_reasons`, as their
    results record them), in order, as one clause: the first `most`, then "...". How
    `summarize` and `estimate` name them."""
    named = list(dict.fromkeys(reasons))
    return "; ".join(named[:most]) + ("; ..." if len(named) > most else "")
