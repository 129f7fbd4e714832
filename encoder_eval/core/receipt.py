"""A checkpoint receipt and its schema: the per-task score it carries (seed 002's
`TaskResult`), the setup it was made under (`TrackSetup`), and the receipt file
(`<out-dir>/receipts/<id>.receipt.json`, schema `encoder-eval-receipt`).

Shared by `track` (receipts written from harness cells, `plans.tracking`), `capability`
(the synthetic suite, scored in process) and the regression report (`reports.tracking`), so
all speak one record and one regression rule reads every receipt.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from encoder_eval.core.comparability import receipt_setup
from encoder_eval.core.errors import HarnessError, quote
from encoder_eval.core.fileio import FileProblem, read_json
from encoder_eval.core.metrics import direction
from encoder_eval.core.schema import check_fields, is_int, is_list_of, is_name, is_number, is_str

RECEIPT_SCHEMA = "encoder-eval-receipt"
SCHEMA_VERSION = 1
EVAL_KINDS = ("probe", "finetune", "synthetic")
RECEIPT_SUFFIX = ".receipt.json"
CHECKPOINT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass
class TaskResult:
    """One task's score on one checkpoint, with its direction and its noise in `details`
    (`std`, `n`: the spread the noise rule uses, over seeds, folds or examples)."""

    name: str
    score: float
    higher_is_better: bool
    n_examples: int | None
    details: dict = field(default_factory=dict)

    @property
    def sign(self) -> float:
        """+1 when a higher score is better, -1 otherwise (`metrics.direction`, the rule
        `metrics.sign` applies too): a score times its sign is higher-is-better. A receipt
        records its direction, since the synthetic suite's axes (perplexity) are no metric
        of the registry."""
        return direction(self.higher_is_better)


def check_checkpoint_id(cid: str) -> str:
    if not CHECKPOINT_ID.fullmatch(cid):
        raise HarnessError(
            f"checkpoint id {cid!r} must be letters, digits, '.', '_' or '-' (it names files)"
        )
    return cid


@dataclass(frozen=True)
class TrackSetup:
    """How every checkpoint of a sequence is evaluated; receipts of different setups are not
    compared. probe: one pooling, `k_folds` folds seeded by `seed`. finetune: report-phase
    cells at `lr_key` over `seeds` (`lr_source` says where the LR came from)."""

    kind: str
    tasks: tuple[str, ...]
    max_seq_len: int | None = None
    pooling: str | None = None
    k_folds: int | None = None
    seed: int | None = None
    precision: str | None = None
    lr_key: str | None = None
    lr: float | None = None
    lr_source: str | None = None
    seeds: tuple[int, ...] = ()
    max_steps: int | None = None
    n_examples: int | None = None  # synthetic: examples per axis

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tasks"], d["seeds"] = list(self.tasks), list(self.seeds)
        return d

    def comparable(self) -> dict:
        """The entries that must agree between receipts (`comparability.receipt_setup`:
        where the LR came from need not)."""
        return receipt_setup(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> TrackSetup:
        """The setup a receipt records (lists become tuples; absent fields, defaults)."""
        args = dict(d)
        args["tasks"], args["seeds"] = tuple(args.get("tasks", ())), tuple(args.get("seeds", ()))
        return cls(**args)


@dataclass
class Receipt:
    """Every task's score for one checkpoint (the seed's per-rung receipt)."""

    checkpoint_id: str
    checkpoint_index: int
    tasks: list[TaskResult]
    seeds: list[int]
    metadata: dict
    setup: dict
    checkpoint_path: str
    model_revision: str
    created_at: str = ""

    def scores(self) -> dict[str, float]:
        return {t.name: t.score for t in self.tasks}

    def task(self, name: str) -> TaskResult | None:
        return next((t for t in self.tasks if t.name == name), None)

    def to_dict(self) -> dict:
        return {"schema": RECEIPT_SCHEMA, "schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, obj: Any) -> Receipt:
        """The receipt of a JSON object; ValueError naming the first problem when invalid."""
        if not isinstance(obj, dict) or obj.get("schema") != RECEIPT_SCHEMA:
            raise ValueError(f"not an {RECEIPT_SCHEMA} file")
        if obj.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {quote(obj.get('schema_version'))}, expected 1")
        body = {k: v for k, v in obj.items() if k not in ("schema", "schema_version")}
        check_fields(body, _RECEIPT_TYPES, "")
        for i, t in enumerate(body["tasks"]):
            if not isinstance(t, dict):
                raise ValueError(f"tasks[{i}] is not an object")
            check_fields(t, _TASK_TYPES, f"tasks[{i}].")
            if not is_number(t["score"]):
                raise ValueError(
                    f"task {quote(t['name'])}: score {quote(t['score'])} is not a finite number"
                )
            details = t["details"]
            std, n = details.get("std"), details.get("n")
            if not (std is None or is_number(std)) or not (n is None or is_int(n)):
                raise ValueError(
                    f"task {quote(t['name'])}: details.std or details.n is not a number"
                )
            if not isinstance(details.get("metric", ""), str):
                raise ValueError(f"task {quote(t['name'])}: details.metric is not a string")
        _check_setup(body["setup"])
        body["tasks"] = [TaskResult(**t) for t in body["tasks"]]
        return cls(**body)


# field -> (check, what it must be): a receipt's fields and one task's, as written.
_RECEIPT_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "checkpoint_id": (lambda x: is_str(x) and bool(CHECKPOINT_ID.fullmatch(x)), "an id"),
    "checkpoint_index": (is_int, "an integer"),
    "tasks": (lambda x: isinstance(x, list), "a list"),
    "seeds": (is_list_of(is_int), "a list of integers"),
    "metadata": (lambda x: isinstance(x, dict), "an object"),
    "setup": (lambda x: isinstance(x, dict), "an object"),
    "checkpoint_path": (is_str, "a string"),
    "model_revision": (is_str, "a string"),
    "created_at": (is_str, "a string"),
}
_TASK_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (is_name, "a name"),
    "score": (lambda x: True, "a number"),
    "higher_is_better": (lambda x: isinstance(x, bool), "true or false"),
    "n_examples": (lambda x: x is None or is_int(x), "an integer or null"),
    "details": (lambda x: isinstance(x, dict), "an object"),
}
# TrackSetup's fields as a receipt records them (None: not used by this kind).
# How a receipt's setup field is checked, by TrackSetup's annotation of it (one place says
# what a setup holds: the dataclass).
_TYPE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (is_int, "an integer"),
    "float": (is_number, "a number"),
    "str": (is_str, "a string"),
    "tuple[str, ...]": (is_list_of(is_name), "a list of names"),
    "tuple[int, ...]": (is_list_of(is_int), "a list of integers"),
}


def _setup_check(f) -> tuple[Callable[[Any], bool], str]:
    if f.name == "kind":
        return (lambda x: x in EVAL_KINDS, " or ".join(EVAL_KINDS))
    base, _, null = str(f.type).partition(" | ")
    check, what = _TYPE_CHECKS[base]
    if null:
        return (lambda x, c=check: x is None or c(x), f"{what} or null")
    return check, what


_SETUP_TYPES = {f.name: _setup_check(f) for f in fields(TrackSetup)}


def _check_setup(setup: dict) -> None:
    """A receipt's setup has TrackSetup's fields (those absent take their defaults)."""
    check_fields(setup, _SETUP_TYPES, "setup.", optional=True)
    if "kind" not in setup or "tasks" not in setup:
        raise ValueError("setup names no kind or tasks")


def receipt_path(out_dir: str | os.PathLike, checkpoint_id: str) -> Path:
    return Path(out_dir) / "receipts" / f"{checkpoint_id}{RECEIPT_SUFFIX}"


def read_receipt(path: str | os.PathLike) -> Receipt:
    """The receipt in `path`; HarnessError naming the file when it is not a valid one."""
    try:
        return Receipt.from_dict(read_json(path))
    except FileProblem as exc:
        raise HarnessError(f"{path}: not a valid {RECEIPT_SCHEMA} ({exc.reason})") from None
    except ValueError as exc:
        raise HarnessError(f"{path}: not a valid {RECEIPT_SCHEMA} ({exc})") from None


def load_receipts(out_dir: str | os.PathLike, warn: Callable[[str], None] | None = None):
    """Every readable receipt of `out_dir`, in checkpoint order; an unreadable one is skipped
    with a warning (never a crash), two receipts at one index are refused."""
    warn = warn or (lambda m: print(m, file=sys.stderr))
    receipts = []
    for path in sorted((Path(out_dir) / "receipts").glob(f"*{RECEIPT_SUFFIX}")):
        try:
            receipts.append(read_receipt(path))
        except HarnessError as exc:
            warn(f"warning: skipping {exc}")
    receipts.sort(key=lambda r: r.checkpoint_index)
    seen: dict[int, str] = {}
    for r in receipts:
        if r.checkpoint_index in seen:
            raise HarnessError(
                f"checkpoints {seen[r.checkpoint_index]} and {r.checkpoint_id} "
                f"both have index {r.checkpoint_index}; re-issue one receipt "
                "with another --index"
            )
        seen[r.checkpoint_index] = r.checkpoint_id
    return receipts
