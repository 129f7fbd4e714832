"""Comparisons computed once: each (pair, task) row of `verdicts.compare_cells`, kept on
disk so that a second `summarize` (another format), a `report` after a `summarize`, or a
second `compare` reads it instead of resampling again. A cached row can save time, never
change a number.

Where: the user's own cache, `comparisons/` in the token cache's folder
(`$ENCODER_EVAL_CACHE_DIR/comparisons/`, default `~/.cache/encoder_eval/tokens/comparisons/`;
`tokencache.default_cache_dir`), never the results folder, which others may write (a lab's
shared directory, a synced copy, a co-author's tarball). The folder is created 0700 and used
only while it is a real directory (not a symlink) of this user that no one else can write
into (even when the token cache is shared on purpose): else one warning and no disk cache.
The `.stats-cache/` an older harness wrote into a results folder is never read.

An entry is the row before its family's correction (which depends on the other rows), named
by the sha256 of everything the row is computed from (so one entry serves every folder of
the same content):

* the ordered pair and the task (A and B are not swapped: a reversed row is not the same
  floating-point numbers), the task's metric and its language rule;
* per model, its table cell (LR key, per-seed scores) and each included report cell: file
  name, seed, the result's content and the bytes of its predictions file;
* the settings a row is computed from (`StatsSettings.row_inputs`: `n_resamples`, `seed`;
  the correction, its family and level act after it), STATS_VERSION and the numpy, scipy
  and statsmodels versions.

The flags that change what is computed (bootstrap interval, example-level test, ASO) end
the file name; an entry computed with more serves a request for less. An entry is trusted
only when its HMAC-SHA256, under a random key kept in the folder (`.hmac-key`, 0600, never
in a results folder), matches; it is read with the regular-file-only, size-capped reader
(`fileio.read_bytes`: a FIFO or a symlink to /dev/zero is refused unread), and
`verdicts.compute_rows` recomputes a row whose models, task, metric, seed counts or means
differ from the table's. Anything else is recomputed and written over, never trusted.
Writes are atomic (`fileio.write_atomic`); the folder is pruned of entries unused for
MAX_AGE_DAYS, and of the least recently used past MAX_ENTRIES or MAX_BYTES. The commands
say on stderr how many rows came from the cache. `rm -r` of the folder is always safe.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from encoder_eval.cells.predictions import predictions_path
from encoder_eval.core.errors import one_line
from encoder_eval.core.fileio import (
    TMP_PREFIX,
    FileProblem,
    MissingFile,
    clean_stale_temporaries,
    read_bytes,
    write_atomic,
)
from encoder_eval.core.results import LoadedResult
from encoder_eval.reports.stats_settings import StatsSettings

# Bump it on ANY change to what `verdicts.compare_cells` computes or to the statistics it
# calls (`core/stats.py`, `core/metrics.py` scoring): every cached row is then recomputed.
STATS_VERSION = 3  # 3: each task's resampling its own stream (stats.task_seed); notes x100
CACHE_SCHEMA = "encoder-eval-stats-cache/2"  # 2: HMAC-authenticated, in the user's cache
SUBDIR = "comparisons"  # inside `tokencache.default_cache_dir()`
KEY_NAME = ".hmac-key"
KEY_BYTES = 32
MAX_ENTRY_BYTES = 1 << 20  # a row is a few kB; nothing larger is read
MAX_AGE_DAYS = 30  # an entry unused this long is removed
MAX_ENTRIES = 20_000
MAX_BYTES = 256 << 20
ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.[01]{3}\.json")


def default_directory() -> Path:
    """The user's comparison cache: `comparisons/` in the token cache's folder (imported
    here: a command's `--help` does not load the token cache's numpy)."""
    from encoder_eval.data.tokencache import default_cache_dir

    return default_cache_dir() / SUBDIR


def _libraries() -> dict[str, str]:
    """The versions of the libraries the statistics call, part of every key. Imported here,
    not at the top: a command's `--help` must not pay for scipy and statsmodels."""
    import numpy
    import scipy
    import statsmodels

    return {
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "statsmodels": statsmodels.__version__,
    }


@dataclass(frozen=True)
class RowFlags:
    """What a comparison row computes beyond the verdict's statistics."""

    bootstrap: bool = True  # the two-level bootstrap interval of the difference
    example_test: bool = True  # the paired swap permutation test
    aso: bool = True  # almost stochastic order, both ways

    @property
    def bits(self) -> str:
        return "".join("1" if x else "0" for x in (self.bootstrap, self.example_test, self.aso))

    def covers(self, other: RowFlags) -> bool:
        """Whether a row computed with these flags holds everything `other` asks for."""
        mine, theirs = self.bits, other.bits
        return all(m == "1" or t == "0" for m, t in zip(mine, theirs, strict=True))


ALL_FLAGS = [RowFlags(b == "1", e == "1", a == "1") for b in "10" for e in "10" for a in "10"]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


class _Unusable(Exception):
    """Why the cache folder is not used (the warning's text)."""


class ComparisonCache:
    """The cached rows in `directory` (the user's `comparisons/`); also holds this run's rows
    in memory, so a cache that cannot be used still computes each row once. `computed` and
    `reused` count the rows of this run, `from_disk` those of `reused` read from entries,
    `refused` the entries found and not trusted."""

    def __init__(self, directory: str | os.PathLike, warn: Callable[[str], None] | None = None):
        # `warn(message)` prints "warning: message" (`errors.warn_once`); default: stderr.
        self.directory = Path(directory)
        self.warn = warn
        self.writable = True
        self.computed = 0
        self.reused = 0
        self.from_disk = 0
        self.refused = 0
        self._memory: dict[str, tuple[RowFlags, dict]] = {}
        self._listing: set[str] | None = None
        self._sides: dict[tuple[str, str], dict | None] = {}
        self._secret: bytes | None = None
        self._opened = False
        self._pruned = False
        self._last_from_disk = False  # whether `get`'s last row came from an entry

    def _warn(self, message: str) -> None:
        (self.warn or (lambda m: print(f"warning: {m}", file=sys.stderr)))(one_line(message))

    # -------------------------------------------------------------------------- keys

    def _side(
        self, model: str, task: str, stats_: object | None, cells: list[LoadedResult]
    ) -> dict | None:
        """One model's inputs on `task`; None when a file cannot be read (not cached)."""
        if (model, task) in self._sides:
            return self._sides[(model, task)]
        side: dict | None = {
            "model": model,
            "lr_key": getattr(stats_, "lr_key", None),
            "scores": sorted((getattr(stats_, "scores", None) or {}).items()),
            "cells": [],
        }
        for c in sorted(cells, key=lambda c: (c.cell["seed"], c.path.name)):
            try:
                # the one safe reader: a FIFO or a device named like a predictions file is
                # refused, never waited on (issue 40 item 4)
                preds = _sha256(read_bytes(predictions_path(c.path)))
            except (FileNotFoundError, MissingFile):
                preds = None
            except Exception:
                side = None
                break
            side["cells"].append([c.path.name, c.cell["seed"], _sha256(_canonical(c.data)), preds])
        self._sides[(model, task)] = side
        return side

    def key(
        self,
        model_a: str,
        model_b: str,
        task: str,
        metric: dict,
        table_cells: dict,
        cells: dict[tuple[str, str], list[LoadedResult]],
        settings: StatsSettings,
    ) -> str | None:
        """The entry name of (A, B, task) under these inputs and `settings` (what of them a
        row is computed from, `row_inputs`); None when one cannot be read. `metric`
        describes how the task is scored (its metric and language rule)."""
        sides = [
            self._side(m, task, table_cells.get((m, task)), cells.get((m, task), []))
            for m in (model_a, model_b)
        ]
        if None in sides:
            return None
        material = {
            "stats_version": STATS_VERSION,
            "libraries": _libraries(),
            "task": task,
            "metric": metric,
            "a": sides[0],
            "b": sides[1],
            **settings.row_inputs(),  # n_resamples, seed: the names the key has always had
        }
        return _sha256(_canonical(material))

    # -------------------------------------------------------------------------- the folder

    def _open(self) -> bytes | None:
        """The HMAC key of a usable cache folder, made (0700, key 0600) when missing; None,
        with one warning, when the folder is not one to trust or cannot be made."""
        if self._opened:
            return self._secret
        self._opened = True
        try:
            self._check_folder()
            self._secret = self._load_key()
        except _Unusable as exc:
            self.writable = False
            self._warn(f"not using the statistics cache {self.directory}: {exc}; computing "
                       "without it")  # fmt: skip
        except OSError as exc:
            self.writable = False
            self._warn(f"cannot write the statistics cache {self.directory} "
                       f"({exc.strerror or exc}); computing without it")  # fmt: skip
        return self._secret

    def _check_folder(self) -> None:
        path = self.directory
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            from encoder_eval.data.tokencache import shared

            # the token cache's folders as it makes them (0700, or the umask's when shared on
            # purpose); this one always 0700: a row is the user's own
            for folder in reversed([p for p in path.parents if not p.exists()]):
                folder.mkdir(mode=0o777 if shared() else 0o700, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            raise _Unusable("it is a symbolic link (remove it; the cache is made again)")
        if not stat.S_ISDIR(info.st_mode):
            raise _Unusable("it is not a directory")
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise _Unusable(
                f"another user could write into it (mode {stat.S_IMODE(info.st_mode):04o}, "
                f"owner uid {info.st_uid}); remove it or chmod 700 it"
            )

    def _load_key(self) -> bytes:
        path = self.directory / KEY_NAME
        if not os.path.lexists(path):
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=self.directory)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd)
                os.close(fd)
                try:
                    os.link(tmp, path)  # atomic: of two processes, one key wins
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
        info = os.lstat(path)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.getuid()
            or info.st_mode & 0o077
            or info.st_size != KEY_BYTES
        ):
            raise _Unusable(f"its key {KEY_NAME} is not a private {KEY_BYTES}-byte file of yours")
        try:
            return read_bytes(path, limit=KEY_BYTES)
        except FileProblem as exc:
            raise _Unusable(f"its key cannot be read ({exc.reason})") from None

    def _mac(self, key: str, flags: RowFlags, row: dict) -> str:
        material = {"schema": CACHE_SCHEMA, "stats_version": STATS_VERSION, "key": key,
                    "flags": flags.bits, "row": row}  # fmt: skip
        return hmac.new(self._secret or b"", _canonical(material), hashlib.sha256).hexdigest()

    def _prune(self) -> None:
        """Remove entries unused for MAX_AGE_DAYS, anything else named like an entry that is
        not a regular file, then the least recently used past MAX_ENTRIES or MAX_BYTES."""
        self._pruned = True
        clean_stale_temporaries(self.directory)
        old = time.time() - MAX_AGE_DAYS * 86400
        kept: list[tuple[float, int, str]] = []
        try:
            with os.scandir(self.directory) as it:
                for entry in it:
                    if not ENTRY_NAME.fullmatch(entry.name):
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                        if not stat.S_ISREG(info.st_mode) or info.st_mtime < old:
                            os.unlink(entry.path)
                        else:
                            kept.append((info.st_mtime, info.st_size, entry.name))
                    except FileNotFoundError:
                        pass
            kept.sort()
            total = sum(size for _, size, _ in kept)
            while kept and (len(kept) > MAX_ENTRIES or total > MAX_BYTES):
                _, size, name = kept.pop(0)
                total -= size
                try:
                    os.unlink(self.directory / name)
                except FileNotFoundError:
                    pass
        except OSError:
            pass  # pruning is housekeeping: a failure costs disk, never a number
        self._listing = None

    # -------------------------------------------------------------------------- entries

    def _path(self, key: str, flags: RowFlags) -> Path:
        return self.directory / f"{key}.{flags.bits}.json"

    def _names(self) -> set[str]:
        if self._listing is None:
            try:
                self._listing = set(os.listdir(self.directory))
            except OSError:
                self._listing = set()
        return self._listing

    def get(self, key: str, flags: RowFlags) -> dict | None:
        """The row (as a dict) stored under `key` by a computation that covers `flags`."""
        self._last_from_disk = False
        if key in self._memory and self._memory[key][0].covers(flags):
            return json.loads(json.dumps(self._memory[key][1]))  # a copy: rows are mutated
        if self._open() is None:
            return None
        names = self._names()
        for have in sorted(ALL_FLAGS, key=lambda f: f.bits.count("1")):
            path = self._path(key, have)
            if path.name in names and have.covers(flags):
                row = self._read(path, key, have)
                if row is not None:
                    self.from_disk += 1
                    self._last_from_disk = True
                    try:
                        os.utime(path)  # used: the last to be pruned
                    except OSError:
                        pass
                    return row
                self.refused += 1
        return None

    def reject(self, key: str) -> None:
        """The row `get(key)` just returned disagrees with the table (`verdicts.compute_rows`):
        it is not counted as read, and is recomputed and written over."""
        self._memory.pop(key, None)
        if self._last_from_disk:
            self.from_disk -= 1
            self.refused += 1
            self._last_from_disk = False

    def _read(self, path: Path, key: str, flags: RowFlags) -> dict | None:
        try:
            doc = json.loads(read_bytes(path, limit=MAX_ENTRY_BYTES))
        except (FileProblem, OSError, ValueError, RecursionError):
            return None
        if (
            not isinstance(doc, dict)
            or doc.get("schema") != CACHE_SCHEMA
            or doc.get("stats_version") != STATS_VERSION
            or doc.get("key") != key
            or doc.get("flags") != flags.bits
            or not isinstance(doc.get("row"), dict)
            or not isinstance(doc.get("mac"), str)
            or not hmac.compare_digest(doc["mac"], self._mac(key, flags, doc["row"]))
        ):
            return None
        return doc["row"]

    def put(self, key: str, flags: RowFlags, row: dict) -> None:
        """Keep `row` for this run and, when the cache folder can be used, on disk."""
        old = self._memory.get(key)
        if old is None or not old[0].covers(flags):
            self._memory[key] = (flags, json.loads(json.dumps(row)))
        if self._open() is None or not self.writable:
            return
        if not self._pruned:
            self._prune()
        try:
            text = json.dumps(
                {
                    "schema": CACHE_SCHEMA,
                    "stats_version": STATS_VERSION,
                    "key": key,
                    "flags": flags.bits,
                    "mac": self._mac(key, flags, row),
                    "row": row,
                },
                allow_nan=True,
            )
        except (TypeError, ValueError):
            return  # a value JSON cannot hold: this row is not kept
        try:
            write_atomic(self._path(key, flags), text + "\n", mode_bits=0o600)
        except OSError as exc:
            self.writable = False
            self._warn(f"cannot write the statistics cache {self.directory} "
                       f"({exc.strerror or exc}); computing without it")  # fmt: skip

    def note(self) -> str | None:
        """The line a command prints on stderr when rows came from the cache (None when none
        did): how many, from where, and how to recompute them."""
        if not self.from_disk and not self.refused:
            return None
        total = self.computed + self.reused
        refused = (
            f"; {self.refused} entr{'y' if self.refused == 1 else 'ies'} not trusted and recomputed"
            if self.refused
            else ""
        )
        return (
            f"note: {self.from_disk} of {total} comparison row(s) read from the statistics "
            f"cache {self.directory}{refused} (--no-cache recomputes every row)"
        )


def open_cache(
    *,
    enabled: bool = True,  # StatsSettings.cache (--no-cache)
    warn: Callable[[str], None] | None,
    directory: str | os.PathLike | None = None,
) -> ComparisonCache | None:
    """The user's comparison cache (`default_directory()` unless `directory`; None when
    `enabled` is False: `--no-cache`). Nothing of it is in a results folder."""
    if not enabled:
        return None
    return ComparisonCache(default_directory() if directory is None else directory, warn)


def print_note(cache: ComparisonCache | None) -> None:
    """Print the cache's line (`ComparisonCache.note`) on stderr, if it has one."""
    if cache is not None and (line := cache.note()):
        print(line, file=sys.stderr)
