"""The statistics settings of `summarize`, `compare` and `report` as one object: each entry
a dataclass field declared as its flag (`core/flags.py`, as `Recipe` declares the recipe's),
so a flag, its default and its help are written once, and the library (`verdicts.compare_table`,
`verdicts.best_marks`, `verdicts.add_statistics`, `html.build_report`) takes the one object.

What a comparison row is computed from (`ROW_INPUTS`: the resamples and the seed) is what
`comparison_cache.ComparisonCache.key` hashes of it (`row_inputs`); the other entries act
after a row is computed (the correction, its family and level, the marks) or change no
number (`jobs`, `cache`).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from encoder_eval.core.flags import add_flags, flag_field
from encoder_eval.core.protocol import seed_arg
from encoder_eval.core.stats import CORRECTIONS
from encoder_eval.reports.table import CI_METHODS

DEFAULT_RESAMPLES = 999
DEFAULT_SEED = 1234
DEFAULT_ALPHA = 0.05
DEFAULT_CORRECTION = "holm"

# What a verdict's correction runs over (`--family`): each pair's tasks, or every row shown.
FAMILIES = ("pair", "table")
# For the marks of `summarize`: every pair of models on every task of the table (the
# default), or the seed's per-task comparisons of the best with the others only.
MARK_FAMILIES = ("table", "task")


def _jobs(text: str) -> int:
    """argparse `type=` for `--jobs`: a whole number of processes, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (1 or more)")
    return value


@dataclass(frozen=True)
class StatsSettings:
    """How the table's intervals and marks and compare's verdicts are computed. The marks
    are corrected at `DEFAULT_ALPHA` with `DEFAULT_CORRECTION` over `marks_family`;
    `family`, `correction` and `alpha` are the verdicts'."""

    ci: str = flag_field(
        "t",
        "--ci",
        choices=CI_METHODS,
        help="each cell's 95 %% interval: "
        "t over seeds (default), or a two-level bootstrap over seeds and report "
        "examples (needs the cells' predictions files)",
    )
    marks: bool = flag_field(
        True,
        "--no-marks",
        action="store_false",
        help="do not mark each task's best "
        "model and those not distinguishable from it (skips the tests)",
    )
    marks_family: str = flag_field(
        "table",
        "--marks-family",
        choices=MARK_FAMILIES,
        help="what the marks are corrected over: table (every pair of models on "
        "every task, the default: any false mark at most 5 %%) or task (the "
        "best against the others of each task only)",
    )
    family: str = flag_field(
        "table",
        "--family",
        choices=FAMILIES,
        help="what each verdict is corrected over: table (every row shown, the "
        "default: bounds any false verdict in the output) or pair (each pair's tasks)",
    )
    correction: str = flag_field(
        DEFAULT_CORRECTION,
        "--correction",
        choices=CORRECTIONS,
        help="multiple-comparison correction within the family (default: holm)",
    )
    alpha: float = flag_field(DEFAULT_ALPHA, "--alpha", help="the verdicts' level")
    n_resamples: int = flag_field(
        DEFAULT_RESAMPLES,
        "--resamples",
        metavar="RESAMPLES",
        help=f"permutations and bootstrap replicates per statistic (default {DEFAULT_RESAMPLES})",
    )
    seed: int = flag_field(DEFAULT_SEED, "--seed", type=seed_arg, help="seed of the resampling")
    jobs: int = flag_field(
        1,
        "--jobs",
        type=_jobs,
        help="processes the comparisons run on (default 1; the numbers are the same "
        "whatever the number)",
    )
    cache: bool = flag_field(
        True,
        "--no-cache",
        action="store_false",
        help="neither read nor write the comparisons kept in your cache "
        "($ENCODER_EVAL_CACHE_DIR/comparisons/)",
    )

    # What a comparison row is computed from; the cache's key hashes these (`row_inputs`).
    ROW_INPUTS = ("n_resamples", "seed")

    def row_inputs(self) -> dict:
        """The entries a comparison row depends on, by name (the cache key's part)."""
        return {name: getattr(self, name) for name in self.ROW_INPUTS}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StatsSettings:
        """The settings a command's parsed flags give; an entry the command has no flag for
        keeps its default."""
        names = [f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)]
        return cls(**{name: getattr(args, name) for name in names})


# Which entries each command takes, in the order its --help lists them.
MARK_ENTRIES = ("marks", "marks_family")
VERDICT_ENTRIES = ("family", "correction", "alpha")
RUN_ENTRIES = ("n_resamples", "seed", "jobs", "cache")


def add_statistics_arguments(
    p: argparse.ArgumentParser, *, ci: bool = False, marks: bool = False, verdicts: bool = False
) -> None:
    """The statistics flags of `summarize`, `compare` and `report` (`StatsSettings`): with
    `ci`, the table's interval (`--ci`); with `marks`, the table's marks (`--no-marks`,
    `--marks-family`); with `verdicts`, compare's family, correction and alpha; always the
    resampling (`--resamples`, `--seed`) and how the comparisons run (`--jobs`, `--no-cache`)."""
    names = (
        (("ci",) if ci else ())
        + (MARK_ENTRIES if marks else ())
        + (VERDICT_ENTRIES if verdicts else ())
        + RUN_ENTRIES
    )
    add_flags(p, StatsSettings, names=names)


# The settings with every entry at its default (what a command without flags computes).
DEFAULTS = StatsSettings()
