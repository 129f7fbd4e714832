"""Result files: the versioned schema, atomic writing, and tolerant reading.

A result is one JSON file per cell. It is written to a hidden temporary file in the same
directory, fsynced and renamed over its final name, so a reader sees either nothing or
the whole file. Readers pass over the harness's own hidden files (temporaries, locks,
resume states, the `.corrupt/` directory of results moved aside) silently, and skip anything
else that is not a valid result (including subdirectories, which they never descend into)
with one warning each naming it and why. `cell_state` is the one definition of a done cell.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .protocol import SELECTION_SPLITS, lr_key_for

SCHEMA_NAME = "encoder-eval-result"
# 2: provenance.data.identity (the resolved data source), recipe.selection_split, and
# scores that may be undefined (null, with the reason under `undefined`).
SCHEMA_VERSION = 2
STATUSES = ("ok", "diverged")
TMP_PREFIX = ".tmp-"
LOCK_PREFIX = ".lock-"
PREDICTIONS_SUFFIX = ".predictions.json"  # per-example predictions written beside a result


def lr_key(lr: float) -> str:
    """The stable key of a learning rate: its grid key, or 'lr' + its value when off the grid."""
    return lr_key_for(lr) or f"lr{lr:.3g}"


def safe_component(text: str) -> str:
    """Make a string safe as one file-name component (no separators, no control characters)."""
    cleaned = re.sub(r"[/\\\x00-\x1f]", "_", text)
    return cleaned if cleaned not in ("", ".", "..") else cleaned.replace(".", "_") or "_"


def result_filename(model: str, task: str, lr: float, seed: int) -> str:
    """`{model}_{task}_{lr key}_s{seed}.json`: seeds and learning rates never overwrite each other."""
    return f"{safe_component(model)}_{safe_component(task)}_{lr_key(lr)}_s{seed}.json"


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_file_mode()


def write_json_atomic(path: str | os.PathLike, obj: dict) -> None:
    """Write `obj` as JSON so that `path` holds either its old content or the whole new one."""
    path = Path(path)
    data = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name + ".", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)  # mkstemp creates 0600; results are for the whole team
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def clean_stale_temporaries(directory: str | os.PathLike, older_than_s: float = 60.0) -> int:
    """Remove temporary files a killed writer left behind; returns how many were removed."""
    removed = 0
    now = time.time()
    for tmp in Path(directory).glob(TMP_PREFIX + "*"):
        try:
            if now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
                removed += 1
        except FileNotFoundError:
            pass
    return removed


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


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate_result(obj) -> list[str]:
    """Return every way `obj` fails the result schema (an empty list: valid)."""
    if not isinstance(obj, dict):
        return ["not a JSON object"]
    errors = []
    if obj.get("schema") != SCHEMA_NAME:
        errors.append(f"schema is {obj.get('schema')!r}, expected {SCHEMA_NAME!r}")
    version = obj.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        errors.append(
            f"written by an older harness (schema_version {version}, this one reads "
            f"{SCHEMA_VERSION}); re-run the cell"
        )
    elif version != SCHEMA_VERSION:
        errors.append(f"schema_version is {version!r}, expected {SCHEMA_VERSION}")
    if errors:
        return errors
    cell = obj.get("cell")
    if not isinstance(cell, dict):
        return ["missing 'cell'"]
    for key, kind in (("model", str), ("task", str), ("lr_key", str), ("phase", str)):
        if not isinstance(cell.get(key), kind):
            errors.append(f"cell.{key} missing or not a {kind.__name__}")
    if not _is_number(cell.get("lr")) or cell.get("lr", 0) <= 0:
        errors.append("cell.lr missing or not a positive number")
    if not isinstance(cell.get("seed"), int):
        errors.append("cell.seed missing or not an integer")
    if cell.get("phase") not in ("select", "report"):
        errors.append(f"cell.phase is {cell.get('phase')!r}, expected select or report")
    status = obj.get("status")
    if status not in STATUSES:
        errors.append(f"status is {status!r}, expected one of {STATUSES}")
    if not isinstance(obj.get("metric"), str):
        errors.append("metric missing")
    for section in ("training", "recipe", "protocol", "provenance"):
        if not isinstance(obj.get(section), dict):
            errors.append(f"missing section {section!r}")
    if errors:
        return errors
    if status == "ok":
        errors += _score_errors("dev", obj.get("dev"))
        report = obj.get("report")
        if cell["phase"] == "report":
            errors += _score_errors("report", report)
        elif report is not None:
            errors.append("a select cell must not hold a report score")
    else:
        if not isinstance(obj["training"].get("diverged_at_step"), int):
            errors.append("diverged cell without training.diverged_at_step")
    if not isinstance(obj["protocol"].get("on_protocol"), bool):
        errors.append("protocol.on_protocol missing")
    if obj["recipe"].get("selection_split") not in SELECTION_SPLITS:
        errors.append(f"recipe.selection_split is {obj['recipe'].get('selection_split')!r}, "
                      f"expected one of {SELECTION_SPLITS}")  # fmt: skip
    data = obj["provenance"].get("data")
    if not isinstance(data, dict) or not isinstance(data.get("identity"), str):
        errors.append("provenance.data.identity missing (the data source the cell read)")
    return errors


def _score_errors(name: str, section) -> list[str]:
    """A score section holds a finite mean, or a null mean with the reason it is undefined."""
    if not isinstance(section, dict):
        return [f"status ok but {name} scores are missing"]
    if not isinstance(section.get("per_language"), dict):
        return [f"{name}.per_language missing"]
    if _is_number(section.get("mean")):
        return []
    undefined = section.get("undefined")
    if section.get("mean") is None and isinstance(undefined, dict) and undefined:
        return []
    return [f"{name}.mean is missing or not finite, and no {name}.undefined says why"]


def score_mean(data: dict, section: str) -> float | None:
    """The mean of a result's `dev` or `report` scores; None when missing or undefined."""
    scores = data.get(section) or {}
    mean = scores.get("mean")
    return float(mean) if _is_number(mean) else None


def data_identity(data: dict) -> str:
    """The data source a cell read (one comparable string: source kind, dataset, commit)."""
    return str(((data.get("provenance") or {}).get("data") or {}).get("identity"))


@dataclass(frozen=True)
class LoadedResult:
    path: Path
    data: dict

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


# Hidden files the harness itself keeps beside results (writer temporaries, cell locks,
# SIGTERM resume states): readers pass over them without a word.
OWN_HIDDEN_PREFIXES = (TMP_PREFIX, LOCK_PREFIX, ".resume-")
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
        or (path.name.endswith(PREDICTIONS_SUFFIX) and not path.is_dir())
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
    path: str | os.PathLike, phase: str | None = None, *, locked: bool = False, warn=None
) -> tuple[str, dict | None, str | None]:
    """`cell_state`, after moving a corrupt result aside so that its cell runs again.

    The move happens under the cell's lock (`locked`: the caller holds it already), so a
    result another runner is writing at that moment is never moved; a corrupt file whose
    cell another runner holds stays where it is ('corrupt'). A moved file gives 'moved'
    and one line to `warn` (default: stderr) naming it, where it went and why.
    """
    state, data, why = cell_state(path, phase)
    if state != CORRUPT:
        return state, data, why
    warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        lock = contextlib.nullcontext(True) if locked else cell_lock(path)
        with lock as mine:
            if not mine:
                return state, data, why
            state, data, why = cell_state(path, phase)  # again, now that nobody writes it
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
