"""The experiment file: what a sweep ran, written once and read by every later command.

A sweep writes `experiment.toml` (`results.EXPERIMENT_NAME`) into its results directory and
beside its scripts: the models (path, loader mode, trust_remote_code), the tasks, the LR
keys and seeds, the recipe entries that differ from the protocol (`[recipe]`, typed:
`max_steps`, `max_seq_len`, `precision`, `limit`, ...), `report_to`, the data directory, the
device, the selection split, the cell flags the harness does not model (`extra_run_args`)
and, per phase, where it ran. Files written before the recipe was typed held its entries in
`extra_run_args`; they are read into `[recipe]` (`unit_spec.cell_flag_values`). A plan
takes the recipe typed (`Experiment.cell_settings`), never as flags. `select`, the report sweep,
`status` and `summarize` read it, so the shrinking flags are given once. A user may write
the file first and pass it with `sweep --experiment FILE`::

    version = 1
    tasks = ["synthetic_sentiment", "synthetic_nli"]
    lr_keys = ["lr06", "lr10"]
    device = "cpu"

    [models.all-minilm-l6-v2]
    path = "/path/to/all-MiniLM-L6-v2"   # relative paths are read from the file's folder
    mode = "auto"

    [seeds]
    select = [42, 43]
    report = [45, 46, 47]

    [recipe]
    max_steps = 40
    max_seq_len = 128
    precision = "fp32"      # any recipe entry that has a `run` flag, typed

A model table may also pin `revision` (the weights' commit) and `code_revision` (the code
another repository holds, when its config's `auto_map` names one). Its `trust_remote_code`
says what the model needs and is never a grant: a sweep refuses it unless the user's own
`--trust-remote-code NAME` (or the registry row, from its own Hub id) allows it.

`tasks` is a list of task keys (or group names), or a table whose entries are the tasks
that run: an empty `[tasks.glue_rte]` names a known task, a `[tasks.X]` with fields defines
task X inline (`taskfile.register_task_rows`). `tasks_files` lists task files
(`taskfile.register_task_files`). A field left out means the protocol's value.

A report phase runs as its select phase did: its sweep takes models, tasks, recipe
overrides, data directory, device and selection split from the experiment its selection
records, and refuses a flag that contradicts them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoder_eval.core.errors import HarnessError, quote, unknown_name
from encoder_eval.core.fileio import (
    DamagedFile,
    MissingFile,
    UnreadableFile,
    check_not_input,
    read_toml,
    write_atomic,
)
from encoder_eval.core.protocol import (
    DEVICES,
    LR_GRID,
    MAX_SEED,
    PHASE_SEEDS,
    PHASES,
    PROTOCOL_RECIPE,
    SELECTION_SPLITS,
    Precision,
    Recipe,
)
from encoder_eval.core.results import (
    EXPERIMENT_NAME,
    TASKS_FILE_PREFIX,
    is_own_file,
    is_probe_result_name,
    is_result_name,
)
from encoder_eval.data import taskfile
from encoder_eval.data.models import (
    MODEL_REGISTRY,
    all_modes,
    as_entry,
    check_model_name,
)
from encoder_eval.data.tasks import TASK_KNOBS, resolve_task_names
from encoder_eval.plans.plan import CellSettings
from encoder_eval.plans.redaction import REDACTED, redact_data, redact_text  # noqa: F401
from encoder_eval.plans.toml_text import dumps

VERSION = 1
_FIELDS = (
    "version",
    "phase",
    "models",
    "tasks",
    "tasks_files",
    "lr_keys",
    "seeds",
    "recipe",
    "data_dir",
    "device",
    "selection_split",
    "report_to",
    "extra_run_args",
    "phases",
)
_MODEL_FIELDS = ("path", "mode", "trust_remote_code", "revision", "code_revision")
# `[recipe]`: every recipe entry with a `run` flag but the selection split (its own field);
# max_steps and max_seq_len are the Experiment's own attributes, the others `recipe_entries`.
_RECIPE_FIELDS = tuple(
    e.name
    for e in dataclasses.fields(Recipe)
    if e.metadata.get("flag") and e.name != "selection_split"
)
_OWN_RECIPE_FIELDS = ("max_steps", "max_seq_len")
_PHASE_FIELDS = ("results_dir", "out_dir", "selection")


@dataclass(frozen=True)
class ModelSpec:
    """How one model loads: Hub id or local directory, loader mode, trust_remote_code (in a
    file: what the model needs, never a grant: the user's `--trust-remote-code` is), and the
    pins of its weights' and its remote code's revisions."""

    path: str
    mode: str = "auto"
    trust_remote_code: bool = False
    revision: str | None = None
    code_revision: str | None = None

    @classmethod
    def of(cls, entry) -> ModelSpec:
        """The spec of a `models.ModelEntry` (a registry row)."""
        return cls(
            entry.path,
            entry.mode,
            bool(entry.trust_remote_code),
            entry.revision,
            entry.code_revision,
        )


@dataclass(frozen=True)
class PhaseRecord:
    """Where a phase ran: its results and scripts, and (report) the selection it ran from."""

    results_dir: str | None = None
    out_dir: str | None = None
    selection: str | None = None


@dataclass
class Experiment:
    """Everything that decides which cells a protocol run has and how they run.

    None (or empty) means "not stated": the protocol's value, or the command line's.
    """

    models: dict[str, ModelSpec] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)
    tasks_files: list[str] = field(default_factory=list)
    task_rows: dict[str, dict] = field(default_factory=dict)  # inline [tasks.X] definitions
    lr_keys: list[str] | None = None
    seeds: dict[str, list[int]] = field(default_factory=dict)  # phase -> seeds
    max_steps: int | None = None
    max_seq_len: int | None = None
    data_dir: str | None = None
    device: str | None = None
    selection_split: str | None = None
    # The other recipe entries that differ from the protocol, typed (precision as its word).
    recipe_entries: dict[str, Any] = field(default_factory=dict)
    report_to: str | None = None  # `run --report-to` for every cell
    # Cell flags the harness does not model (no recipe entry, no --report-to).
    extra_run_args: list[str] = field(default_factory=list)
    phases: dict[str, PhaseRecord] = field(default_factory=dict)
    phase: str | None = None  # the phase of the sweep that wrote the file (None: user-written)
    version: int = VERSION

    def cell_settings(self) -> CellSettings:
        """What this experiment sets for every cell beyond its own fields (max_steps,
        max_seq_len, selection_split), typed, as a plan takes it: its `[recipe]` entries,
        `report_to` and `extra_run_args` (`plan.CellSettings`; no flags between)."""
        entries = {
            name: Precision.of(value) if name == "precision" else value
            for name, value in self.recipe_entries.items()
        }
        recipe = dataclasses.replace(PROTOCOL_RECIPE, **entries)
        return CellSettings(recipe, self.report_to, tuple(self.extra_run_args))

    def redacted(self) -> Experiment:
        """This experiment without local paths (model directories, the data directory, task
        files, where the phases ran), for a file meant to be shared; Hub ids stay."""
        replace = dataclasses.replace

        def local(path: str) -> bool:
            return os.path.isabs(path) or path.startswith(("~", "."))

        return replace(
            self,
            models={
                n: replace(m, path=REDACTED) if local(m.path) else m for n, m in self.models.items()
            },
            data_dir=None if self.data_dir is None else REDACTED,
            tasks_files=[REDACTED for _ in self.tasks_files],
            extra_run_args=[redact_text(arg) for arg in self.extra_run_args],
            phases={p: PhaseRecord() for p in self.phases},
        )

    def to_dict(self) -> dict:
        """The file's content as plain data (TOML tables; None entries left out)."""
        out: dict[str, Any] = {"version": self.version}
        if self.phase is not None:
            out["phase"] = self.phase
        if self.task_rows:
            out["tasks"] = {t: dict(self.task_rows.get(t, {})) for t in self.tasks}
        else:
            out["tasks"] = list(self.tasks)
        out["tasks_files"] = list(self.tasks_files)
        if self.lr_keys is not None:
            out["lr_keys"] = list(self.lr_keys)
        for name in ("data_dir", "device", "selection_split", "report_to"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out["extra_run_args"] = list(self.extra_run_args)
        out["models"] = {
            name: {
                "path": m.path,
                "mode": m.mode,
                "trust_remote_code": m.trust_remote_code,
                **{k: v for k in _MODEL_FIELDS[3:] if (v := getattr(m, k)) is not None},
            }
            for name, m in self.models.items()
        }
        out["seeds"] = {p: list(s) for p, s in self.seeds.items()}
        out["recipe"] = {
            **{k: getattr(self, k) for k in _OWN_RECIPE_FIELDS if getattr(self, k) is not None},
            **{k: _toml_entry(v) for k, v in self.recipe_entries.items() if v is not None},
        }
        out["phases"] = {
            p: {k: v for k in _PHASE_FIELDS if (v := getattr(r, k)) is not None}
            for p, r in self.phases.items()
        }
        return out


# ----------------------------------------------------------------------------- reading


class _Reader:
    """Checks one file's fields, naming the file, the field and the valid values."""

    def __init__(self, source: str, base_dir: Path | None):
        self.source = source
        self.base_dir = base_dir

    def fail(self, where: str, problem: str) -> HarnessError:
        return HarnessError(f"{self.source}: {where} {problem}")

    def known(self, table: dict, valid: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in valid:
                err = unknown_name("field", key, valid)
                raise HarnessError(f"{self.source}: {where}{err}")

    def table(self, value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table, got {quote(value)}")
        return value

    def string(self, value: Any, where: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"must be a non-empty string, got {quote(value)}")
        if choices is not None and value not in choices:
            raise self.fail(where, f"is {quote(value)}; valid values: {', '.join(choices)}")
        return value

    def strings(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(where, f"must be a list of strings, got {quote(value)}")
        return list(dict.fromkeys(value))

    def integer(self, value: Any, where: str, minimum: int, maximum: int | None = None) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < minimum
            or (maximum is not None and value > maximum)
        ):
            most = "" if maximum is None else f" and <= {maximum}"
            raise self.fail(where, f"must be an integer >= {minimum}{most}, got {quote(value)}")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"must be true or false, got {quote(value)}")
        return value

    def path(self, value: Any, where: str) -> str:
        """A path from the file: relative ones are read from the file's folder."""
        if value == REDACTED:
            return REDACTED
        text = os.path.expanduser(self.string(value, where))
        if self.base_dir is not None and not os.path.isabs(text):
            text = str(self.base_dir / text)
        return os.path.abspath(text)

    def model_path(self, value: Any, where: str) -> str:
        """A model path: a local directory (relative to the file's folder) or a Hub id."""
        if value == REDACTED:
            return REDACTED
        text = os.path.expanduser(self.string(value, where))
        local = text if self.base_dir is None else str(self.base_dir / text)
        return os.path.abspath(local) if os.path.exists(local) else text


def from_dict(data: dict, source: str, base_dir: Path | None = None) -> Experiment:
    """Check and convert a file's content; raises HarnessError naming the file and field."""
    r = _Reader(source, base_dir)
    r.known(data, _FIELDS, "")
    version = data.get("version", VERSION)
    if version != VERSION:
        raise r.fail(
            "version",
            f"is {quote(version)}; this harness reads version {VERSION} "
            "(write the file again with this harness's sweep)",
        )
    exp = Experiment()
    if "phase" in data:
        exp.phase = r.string(data["phase"], "phase", PHASES)
    exp.models = _read_models(r, data.get("models", {}))
    exp.tasks, exp.task_rows = _read_tasks(r, data.get("tasks", []))
    exp.tasks_files = [
        r.path(p, "tasks_files") for p in r.strings(data.get("tasks_files", []), "tasks_files")
    ]
    if "lr_keys" in data:
        keys = r.strings(data["lr_keys"], "lr_keys")
        for key in keys:
            if key not in LR_GRID:
                raise r.fail("lr_keys", f"holds {quote(key)}; valid keys: {', '.join(LR_GRID)}")
        exp.lr_keys = sorted(keys, key=LR_GRID.__getitem__)
    seeds = r.table(data.get("seeds", {}), "seeds")
    r.known(seeds, PHASES, "seeds: ")
    for phase, value in seeds.items():
        if not isinstance(value, list) or not value:
            raise r.fail(f"seeds.{phase}", f"must be a non-empty list of seeds, got {quote(value)}")
        exp.seeds[phase] = list(
            dict.fromkeys(r.integer(s, f"seeds.{phase}", 0, MAX_SEED) for s in value)
        )
    recipe = r.table(data.get("recipe", {}), "recipe")
    r.known(recipe, _RECIPE_FIELDS, "recipe: ")
    for name, value in recipe.items():
        if name in _OWN_RECIPE_FIELDS:
            setattr(exp, name, r.integer(value, f"recipe.{name}", 1))
        else:
            exp.recipe_entries[name] = _recipe_value(r, name, value)
    if "data_dir" in data:
        exp.data_dir = r.path(data["data_dir"], "data_dir")
    if "device" in data:
        exp.device = r.string(data["device"], "device", DEVICES)
    if "selection_split" in data:
        exp.selection_split = r.string(data["selection_split"], "selection_split", SELECTION_SPLITS)
    if "extra_run_args" in data:
        value = data["extra_run_args"]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise r.fail("extra_run_args", f"must be a list of strings, got {quote(value)}")
        _read_extra_run_args(r, exp, list(value))
    if "report_to" in data:
        exp.report_to = r.string(data["report_to"], "report_to")
    phases = r.table(data.get("phases", {}), "phases")
    r.known(phases, PHASES, "phases: ")
    for phase, record in phases.items():
        record = r.table(record, f"phases.{phase}")
        r.known(record, _PHASE_FIELDS, f"phases.{phase}: ")
        exp.phases[phase] = PhaseRecord(
            **{k: r.path(v, f"phases.{phase}.{k}") for k, v in record.items()}
        )
    return exp


def _recipe_value(r: _Reader, name: str, value: Any) -> Any:
    """A `[recipe]` entry checked against its recipe field: its type, its choices, and the
    value the Recipe takes (HarnessError naming the file and the entry otherwise)."""
    where = f"recipe.{name}"
    entry = next(e for e in dataclasses.fields(Recipe) if e.name == name)
    kind = str(entry.type).split(" |")[0]
    if kind == "Precision":
        return r.string(value, where, tuple(p.value for p in Precision))
    if kind == "bool":
        return r.boolean(value, where)
    if kind == "int":
        return r.integer(value, where, 1)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise r.fail(where, f"must be a number, got {quote(value)}")
        return float(value)
    return r.string(value, where, entry.metadata.get("choices"))


def _toml_entry(value: Any) -> Any:
    """A recipe entry's value as the file holds it (a precision as its word)."""
    return value.value if isinstance(value, Precision) else value


def _read_extra_run_args(r: _Reader, exp: Experiment, argv: list[str]) -> None:
    """`extra_run_args` as a file holds it: the flags the harness does not model; in a file
    written before the recipe was typed, also recipe entries and `--report-to`, which are
    read into their own fields here (the cell command's parser reads them). A list that
    parser cannot read (a flag of a newer harness, a redacted value) stays as given."""
    from encoder_eval.cells.unit_spec import cell_flag_values

    if not argv:  # what every file written since the recipe was typed holds
        return
    try:
        values, report_to, rest = cell_flag_values(argv)
    except HarnessError:
        exp.extra_run_args = argv
        return
    for name, value in values.items():
        if name in _OWN_RECIPE_FIELDS or name == "selection_split":
            if getattr(exp, name) is None:
                setattr(exp, name, value)
        else:
            exp.recipe_entries.setdefault(name, _toml_entry(value))
    if report_to is not None and exp.report_to is None:
        exp.report_to = report_to
    exp.extra_run_args = rest


def _read_models(r: _Reader, value: Any) -> dict[str, ModelSpec]:
    """`models = ["registry-key", ...]` or `[models.NAME]` tables; a registry key's row
    supplies what its table leaves out, and may not be contradicted."""
    if isinstance(value, list):
        value = {name: {} for name in r.strings(value, "models")}
    models = {}
    for name, entry in r.table(value, "models").items():
        check_model_name(name, f"{r.source}: models")
        where = f"models.{name}"
        entry = r.table(entry, where)
        r.known(entry, _MODEL_FIELDS, f"{where}: ")
        row = MODEL_REGISTRY.get(name)
        if row is None and "path" not in entry:
            err = unknown_name("model", name, MODEL_REGISTRY)
            raise r.fail(where, f"has no path and is not a registry model ({err}); give path")
        default = ModelSpec.of(as_entry(row)) if row else ModelSpec("")
        spec = ModelSpec(
            path=r.model_path(entry["path"], f"{where}.path") if "path" in entry else default.path,
            mode=r.string(entry.get("mode", default.mode), f"{where}.mode", all_modes()),
            trust_remote_code=r.boolean(
                entry.get("trust_remote_code", default.trust_remote_code),
                f"{where}.trust_remote_code",
            ),
            revision=r.string(entry["revision"], f"{where}.revision")
            if "revision" in entry
            else default.revision,
            code_revision=r.string(entry["code_revision"], f"{where}.code_revision")
            if "code_revision" in entry
            else default.code_revision,
        )
        if row is not None and not loads_registry_row(name, spec):
            differs = [
                f"{k} {quote(getattr(spec, k))} (registry: {quote(getattr(default, k))})"
                for k in _MODEL_FIELDS[:3]
                if getattr(spec, k) != getattr(default, k)
            ]
            raise r.fail(
                where,
                f"contradicts the registry model {quote(name)}: {'; '.join(differs)}; "
                "drop those fields or give the model another name",
            )
        models[name] = spec
    return models


def _read_tasks(r: _Reader, value: Any) -> tuple[list[str], dict[str, dict]]:
    if isinstance(value, list):
        return r.strings(value, "tasks"), {}
    table = r.table(value, "tasks")
    rows = {name: r.table(row, f"tasks.{name}") for name, row in table.items()}
    return list(table), {name: row for name, row in rows.items() if row}


def load(path: str | os.PathLike) -> Experiment:
    """Read an experiment file; raises HarnessError naming the file and what is wrong."""
    path = Path(path)
    try:
        data = read_toml(path)
    except MissingFile:
        raise HarnessError(
            f"experiment file {path} does not exist; a sweep writes one into "
            f"its results directory ({EXPERIMENT_NAME}), or write your own "
            "(see examples/experiment.toml)"
        ) from None
    except UnreadableFile as exc:
        raise HarnessError(f"cannot read experiment file {path}: {exc.reason}") from None
    except DamagedFile as exc:
        raise HarnessError(f"{exc}; fix it or write it again") from None
    return from_dict(data, str(path), path.absolute().parent)


def in_results_dir(results_dir: str | os.PathLike) -> tuple[Experiment | None, Path]:
    """The experiment a sweep wrote into `results_dir` (None when it has none), and its path."""
    path = Path(results_dir) / EXPERIMENT_NAME
    return (load(path) if path.is_file() else None), path


def from_selection(selection: dict, source: str) -> Experiment | None:
    """The select phase's experiment a selection records (None for older selections)."""
    data = selection.get("experiment")
    if data is None:
        return None
    if not isinstance(data, dict):
        raise HarnessError(
            f"{source}: 'experiment' must be an object; regenerate it with encoder-eval select"
        )
    return from_dict(data, f"{source} (its experiment)")


# ----------------------------------------------------------------------------- writing


def write(exp: Experiment, path: str | os.PathLike) -> None:
    """Write `exp` to `path` atomically (the old content or the whole new one)."""
    path = Path(path)
    text = (
        "# Written by encoder-eval sweep; read by select, status, summarize and the report\n"
        "# sweep (see encoder_eval/plans/experiment.py).\n" + dumps(exp.to_dict())
    )
    write_atomic(path, text)


# ----------------------------------------------------------------------------- tasks


def register_tasks(exp: Experiment, source: str) -> None:
    """Make the experiment's own tasks known: its task files and inline `[tasks.X]` rows."""
    if exp.tasks_files:
        taskfile.register_task_files(exp.tasks_files)
    if exp.task_rows:
        taskfile.register_task_rows(exp.task_rows, source)


def task_keys(names: list[str], source: str | None = None) -> list[str]:
    """Task keys of a list of keys and group names (unknown names raise with the valid ones,
    naming `source`, the file the names were read from, when given)."""
    try:
        return resolve_task_names(names) if names else []
    except HarnessError as exc:
        if source is None:
            raise
        raise HarnessError(f"{source}: tasks: {exc}") from None


# ----------------------------------------------------------------------------- the commands


@dataclass(frozen=True)
class Fact:
    """One flag that an experiment can fill: its attribute, flag, and how values compare."""

    attr: str
    flag: str
    default: Any = None  # what an unset value means, for comparing

    def get(self, exp: Experiment, phase: str) -> Any:
        if self.attr == "seeds":
            return exp.seeds.get(phase)
        if self.attr == "extra_run_args":  # what the experiment sets for every cell, typed
            return exp.cell_settings()
        return getattr(exp, self.attr)

    def from_args(self, args: argparse.Namespace) -> Any:
        """The flag's value as the experiment holds it (None: not given); `resolve`'s draft
        holds LR keys and seeds as lists already, extra run arguments as `CellSettings`
        (`_typed_draft`)."""
        raw = getattr(args, self.attr)
        if raw is None or raw == "" or raw == []:
            return None
        if self.attr == "data_dir":
            return os.path.abspath(raw)
        return raw

    def to_args(self, value: Any) -> Any:
        return list(value) if isinstance(value, list) else value

    def show(self, value: Any) -> str:
        value = self.default if value is None else value
        if value is None:
            return "none"
        if isinstance(value, CellSettings):  # shown as the cell flags it stands for
            value = value.argv()
        if isinstance(value, list):
            return ",".join(map(str, value)) if value else "none"
        return str(value)


# The facts a report phase inherits from its select phase (and status from its results).
SELECT_FACTS = (
    Fact("max_steps", "--max-steps", PROTOCOL_RECIPE.max_steps),
    Fact("max_seq_len", "--max-seq-len", PROTOCOL_RECIPE.max_seq_len),
    Fact("data_dir", "--data-dir"),
    Fact("device", "--device", "auto"),
    Fact("selection_split", "--selection-split", PROTOCOL_RECIPE.selection_split),
    Fact("extra_run_args", "--extra-run-args", CellSettings()),
)
LR_KEYS_FACT = Fact("lr_keys", "--lr-keys", list(LR_GRID))


def _canonical_extra(argv: list[str] | tuple[str, ...]) -> list[str]:
    """Extra run arguments in their one spelling (`CellSettings.from_argv`, then `argv`): an
    experiment written before it, or flags given in another order, say the same thing."""
    return CellSettings.from_argv(argv).argv()


def seeds_fact(phase: str) -> Fact:
    """The `--seeds` fact of `phase`, its default the phase's protocol seeds (`sweep_config`
    fills and checks it)."""
    return Fact("seeds", "--seeds", list(PHASE_SEEDS[phase]))


def registry_spec(name: str) -> ModelSpec | None:
    """Registry model `name` as an experiment records a model (None: not in the registry), so
    an experiment's models and the registry's compare as one type."""
    row = MODEL_REGISTRY.get(name)
    return ModelSpec.of(as_entry(row)) if row else None


def loads_registry_row(name: str, spec: ModelSpec) -> bool:
    """Whether `spec` loads registry model `name` as its row does (pins may differ)."""
    row = registry_spec(name)
    return row is not None and (row.path, row.mode, row.trust_remote_code) == (
        spec.path,
        spec.mode,
        spec.trust_remote_code,
    )


def contradiction(flag_text: str, inherited: str, where: str, fix: str) -> HarnessError:
    """The error for a flag that contradicts an experiment file: both values and the fix named,
    worded alike wherever a written experiment is checked."""
    return HarnessError(f"{flag_text} contradicts {where} ({inherited}); drop it: {fix}")


def check_table_output(
    out: str | os.PathLike | None,
    results_dirs: str | os.PathLike | list[str],
    selection: str | list[str] | None,
    flag: str = "--out",
) -> None:
    """Refuse an output file of a table command (`summarize`, `export`) that is one of the
    table's inputs, in every results folder of the table: the selections (given, or those
    the experiment files record), the experiment files, any file a report or select results
    folder keeps."""
    if not out:
        return
    dirs = as_dir_list(results_dirs)
    given = [selection] if isinstance(selection, (str, os.PathLike)) else list(selection or [])
    for results_dir, chosen in zip(dirs, pair_selections(dirs, given), strict=True):
        recorded = select_dir = None
        try:
            exp, _ = in_results_dir(results_dir)
        except HarnessError:  # the table's reader refuses it next, naming the problem
            exp = None
        if exp is not None:
            report, select = exp.phases.get("report"), exp.phases.get("select")
            recorded = report.selection if report else None
            select_dir = select.results_dir if select else None
        check_output_not_input(
            out, flag, inputs=(chosen, recorded), results_dirs=(results_dir, select_dir)
        )


def check_outside_results(
    out: str | os.PathLike | None,
    results_dirs: str | os.PathLike | list[str],
    flag: str = "--out",
) -> None:
    """Refuse an output (file or folder) of a table command that lies in one of its results
    folders: those keep results only, and every later reader would warn about the file."""
    if not out:
        return
    target = Path(out).resolve()
    for folder in as_dir_list(results_dirs):
        results = Path(folder).resolve()
        if target == results or results in target.parents:
            raise HarnessError(
                f"{flag} {out} lies in --results-dir {folder}: a results folder keeps results "
                "only (every later command would warn about the file); write it elsewhere"
            )


def as_dir_list(results_dirs: str | os.PathLike | list) -> list[str]:
    """The `--results-dir` folders as a list (one folder, or the repeated flag's list)."""
    if isinstance(results_dirs, (str, os.PathLike)):
        return [os.fspath(results_dirs)]
    return [os.fspath(d) for d in results_dirs]


def pair_selections(dirs: list[str], selections: list[str]) -> list[str | None]:
    """Each results folder's `--selection`: none (each folder's experiment file names its
    own), one for every folder, or one per folder in the order of `--results-dir`. The one
    rule of every table command (`summarize`, `compare`, `leaderboard`, `report`,
    `export`)."""
    if not selections:
        return [None] * len(dirs)
    if len(selections) == 1:
        return list(selections) * len(dirs)
    if len(selections) == len(dirs):
        return list(selections)
    raise HarnessError(
        f"--selection is given {len(selections)} times for {len(dirs)} --results-dir: give "
        "one for every folder, or one per folder in the order of --results-dir"
    )


# The entries of an experiment file that decide what its cells computed: folders whose
# files disagree on one ran other protocols and share no table. The report seeds may
# differ (a noise-check twin runs other seeds; the table counts them as it counts any);
# so may the extra run arguments (local folders, trackers; a recipe flag among them is in
# every cell's recipe, which the table compares).
_PROTOCOL_KEYS = (
    "lr_keys",
    "seeds.select",
    "recipe.max_steps",
    "recipe.max_seq_len",
    "selection_split",
)


def protocol_differences(a: Experiment, b: Experiment) -> list[str]:
    """`entry: a -> b` for each protocol entry (`_PROTOCOL_KEYS`: the select grid and
    seeds, the recipe overrides, the selection split) two experiments disagree on, an
    entry left unset read as the protocol's value."""
    defaults = {
        "lr_keys": list(LR_GRID),
        "seeds.select": list(PHASE_SEEDS["select"]),
        "recipe.max_steps": PROTOCOL_RECIPE.max_steps,
        "recipe.max_seq_len": PROTOCOL_RECIPE.max_seq_len,
        "selection_split": SELECTION_SPLITS[0],
    }
    fa, fb = _flat(a.to_dict()), _flat(b.to_dict())
    out = []
    for key in _PROTOCOL_KEYS:
        va, vb = fa.get(key, defaults[key]), fb.get(key, defaults[key])
        if va != vb:
            out.append(f"{key}: {va} -> {vb}")
    return out


def check_output_not_input(
    out: str | os.PathLike,
    flag: str,
    *,
    inputs: tuple[str | os.PathLike | None, ...] = (),
    results_dirs: tuple[str | os.PathLike | None, ...] = (),
) -> None:
    """`fileio.check_not_input` with the results folder's rule of what it keeps: a file
    named like a cell's result (fine-tune or probe) and what a sweep writes beside results
    (predictions, TREC runs, experiment.toml, the hidden lock, resume and task files). A
    file of another name may be written there (`cd results/select && select --results-dir
    .` writes selection.json beside the results)."""
    check_not_input(
        out,
        flag,
        inputs=inputs,
        results_dirs=results_dirs,
        kept=lambda p: is_own_file(p) or is_result_name(p) or is_probe_result_name(p),
    )


def task_rows_file(rows: dict[str, dict], results_dir: str | os.PathLike) -> Path:
    """Write an experiment's inline task definitions as a task file in `results_dir` (named
    by its content), so every cell process reads them with `run --tasks-file`."""
    absolute = {}
    for key, row in rows.items():  # registered already: a data_dir is resolved
        folder = TASK_KNOBS[key].data_dir
        absolute[key] = {**row, **({"data_dir": str(folder)} if folder else {})}
    text = dumps({"tasks": absolute})
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    path = Path(results_dir) / f"{TASKS_FILE_PREFIX}{digest}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        write_atomic(path, text)
    return path.absolute()


def manifest_paths(plan, out_dir: str | os.PathLike) -> list[Path]:
    """Where a sweep records its experiment: its results directory and its script folder."""
    folders = dict.fromkeys((Path(plan.results_dir), Path(out_dir).absolute()))
    return [folder / EXPERIMENT_NAME for folder in folders]


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def differences(old: Experiment, new: Experiment) -> list[str]:
    """`field: old -> new` for every entry two experiments disagree on; where each phase's
    scripts and results went (`phases`) is left out, a new select phase forgets the report."""
    a, b = old.to_dict(), new.to_dict()
    for d in (a, b):
        d.pop("phases", None)
        d["extra_run_args"] = _canonical_extra(d["extra_run_args"])
    fa, fb = _flat(a), _flat(b)
    return [
        f"{key}: {fa.get(key, 'unset')} -> {fb.get(key, 'unset')}"
        for key in sorted(set(fa) | set(fb))
        if fa.get(key) != fb.get(key)
    ]


def check_unchanged(plan, out_dir: str | os.PathLike, exp: Experiment) -> None:
    """Refuse a sweep whose experiment differs from the one already recorded where it would
    write (another grid, seeds, steps...): its results would mix with, and be counted as
    done by, results of another recipe. `sweep --force` overwrites instead."""
    for path in manifest_paths(plan, out_dir):
        if not path.is_file():
            continue
        changed = differences(load(path), exp)
        if changed:
            raise HarnessError(
                f"{path} records another experiment ({'; '.join(changed)}); this sweep would "
                "overwrite it, and results already there would count as done for it. Give "
                "another --results-dir/--out-dir, or --force to overwrite the record"
            )


def select_expectations(
    results_dir: str | os.PathLike,
    *,
    lr_keys: list[str] | None,
    seeds: list[int] | None,
    models: list[str] | None,
    tasks: list[str] | None,
) -> tuple[
    Experiment | None, list[str] | None, list[int] | None, list[str] | None, list[str] | None
]:
    """What `select` expects of `results_dir`: its experiment file's LR keys, select seeds,
    models and tasks, unless flags say otherwise: LR keys and seeds may add to the file's,
    models and tasks may narrow it, and any other flag is refused naming both values.
    Returns (experiment, lr_keys, seeds, models, tasks)."""
    exp, path = in_results_dir(results_dir)
    if exp is None:
        return None, lr_keys, seeds, models, tasks
    if exp.phase == "report":
        raise HarnessError(
            f"{path} says {results_dir} holds report-phase results; give "
            "select the select phase's results directory"
        )
    register_tasks(exp, str(path))
    fix = "select reads what the sweep ran from its experiment file"
    for fact, have in ((LR_KEYS_FACT, lr_keys), (seeds_fact("select"), seeds)):
        want = fact.get(exp, "select")
        # More than the sweep ran (cells `status --emit` added) is fine: whatever is missing
        # is refused as missing. Less would choose over part of what ran, silently.
        if have is not None and set(fact.default if want is None else want) - set(have):
            raise contradiction(
                f"{fact.flag} {fact.show(have)}", f"{fact.attr} {fact.show(want)}", str(path), fix
            )
    if models is not None and exp.models:
        for name in models:
            if name not in exp.models:
                raise contradiction(
                    f"--models {','.join(models)}",
                    f"its models: {', '.join(exp.models)}",
                    str(path),
                    fix,
                )
    known = task_keys(exp.tasks, str(path))
    if tasks is not None and known:
        for name in tasks:
            if name not in known:
                raise contradiction(
                    f"--tasks {','.join(tasks)}", f"its tasks: {', '.join(known)}", str(path), fix
                )
    return (
        exp,
        lr_keys or exp.lr_keys,
        seeds or exp.seeds.get("select"),
        models or list(exp.models) or None,
        tasks or known or None,
    )


def _has_results(results_dir: str | os.PathLike) -> bool:
    """Whether `results_dir` holds a file named like a cell's result (read or not)."""
    try:
        return any(
            is_result_name(p) or is_probe_result_name(p) for p in Path(results_dir).iterdir()
        )
    except OSError:
        return True  # unreadable: the reader that lists it says why


def summarize_inputs(
    results_dir: str | os.PathLike, selection: str | None
) -> tuple[str, list[int] | None, str | None]:
    """The selection file, the report seeds the sweep ran and the select results directory
    for `summarize --results-dir R`, from R's experiment file (a `selection` that contradicts
    it is refused). Without a file: (selection, None, None)."""
    exp, path = in_results_dir(results_dir)
    if exp is not None and exp.phase == "select":
        raise HarnessError(
            f"{path} says {results_dir} holds select-phase results; the table is read from "
            "the report phase's results directory: pick learning rates with `encoder-eval "
            f"select --results-dir {results_dir} --out selection.json`, run the report sweep "
            "(`encoder-eval sweep --phase report --selection selection.json ...`) and give "
            "its --results-dir"
        )
    record = exp.phases.get("report") if exp else None
    recorded = record.selection if record else None
    if selection is None:
        if recorded is None:
            if exp is None and not _has_results(results_dir):
                raise HarnessError(
                    f"{results_dir} holds no results and no experiment file; give the report "
                    "sweep's --results-dir (the folder its cells wrote, e.g. results/report)"
                )
            why = "has no experiment file" if exp is None else "its experiment file names none"
            raise HarnessError(f"give --selection selection.json ({results_dir} {why})")
        selection = recorded
    elif recorded is not None and Path(selection).resolve() != Path(recorded).resolve():
        raise contradiction(
            f"--selection {selection}",
            f"the report sweep ran from {recorded}",
            str(path),
            "summarize reads the selection its report phase ran from",
        )
    if exp is None:
        return selection, None, None
    register_tasks(exp, str(path))  # user tasks in the table are known to summarize too
    select_record = exp.phases.get("select")
    return selection, exp.seeds.get("report"), select_record.results_dir if select_record else None


__all__ = [
    "Experiment",
    "ModelSpec",
    "PhaseRecord",
    "VERSION",
    "check_output_not_input",
    "as_dir_list",
    "check_outside_results",
    "check_table_output",
    "check_unchanged",
    "differences",
    "dumps",
    "redact_data",
    "redact_text",
    "from_dict",
    "from_selection",
    "in_results_dir",
    "load",
    "pair_selections",
    "protocol_differences",
    "register_tasks",
    "select_expectations",
    "summarize_inputs",
    "write",
]
