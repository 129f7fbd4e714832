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
import errno
import fcntl
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from encoder_eval.core import process_state
from encoder_eval.core.errors import HarnessError, one_line, quote
from encoder_eval.core.fileio import (  # noqa: F401  (re-exported: the one atomic writer and its cleaner)
    FILE_MODE,
    TMP_PREFIX,
    UNSAFE_IN_NAME,
    DamagedFile,
    MissingFile,
    UnreadableFile,
    clean_stale_temporaries,
    parse_json,
    read_bytes,
    safe_filename_part,
    write_json_atomic,
)
from encoder_eval.core.protocol import PROBE_PHASE, lr_key_for
from encoder_eval.core.schema import (  # noqa: F401  (re-exported: the result schema is defined in schema.py)
    PROBE_SCHEMA_NAME,
    PROBE_SCHEMA_VERSION,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    STATUSES,
    CellResult,
    is_number,
    validate_probe_result,
    validate_result,
)

LOCK_PREFIX = ".lock-"
PREDICTIONS_SUFFIX = ".predictions.json"  # per-example predictions written beside a result
TREC_SUFFIX = ".run.trec"  # a ranking cell's TREC run file, written beside its result
PROBE_RESULT_SUFFIX = ".probe.json"  # a probe cell's result (`encoder-eval probe --model`)


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


def probe_result_filename(model: str, pooling: str, task: str) -> str:
    """The file name of a probe cell's result: `{model}_{pooling}_{task}.probe.json`."""
    return f"{safe_filename_part(model)}_{pooling}_{task}{PROBE_RESULT_SUFFIX}"


def is_probe_result_name(path: str | os.PathLike) -> bool:
    """Whether `path` is named like a probe cell's result (the only probe files ever moved)."""
    name = Path(path).name
    return name.endswith(PROBE_RESULT_SUFFIX) and not name.startswith(".")


def _lock_mode(directory: Path) -> int:
    """The mode of a lock file in `directory`: the results' file mode, group-writable where
    the directory is (a team's shared results), so any member can take a leftover lock."""
    mode = FILE_MODE
    with contextlib.suppress(OSError):
        if os.stat(directory).st_mode & stat.S_IWGRP:
            mode |= stat.S_IRGRP | stat.S_IWGRP
    return mode


def _open_lock_file(lock_path: Path) -> int:
    """Open (creating it when absent) the lock file; read-only when it is another user's
    (flock needs no write access), so a leftover lock never blocks its cell."""
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    except PermissionError:
        return os.open(lock_path, os.O_RDONLY)
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, _lock_mode(lock_path.parent))
    return fd


# errno values of a file system that has no flock (Lustre `noflock`, NFS without a lock
# daemon): cells are then locked by `_exclusive_lock`.
NO_FLOCK_ERRNOS = frozenset(
    e
    for e in (errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", None), errno.ENOLCK)
    if e is not None
)
EXCL_SUFFIX = ".excl"  # `.lock-<result>.excl`: the lock file where flock is missing
_noted_no_flock: set[str] = set()
process_state.set_clearer("no-flock notes (core/results.py)", _noted_no_flock)


def _note_no_flock(directory: Path) -> None:
    key = str(directory)
    if key not in _noted_no_flock:
        _noted_no_flock.add(key)
        print(
            f"note: the file system of {directory} has no flock; cells are locked with "
            f"{LOCK_PREFIX}*{EXCL_SUFFIX} files naming their host and process instead. A "
            "lock left by a process of this host that is gone is taken over; one left by "
            "another host is not: remove it by hand once that host's run is gone",
            file=sys.stderr,
            flush=True,
        )


def _lock_owner() -> str:
    return f"{socket.gethostname()} {os.getpid()} {os.urandom(6).hex()}\n"


def _is_stale(owner: str) -> bool:
    """A lock whose holder is a process of this host that no longer exists."""
    parts = owner.split()
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _take_exclusive(lock_path: Path) -> bool:
    """Create `lock_path` with O_EXCL (True: this process holds the cell now); a stale lock
    (`_is_stale`) is renamed away first, and put back if it turned out to be fresh."""
    owner = _lock_owner()
    for _ in range(3):
        try:
            fd = os.open(
                lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, _lock_mode(lock_path.parent)
            )
        except FileExistsError:
            try:
                seen = lock_path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                continue  # released just now: try again
            if not _is_stale(seen):
                return False
            aside = lock_path.with_name(f"{lock_path.name}.stale-{os.getpid()}")
            try:
                os.rename(lock_path, aside)
            except FileNotFoundError:
                continue
            if aside.read_text(encoding="utf-8", errors="replace") != seen:
                with contextlib.suppress(OSError):  # another runner's fresh lock: give it back
                    os.link(aside, lock_path)
                aside.unlink(missing_ok=True)
                return False
            aside.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(owner)
        return True
    return False


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path, wait: bool) -> Iterator[bool]:
    """`cell_lock` where flock is missing: an O_EXCL lock file naming host and process."""
    _note_no_flock(lock_path.parent)
    while not _take_exclusive(lock_path):
        if not wait:
            yield False
            return
        time.sleep(1.0)
    try:
        yield True
    finally:
        lock_path.unlink(missing_ok=True)


@contextlib.contextmanager
def cell_lock(out_json: str | os.PathLike, wait: bool = False) -> Iterator[bool]:
    """Hold an exclusive lock for one cell while it runs; yields False if another runner has it.

    The lock is `flock` on a hidden file beside the result: the kernel releases it when its
    holder exits or is killed, so a dead runner never leaves a cell locked. `wait=True`
    blocks until the holder is done instead of yielding False. The holder removes the file
    on release (a killed holder leaves it behind, harmlessly: it is created with the
    results' file mode, group-writable in a group-writable directory, and another user's
    leftover is locked read-only); a runner that opened the file just before that notices,
    once it has the lock, that the path names another file now, and locks that one instead.
    On a file system without flock, `_exclusive_lock` holds the cell instead.
    """
    path = Path(out_json)
    lock_path = path.parent / f"{LOCK_PREFIX}{path.name}"
    while True:
        try:
            fd = _open_lock_file(lock_path)
        except OSError as exc:
            raise _lock_error(path, lock_path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except OSError as exc:
            os.close(fd)
            if exc.errno not in NO_FLOCK_ERRNOS:
                raise _lock_error(path, lock_path, exc) from None
            with contextlib.suppress(OSError):  # only ever this process's empty file
                if os.stat(lock_path).st_size == 0 and os.stat(lock_path).st_uid == os.geteuid():
                    os.unlink(lock_path)
            excl = lock_path.with_name(lock_path.name + EXCL_SUFFIX)
            try:
                with _exclusive_lock(excl, wait) as mine:
                    yield mine
            except OSError as exc2:
                raise _lock_error(path, excl, exc2) from None
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


def _lock_error(path: Path, lock_path: Path, exc: OSError) -> HarnessError:
    """The one-line error of a cell lock that cannot be taken, with what to do."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = (
            f"make {path.parent} writable for you (a team's shared results directory: "
            "group-writable, chmod g+w), or choose another results directory"
        )
    elif exc.errno == errno.EBADF:
        fix = (
            f"{lock_path} is another user's and this file system locks only files one may "
            "write: ask its owner to remove it, or make it group-writable"
        )
    else:
        fix = "check the file system, or choose another results directory"
    return HarnessError(f"cannot lock the cell of {path} ({lock_path}: {why}); {fix}")


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


@dataclass(frozen=True)
class ResultKind:
    """How one kind of result file is judged: the schema (and the newest version of it this
    harness reads) and validator it must pass, and the file name its cell identity gives."""

    schema: str
    version: int
    validate: Callable[[object], list[str]]
    what: str  # how a message names it: "result", "probe result"
    filename: Callable[[dict], str]  # the file name of the cell a valid result names
    missing: str  # the reason given for a file gone since it was listed


# Fine-tune cells (classification, regression, ranking: `schema.CellResult`) and probe
# cells (`*.probe.json`, `schema.validate_probe_result`): one reader for both (`_examine`).
RESULT_KINDS: dict[str, ResultKind] = {
    "finetune": ResultKind(
        SCHEMA_NAME,
        SCHEMA_VERSION,
        validate_result,
        "result",
        lambda cell: result_filename(cell["model"], cell["task"], cell["lr"], cell["seed"]),
        "unreadable (FileNotFoundError)",
    ),
    "probe": ResultKind(
        PROBE_SCHEMA_NAME,
        PROBE_SCHEMA_VERSION,
        validate_probe_result,
        "probe result",
        lambda cell: probe_result_filename(cell["model"], cell["pooling"], cell["task"]),
        "no file",
    ),
}


def result_kind(path: str | os.PathLike) -> str:
    """The kind of result a file is, by its name: 'probe' (`*.probe.json`) or 'finetune'."""
    return "probe" if is_probe_result_name(path) else "finetune"


def _examine(path: Path, kind: str) -> tuple[dict | None, str | None, bool]:
    """(data, None, True) for a valid result of `kind` (`RESULT_KINDS`) at `path`; else
    (None, why, judged): `judged` is False when this harness cannot judge the file (it does
    not read, or a newer harness wrote it), True when the file reads and is not a valid
    result (damaged). The result must validate against its kind's schema and name the cell
    its file name says."""
    spec = RESULT_KINDS[kind]
    try:
        raw = read_bytes(path)
        data = parse_json(raw, path)
    except MissingFile:
        return None, spec.missing, False
    except UnreadableFile as exc:
        return None, exc.reason, False
    except DamagedFile as exc:
        return None, "empty file" if not raw.strip() else exc.reason, True
    if isinstance(data, dict) and data.get("schema") == spec.schema:
        version = data.get("schema_version")
        if isinstance(version, int) and not isinstance(version, bool) and version > spec.version:
            return (
                None,
                (
                    f"written by a newer harness (schema_version {quote(version)}; this one "
                    f"reads {spec.version}): read it with that harness"
                ),
                False,
            )
    errors = spec.validate(data)
    if errors:
        return None, f"not a valid {spec.what}: " + "; ".join(errors[:3]), True
    expected = spec.filename(data["cell"])
    if path.name != expected:
        return (
            None,
            f"its cell identity says {quote(expected)}, which disagrees with its filename",
            True,
        )
    return data, None, True


def read_result(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """Read and validate one result file, of either kind (by its name: `result_kind`):
    (data, None) when good, (None, reason) when not."""
    data, why, _ = _examine(Path(path), result_kind(path))
    return data, why


def read_cell_result(path: str | os.PathLike) -> tuple[CellResult | None, str | None]:
    """`read_result`, typed: (CellResult, None) when good, (None, reason) when not."""
    data, why = read_result(path)
    return (None, why) if data is None else (CellResult.from_dict(data), None)


# Hidden files the harness itself keeps beside results (writer temporaries, cell locks,
# SIGTERM resume states): readers pass over them without a word.
# An experiment's inline task definitions, as the task file its cells read (experiment.py).
TASKS_FILE_PREFIX = ".tasks-"
# A cell's resume state, saved on a stop signal: `.resume-<result name>.pt` (cells/resume.py).
RESUME_PREFIX, RESUME_SUFFIX = ".resume-", ".pt"
OWN_HIDDEN_PREFIXES = (TMP_PREFIX, LOCK_PREFIX, RESUME_PREFIX, TASKS_FILE_PREFIX)
# The subdirectory of a results directory that corrupt results are moved into (never read).
QUARANTINE_DIR = ".corrupt"
# The subdirectory where an older harness kept computed comparisons: passed over by every
# reader and never read or written now (`reports/comparison_cache.py` keeps them in the
# user's cache, where no one else writes).
STATS_CACHE_DIR = ".stats-cache"
# The experiment manifest a sweep writes into its results directory (encoder_eval.plans.experiment).
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
        or path.name in (QUARANTINE_DIR, STATS_CACHE_DIR, EXPERIMENT_NAME)
        or (path.name.endswith((PREDICTIONS_SUFFIX, TREC_SUFFIX)) and not path.is_dir())
    )


# ----------------------------------------------------------------------------- done cells

MISSING, CORRUPT, MOVED, KEPT = "missing", "corrupt", "moved", "kept"
DONE_STATES = STATUSES  # a diverged cell is a finished outcome too: it is never re-run
# A result file's name: `{model}_{task}_{LR key}_s{seed}.json` (`result_filename`).
_RESULT_NAME = re.compile(r"[^.].*_lr[0-9][0-9A-Za-z.+-]*_s[0-9]+\.json")


def is_result_name(path: str | os.PathLike) -> bool:
    """Whether `path` is named like a fine-tuning cell's result (`result_filename`): the only
    files the harness ever moves aside."""
    name = Path(path).name
    return bool(_RESULT_NAME.fullmatch(name)) and not is_own_file(Path(path))


def cell_state(
    path: str | os.PathLike,
    phase: str | None = None,
    *,
    model: str | None = None,
    task: str | None = None,
) -> tuple[str, dict | None, str | None]:
    """Whether the result file at `path` makes its cell done: the one definition of "done".

    Done ('ok' or 'diverged', data, None) means the file parses, validates and names the
    cell its file name (and `phase`, `model` and `task`, when given) says; ('missing', None,
    None) is no file. ('kept', None, why) is a file this harness must leave alone: one it
    cannot read (permissions, I/O), one a newer harness wrote, or another model's or task's
    valid result under this cell's name; ('corrupt', None, why) is a file that reads and is
    not this cell's valid result. Neither counts as done.
    A probe cell's result (`*.probe.json`, `schema.validate_probe_result`) is done ('ok') by
    the same rules; it has no LR, seed or phase to check.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return MISSING, None, None
    kind = result_kind(path)
    data, why, judged = _examine(path, kind)
    if data is None:
        return (CORRUPT if judged else KEPT), None, why
    cell = data["cell"]
    probe = kind == "probe"  # a probe cell: no LR, seed or phase
    if not probe and cell["lr_key"] != lr_key(cell["lr"]):
        why = f"its cell.lr_key {quote(cell['lr_key'])} disagrees with its lr {cell['lr']:g}"
        return CORRUPT, None, why
    cell_phase = PROBE_PHASE if probe else cell["phase"]
    if phase is not None and cell_phase != phase:
        return CORRUPT, None, f"a {cell_phase} cell in a {phase} results directory"
    return planned_cell_state((("ok" if probe else data["status"]), data, None), model, task)


def planned_cell_state(
    state: tuple[str, dict | None, str | None], model: str | None, task: str | None
) -> tuple[str, dict | None, str | None]:
    """`cell_state`'s verdict `state` (read without `model` and `task`) with the planned
    model and task checked too, without reading the file again: a valid result of another
    model or task under this cell's name is 'kept'."""
    data = state[1]
    if data is None:
        return state
    for kind, planned in (("model", model), ("task", task)):
        if planned is not None and data["cell"][kind] != planned:
            return (
                KEPT,
                None,
                (
                    f"a valid result of {kind} {quote(data['cell'][kind])}, whose file name is "
                    f"{kind} {quote(planned)}'s too: give one of the two another name"
                ),
            )
    return state


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
    names_result: Callable[[str | os.PathLike], bool] | None = None,
    model: str | None = None,
    task: str | None = None,
) -> tuple[str, dict | None, str | None]:
    """`cell_state` (with `model` and `task`), after moving a corrupt result aside so that its
    cell runs again (`state_of(path, phase)` instead of `cell_state`, and `names_result`
    instead of `is_result_name`, for another kind of result file).

    Only a file named like a cell result that reads and fails to parse or validate is moved,
    into `.corrupt/` (never deleted); the move happens under the cell's lock (`locked`: the
    caller holds it already), so a result another runner is writing at that moment is never
    moved, and a corrupt file whose cell another runner holds stays ('corrupt'). A moved file
    gives 'moved' and one line to `warn` (default: stderr) naming it, where it went and why.
    A file this harness must leave alone (`cell_state`'s 'kept', or any file not named like
    a cell result) gives 'kept' and one line saying so: its cell is not done, and no runner
    writes over it until the user has looked.
    """
    cell_state_ = state_of or (lambda p, ph: cell_state(p, ph, model=model, task=task))
    names_result_ = names_result or is_result_name
    warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
    state, data, why = cell_state_(path, phase)
    if state == CORRUPT and not names_result_(path):
        state, why = KEPT, f"{why}; not named like a cell result, so never moved"
    if state == KEPT:
        warn(
            one_line(
                f"left {path} in place ({why}); its cell is not done, and is not run "
                "over it: fix or move the file, then run again"
            )
        )
        return state, data, why
    if state != CORRUPT:
        return state, data, why
    try:
        lock = contextlib.nullcontext(True) if locked else cell_lock(path)
        with lock as mine:
            if not mine:
                return state, data, why
            state, data, why = cell_state_(path, phase)  # again, now that nobody writes it
            if state != CORRUPT:
                return state, data, why
            dest = quarantine_result(path)
    except (OSError, HarnessError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        warn(
            f"warning: cannot move the corrupt result {path} aside ({problem}); its cell is "
            f"not done: move it away yourself"
        )
        return state, data, why
    if dest is None:
        return MISSING, None, None
    warn(one_line(f"moved the corrupt result {path} to {dest} ({why}); its cell runs again"))
    return MOVED, None, why


def count_quarantined(results_dir: str | os.PathLike) -> int:
    """How many corrupt results have been moved aside into `results_dir`'s `.corrupt/`."""
    qdir = Path(results_dir) / QUARANTINE_DIR
    return sum(1 for p in qdir.iterdir() if p.is_file()) if qdir.is_dir() else 0


def load_results(
    results_dir: str | os.PathLike,
    warn=None,
    phase: str | None = None,
    states: dict[Path, tuple[str, dict | None, str | None]] | None = None,
) -> list[LoadedResult]:
    """Read every valid result in `results_dir`, warning once per entry it skips.

    `warn` receives one message per skipped entry, naming it and why (default: print to
    stderr): files that are not done results by `cell_state` (that do not parse, validate
    or name their cell, or with `phase` are of the other phase), files that are not `*.json`
    result files and subdirectories (never descended into: a backup copy there must not fill
    a gap). The harness's own files (writer temporaries, lock files, resume states,
    `*.predictions.json`, `.corrupt/`) are passed over silently. `states`, when given,
    receives each file's `cell_state` verdict by path, so a caller that needs them (status)
    reads every file once.
    """
    warn = warn or (lambda msg: print(f"warning: {one_line(msg)}", file=sys.stderr))
    root = Path(results_dir)
    out = []
    if not root.exists():
        return out
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise UnreadableFile(root, f"cannot be listed ({exc.strerror or exc})") from None
    for path in entries:
        if is_own_file(path):
            continue
        reason = foreign_entry(path)
        if reason is None:
            state = cell_state(path, phase)
            if states is not None:
                states[path] = state
            _, data, reason = state
            if data is None and reason is None:
                continue  # moved aside or removed since the listing
        if reason is not None:
            warn(f"skipping {path}: {reason}")
            continue
        out.append(LoadedResult(path, data))
    return out
