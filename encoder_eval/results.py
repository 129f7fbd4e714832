"""Result files on disk: their names, locks, tolerant reading and the one definition of done.

A result is one JSON file per cell, laid out by `schema.CellResult` and written with
`fileio.write_json_atomic` (a hidden temporary, fsynced and renamed over its final name),
so a reader sees either nothing or the whole file. Readers pass over the harness's own
hidden files (temporaries, locks, resume states, the `.corrupt/` directory of results moved
aside) silently, and skip anything else that is not a valid result (including
subdirectories, which they never descend into) with one warning each naming it and why.
`cell_state` is the one definition of a done cell; `LoadedResult.result` is the typed form.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .fileio import (  # noqa: F401  (re-exported: the one atomic writer and its cleaner)
    TMP_PREFIX,
    UNSAFE_IN_NAME,
    clean_stale_temporaries,
    safe_filename_part,
    write_json_atomic,
)
from .protocol import lr_key_for
from .schema import (  # noqa: F401  (re-exported: the result schema is defined in schema.py)
    SCHEMA_NAME,
    SCHEMA_VERSION,
    STATUSES,
    CellResult,
    is_number,
    validate_result,
)

LOCK_PREFIX = ".lock-"
PREDICTIONS_SUFFIX = ".predictions.json"  # per-example predictions written beside a result
TREC_SUFFIX = ".run.trec"  # a ranking cell's TREC run file, written beside its result


def lr_key(lr: float) -> str:
    """The stable key of a learning rate: its grid key, or 'lr' + its value when off the grid."""
    return lr_key_for(lr) or f"lr{lr:.3g}"


def safe_component(text: str) -> str:
    """Make a string safe as one file-name component (no separators, no control characters);
    the rule result file names have always used, so files already written keep their names."""
    return safe_filename_part(text, UNSAFE_IN_NAME)


def result_filename(model: str, task: str, lr: float, seed: int) -> str:
    """`{model}_{task}_{lr key}_s{seed}.json`: seeds and learning rates never overwrite each other."""
    return f"{safe_component(model)}_{safe_component(task)}_{lr_key(lr)}_s{seed}.json"


@contextlib.contextmanager
def cell_lock(out_json: str | os.PathLike, wait: bool = False) -> Iterator[bool]:
    """Hold an exclusive lock for one cell while it runs; yields False if another runner has it.

    The lock is `flock` on a hidden file beside the result: the kernel releases it when its
    holder exits or is killed, so a dead runner never leaves a cell locked. `wait=True`
    blocks until the holder is done instead of yielding False. The holder removes the file
    on release (a killed holder leaves it behind, harmlessly); a runner that opened the file
    just before that notices, once it has the lock, that the path names another file now,
    and locks that one instead.
    """
    path = Path(out_json)
    lock_path = path.parent / f"{LOCK_PREFIX}{path.name}"
    while True:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        try:
            current = os.stat(lock_path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # the previous holder removed this file: lock the one at the path now
    try:
        yield True
    finally:
        try:
            os.unlink(lock_path)
        except FileNotFoundError:
            pass
        os.close(fd)  # releases the lock


@dataclass(frozen=True)
class LoadedResult:
    """A valid result read from `path`: `result` typed, `data` the JSON object as read."""

    path: Path
    data: dict

    @cached_property
    def result(self) -> CellResult:
        return CellResult.from_dict(self.data)

    @property
    def cell(self) -> dict:
        return self.data["cell"]

    @property
    def ok(self) -> bool:
        return self.data["status"] == "ok"


def read_result(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """Read and validate one result file: (data, None) when good, (None, reason) when not."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({exc.__class__.__name__})"
    if not text.strip():
        return None, "empty file"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at line {exc.lineno})"
    errors = validate_result(data)
    if errors:
        return None, "not a valid result: " + "; ".join(errors[:3])
    cell = data["cell"]
    expected = result_filename(cell["model"], cell["task"], cell["lr"], cell["seed"])
    if path.name != expected:
        return None, f"its cell identity says {expected!r}, which disagrees with its filename"
    return data, None


def read_cell_result(path: str | os.PathLike) -> tuple[CellResult | None, str | None]:
    """`read_result`, typed: (CellResult, None) when good, (None, reason) when not."""
    data, why = read_result(path)
    return (None, why) if data is None else (CellResult.from_dict(data), None)


# Hidden files the harness itself keeps beside results (writer temporaries, cell locks,
# SIGTERM resume states): readers pass over them without a word.
# An experiment's inline task definitions, as the task file its cells read (experiment.py).
TASKS_FILE_PREFIX = ".tasks-"
OWN_HIDDEN_PREFIXES = (TMP_PREFIX, LOCK_PREFIX, ".resume-", TASKS_FILE_PREFIX)
# The subdirectory of a results directory that corrupt results are moved into (never read).
QUARANTINE_DIR = ".corrupt"
# The experiment manifest a sweep writes into its results directory (encoder_eval.experiment).
EXPERIMENT_NAME = "experiment.toml"


def foreign_entry(path: Path) -> str | None:
    """Why an entry of a results directory is not a result file to read (None: it is a
    candidate, or one of the harness's own files, which `is_own_file` tells apart)."""
    if path.is_dir():
        return "a subdirectory; results are read from the top level of the directory only"
    if not path.name.endswith(".json"):
        return "not a result file (result files are *.json)"
    if path.name.startswith("."):
        return "not a result file (a hidden file)"
    return None


def is_own_file(path: Path) -> bool:
    """A file the harness writes beside results that is not a result (read by no reader)."""
    return (
        path.name.startswith(OWN_HIDDEN_PREFIXES)
        or path.name in (QUARANTINE_DIR, EXPERIMENT_NAME)
        or (path.name.endswith((PREDICTIONS_SUFFIX, TREC_SUFFIX)) and not path.is_dir())
    )


# ----------------------------------------------------------------------------- done cells

MISSING, CORRUPT, MOVED = "missing", "corrupt", "moved"
DONE_STATES = STATUSES  # a diverged cell is a finished outcome too: it is never re-run


def cell_state(
    path: str | os.PathLike, phase: str | None = None
) -> tuple[str, dict | None, str | None]:
    """Whether the result file at `path` makes its cell done: the one definition of "done".

    Done ('ok' or 'diverged', data, None) means the file parses, validates and names the
    cell its file name (and `phase`, when given) says; ('missing', None, None) is no file;
    anything else is ('corrupt', None, why) and never counts as done.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return MISSING, None, None
    data, why = read_result(path)
    if data is None:
        return CORRUPT, None, why
    cell = data["cell"]
    if cell["lr_key"] != lr_key(cell["lr"]):
        why = f"its cell.lr_key {cell['lr_key']!r} disagrees with its lr {cell['lr']:g}"
        return CORRUPT, None, why
    if phase is not None and cell["phase"] != phase:
        return CORRUPT, None, f"a {cell['phase']} cell in a {phase} results directory"
    return data["status"], data, None


def quarantine_result(path: str | os.PathLike) -> Path | None:
    """Move a corrupt result into `<its directory>/.corrupt/<name>.<UTC time>`, never deleting
    it, so its cell runs again; returns where it went (None: the file was already gone)."""
    path = Path(path)
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    now_ns = time.time_ns()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ns // 10**9))
    stamp += f".{now_ns % 10**9 // 1000:06d}Z"
    dest = qdir / f"{path.name}.{stamp}"
    n = 0
    while os.path.lexists(dest):
        n += 1
        dest = qdir / f"{path.name}.{stamp}-{n}"
    try:
        os.rename(path, dest)
    except FileNotFoundError:
        return None
    return dest


def settle_cell(
    path: str | os.PathLike,
    phase: str | None = None,
    *,
    locked: bool = False,
    warn=None,
    state_of: Callable[[str | os.PathLike, str | None], tuple] | None = None,
) -> tuple[str, dict | None, str | None]:
    """`cell_state`, after moving a corrupt result aside so that its cell runs again
    (`state_of(path, phase)` instead of `cell_state` for another kind of result file).

    The move happens under the cell's lock (`locked`: the caller holds it already), so a
    result another runner is writing at that moment is never moved; a corrupt file whose
    cell another runner holds stays where it is ('corrupt'). A moved file gives 'moved'
    and one line to `warn` (default: stderr) naming it, where it went and why.
    """
    cell_state_ = state_of or cell_state
    state, data, why = cell_state_(path, phase)
    if state != CORRUPT:
        return state, data, why
    warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        lock = contextlib.nullcontext(True) if locked else cell_lock(path)
        with lock as mine:
            if not mine:
                return state, data, why
            state, data, why = cell_state_(path, phase)  # again, now that nobody writes it
            if state != CORRUPT:
                return state, data, why
            dest = quarantine_result(path)
    except OSError as exc:
        warn(f"warning: cannot move the corrupt result {path} aside ({exc.strerror or exc}); "
             "fix the directory's permissions or move it yourself")  # fmt: skip
        return state, data, why
    if dest is None:
        return MISSING, None, None
    warn(f"moved the corrupt result {path} to {dest} ({why}); its cell runs again")
    return MOVED, None, why


def count_quarantined(results_dir: str | os.PathLike) -> int:
    """How many corrupt results have been moved aside into `results_dir`'s `.corrupt/`."""
    qdir = Path(results_dir) / QUARANTINE_DIR
    return sum(1 for p in qdir.iterdir() if p.is_file()) if qdir.is_dir() else 0


def load_results(
    results_dir: str | os.PathLike, warn=None, phase: str | None = None
) -> list[LoadedResult]:
    """Read every valid result in `results_dir`, warning once per entry it skips.

    `warn` receives one message per skipped entry, naming it and why (default: print to
    stderr): files that are not done results by `cell_state` (that do not parse, validate
    or name their cell, or with `phase` are of the other phase), files that are not `*.json`
    result files and subdirectories (never descended into: a backup copy there must not fill
    a gap). The harness's own files (writer temporaries, lock files, resume states,
    `*.predictions.json`, `.corrupt/`) are passed over silently.
    """
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    root = Path(results_dir)
    out = []
    if not root.exists():
        return out
    for path in sorted(root.iterdir()):
        if is_own_file(path):
            continue
        reason = foreign_entry(path)
        if reason is None:
            _, data, reason = cell_state(path, phase)
            if data is None and reason is None:
                continue  # moved aside or removed since the listing
        if reason is not None:
            warn(f"skipping {path}: {reason}")
            continue
        out.append(LoadedResult(path, data))
    return out
