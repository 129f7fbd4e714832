"""What a phase runs: its cells (model, task, LR, seed), the units processes run them in, and
each unit's `encoder_eval.run` arguments. `emit.py` turns a Plan into launch scripts;
`sweep.py` is the command line. Nothing here imports torch: it runs on a login node.

The probe phase (`build_probe_plan`) is the same machinery for linear probes on frozen
embeddings: a cell is one (model, pooling, task) probe result, a unit every pooling of one
(model, task), run by one `encoder_eval.probe` process (one forward pass serves them all).
Building a probe plan imports `embed` (torch) once, for its list of poolings.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.cells.probe_cell import result_path
from encoder_eval.cells.probe_flags import (
    DEFAULT_POOLINGS,
    ProbeFlags,
    probe_parser,
)
from encoder_eval.cells.probing import DEFAULT_K_FOLDS, DEFAULT_SEED, ProbeConfig
from encoder_eval.cells.run_flags import RunFlags, run_parser
from encoder_eval.cells.unit_spec import (
    FINETUNE,
    MODULES,
    PROBE,
    PROBE_SETTINGS,
    UnitSpec,
    cell_flag_values,
)
from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.flags import flags_argv
from encoder_eval.core.protocol import (
    DEVICES,
    LR_GRID,
    PHASE_SEEDS,
    PHASES,
    PRECISION_FLAG,
    PROBE_PHASE,
    PROTOCOL_RECIPE,
    SELECTION_SPLITS,
    SPELLED_OUT,
    Precision,
    Recipe,
    changed_entries,
    check_seed,
    lr_for_key,
    lr_key_for,
    precision_word,
    recipe_argv,
)
from encoder_eval.core.results import cell_state, result_filename
from encoder_eval.data.limit import check_limit
from encoder_eval.data.models import (
    MODEL_REGISTRY,
    ModelEntry,
    check_model_path,
    model_entry,
    parse_model_spec,
    registry_trusts,
)
from encoder_eval.data.taskfile import register_task_files
from encoder_eval.data.tasks import resolve_task_names

__all__ = [
    "Cell",
    "CellSettings",
    "Plan",
    "PlanInputs",
    "ProbeSettings",
    "build_plan",
    "build_probe_plan",
]

# The module a unit's process runs, by the plan's kind of cell: `unit_spec.MODULES`.
# How many cells share one `encoder_eval.run` process (see `Plan.units`).
GROUPS = ("pair", "lr", "cell")
# Flags that define a cell's identity, or what code and weights it runs (remote code needs
# the user's own word, `--trust-remote-code MODEL`); --extra-run-args must not set them. They
# are found by parsing the extra arguments with the cell command's own parser.
_RESERVED_RUN_FLAGS = (
    "--model-key",
    "--model-path",
    "--mode",
    "--task",
    "--lr",
    "--seed",
    "--phase",
    "--results-dir",
    "--out-json",
    "--skip-existing",
    "--tasks-file",
    "--trust-remote-code",
    "--no-trust-remote-code",
    "--cache-dir",
    "--model-revision",
    "--model-code-revision",
)
# The same for a probe unit's `encoder_eval.probe` flags.
_RESERVED_PROBE_FLAGS = (
    "--model",
    "--tasks",
    "--pooling",
    "--results-dir",
    "--k-folds",
    "--seed",
    "--max-seq-len",
    PRECISION_FLAG,
    "--device",
    "--data-dir",
    "--tasks-file",
    "--trust-remote-code",
    "--force",
    "--model-revision",
    "--model-code-revision",
)

# ----------------------------------------------------------------------------- parsing helpers


def split_csv(text: str | None) -> list[str]:
    """`'a, b,,c'` -> `['a', 'b', 'c']` (order kept, duplicates dropped); None -> []."""
    out: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if item and item not in out:
            out.append(item)
    return out


def parse_seeds(text: str | None, flag: str = "--seeds") -> list[int] | None:
    """Parse a comma-separated seed list (None when the flag was not given)."""
    if text is None:
        return None
    try:
        seeds = [int(s) for s in split_csv(text)]
    except ValueError:
        raise HarnessError(
            f"{flag} {text!r} must be comma-separated integers, e.g. 42,43"
        ) from None
    if not seeds:
        raise HarnessError(f"{flag} is empty; give at least one seed, e.g. {flag} 42")
    for seed in seeds:
        check_seed(seed, flag)
    return seeds


# The recipe entries an experiment file records as its own fields (`recipe.max_steps`,
# `recipe.max_seq_len`, `selection_split`); the others are its `[recipe]` entries
# (`Plan.recipe_entries`).
TYPED_ENTRIES = ("max_steps", "max_seq_len", "selection_split")


def parse_lr_keys(text: str | None) -> list[str] | None:
    """Parse `--lr-keys lr03,lr06` against the grid (None when the flag was not given)."""
    if text is None:
        return None
    keys = split_csv(text)
    if not keys:
        raise HarnessError("--lr-keys is empty; give grid keys such as lr03,lr06")
    for key in keys:
        lr_for_key(key)  # raises with the valid keys
    return sorted(keys, key=lambda k: LR_GRID[k])


def model_table(extra_specs: list[str] | None = None) -> tuple[dict[str, tuple], list[str]]:
    """The registry merged with `--model NAME=PATH[:MODE]` additions, and the added names."""
    table = dict(MODEL_REGISTRY)
    added = []
    for spec in extra_specs or []:
        name, entry = parse_model_spec(spec)
        entry = entry._replace(path=check_model_path(spec, entry.path))
        if name in MODEL_REGISTRY:
            raise HarnessError(
                f"--model {name}=... shadows the registry model {name!r}; choose another NAME"
            )
        if name in added:
            raise HarnessError(f"--model {name}=... is given twice; give each NAME once")
        table[name] = tuple(entry)
        added.append(name)
    return table, added


def resolve_models(
    models: list[str] | None,
    extra_specs: list[str] | None = None,
    trusted: Sequence[str] = (),
    pins: dict[str, tuple[str | None, str | None]] | None = None,
) -> dict[str, ModelEntry]:
    """Which models a sweep covers: `models` (names of the registry or of additions), else the
    additions when there are any, else the whole registry.

    Remote code is on for the names in `trusted` (the user's `--trust-remote-code`) and for
    registry rows that say so (from their own Hub id); never from a file. `pins`: name ->
    (weights revision, code revision), from an experiment file; a registry row's own pins
    otherwise."""
    table, added = model_table(extra_specs)
    names = models if models else (added or list(MODEL_REGISTRY))
    for name in trusted:
        if name not in table:
            raise HarnessError(
                f"--trust-remote-code names {name!r}, which is no model of "
                f"this sweep ({', '.join(names)})"
            )
    out = {}
    for name in names:
        if name not in table:
            raise unknown_name("model", name, table)
        entry = model_entry(name, table)
        trust = name in trusted or registry_trusts(name, entry.path)
        entry = entry._replace(trust_remote_code=trust)
        if pins and name in pins:
            revision, code_revision = pins[name]
            entry = entry._replace(
                revision=revision or entry.revision,
                code_revision=code_revision or entry.code_revision,
            )
        out[name] = entry
    return out


def resolve_tasks(tasks: list[str] | None) -> list[str]:
    """Task keys of `--tasks` (keys and the groups of `tasks.TASK_GROUPS`; default: the
    multilingual tasks); unknown names raise with the valid ones."""
    return resolve_task_names(tasks)


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Cell:
    """One (model, task, learning rate, seed) of a phase, with how to load its model.

    A probe cell (`pooling` set) is one (model, pooling, task) of the probe phase: `seed` is
    the folds' seed, `lr_key` and `lr` are empty ("" and 0.0)."""

    model: str
    model_path: str
    mode: str
    trust_remote_code: bool
    task: str
    lr_key: str
    lr: float
    seed: int
    phase: str
    pooling: str | None = None
    revision: str | None = None  # the weights' pin (`--model-revision`)
    code_revision: str | None = None  # another repository's remote code (`--model-code-revision`)

    @property
    def kind(self) -> str:
        return FINETUNE if self.pooling is None else PROBE

    @property
    def filename(self) -> str:
        if self.pooling is not None:
            return result_path(Path(""), self.model, self.pooling, self.task).name
        return result_filename(self.model, self.task, self.lr, self.seed)

    @property
    def pair(self) -> tuple[str, str]:
        return (self.model, self.task)

    @property
    def label(self) -> str:
        if self.pooling is not None:
            return f"{self.model}/{self.task}/{self.pooling}"
        return f"{self.model}/{self.task}/{self.lr_key}/s{self.seed}"


@dataclass(frozen=True)
class ProbeSettings:
    """What every unit of a probe plan passes to `encoder_eval.probe` besides its cells and
    its recipe (length, limit). Given to `build_probe_plan` as asked (defaults:
    `encoder_eval.probe`'s); the plan holds them checked, a precision as its word."""

    poolings: tuple[str, ...] = DEFAULT_POOLINGS
    k_folds: int = DEFAULT_K_FOLDS
    seed: int = DEFAULT_SEED
    precision: str = Precision.BF16.value

    @classmethod
    def asked(cls, **values: object) -> ProbeSettings:
        """The settings a command's flags ask for (a value None: not given, the default)."""
        return cls(**{name: value for name, value in values.items() if value is not None})


@dataclass(frozen=True)
class PlanInputs:
    """What every phase's plan covers and where its cells run, as the caller asks it
    (`build_plan` and `build_probe_plan` check it): the models (`resolve_models`: names,
    `--model NAME=PATH[:MODE]` additions, the names allowed remote code, per-model
    (weights, code) revision pins), the tasks and the user task files that define some,
    the data directory, the device and the results directory. Empty means the default."""

    results_dir: str | os.PathLike
    models: tuple[str, ...] = ()
    extra_models: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    tasks_files: tuple[str | os.PathLike, ...] = ()
    trust_remote_code: tuple[str, ...] = ()
    pins: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    data_dir: str | os.PathLike | None = None
    device: str | None = None

    def __post_init__(self) -> None:
        for name in ("models", "extra_models", "tasks", "tasks_files", "trust_remote_code"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        object.__setattr__(self, "pins", dict(self.pins or {}))


@dataclass(frozen=True)
class CellSettings:
    """What every cell of a plan runs with beyond its identity: the recipe, typed (for a
    probe plan only its length and limit count), `run --report-to` (None: none), and the
    cell flags the harness does not model, in the cell command's one spelling.

    Cell flags given as text (`sweep --extra-run-args`, an older experiment file's
    `extra_run_args`) become settings once, at the edge (`from_argv`); an experiment file's
    typed `[recipe]` becomes settings without flags (`Experiment.cell_settings`)."""

    recipe: Recipe = PROTOCOL_RECIPE
    report_to: str | None = None
    extra_run_args: tuple[str, ...] = ()
    # The recipe entries the text named (`from_argv`), also those it set to the protocol's
    # value; None: the entries that differ from the protocol. Not part of the settings.
    named: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_run_args", tuple(self.extra_run_args))

    @classmethod
    def from_argv(cls, argv: Sequence[str], kind: str = FINETUNE) -> CellSettings:
        """Cell flags given as text, read once by the cell command's own parser
        (`unit_spec.cell_flag_values`): the recipe entries they set, `--report-to` and the
        rest. A list that parser cannot read, or that asks it to print and exit (`--help`),
        stays as given (the plan refuses it, saying why)."""
        try:
            values, report_to, rest = cell_flag_values(list(argv), kind)
        except (HarnessError, SystemExit):
            return cls(extra_run_args=tuple(argv))
        recipe = dataclasses.replace(PROTOCOL_RECIPE, **values)
        return cls(recipe, report_to, tuple(rest), tuple(values))

    def over(self, base: CellSettings) -> CellSettings:
        """These settings (given on the command line) on top of `base` (an experiment
        file's): each recipe entry these name wins and `base` keeps every other entry it
        sets; `--report-to`, and the flags the harness does not model, likewise as a whole.
        So `--extra-run-args '--pad-multiple 32'` adds to an experiment's `[recipe]`
        instead of dropping its precision or limit."""
        named = set(changed_entries(self.recipe) if self.named is None else self.named)
        kept = {n: getattr(base.recipe, n) for n in changed_entries(base.recipe) if n not in named}
        return CellSettings(
            dataclasses.replace(self.recipe, **kept),
            self.report_to or base.report_to,
            self.extra_run_args or base.extra_run_args,
        )

    def argv(self) -> list[str]:
        """These settings as cell flags in their one spelling and order, for a message or
        a comparison of flag lists: the recipe entries that differ from the protocol
        (`recipe_argv`), `--report-to`, then the flags the harness does not model."""
        return [
            *recipe_argv(self.recipe, changed_entries(self.recipe)),
            *(["--report-to", self.report_to] if self.report_to else []),
            *self.extra_run_args,
        ]

    def given(self, *, report_to: str | None = None, **entries: object) -> CellSettings:
        """These settings with the recipe entries (and `--report-to`) a command's own flags
        give (None: not given); a given value that contradicts one these settings set
        (from `--extra-run-args` or an experiment) is refused, naming both."""
        recipe, changed = self.recipe, set(changed_entries(self.recipe))
        values: dict[str, object] = {}
        for name, value in entries.items():
            if value is None:
                continue
            if name == "precision":
                value = Precision.of(str(value))
            if name in changed and getattr(recipe, name) != value:
                asked = recipe_argv(dataclasses.replace(recipe, **{name: value}), (name,))
                raise HarnessError(
                    f"{shlex.join(asked)} contradicts {shlex.join(recipe_argv(recipe, (name,)))}"
                    " of --extra-run-args or of the select phase's experiment; give one value"
                )
            values[name] = value
        if report_to and self.report_to and report_to != self.report_to:
            raise HarnessError(
                f"--report-to {report_to} contradicts --report-to {self.report_to} of "
                "--extra-run-args or of the select phase's experiment; give one value"
            )
        return dataclasses.replace(
            self,
            recipe=dataclasses.replace(recipe, **values),
            report_to=report_to or self.report_to,
        )


@dataclass
class Plan:
    """Every cell of one phase plus what each cell command needs besides its identity."""

    phase: str
    cells: list[Cell]
    results_dir: str
    # Every cell's recipe (limit and precision included); for a probe plan, its length and
    # limit (the probe's own settings are `probe`).
    recipe: Recipe = PROTOCOL_RECIPE
    data_dir: str | None = None
    device: str = "auto"
    report_to: str | None = None  # `run --report-to` for every cell (None: none)
    # Cell flags the plan does not model (no recipe entry, no --report-to), as given.
    extra_run_args: list[str] = field(default_factory=list)
    tasks_files: list[str] = field(default_factory=list)  # absolute paths, given to every run
    shrunk: list[str] = field(default_factory=list)  # how this plan departs from the protocol
    probe: ProbeSettings | None = None  # set for the probe phase (`build_probe_plan`)

    @property
    def kind(self) -> str:
        """FINETUNE (select, report) or PROBE: which kind of cell the plan holds."""
        return FINETUNE if self.probe is None else PROBE

    @property
    def module(self) -> str:
        """The module a unit's process runs (`python -m MODULE RUN_ARGS...`)."""
        return MODULES[self.kind]

    @property
    def max_steps(self) -> int:
        return self.recipe.max_steps

    @property
    def max_seq_len(self) -> int:
        return self.recipe.max_seq_len

    @property
    def selection_split(self) -> str:
        return self.recipe.selection_split

    def out_json(self, cell: Cell) -> str:
        return os.path.join(self.results_dir, cell.filename)

    def recipe_args(self) -> list[str]:
        """The recipe, flag by flag, each once (`recipe_argv`): the entries every cell
        spells out (`SPELLED_OUT`), then any other the plan changes (`--limit`,
        `--micro-batch`...); for a probe plan, the probe's settings and its limit."""
        if self.probe is not None:
            return flags_argv(self._probe_flags(), PROBE_SETTINGS)
        others = tuple(n for n in changed_entries(self.recipe) if n not in SPELLED_OUT)
        return recipe_argv(self.recipe, SPELLED_OUT + others)

    def recipe_entries(self) -> dict:
        """The recipe entries an experiment file records in `[recipe]` beyond its own
        fields (`TYPED_ENTRIES`): those that differ from the protocol, typed, a precision
        as its word."""
        return {
            name: getattr(self.recipe, name)
            for name in changed_entries(self.recipe)
            if name not in TYPED_ENTRIES
        }

    def unit_spec(self, cells: list[Cell]) -> UnitSpec:
        """The spec of one unit (`cells/unit_spec.py`): what its process runs, typed.

        A unit is every (LR, seed) combination of its LRs and seeds for one (model, task):
        the process runs them LR by LR, each LR's seeds in order (see `Plan.units`). For a
        probe plan, every pooling of one (model, task). The plan's extra run arguments (flags
        it does not model) are set on it as the cell command's parser reads them."""
        if self.probe is not None:
            first = cells[0]
            poolings = list(dict.fromkeys(c.pooling for c in cells))
            if any(c.pair != first.pair for c in cells) or len(poolings) != len(cells):
                raise ValueError("unit_spec takes the cells of one unit (poolings of one pair)")
            spec = UnitSpec(PROBE, self._probe_flags(first, poolings))
            return spec.with_extra(self.extra_run_args)
        first = cells[0]
        lrs = list(dict.fromkeys(c.lr for c in cells))
        seeds = list(dict.fromkeys(c.seed for c in cells))
        if (
            any(c.pair != first.pair for c in cells)
            or len(cells) != len(lrs) * len(seeds)
            or ({(c.lr, c.seed) for c in cells} != {(lr, s) for lr in lrs for s in seeds})
        ):
            raise ValueError("unit_spec takes the cells of one unit (LRs x seeds of one pair)")
        flags = RunFlags(
            model_key=first.model,
            model_path=first.model_path,
            mode=first.mode,
            task=first.task,
            lr=",".join(f"{lr:g}" for lr in lrs),
            seed=",".join(map(str, seeds)),
            phase=self.phase,
            results_dir=self.results_dir,
            skip_existing=True,
            trust_remote_code=first.trust_remote_code,
            model_revision=first.revision or None,
            model_code_revision=first.code_revision or None,
            device=self.device,
            data_dir=self.data_dir or None,
            tasks_file=list(self.tasks_files) or None,
            # run then marks the result off-protocol
            allow_off_protocol=any(s not in PHASE_SEEDS[self.phase] for s in seeds),
            progress="json",
            report_to=self.report_to or "none",
        )
        return UnitSpec(FINETUNE, flags, self.recipe).with_extra(self.extra_run_args)

    def run_args(self, cells: list[Cell]) -> list[str]:
        """Arguments of `python -m encoder_eval.run` (for a probe plan `encoder_eval.probe`)
        that run one unit by hand: its spec's command line (`UnitSpec.argv`), each recipe
        flag once, with its value, so a log or `ps` shows what the cell runs with."""
        return self.unit_spec(cells).argv()

    def cell_configs(self, unit: list[Cell]) -> list:
        """The checked configurations of one unit, exactly as its launch script runs them:
        its spec (`unit_spec`) planned by the cell's own planner (`runner.plan_cells`:
        `cell_config.CellConfig`s; for a probe plan, one `probe_cell.ProbeRun`). How `track`
        runs a unit in process, so the cells a receipt reads are the ones a script would
        run. Imports torch."""
        return spec_configs(self.unit_spec(unit))

    def _probe_flags(self, first: Cell | None = None, poolings: Sequence[str] = ()) -> ProbeFlags:
        """A probe unit's flags: the plan's settings, and with `first` its cells' model,
        task and `poolings`."""
        p = self.probe
        flags = ProbeFlags(
            k_folds=p.k_folds,
            seed=p.seed,
            max_seq_len=self.max_seq_len,
            precision=p.precision,
            limit=self.recipe.limit,
            results_dir=self.results_dir,
            device=self.device,
            data_dir=self.data_dir or None,
            tasks_file=list(self.tasks_files) or None,
        )
        if first is None:
            return flags
        # The mode suffix keeps a ':' in the path's last part from reading as one (the probe
        # itself ignores the mode: it loads the encoder body).
        return dataclasses.replace(
            flags,
            model=[f"{first.model}={first.model_path}:{first.mode}"],
            tasks=first.task,
            pooling=",".join(poolings),
            trust_remote_code=first.trust_remote_code,
            model_revision=first.revision or None,
            model_code_revision=first.code_revision or None,
        )

    def units(self, cells: list[Cell] | None = None, group: str = "pair") -> list[list[Cell]]:
        """Split cells into units, each run by one process, in plan order.

        group "pair": every cell of one (model, task), when they are all combinations of
        their LRs and seeds (a plan's always are; a subset that is not, e.g. from `status
        --emit`, falls back to one unit per LR); "lr": the seeds of one (model, task, LR);
        "cell": one cell per unit.
        """
        if group not in GROUPS:
            raise HarnessError(f"--group {group!r} must be one of {', '.join(GROUPS)}")
        if self.probe is not None and group != "pair":
            raise HarnessError(
                f"--group {group}: a probe sweep runs one process per (model, task), every "
                "pooling from one forward pass; drop --group"
            )
        if group == "cell":
            return [[c] for c in (self.cells if cells is None else cells)]
        by_pair: dict[tuple, list[Cell]] = {}
        for cell in self.cells if cells is None else cells:
            by_pair.setdefault(cell.pair, []).append(cell)
        if self.probe is not None:
            return list(by_pair.values())
        units = []
        for pair_cells in by_pair.values():
            by_lr: dict[float, list[Cell]] = {}
            for cell in pair_cells:
                by_lr.setdefault(cell.lr, []).append(cell)
            seed_sets = {tuple(sorted(c.seed for c in v)) for v in by_lr.values()}
            if group == "pair" and len(seed_sets) == 1:
                seeds = [c.seed for c in next(iter(by_lr.values()))]
                units.append([c for lr in by_lr for s in seeds for c in by_lr[lr] if c.seed == s])
            else:
                units.extend(by_lr.values())
        return units

    def cell_state(self, cell: Cell) -> str:
        """'ok' or 'diverged' (done), 'missing', 'corrupt' or 'kept', by `results.cell_state`
        with the cell's model and task (one rule for fine-tune and probe cells)."""
        return self.cell_status(cell)[0]

    def cell_status(self, cell: Cell) -> tuple[str, dict | None, str | None]:
        """`cell_state`'s (state, data, why) of one cell of this plan (either kind)."""
        return cell_state(self.out_json(cell), self.phase, model=cell.model, task=cell.task)


def spec_configs(spec: UnitSpec) -> list:
    """The checked configurations a unit's spec runs (`runner.plan_cells` for a fine-tune
    unit, one `probe_cell.ProbeRun` for a probe unit), from its values. Imports torch."""
    if spec.kind == PROBE:
        from encoder_eval.cells import probe_cell

        return [probe_cell.run_from_args(spec.namespace())]
    from encoder_eval.cells import runner

    return runner.plan_cells(spec.namespace())


def check_file_names(cells: list[Cell]) -> None:
    """Refuse a plan in which two models (or tasks) would write one result file (`a/b` and
    `a_b` both give `a_b_...`): each would count the other's result as its own."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        other = seen.setdefault(cell.filename, cell)
        if other.pair != cell.pair:
            raise HarnessError(
                f"model {other.model!r} on task {other.task!r} and model {cell.model!r} on "
                f"task {cell.task!r} would write one result file ({cell.filename}), each "
                "counting the other's result as its own; give one of the models another name "
                "(--model NAME=PATH)"
            )


def _models_and_tasks(inputs: PlanInputs) -> tuple[dict[str, ModelEntry], list[str], list[str]]:
    """What every phase's plan covers: the models (`resolve_models`: remote code, pins), the
    tasks (`resolve_tasks`, after the user task files are registered, so their tasks are
    known) and those files as absolute paths (each cell's run reads them too)."""
    resolved = resolve_models(
        list(inputs.models) or None,
        list(inputs.extra_models),
        inputs.trust_remote_code,
        inputs.pins or None,
    )
    files = [os.path.abspath(f) for f in inputs.tasks_files]
    register_task_files(files)
    return resolved, resolve_tasks(list(inputs.tasks) or None), files


def _cell(
    name: str,
    entry: ModelEntry,
    task: str,
    lr_key: str,
    lr: float,
    seed: int,
    phase: str,
    pooling: str | None = None,
) -> Cell:
    """A cell of model `name`, loaded as its resolved `entry` says (local paths absolute)."""
    return Cell(
        name,
        _abs_if_local(entry.path),
        entry.mode,
        bool(entry.trust_remote_code),
        task,
        lr_key,
        lr,
        seed,
        phase,
        pooling,
        entry.revision,
        entry.code_revision,
    )


def _abs_if_local(path: str) -> str:
    """Absolute path for a local model directory (jobs may start elsewhere); Hub ids unchanged."""
    return os.path.abspath(path) if os.path.exists(path) else path


def _check_run_inputs(
    inputs: PlanInputs,
    settings: CellSettings,
    kind: str,
    reserved: tuple[str, ...],
    per: str,
    parser: Callable[[], argparse.ArgumentParser],
) -> tuple[str, list[str], str | None]:
    """The device, extra run arguments and data directory every phase's plan takes,
    checked: (device, extra args, absolute data dir or None). The extra arguments are
    parsed with the cell command's own `parser()`, so a flag is found however it is
    spelled; any of `reserved` is refused, as is anything that command would refuse or a
    flag the settings model (a recipe entry, `--report-to`: `CellSettings.from_argv` reads
    those out of text)."""
    device = inputs.device or "auto"
    if device not in DEVICES:
        raise HarnessError(f"--device {device!r} must be auto, cuda or cpu")
    extra = list(settings.extra_run_args)
    if extra:
        _refuse_reserved(extra, parser(), reserved, per)
        read = CellSettings.from_argv(extra, kind)
        flags = read.argv()  # the modelled flags first, then the others
        modelled = flags[: len(flags) - len(read.extra_run_args)]
        if modelled:
            raise HarnessError(
                f"--extra-run-args {shlex.join(extra)!r} sets {shlex.join(modelled)}, which "
                "the plan models: give it in the plan's settings (its recipe, report_to)"
            )
        extra = list(read.extra_run_args)
    data_dir = inputs.data_dir
    if data_dir is not None:
        if not Path(data_dir).is_dir():
            raise HarnessError(f"--data-dir {data_dir} is not a directory; give the mirror's path")
        data_dir = os.path.abspath(data_dir)
    return device, extra, None if data_dir is None else str(data_dir)


def _refuse_reserved(
    extra: list[str], parser: argparse.ArgumentParser, reserved: tuple[str, ...], per: str
) -> None:
    """Parse `extra` as the cell command would, and refuse it when it sets a flag of
    `reserved` (by the flag's destination: `--no-x` sets what `--x` does) or does not parse."""
    shown = shlex.join(extra)

    def fail(message: str):
        raise HarnessError(f"--extra-run-args {shown!r}: {message}")

    for action in parser._actions:  # None: not given (a given flag stores a value)
        action.required = False
        action.default = None
    parser.error = fail  # type: ignore[method-assign]
    try:
        given = parser.parse_args(extra)
    except SystemExit:  # --help or --version: printed, then exit
        fail("holds a flag that prints and exits (--help?)")
    for action in parser._actions:
        if getattr(given, action.dest, None) is None:
            continue
        if any(option in reserved for option in action.option_strings):
            spelled = next(
                (a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in action.option_strings),
                action.option_strings[0],
            )
            hint = (
                (
                    "; remote code is turned on by --trust-remote-code MODEL on the sweep's own "
                    "command line"
                )
                if "trust" in spelled
                else ""
            )
            raise HarnessError(
                f"--extra-run-args may not set {spelled}; the sweep sets it per {per}{hint}"
            )


def build_plan(
    phase: str,
    inputs: PlanInputs,
    settings: CellSettings = CellSettings(),
    *,
    lr_keys: list[str] | None = None,
    seeds: list[int] | None = None,
    selection: dict | None = None,
) -> Plan:
    """Expand a phase into its cells, checking every input; raises HarnessError on bad input.

    select: models x tasks x LR keys (default: the whole grid) x seeds (default 42-44).
    report: models x tasks x seeds (default 45-49) at each pair's LR in `selection`, with
    the selection split its select cells used (a recipe that asks for another split is
    refused). `inputs`: the models, tasks and places every phase shares (`PlanInputs`; user
    task files are registered before the tasks are resolved, and every cell's run reads
    them too); `settings`: every cell's recipe, `--report-to` and unmodelled flags.
    """
    if phase not in PHASES:
        raise HarnessError(f"--phase {phase!r} must be select or report")
    resolved, task_list, files = _models_and_tasks(inputs)
    shrunk = []
    if seeds is None:
        seeds = list(PHASE_SEEDS[phase])
    elif seeds != list(PHASE_SEEDS[phase]):
        shrunk.append(f"seeds {','.join(map(str, seeds))} (protocol: {list(PHASE_SEEDS[phase])})")
    if phase == "select":
        if selection is not None:
            raise HarnessError("--selection is for --phase report; drop it for --phase select")
        if lr_keys is None:
            lr_keys = list(LR_GRID)
        for key in lr_keys:
            lr_for_key(key)  # raises with the valid keys
        lr_keys = sorted(dict.fromkeys(lr_keys), key=LR_GRID.__getitem__)  # grid order
        if lr_keys != list(LR_GRID):
            shrunk.append(f"lr keys {','.join(lr_keys)} (protocol: all {len(LR_GRID)})")
    else:
        if lr_keys is not None:
            raise HarnessError(
                "--lr-keys is for --phase select; the report phase runs each pair's selected LR"
            )
        if selection is None:
            raise HarnessError(
                "--phase report needs --selection selection.json; "
                "create it with encoder-eval select"
            )
    device, extra, data_dir = _check_run_inputs(
        inputs, settings, FINETUNE, _RESERVED_RUN_FLAGS, "cell", run_parser
    )
    recipe = settings.recipe
    asked = recipe.selection_split if "selection_split" in changed_entries(recipe) else None
    recipe = dataclasses.replace(recipe, selection_split=_selection_split(phase, selection, asked))
    _check_recipe(recipe)
    shrunk += _departures(recipe)

    cells: list[Cell] = []
    missing_pairs = []
    for name, entry in resolved.items():
        for task in task_list:
            if phase == "select":
                pair_lrs = [(key, LR_GRID[key]) for key in lr_keys]
            else:
                chosen = selection.get("pairs", {}).get(name, {}).get(task) or {}
                if not chosen.get("lr_key"):
                    missing_pairs.append(f"{name}/{task}")
                    continue
                pair_lrs = [(chosen["lr_key"], float(chosen["lr"]))]
            for key, lr in pair_lrs:
                if lr_key_for(lr) != key:
                    raise HarnessError(
                        f"selection gives {name}/{task} lr {lr:g} under key {key!r}, which "
                        "disagrees with the grid; regenerate it with encoder-eval select"
                    )
                cells += [_cell(name, entry, task, key, lr, seed, phase) for seed in seeds]
    if missing_pairs:
        raise HarnessError(
            f"the selection has no selected LR for {len(missing_pairs)} pair(s): "
            f"{', '.join(missing_pairs)}; finish the select phase or narrow --models/--tasks"
        )
    check_file_names(cells)
    return Plan(
        phase=phase,
        cells=cells,
        results_dir=os.path.abspath(inputs.results_dir),
        recipe=recipe,
        data_dir=data_dir,
        device=device,
        report_to=settings.report_to,
        extra_run_args=extra,
        tasks_files=files,
        shrunk=shrunk,
    )


def _check_recipe(recipe: Recipe) -> None:
    """Refuse a plan's recipe whose step cap or length is under 1, or whose limit
    `limit.check_limit` refuses."""
    for name in ("max_steps", "max_seq_len"):
        if getattr(recipe, name) < 1:
            raise HarnessError(f"--{name.replace('_', '-')} must be at least 1")
    check_limit(recipe.limit)


def _departures(recipe: Recipe) -> list[str]:
    """How a plan's recipe shrinks the protocol, as the sweep's note names it."""
    out = []
    for name in ("max_steps", "max_seq_len"):
        value, protocol = getattr(recipe, name), getattr(PROTOCOL_RECIPE, name)
        if value != protocol:
            out.append(f"{name.replace('_', ' ')} {value} (protocol: {protocol})")
    if recipe.limit is not None:
        out.append(f"limit {recipe.limit}: a smoke run, every split cut to {recipe.limit} examples")
    if recipe.precision == "auto":  # each cell decides on its device
        out.append("precision auto: fp32 (off-protocol) where a cell's CPU has no native bf16")
    elif recipe.precision != PROTOCOL_RECIPE.precision:
        out.append(f"precision {precision_word(recipe.precision)} (protocol: bf16)")
    return out


def _selection_split(phase: str, selection: dict | None, requested: str | None) -> str:
    """The split that picks LRs and checkpoints: as requested, and for a report phase the
    one its select cells used (a report phase never contradicts its select phase)."""
    if requested is not None and requested not in SELECTION_SPLITS:
        raise HarnessError(f"--selection-split {requested!r}: valid: {', '.join(SELECTION_SPLITS)}")
    if phase != "report" or selection is None:
        return requested or PROTOCOL_RECIPE.selection_split
    used = {
        (entry.get("select_setup") or {}).get("selection_split")
        for by_task in selection.get("pairs", {}).values()
        for entry in by_task.values()
        if isinstance(entry, dict) and entry.get("lr_key")
    } - {None}
    if len(used) > 1:
        raise HarnessError(
            f"the selection mixes selection splits ({', '.join(sorted(used))}); "
            "select each variant into its own selection file"
        )
    chosen = next(iter(used), None) or requested or PROTOCOL_RECIPE.selection_split
    if requested is not None and requested != chosen:
        raise HarnessError(
            f"--selection-split {requested} contradicts the selection, whose select cells used "
            f"{chosen}; drop the flag (the report phase follows its select phase)"
        )
    return chosen


def build_probe_plan(
    inputs: PlanInputs,
    probe: ProbeSettings = ProbeSettings(),
    settings: CellSettings = CellSettings(),
) -> Plan:
    """The probe phase: one cell per (model, pooling, task), one unit per (model, task); raises
    HarnessError on bad input. `probe`: the probe's poolings, folds, seed and precision
    (defaults `encoder_eval.probe`'s: mean, 10 folds, seed 42, bf16); `settings`: its
    recipe's length (default 256) and limit, and `encoder_eval.probe` flags the plan does
    not model. Models and tasks are chosen as for the other phases (`inputs`)."""
    from encoder_eval.cells.embed import check_poolings  # the probe's rules (imports torch)

    resolved, task_list, files = _models_and_tasks(inputs)
    poolings = list(check_poolings(list(probe.poolings)))
    precision = precision_word(probe.precision or "bf16")  # refuses an unknown one
    seed = check_seed(probe.seed)
    try:
        k_folds = ProbeConfig(probe.k_folds, seed).k_folds
    except HarnessError as exc:
        raise HarnessError(f"--k-folds: {exc}") from None
    recipe = settings.recipe
    if recipe.max_seq_len < 1:
        raise HarnessError("--max-seq-len must be at least 1")
    device, extra, data_dir = _check_run_inputs(
        inputs, settings, PROBE, _RESERVED_PROBE_FLAGS, "unit", probe_parser
    )
    others = [n for n in changed_entries(recipe) if n not in ("max_seq_len", "limit")]
    if others:
        raise HarnessError(
            f"a probe plan's recipe sets its length and limit only, not {', '.join(others)}"
        )
    check_limit(recipe.limit)
    if settings.report_to:
        raise HarnessError("--report-to is for fine-tuning phases; a probe cell has no curves")
    cells = [
        _cell(name, entry, task, "", 0.0, seed, PROBE_PHASE, pooling)
        for name, entry in resolved.items()
        for task in task_list
        for pooling in poolings
    ]
    check_file_names(cells)
    return Plan(
        phase=PROBE_PHASE,
        cells=cells,
        results_dir=os.path.abspath(inputs.results_dir),
        recipe=recipe,
        data_dir=data_dir,
        device=device,
        extra_run_args=extra,
        tasks_files=files,
        probe=ProbeSettings(tuple(poolings), k_folds, seed, precision),
    )
