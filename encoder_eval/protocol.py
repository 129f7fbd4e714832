"""The fixed protocol: learning-rate grid, seed sets and the shared optimiser recipe.

Everything a cell must share with every other cell of a table lives here, so that
`run`, `sweep`, `select` and `summarize` agree on one definition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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

# Which split picks the learning rate and the early-stopping checkpoint. "dev" is the
# specification's default (the official dev split; for GLUE and SuperGLUE also the reported
# split, so their number is a maximum over evaluations); "holdout" is the strict variant: a
# fixed, label-stratified slice of train, the official dev split untouched until the report
# score (EVALUATION_METHODOLOGY.md, section 6). A variant, not a departure from the protocol.
SELECTION_SPLITS: tuple[str, ...] = ("dev", "holdout")


@dataclass(frozen=True)
class Recipe:
    """The shared fine-tuning recipe (EuroBERT card settings, applied to every model)."""

    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.1
    batch_size: int = 32
    max_steps: int = 10_000
    epoch_cap: int = 20
    patience: int = 3
    early_stop: bool = True
    max_seq_len: int = 256
    precision: str = "bf16-autocast"
    selection_split: str = "dev"

    def to_dict(self) -> dict:
        return asdict(self)


PROTOCOL_RECIPE = Recipe()
# Recipe fields that name a protocol variant rather than a departure from it: a table may
# use either value, but never mixes them (summarize labels the table with the value).
VARIANT_FIELDS: tuple[str, ...] = ("selection_split",)


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
    for field, expected in PROTOCOL_RECIPE.to_dict().items():
        if field in VARIANT_FIELDS:
            continue
        got = getattr(recipe, field)
        if got != expected:
            reasons.append(f"{field}={got} (protocol: {expected})")
    if lr_key_for(lr) is None:
        reasons.append(f"lr={lr:g} is not on the grid")
    if phase in PHASE_SEEDS and seed not in PHASE_SEEDS[phase]:
        reasons.append(f"seed {seed} is not a {phase} seed {list(PHASE_SEEDS[phase])}")
    return reasons
