"""The result file of one cell, defined once: typed sections, their JSON layout, the validator.

A result is the JSON object `CellResult.to_dict()` produces (schema `encoder-eval-result`,
version 2): the training writer builds a `CellResult` and writes `to_dict()`, every reader
gets one back from `CellResult.from_dict`, and `validate_result` checks a JSON object
against the rules written on the fields below. `to_dict` keeps the key order files have
always had; keys this version does not know are kept (in `extra`) and written back after
the known ones, so reading and writing a file changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from encoder_eval.core.errors import quote
from encoder_eval.core.protocol import PHASES, RANK_OBJECTIVES, SELECTION_SPLITS

SCHEMA_NAME = "encoder-eval-result"
# 2: provenance.data.identity (the resolved data source), recipe.selection_split, and
# scores that may be undefined (null, with the reason under `undefined`).
SCHEMA_VERSION = 2
STATUSES = ("ok", "diverged")


def is_number(x: Any) -> bool:
    """A finite int or float that is not a bool (JSON numbers a score may be), within a
    float's range (a 400-digit integer is not a number any reader can compute with)."""
    if not isinstance(x, int | float) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def all_numbers(values: list) -> bool:
    """`is_number` of every entry, at array speed for the usual case (a JSON list of plain
    ints and floats: a predictions file holds millions); anything else takes the per-entry
    rule, so the answer is always `all(is_number(x) for x in values)`'s."""
    if not set(map(type, values)) <= {int, float}:  # bools, strings, None, subclasses
        return all(is_number(x) for x in values)
    import numpy as np  # on use: the registries import this module and stay light

    try:
        return bool(np.isfinite(np.asarray(values, dtype=np.float64)).all())
    except OverflowError:  # an int beyond a float's range: not a number (see is_number)
        return False


def all_ints(values: list) -> bool:
    """Every entry an int and never a bool, at C speed for plain ints."""
    if set(map(type, values)) <= {int}:
        return True
    return all(isinstance(x, int) and not isinstance(x, bool) for x in values)


INT_LIMIT = 2**63  # integers in result files (seeds, steps, sizes) stay below this


def is_int(x: Any) -> bool:
    """An int that is not a bool, of magnitude below `INT_LIMIT`."""
    return isinstance(x, int) and not isinstance(x, bool) and -INT_LIMIT < x < INT_LIMIT


def is_str(x: Any) -> bool:
    return isinstance(x, str)


def is_name(x: Any) -> bool:
    """A non-empty string without control characters (a model or task name)."""
    return isinstance(x, str) and bool(x) and not any(ord(c) < 32 or ord(c) == 127 for c in x)


def is_list_of(kind: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A check for a list whose every item passes `kind`."""
    return lambda x: isinstance(x, list) and all(kind(v) for v in x)


def check_fields(
    obj: dict,
    types: dict[str, tuple[Callable[[Any], bool], str]],
    where: str = "",
    optional: bool = False,
    unknown_ok: bool = False,
) -> None:
    """Raise ValueError naming the first field of the JSON object `obj` that is missing
    (unless `optional`), unknown (unless `unknown_ok`), or fails its check in `types`
    (field -> (check, what it must be)): the one check readers of shared JSON files use
    before they trust a field's type."""
    if not unknown_ok:
        for key in obj:
            if key not in types:
                raise ValueError(f"unknown field {where}{quote(key)}")
    for key, (check, what) in types.items():
        if key not in obj:
            if optional:
                continue
            raise ValueError(f"field {where}{key} is missing")
        if not check(obj[key]):
            raise ValueError(f"field {where}{key} is {quote(obj[key])}, not {what}")


def _rule(check, expected: str) -> dict:
    """Field metadata: `check(value)` holds for a valid value; the message names `expected`."""
    return {"check": check, "expected": expected}


def _since(least: int):
    """A section field added after results were first written: an integer of at least
    `least`, or null; a result without it reads as None and is written back without it."""
    check = _rule(
        lambda x: x is None or (is_int(x) and x >= least), f"null or an integer of at least {least}"
    )
    return field(default=None, metadata={**check, "omitted_when_none": True})


# ----------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class CellId:
    """Which cell a result is: model key, task, learning rate (and its grid key), seed, phase."""

    model: str = field(metadata=_rule(is_str, "missing or not a str"))
    task: str = field(metadata=_rule(is_str, "missing or not a str"))
    lr: float = field(
        metadata=_rule(lambda x: is_number(x) and x > 0, "missing or not a positive number")
    )
    lr_key: str = field(metadata=_rule(is_str, "missing or not a str"))
    seed: int = field(metadata=_rule(is_int, "missing or not an integer"))
    phase: str = field(metadata={**_rule(is_str, "missing or not a str"), "choices": PHASES})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, obj: dict) -> CellId:
        return cls(**{f.name: obj[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class ScoreSection:
    """The scores of one split: per language (None: undefined), the headline mean over
    `languages_in_mean` (None when undefined, with the reason per language in `undefined`),
    and for the report section the split it was scored on."""

    per_language: dict[str, float | None]
    mean: float | None
    languages_in_mean: list[str] = field(default_factory=list)
    undefined: dict[str, str] = field(default_factory=dict)
    split: str | None = None  # report only; written first
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        head = {} if self.split is None else {"split": self.split}
        return {
            **head,
            "per_language": self.per_language,
            "mean": self.mean,
            "languages_in_mean": self.languages_in_mean,
            "undefined": self.undefined,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, obj: Any) -> ScoreSection | None:
        """The section of a JSON object; None for a null (or, in a diverged cell, no) section."""
        return _from_dict(cls, obj) if isinstance(obj, dict) else None


@dataclass(frozen=True)
class Training:
    """How training went: steps, early stopping or divergence, timings and throughput."""

    steps: int | None = None
    max_steps: int | None = None
    best_step: int | None = None
    epochs: float | None = None
    epochs_started: int | None = None
    steps_per_epoch: int | None = None
    eval_every: int | None = None
    early_stopped: bool | None = None
    stopped_by: str | None = None  # diverged | early_stop | step_cap | epoch_cap
    diverged_at_step: int | None = None
    final_loss: float | None = None
    train_examples: int | None = None
    dev_history: list = field(default_factory=list)
    wall_time_s: float | None = None
    train_time_s: float | None = None
    dev_eval_time_s: float | None = None
    time_to_first_step_s: float | None = None
    process_start_to_first_step_s: float | None = None
    train_tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    # What peak_memory_bytes covers: "cell" (counted from the cell's start) or "process"
    # (the CPU's peak resident memory could not be reset: everything the process held
    # before); the process that ran the cell, and its unit's number in a warm worker
    # (`run_all.sh --warm`; absent in a fresh process). Absent from older results.
    peak_memory_scope: str | None = field(
        default=None,
        metadata={
            **_rule(lambda x: x in (None, "cell", "process"), 'null, "cell" or "process"'),
            "omitted_when_none": True,
        },
    )
    process_id: int | None = _since(1)
    warm_unit: int | None = _since(1)
    # The cell's number among the cells its process started (1: the first, which meets every
    # batch width for the first time; a warm worker's count runs across its units).
    process_cell: int | None = _since(1)
    # Out of memory (CUDA): training steps retried with the micro-batch halved, the
    # micro-batch and gradient accumulation the last step ran with (the effective batch is
    # the recipe's throughout), evaluations rescored with the evaluation batch halved, and
    # the evaluation batch in use at the end. Absent from results that predate them.
    oom_retries: int | None = _since(0)
    micro_batch_used: int | None = _since(1)
    grad_accumulation_used: int | None = _since(1)
    eval_oom_retries: int | None = _since(0)
    eval_batch_used: int | None = _since(1)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> Training:
        return _from_dict(cls, obj)


@dataclass(frozen=True)
class Protocol:
    """Whether the cell ran the fixed protocol, and every reason it did not."""

    on_protocol: bool = field(metadata=_rule(lambda x: isinstance(x, bool), "missing"))
    off_protocol_reasons: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> Protocol:
        return _from_dict(cls, obj)


def _to_dict(obj) -> dict:
    """A section's fields in declaration order, then the keys it did not know (`extra`)."""
    out = {
        f.name: getattr(obj, f.name)
        for f in fields(obj)
        if f.name != "extra"
        and not (f.metadata.get("omitted_when_none") and getattr(obj, f.name) is None)
    }
    return {**out, **obj.extra}


def _from_dict(cls, obj: dict):
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: v for k, v in obj.items() if k in names}
    for f in fields(cls):  # a required field a lenient older file lacks reads as None
        if (
            f.name in names
            and f.name not in known
            and f.default is MISSING
            and f.default_factory is MISSING
        ):
            known[f.name] = None
    return cls(**known, extra={k: v for k, v in obj.items() if k not in names})


def data_identity(provenance: dict) -> str:
    """The data source a result's provenance names (source kind, dataset, commit), as one
    comparable string; two cells of one task read the same data iff these agree."""
    return str(((provenance or {}).get("data") or {}).get("identity"))


# ----------------------------------------------------------------------------- the result

_OBJECT = {"object": True}  # a section that must be a JSON object in every result


@dataclass(frozen=True)
class CellResult:
    """One cell's result file. `recipe` is `Recipe.to_dict()` plus what the run derived from
    it (micro-batch, warm-up steps, ...); `provenance` is `provenance.collect()`'s record with
    the data source under `data`."""

    cell: CellId
    status: str
    metric: str
    training: Training = field(metadata=_OBJECT)
    recipe: dict = field(metadata=_OBJECT)
    protocol: Protocol = field(metadata=_OBJECT)
    provenance: dict = field(metadata=_OBJECT)
    dev: ScoreSection | None = None
    report: ScoreSection | None = None
    # A ranking cell's objective, group sizes and training query counts (`kinds`); its
    # score sections add `secondary`, `first_stage` and `queries`. None for other cells.
    ranking: dict | None = None
    created_at: str | None = None
    schema: str = SCHEMA_NAME
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def score(self, section: str) -> float | None:
        """The headline mean of `dev` or `report`; None when absent or undefined."""
        scores = getattr(self, section)
        return float(scores.mean) if scores is not None and is_number(scores.mean) else None

    @property
    def data_identity(self) -> str:
        """The data source the cell read (source kind, dataset, commit), as one string."""
        return data_identity(self.provenance)

    def to_dict(self) -> dict:
        """The JSON object of the result file, keys in the order files have always had."""
        return {
            "schema": self.schema,
            "schema_version": self.schema_version,
            "cell": self.cell.to_dict(),
            "status": self.status,
            "metric": self.metric,
            "dev": None if self.dev is None else self.dev.to_dict(),
            "report": None if self.report is None else self.report.to_dict(),
            "training": self.training.to_dict(),
            "recipe": self.recipe,
            "protocol": self.protocol.to_dict(),
            "provenance": self.provenance,
            **({} if self.ranking is None else {"ranking": self.ranking}),
            "created_at": self.created_at,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, obj: Any) -> CellResult:
        """The typed form of a result object; ValueError naming every problem when invalid."""
        errors = validate_result(obj)
        if errors:
            raise ValueError("not a valid result: " + "; ".join(errors))
        known = {
            "schema",
            "schema_version",
            "cell",
            "status",
            "metric",
            "dev",
            "report",
            "training",
            "recipe",
            "protocol",
            "provenance",
            "ranking",
            "created_at",
        }
        return cls(
            cell=CellId.from_dict(obj["cell"]),
            status=obj["status"],
            metric=obj["metric"],
            training=Training.from_dict(obj["training"]),
            recipe=obj["recipe"],
            protocol=Protocol.from_dict(obj["protocol"]),
            provenance=obj["provenance"],
            ranking=obj.get("ranking"),
            dev=ScoreSection.from_dict(obj.get("dev")),
            report=ScoreSection.from_dict(obj.get("report")),
            created_at=obj.get("created_at"),
            schema=obj["schema"],
            schema_version=obj["schema_version"],
            extra={k: v for k, v in obj.items() if k not in known},
        )


# ----------------------------------------------------------------------------- validation


def validate_result(obj: Any) -> list[str]:
    """Return every way `obj` fails the result schema (an empty list: valid)."""
    if not isinstance(obj, dict):
        return ["not a JSON object"]
    errors = []
    if obj.get("schema") != SCHEMA_NAME:
        errors.append(f"schema is {quote(obj.get('schema'))}, expected {SCHEMA_NAME!r}")
    version = obj.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        errors.append(
            f"written by an older harness (schema_version {version}, this one reads "
            f"{SCHEMA_VERSION}); re-run the cell"
        )
    elif version != SCHEMA_VERSION:
        errors.append(f"schema_version is {quote(version)}, expected {SCHEMA_VERSION}")
    if errors:
        return errors
    cell = obj.get("cell")
    if not isinstance(cell, dict):
        return ["missing 'cell'"]
    for f in fields(CellId):  # the rules written on CellId's fields
        if not f.metadata["check"](cell.get(f.name)):
            errors.append(f"cell.{f.name} {f.metadata['expected']}")
    for f in fields(CellId):
        choices = f.metadata.get("choices")
        if choices and cell.get(f.name) not in choices:
            errors.append(
                f"cell.{f.name} is {quote(cell.get(f.name))}, expected " + " or ".join(choices)
            )
    status = obj.get("status")
    if status not in STATUSES:
        errors.append(f"status is {quote(status)}, expected one of {STATUSES}")
    if not isinstance(obj.get("metric"), str):
        errors.append("metric missing")
    for f in fields(CellResult):
        if f.metadata.get("object") and not isinstance(obj.get(f.name), dict):
            errors.append(f"missing section {f.name!r}")
    if errors:
        return errors
    errors += _typed_errors("training", obj["training"], Training)
    if status == "ok":
        errors += _score_errors("dev", obj.get("dev"))
        report = obj.get("report")
        if cell["phase"] == "report":
            errors += _score_errors("report", report)
        elif report is not None:
            errors.append("a select cell must not hold a report score")
    elif not isinstance(obj["training"].get("diverged_at_step"), int):
        errors.append("diverged cell without training.diverged_at_step")
    for f in fields(Protocol):
        if "check" in f.metadata and not f.metadata["check"](obj["protocol"].get(f.name)):
            errors.append(f"protocol.{f.name} {f.metadata['expected']}")
    if obj["recipe"].get("selection_split") not in SELECTION_SPLITS:
        errors.append(
            f"recipe.selection_split is {quote(obj['recipe'].get('selection_split'))}, "
            f"expected one of {SELECTION_SPLITS}"
        )
    for key in ("attn_implementation", "attn_backend"):  # absent before issues 38 and 49
        attention = obj["recipe"].get(key)
        if attention is not None and not isinstance(attention, str):
            errors.append(f"recipe.{key} is {quote(attention)}, not a string or null")
    data = obj["provenance"].get("data")
    if not isinstance(data, dict) or not isinstance(data.get("identity"), str):
        errors.append("provenance.data.identity missing (the data source the cell read)")
    for key, (check, what) in _PROVENANCE_TYPES.items():
        value = obj["provenance"].get(key)
        if not check(value):
            errors.append(f"provenance.{key} is {quote(value)}, not {what}")
    if "ranking" in obj:
        errors += _ranking_errors(obj["ranking"])
    return errors


# A section field's declared type -> the check its JSON value must pass.
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int | None": lambda x: x is None or is_int(x),
    "float | None": lambda x: x is None or is_number(x),
    "bool | None": lambda x: x is None or isinstance(x, bool),
    "str | None": lambda x: x is None or isinstance(x, str),
    "list": lambda x: isinstance(x, list),
}


# What readers take from a result's provenance (absent is null).
_PROVENANCE_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model_revision": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "trust_remote_code": (lambda x: x is None or isinstance(x, bool), "true, false or null"),
    **{
        k: (lambda x: x is None or isinstance(x, dict), "an object or null")
        for k in ("software", "hardware", "model")
    },
}


def _typed_errors(name: str, section: dict, cls: type) -> list[str]:
    """Every field of `section` whose value is not of the type `cls` declares for it."""
    errors = []
    for f in fields(cls):
        check = f.metadata.get("check") or _TYPE_CHECKS.get(str(f.type))
        if check is not None and f.name in section and not check(section[f.name]):
            expected = f.metadata.get("expected") or f.type
            errors.append(f"{name}.{f.name} is {quote(section[f.name])}, not {expected}")
    return errors


def _ranking_errors(section: Any) -> list[str]:
    """A ranking section names its objective and the group sizes asked for and used."""
    if not isinstance(section, dict):
        return ["ranking is not an object"]
    errors = []
    if section.get("objective") not in RANK_OBJECTIVES:
        errors.append(
            f"ranking.objective is {quote(section.get('objective'))}, expected one of "
            f"{RANK_OBJECTIVES}"
        )
    for key in ("group_size", "group_size_used"):
        value = section.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errors.append(f"ranking.{key} missing or not a positive integer")
    return errors


# Every metric (`metrics.METRIC_SPECS`: accuracy, F1s, MCC, Spearman, MRR, NDCG) scores in
# [-1, 1]; a score outside (with room for rounding) is damage, not a result.
SCORE_LIMIT = 1.0 + 1e-9


def is_score(x: Any) -> bool:
    """A score a metric can give: a number in [-1, 1]."""
    return is_number(x) and -SCORE_LIMIT <= x <= SCORE_LIMIT


def _score_errors(name: str, section: Any) -> list[str]:
    """A score section holds a finite mean, or a null mean with the reason it is undefined;
    every score in it is a metric's (in [-1, 1]) or null."""
    if not isinstance(section, dict):
        return [f"status ok but {name} scores are missing"]
    per_language = section.get("per_language")
    if not isinstance(per_language, dict):
        return [f"{name}.per_language missing"]
    bad = [k for k, v in per_language.items() if not (v is None or is_score(v))]
    if bad or not (section.get("mean") is None or is_score(section.get("mean"))):
        return [f"{name} holds a score that is not a number in [-1, 1] or null"]
    if not isinstance(section.get("undefined", {}), dict) or not is_list_of(is_str)(
        section.get("languages_in_mean", [])
    ):
        return [f"{name}.undefined or {name}.languages_in_mean is malformed"]
    if is_number(section.get("mean")):
        return []
    undefined = section.get("undefined")
    if section.get("mean") is None and isinstance(undefined, dict) and undefined:
        return []
    return [f"{name}.mean is missing or not finite, and no {name}.undefined says why"]


# ----------------------------------------------------------------------------- probe cells

# A probe cell's result (`encoder-eval probe`, one file per model, pooling and task): the
# fold protocol's scores over `k_folds` folds instead of one training run's. Written by
# `cells.probing.result_record`; read, like a fine-tune result, through `results.cell_state`.
PROBE_SCHEMA_NAME = "encoder-eval-probe"
PROBE_SCHEMA_VERSION = 1
_number_or_null = (lambda x: x is None or is_number(x), "a number or null")
_PROBE_CELL_TYPES = {
    "model": (is_name, "a non-empty name"),
    "pooling": (is_str, "a string"),
    "task": (is_name, "a non-empty name"),
    "method": (is_str, "a string"),
}
# What every reader of a probe cell needs (required), then what it may hold (typed when
# present: older files and NeuCo-Bench mode's records lack some).
PROBE_REQUIRED = {
    "cell": (lambda x: isinstance(x, dict), "an object"),
    "metric": (is_str, "a string"),
    "mean_score": _number_or_null,
    "protocol": (lambda x: isinstance(x, dict), "an object"),
}
PROBE_OPTIONAL = {
    "task_type": (is_str, "a string"),
    "q_stat": _number_or_null,
    "std_dev": _number_or_null,
    "provenance": (lambda x: isinstance(x, dict), "an object"),
    "q_t": (is_list_of(lambda v: v is None or is_number(v)), "a list of numbers or nulls"),
}
_PROBE_PROTOCOL_TYPES = {
    "k_folds": (is_int, "an integer"),
    "seed": (is_int, "an integer"),
}


def validate_probe_result(obj: Any, model_cell: bool = True) -> list[str]:
    """Every way `obj` fails the probe result schema (an empty list: valid). A cell of a
    model (`model_cell`, what `encoder-eval probe --model` writes) names its model, pooling
    and task; NeuCo-Bench mode's cells name a method only."""
    if not isinstance(obj, dict):
        return ["not a JSON object"]
    if obj.get("schema") != PROBE_SCHEMA_NAME:
        return [f"schema is {quote(obj.get('schema'))}, expected {PROBE_SCHEMA_NAME!r}"]
    version = obj.get("schema_version")
    if version != PROBE_SCHEMA_VERSION:
        return [f"schema_version {quote(version)}, expected {PROBE_SCHEMA_VERSION}"]
    try:
        check_fields(obj, PROBE_REQUIRED, unknown_ok=True)
        check_fields(obj, PROBE_OPTIONAL, optional=True, unknown_ok=True)
        check_fields(obj["protocol"], _PROBE_PROTOCOL_TYPES, "protocol.", unknown_ok=True)
        if model_cell:
            check_fields(obj["cell"], _PROBE_CELL_TYPES, "cell.", unknown_ok=True)
    except ValueError as exc:
        return [str(exc)]
    return []
