"""Learning-rate selection and the selection file: each (model, task)'s LR chosen by the
seed-averaged dev mean over the select seeds, and `selection.json` read and checked.

`select_pairs` applies the policy (`POLICY_RULE`) to loaded select results; `load_selection`
reads a selection file of a readable version and checks every field. The command is
`encoder_eval.select`; the report sweep, `summarize`, `compare` and the experiment file
read selections through `load_selection`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime

from encoder_eval.core.comparability import cell_setup, setup_differences
from encoder_eval.core.errors import (
    HarnessError,
    quote,
)
from encoder_eval.core.fileio import FileProblem, MissingFile, read_json
from encoder_eval.core.metrics import sign
from encoder_eval.core.protocol import (
    LR_GRID,
    PROTOCOL_RECIPE,
    SELECT_SEEDS,
    SELECTION_SPLITS,
)
from encoder_eval.core.results import (
    LoadedResult,
    result_filename,
)
from encoder_eval.core.schema import check_fields, is_int, is_list_of, is_number, is_str

SCHEMA = "encoder-eval-selection"
# 2: per pair, `select_setup` (what its select cells ran with) and `undefined_by_lr`.
# 3: `experiment`, the select phase's experiment file (null for results without one).
VERSION = 3
READABLE_VERSIONS = (2, 3)
POLICY_RULE = (
    "best seed-averaged dev mean; an LR with a diverged seed or an undefined dev score is "
    "ineligible; an LR missing seeds is ineligible unless allow_partial; ties go to the "
    "smaller LR"
)


class Refusal(Exception):
    """The protocol forbids the requested output; `items` lists every offending cell."""

    def __init__(self, summary: str, items: list[str]):
        super().__init__(summary)
        self.summary = summary
        self.items = items

    def render(self) -> str:
        return "\n".join([f"error: {self.summary}", *(f"  {item}" for item in self.items)])


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


@dataclass
class _Row:
    ok: dict[int, float] = field(default_factory=dict)  # seed -> dev mean
    diverged: list[int] = field(default_factory=list)
    undefined: list[int] = field(default_factory=list)  # finished, but the dev mean is null
    cells: list[LoadedResult] = field(default_factory=list)


def select_pairs(
    results: list[LoadedResult],
    *,
    models: list[str] | None = None,
    tasks: list[str] | None = None,
    lr_keys: list[str] | None = None,
    seeds: list[int] | None = None,
    allow_partial: bool = False,
    note=None,
    unfinished_fix: str | None = None,
) -> dict:
    """Build the selection document from select-phase results (see the module docstring).

    Raises `Refusal` when expected cells are missing (unless `allow_partial`) or a pair's
    cells disagree on their setup (`cell_setup`). `note` receives informational messages;
    `unfinished_fix` is the fix to name for missing cells when the expected ones came from
    the sweep's own record (its experiment file), so they cannot be a smaller grid.
    """
    note = note or (lambda msg: None)
    lr_keys = list(lr_keys) if lr_keys else list(LR_GRID)
    seeds = list(seeds) if seeds else list(SELECT_SEEDS)
    results = [r for r in results if r.cell["phase"] == "select"]
    present = {(r.cell["model"], r.cell["task"]) for r in results}
    if models or tasks:
        ms = models or sorted({m for m, _ in present})
        ts = tasks or sorted({t for _, t in present})
        pairs = [(m, t) for m in ms for t in ts]
    else:
        pairs = sorted(present)
    if not pairs:
        raise HarnessError(
            "no select-phase results to choose from; run the select sweep first, or check "
            "--results-dir"
        )
    rows: dict[tuple[str, str], dict[str, _Row]] = {p: {k: _Row() for k in lr_keys} for p in pairs}
    ignored = 0
    for r in results:
        pair = (r.cell["model"], r.cell["task"])
        if pair not in rows:
            continue
        key, seed = r.cell["lr_key"], r.cell["seed"]
        if key not in rows[pair] or seed not in seeds:
            ignored += 1
            continue
        row = rows[pair][key]
        row.cells.append(r)
        score = r.result.score("dev")
        if not r.ok:
            row.diverged.append(seed)
        elif score is None:
            row.undefined.append(seed)
        else:
            row.ok[seed] = score
    if ignored:
        note(
            f"ignored {ignored} cell(s) outside lr keys {','.join(lr_keys)} / seeds "
            f"{','.join(map(str, seeds))}"
        )

    missing_items, mismatch_items = [], []
    for (model, task), by_lr in rows.items():
        for key, row in by_lr.items():
            for s in _missing_seeds(row, seeds):
                missing_items.append(
                    f"{model}/{task}/{key}/s{s}: missing "
                    f"({result_filename(model, task, LR_GRID[key], s)})"
                )
        cells = sorted((c for row in by_lr.values() for c in row.cells), key=lambda c: c.path)
        if cells:
            reference = cell_setup(cells[0].data)
            for c in cells[1:]:
                has = f"{cells[0].path.name} has"
                differs = setup_differences(cell_setup(c.data), reference, has)
                if differs:
                    mismatch_items.append(f"{model}/{task}: {c.path.name} has {'; '.join(differs)}")
    if mismatch_items:
        raise Refusal(
            "the select cells of a pair disagree on their setup (recipe, model revision, "
            "loader mode, trust_remote_code, data or selection split); re-run them with one",
            mismatch_items,
        )
    if missing_items and not allow_partial:
        raise Refusal(
            f"{len(missing_items)} select cell(s) are missing, so their LRs are not eligible; "
            + _missing_fix(results, rows, lr_keys, seeds, unfinished_fix),
            missing_items,
        )

    out_pairs: dict[str, dict[str, dict]] = {}
    all_on_protocol = lr_keys == list(LR_GRID) and seeds == list(SELECT_SEEDS)
    for (model, task), by_lr in rows.items():
        entry = _choose(by_lr, seeds, allow_partial)
        all_on_protocol &= entry["on_protocol"] and not entry["partial"]
        out_pairs.setdefault(model, {})[task] = entry
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "policy": {
            "lr_keys": lr_keys,
            "seeds": seeds,
            "allow_partial": allow_partial,
            "rule": POLICY_RULE,
            "protocol_max_steps": PROTOCOL_RECIPE.max_steps,
        },
        "experiment": None,
        "on_protocol": bool(all_on_protocol),
        "pairs": out_pairs,
    }


def _missing_seeds(row: _Row, seeds: list[int]) -> list[int]:
    return [s for s in seeds if s not in row.ok and s not in row.diverged + row.undefined]


def _missing_fix(
    results: list[LoadedResult],
    rows: dict[tuple[str, str], dict[str, _Row]],
    lr_keys: list[str],
    seeds: list[int],
    unfinished_fix: str | None,
) -> str:
    """The fix for missing cells: finishing the sweep when its experiment file said what to
    expect (`unfinished_fix`), else the flags of the complete smaller grid the results form
    (whatever seeds and keys they hold), else finishing the sweep."""
    if unfinished_fix is not None:
        return unfinished_fix
    ran: dict[tuple[str, str], set[tuple[str, int]]] = {pair: set() for pair in rows}
    for r in results:
        cells = ran.get((r.cell["model"], r.cell["task"]))
        if cells is not None and r.cell["lr_key"] in LR_GRID:
            cells.add((r.cell["lr_key"], r.cell["seed"]))
    ran_keys = sorted({k for cells in ran.values() for k, _ in cells}, key=LR_GRID.__getitem__)
    ran_seeds = sorted({s for cells in ran.values() for _, s in cells})
    grid = {(k, s) for k in ran_keys for s in ran_seeds}
    if (
        ran_keys
        and all(cells == grid for cells in ran.values())
        and (ran_keys, ran_seeds) != (lr_keys, seeds)
    ):
        keys, ran_text = ",".join(ran_keys), ",".join(map(str, ran_seeds))
        return (
            f"this looks like a shrunken sweep that ran lr keys {keys} and seeds {ran_text}; "
            f"pass --lr-keys {keys} --seeds {ran_text} (a sweep of this harness records "
            "them in the experiment.toml it writes into the results directory, and select "
            "reads them from there), or finish the sweep"
        )
    return "finish the sweep (re-run its script) or pass --allow-partial"


def _choose(by_lr: dict[str, _Row], seeds: list[int], allow_partial: bool) -> dict:
    dev_by_lr, seeds_by_lr, diverged_by_lr, missing_by_lr = {}, {}, {}, {}
    undefined_by_lr: dict[str, list[int]] = {}
    metric = None
    on_protocol = True
    eligible = []
    cells = sorted((c for row in by_lr.values() for c in row.cells), key=lambda c: c.path)
    for key, row in by_lr.items():
        used = sorted(row.ok)
        seeds_by_lr[key] = used
        missing = _missing_seeds(row, seeds)
        if missing:
            missing_by_lr[key] = missing
        if row.diverged:
            diverged_by_lr[key] = sorted(row.diverged)
        if row.undefined:
            undefined_by_lr[key] = sorted(row.undefined)
        for c in row.cells:
            metric = metric or c.data["metric"]
            on_protocol &= bool(c.data["protocol"]["on_protocol"])
        if row.diverged or row.undefined or not used or (missing and not allow_partial):
            dev_by_lr[key] = None
            continue
        dev_by_lr[key] = _mean([row.ok[s] for s in used])
        eligible.append(key)
    entry = {
        "lr_key": None,
        "lr": None,
        "dev_mean": None,
        "metric": metric,
        "dev_mean_by_lr": dev_by_lr,
        "seeds_by_lr": seeds_by_lr,
        "diverged_by_lr": diverged_by_lr,
        "undefined_by_lr": undefined_by_lr,
        "missing_by_lr": missing_by_lr,
        "partial": bool(missing_by_lr),
        "on_protocol": on_protocol,
        "reason": None,
        "select_setup": cell_setup(cells[0].data) if cells else None,
    }
    if not eligible:
        why = [f"{k} diverged on seeds {v}" for k, v in diverged_by_lr.items()]
        why += [f"{k} undefined on seeds {v}" for k, v in undefined_by_lr.items()]
        entry["reason"] = "no eligible LR: " + ("; ".join(why) or "no finished cells")
        return entry
    # The best seed-averaged dev mean in the metric's direction; ties go to the smaller LR.
    best = min(eligible, key=lambda k: (-sign(metric) * dev_by_lr[k], LR_GRID[k]))
    entry.update(lr_key=best, lr=LR_GRID[best], dev_mean=dev_by_lr[best])
    return entry


def unselected_pairs(selection: dict) -> list[str]:
    """`model/task: reason` for every pair without a chosen LR."""
    return [
        f"{model}/{task}: {entry.get('reason') or 'no selection'}"
        for model, by_task in selection["pairs"].items()
        for task, entry in by_task.items()
        if not entry.get("lr_key")
    ]


_number_or_null = (lambda x: x is None or is_number(x), "a number or null")
_by_lr_seeds = (
    lambda x: isinstance(x, dict) and all(is_list_of(is_int)(v) for v in x.values()),
    "an object of seed lists",
)
# A selection's fields (all but `pairs` optional: older versions lack some), and a pair's.
_SELECTION_TYPES = {
    "schema": (is_str, "a string"),
    "version": (is_int, "an integer"),
    "created_at": (is_str, "a string"),
    "results_dir": (is_str, "a string"),
    "policy": (lambda x: isinstance(x, dict), "an object"),
    "experiment": (lambda x: x is None or isinstance(x, dict), "an object or null"),
    "on_protocol": (lambda x: isinstance(x, bool), "true or false"),
    "pairs": (lambda x: isinstance(x, dict), "an object"),
}
_POLICY_TYPES = {
    "lr_keys": (is_list_of(lambda k: is_str(k) and k in LR_GRID), "a list of grid keys"),
    "seeds": (is_list_of(is_int), "a list of integers"),
    "allow_partial": (lambda x: isinstance(x, bool), "true or false"),
    "rule": (is_str, "a string"),
    "protocol_max_steps": (is_int, "an integer"),
}
_ENTRY_TYPES = {
    "lr_key": (lambda x: x is None or (is_str(x) and x in LR_GRID), "a grid key or null"),
    "lr": _number_or_null,
    "dev_mean": _number_or_null,
    "metric": (lambda x: x is None or is_str(x), "a string or null"),
    "dev_mean_by_lr": (
        lambda x: isinstance(x, dict) and all(_number_or_null[0](v) for v in x.values()),
        "an object of numbers or nulls",
    ),
    "seeds_by_lr": _by_lr_seeds,
    "diverged_by_lr": _by_lr_seeds,
    "undefined_by_lr": _by_lr_seeds,
    "missing_by_lr": _by_lr_seeds,
    "partial": (lambda x: isinstance(x, bool), "true or false"),
    "on_protocol": (lambda x: isinstance(x, bool), "true or false"),
    "reason": (lambda x: x is None or is_str(x), "a string or null"),
    "select_setup": (lambda x: x is None or isinstance(x, dict), "an object or null"),
}
_str_or_null = (lambda x: x is None or is_str(x), "a string or null")
# `cell_setup`'s entries, as a selection records them per pair.
_SETUP_TYPES = {
    "model_revision": _str_or_null,
    "mode": _str_or_null,
    "data_identity": _str_or_null,
    "trust_remote_code": (lambda x: x is None or isinstance(x, bool), "true, false or null"),
    "selection_split": (
        lambda x: x is None or (is_str(x) and x in SELECTION_SPLITS),
        f"one of {', '.join(SELECTION_SPLITS)} or null",
    ),
    "recipe": (lambda x: isinstance(x, dict), "an object"),
}


def _selection_problem(data: dict) -> str | None:
    """The first way a selection document's fields are not what `select` writes (None: fine)."""
    try:
        check_fields(data, _SELECTION_TYPES, optional=True, unknown_ok=True)
        check_fields(
            data.get("policy") or {}, _POLICY_TYPES, "policy.", optional=True, unknown_ok=True
        )
        for model, by_task in data["pairs"].items():
            if not isinstance(by_task, dict):
                return f"pairs.{quote(model)} is not an object"
            for task, entry in by_task.items():
                if not isinstance(entry, dict):
                    return f"pairs.{quote(model)}.{quote(task)} is not an object"
                check_fields(
                    entry, _ENTRY_TYPES, f"pairs.{model}.{task}.", optional=True, unknown_ok=True
                )
                check_fields(
                    entry.get("select_setup") or {},
                    _SETUP_TYPES,
                    f"pairs.{model}.{task}.select_setup.",
                    optional=True,
                    unknown_ok=True,
                )
    except ValueError as exc:
        return str(exc)
    return None


def load_selection(path: str | os.PathLike) -> dict:
    """Read and check a selection.json; raises HarnessError naming the problem."""
    try:
        data = read_json(path)
    except MissingFile:
        raise HarnessError(
            f"selection file {path} does not exist; create it with encoder-eval select"
        ) from None
    except FileProblem as exc:
        raise HarnessError(
            f"cannot read selection file {path}: {exc.reason}; regenerate it with "
            "encoder-eval select"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise HarnessError(
            f"{path} is not a selection file (schema {SCHEMA!r}); "
            "pass the file encoder-eval select wrote"
        )
    if data.get("version") not in READABLE_VERSIONS:
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise HarnessError(
            f"{path} has selection version {quote(data.get('version'))}, this "
            f"harness reads {readable}; regenerate it with "
            "encoder-eval select"
        )
    pairs = data.get("pairs")
    if not isinstance(pairs, dict) or not all(isinstance(v, dict) for v in pairs.values()):
        raise HarnessError(f"{path} has no valid 'pairs' object; regenerate it")
    problem = _selection_problem(data)
    if problem is not None:
        raise HarnessError(f"{path}: {problem}; regenerate it with encoder-eval select")
    for model, by_task in pairs.items():
        for task, entry in by_task.items():
            key = entry.get("lr_key")
            if key is not None and (key not in LR_GRID or entry.get("lr") != LR_GRID[key]):
                raise HarnessError(
                    f"{path}: {quote(model)}/{quote(task)} has lr_key "
                    f"{quote(key)} / lr {quote(entry.get('lr'))}, not a grid "
                    "entry; regenerate it"
                )
    return data


def format_selection(selection: dict) -> str:
    """A short human summary: one line per pair."""
    lines = []
    for model, by_task in selection["pairs"].items():
        for task, e in by_task.items():
            if e["lr_key"]:
                head = f"{model}/{task}: {e['lr_key']} (lr {e['lr']:g}), dev {e['dev_mean']:.4f}"
            else:
                head = f"{model}/{task}: NO SELECTION ({e['reason']})"
            means = " ".join(
                f"{k}={'-' if v is None else f'{v:.4f}'}" for k, v in e["dev_mean_by_lr"].items()
            )
            extra = " [partial]" if e["partial"] else ""
            lines.append(f"{head}{extra}  | {means}")
    return "\n".join(lines)
