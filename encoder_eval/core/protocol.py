"""The fixed protocol: learning-rate grid, seed sets and the shared optimiser recipe.

Everything a cell must share with every other cell of a table lives here, so that
`run`, `sweep`, `select` and `summarize` agree on one definition.
"""

from __future__ import annotations

import argparse
import enum
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.flags import add_flags, flag_meta, flag_of, flags_argv

# Ten log-spaced learning rates from 1e-5 to 1e-4, rounded to three significant
# digits; the rounded value is the canonical one (it is what goes on command lines).
LR_GRID: dict[str, float] = {
    f"lr{i + 1:02d}": float(f"{v:.3g}") for i, v in enumerate(np.logspace(-5, -4, 10))
}
SELECT_SEEDS: tuple[int, ...] = (42, 43, 44)
REPORT_SEEDS: tuple[int, ...] = (45, 46, 47, 48, 49)
PHASE_SEEDS: dict[str, tuple[int, ...]] = {"select": SELECT_SEEDS, "report": REPORT_SEEDS}
# The phases: a fine-tune cell's (select: pick the LR on dev; report: score the fresh seeds),
# and the probe phase, whose cells probe frozen embeddings (a sweep's `--phase probe`).
PHASES: tuple[str, ...] = tuple(PHASE_SEEDS)
PROBE_PHASE = "probe"
SWEEP_PHASES: tuple[str, ...] = (*PHASES, PROBE_PHASE)
# Where a cell runs: auto picks a CUDA/ROCm GPU when one is visible (ROCm answers as cuda).
DEVICES: tuple[str, ...] = ("auto", "cuda", "cpu")
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


# The precision words every command takes (`--precision`): auto (fp32 on a CPU without native
# bf16, else bf16: `cpu.resolve_precision`), bf16 (autocast, the protocol's) and fp32;
# `bf16-autocast`, run's older name for bf16 (and what fine-tune results record), is accepted
# as its alias.
class Precision(enum.StrEnum):
    """The one precision type: what a plan asks for (AUTO, resolved by each cell on its own
    device) or a cell runs (BF16: autocast; FP32). Written as the strings results have
    always recorded only at the result boundary (`recorded`): a fine-tune recipe's
    "bf16-autocast", a probe's "bf16", "fp32"."""

    AUTO = "auto"
    BF16 = "bf16"
    FP32 = "fp32"

    @classmethod
    def of(cls, value: str | Precision) -> Precision:
        """The precision a word, alias or recorded string names; HarnessError naming the
        valid words otherwise."""
        word = PRECISION_ALIASES.get(str(value), str(value))
        try:
            return cls(word)
        except ValueError:
            raise unknown_name("precision", str(value), PRECISIONS) from None

    def recorded(self, kind: str = "finetune") -> str:
        """How a result of `kind` (finetune or probe) records this precision."""
        return RECORDED_BF16 if self is Precision.BF16 and kind == "finetune" else self.value


PRECISIONS: tuple[str, ...] = tuple(p.value for p in Precision)
PRECISION_ALIASES: dict[str, str] = {"bf16-autocast": "bf16"}
# How a fine-tune result's recipe records bf16 (what every result has recorded).
RECORDED_BF16 = "bf16-autocast"
PRECISION_FLAG = "--precision"
PRECISION_METAVAR = "{" + ",".join(PRECISIONS) + "}"


def precision_word(text: str) -> str:
    """The precision word `text` names (auto, bf16 or fp32; an alias becomes its word);
    HarnessError naming the valid words otherwise."""
    return Precision.of(text).value


def precision_arg(text: str) -> Precision:
    """argparse `type=` for `--precision`: the precision it names (`Precision.of`)."""
    try:
        return Precision.of(text)
    except HarnessError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def precision_flag(help: str, group: str | None = None) -> dict:
    """The field metadata of `--precision` (`flags.flag_meta`): the flag every command
    declares through this one function (the recipe, the probe's flags, sweep, track, demo),
    its words and alias, and how a value is written back (the word)."""
    return flag_meta(
        PRECISION_FLAG,
        help,
        group=group,
        to_text=precision_word,
        type=precision_arg,
        metavar=PRECISION_METAVAR,
    )


def add_precision_argument(parser, default: str | None, help: str) -> None:
    """`--precision` on a command's own parser (sweep, track, demo), declared as
    `precision_flag` declares it."""
    meta = precision_flag(help)
    parser.add_argument(
        PRECISION_FLAG, dest="precision", default=default, help=help, **meta["argparse"]
    )


def recorded_precision(word: str) -> str:
    """The value a fine-tune result records for a precision word (`Precision.recorded`)."""
    return Precision.of(word).recorded()


# How far a recipe entry must agree between cells that share a table (its `scope`):
TABLE = "table"  # every cell of a table (and of a selection)
MODEL = "model"  # every cell of one model (the loader: a property of how a model is read)
CELL = "cell"  # free per cell: how the arithmetic is laid out, not what is computed
SCOPES = (TABLE, MODEL, CELL)


def _entry(
    default,
    scope: str = TABLE,
    checked: bool = True,
    flag: str | None = None,
    help: str | None = None,
    choices: tuple[str, ...] | None = None,
):
    """A recipe entry: its default, its comparability scope, whether a value other than the
    protocol's marks a cell off-protocol (`checked`), and the `run` flag that sets it (with
    its help and choices; `recipe_arguments` makes the flags from these, `flags.add_flags`)."""
    kwargs: dict = {"choices": choices} if choices else {}
    if flag and not choices and not isinstance(default, bool):
        kwargs["metavar"] = "N" if flag == "--limit" else flag[2:].upper()
    meta = {"scope": scope, "checked": checked, "choices": choices}
    flagged = precision_flag(help) if flag == PRECISION_FLAG else flag_meta(flag, help, **kwargs)
    return field(default=default, metadata={**meta, **flagged})


@dataclass(frozen=True)
class Recipe:
    """Everything that makes two cells comparable: the shared fine-tuning recipe (EuroBERT card
    settings, applied to every model), how batches are formed, how often dev is scored, which
    split selects, and how the model is loaded. `signature` derives comparability from it."""

    weight_decay: float = _entry(0.1, flag="--weight-decay", help="AdamW weight decay")
    adam_beta1: float = _entry(0.9)
    adam_beta2: float = _entry(0.95, flag="--adam-beta2", help="AdamW beta2")
    adam_eps: float = _entry(1e-8)
    warmup_ratio: float = _entry(0.1, flag="--warmup-ratio", help="linear warmup share")
    # The effective batch (see micro_batch).
    batch_size: int = _entry(32, flag="--bsz", help="effective batch size")
    max_steps: int = _entry(
        10_000, flag="--max-steps", help="step cap; training runs min(max-steps, epoch-cap epochs)"
    )
    epoch_cap: int = _entry(20, flag="--epoch-cap", help="epoch cap")
    patience: int = _entry(3, flag="--patience", help="early-stopping patience")
    early_stop: bool = _entry(
        True, flag="--early-stop", help="stop after --patience dev evaluations without improvement"
    )
    max_seq_len: int = _entry(256, flag="--max-seq-len", help="truncation length")
    # A `Precision`, recorded as "bf16-autocast" or "fp32" (`to_dict`); AUTO only in a plan,
    # where the cell resolves it on its own device (`cpu.resolve_precision`).
    precision: Precision = _entry(
        Precision.BF16,
        flag=PRECISION_FLAG,
        help="auto: fp32 on a CPU without native bf16, else bf16; bf16 (alias bf16-autocast): "
        "autocast, the protocol's; fp32 marks the cell off-protocol",
    )
    # A variant, not a departure: see SELECTION_SPLITS.
    selection_split: str = _entry(
        "dev",
        checked=False,
        flag="--selection-split",
        help="what picks the LR and the early-stopping checkpoint: dev (the specification's "
        "default) or holdout (strict: a fixed slice of train; the official dev split is only "
        "scored for the report)",
        choices=SELECTION_SPLITS,
    )
    batching: str = _entry(
        "length-grouped",
        flag="--batching",
        help="how training batches are formed (see EVALUATION_METHODOLOGY.md)",
        choices=("length-grouped", "random"),  # random: an ablation
    )
    # Dev evaluation cadence: once an epoch, at least every `eval_every_max` steps, and at
    # least `min_evals_when_capped` times when max_steps ends training early.
    eval_every_max: int = _entry(500)
    min_evals_when_capped: int = _entry(4)
    # The evaluation batch asked for; None: by device (EVAL_BATCH_SIZE in cells/batching.py). A
    # different value changes predictions by bf16 rounding only, yet tables never mix them.
    eval_batch_size: int | None = _entry(
        None,
        checked=False,
        flag="--eval-batch",
        help="evaluation batch size (default: 16 on the CPU, 128 on a GPU); a table never "
        "mixes cells that set it differently",
    )
    # Ranking cells: the objective (RANK_OBJECTIVES) and the group per query, one relevant
    # candidate plus sampled negatives (the seed's 36); other cells ignore them.
    rank_objective: str = _entry(
        "listwise",
        flag="--rank-objective",
        help="ranking tasks: listwise (softmax cross-entropy over each query's group, the "
        "protocol's) or pointwise (binary cross-entropy per pair, an ablation; marks the cell "
        "off-protocol)",
        choices=RANK_OBJECTIVES,
    )
    rank_group_size: int = _entry(
        36,
        flag="--rank-group-size",
        help="ranking tasks: candidates per query group in training, one relevant plus "
        "sampled negatives (capped at the candidates a query has)",
    )
    # How many first-stage candidates each query re-ranks: the seed re-ranks BM25's top
    # 1,000. A cell whose data holds another depth is off-protocol (kinds._ranking_record).
    rank_depth: int = _entry(1000)
    mode: str = _entry("auto", scope=MODEL, checked=False)  # the loader (models.MODES)
    # The decoder-adapted loader's settings (models.loader_settings); None for other modes.
    attention: str | None = _entry(None, scope=MODEL, checked=False)  # bidirectional | causal
    pooling: str | None = _entry(None, scope=MODEL, checked=False)  # models.HEAD_POOLINGS
    head_dropout: float | None = _entry(None, scope=MODEL, checked=False)
    # The body's dropout (every dropout of the decoder body; None: the checkpoint's own): the
    # seed's ablation axis, a property of how the model is read, like the head's.
    body_dropout: float | None = _entry(None, scope=MODEL, checked=False)
    # A smoke run (`--limit N`, encoder_eval/data/limit.py): every split cut to N examples.
    limit: int | None = _entry(
        None,
        flag="--limit",
        help="a smoke run: cut every split to N examples (seeded; stratified by label; N "
        "queries for ranking); off-protocol, refused by summarize without --allow-partial",
    )
    # Gradient accumulation when the effective batch does not fit: the same update.
    micro_batch: int | None = _entry(
        None,
        scope=CELL,
        checked=False,
        flag="--micro-batch",
        help="micro-batch size for gradient accumulation when the effective batch does not "
        "fit in memory",
    )

    # Speed settings (issue 38, item 7): how the arithmetic is laid out, not what is computed,
    # so free per cell like the micro-batch (bench/README.md, bench_host.py, measures both).
    # Batch widths rounded up to a multiple of N tokens (at most max_seq_len), so a run meets
    # a few shapes, not one per width: the attention mask hides the padding.
    pad_multiple: int | None = _entry(
        None,
        scope=CELL,
        checked=False,
        flag="--pad-multiple",
        help="a speed setting: pad every batch's width up to a multiple of N tokens (32 or "
        "64; at most --max-seq-len), so a compiled model meets a few shapes; the attention "
        "mask hides the padding",
    )
    # torch.compile the model: CUDA graphs (mode reduce-overhead) on a GPU, inductor's default
    # mode on the CPU (needs a C++ compiler); the mode that ran is `recipe.compile_mode`.
    compile: bool = _entry(
        False,
        scope=CELL,
        checked=False,
        flag="--compile",
        help="a speed setting: torch.compile the model (CUDA graphs on a GPU, best with "
        "--pad-multiple 32; inductor on the CPU, which needs a C++ compiler); dropout draws "
        "the same random numbers as without it",
    )

    # One CUDA graph of the whole training step per batch shape, without torch.compile
    # (cells/graph_step.py): the same arithmetic, replayed; eager where it cannot run.
    graph_step: bool = _entry(
        False,
        scope=CELL,
        checked=False,
        flag="--graph-step",
        help="a speed setting: capture one CUDA graph of the whole training step per batch "
        "shape (best with --pad-multiple 32) and replay it; falls back to eager steps, "
        "saying so in one line, where it cannot (the CPU, a failed capture)",
    )

    # Deterministic algorithms (torch.use_deterministic_algorithms, cuDNN without autotuning,
    # CUBLAS_WORKSPACE_CONFIG=:4096:8): a GPU rerun then repeats bit for bit, at some speed.
    # Which kernels run, not what is computed: free per cell, like compile.
    deterministic: bool = _entry(
        False,
        scope=CELL,
        checked=False,
        flag="--deterministic",
        help="deterministic algorithms (torch.use_deterministic_algorithms, cuDNN without "
        "autotuning, CUBLAS_WORKSPACE_CONFIG=:4096:8), so that a GPU rerun repeats bit for "
        "bit; slower on a GPU; an operation without a deterministic kernel stops the cell",
    )

    def __post_init__(self) -> None:
        # A word, alias or recorded string (a result's, a spec's) becomes the one type.
        object.__setattr__(self, "precision", Precision.of(self.precision))

    def to_dict(self) -> dict:
        """The recipe as a result records it: precision as results always have
        (`Precision.recorded`), every other entry as is."""
        return {**asdict(self), "precision": self.precision.recorded()}


PROTOCOL_RECIPE = Recipe()
# Recipe fields that name a protocol variant rather than a departure from it: a table may
# use either value, but never mixes them (summarize labels the table with the value).
VARIANT_FIELDS: tuple[str, ...] = ("selection_split",)


def recipe_fields(scope: str) -> tuple[str, ...]:
    """The recipe entries whose values must agree at `scope` (table, model or cell)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; valid: {', '.join(SCOPES)}")
    return tuple(f.name for f in fields(Recipe) if f.metadata["scope"] == scope)


# The recipe entries every planned cell command spells out (`recipe_argv`), in this order;
# the others keep the protocol's value unless a user's extra run arguments set them.
SPELLED_OUT: tuple[str, ...] = (
    "weight_decay",
    "adam_beta2",
    "warmup_ratio",
    "batch_size",
    "early_stop",
    "patience",
    "epoch_cap",
    "max_steps",
    "max_seq_len",
    "precision",
    "selection_split",
)


def recipe_arguments(group) -> None:
    """Add a flag for every recipe entry that has one to an argparse group, with the
    protocol's value as its default: `run`'s recipe flags are declared here only."""
    add_flags(group, Recipe)


def recipe_flag(name: str) -> str:
    """The `run` flag that sets recipe entry `name` (`batch_size` -> `--bsz`)."""
    return flag_of(Recipe, name)


def recipe_from_args(args: argparse.Namespace, **others) -> Recipe:
    """The Recipe a namespace parsed with `recipe_arguments` describes; `others` sets the
    entries without a flag (the loader's mode and settings)."""
    flagged = {e.name: getattr(args, e.name) for e in fields(Recipe) if e.metadata["flag"]}
    return Recipe(**flagged, **others)


def changed_entries(recipe: Recipe, base: Recipe = PROTOCOL_RECIPE) -> tuple[str, ...]:
    """The flagged recipe entries whose value in `recipe` is not `base`'s, in field order."""
    return tuple(
        e.name
        for e in fields(Recipe)
        if e.metadata["flag"] and getattr(recipe, e.name) != getattr(base, e.name)
    )


def recipe_argv(recipe: Recipe, names: tuple[str, ...] = SPELLED_OUT) -> list[str]:
    """The flags that set `names` of `recipe` on a `run` command line, in that order: the
    one serialiser of a recipe to argv (plans, launch scripts, experiment files)."""
    return flags_argv(recipe, names)


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


def eval_interval(steps_per_epoch: int, max_steps: int, recipe: Recipe = PROTOCOL_RECIPE) -> int:
    """Dev evaluation cadence: once an epoch, but at least every `recipe.eval_every_max` steps
    on large tasks, and at least `recipe.min_evals_when_capped` times when max_steps ends
    training early."""
    cap_every = math.ceil(max_steps / recipe.min_evals_when_capped)
    return max(1, min(steps_per_epoch, recipe.eval_every_max, cap_every))


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


def nearest_grid_lr(lr: float) -> tuple[str, float]:
    """The grid key and value nearest `lr` on the grid's log scale (a positive `lr`), to name
    in the refusal of an off-grid learning rate."""
    return min(LR_GRID.items(), key=lambda item: abs(math.log(item[1] / lr)))


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
    recorded, protocol = recipe.to_dict(), PROTOCOL_RECIPE.to_dict()  # as results name them
    for entry in fields(Recipe):
        expected, got = protocol[entry.name], recorded[entry.name]
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
