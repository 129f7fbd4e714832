"""Comparisons computed once: each (pair, task) row of `verdicts.compare_cells`, kept on
disk beside the table so that a second `summarize` (another format), a `report` after a
`summarize`, or a second `compare` reads it instead of resampling again.

An entry is the row before its family's correction (which depends on the other rows), in
`<results dir>/.stats-cache/` (`results.STATS_CACHE_DIR`, which every reader of results
passes over; for a table over several folders, the first `--results-dir`'s: the key below
names files, not folders, so an entry is right whichever folder holds it), named by the sha256 of everything the row is computed from:

* the ordered pair and the task (A and B are not swapped: a reversed row is not the same
  floating-point numbers), the task's metric and its language rule;
* per model, its table cell (LR key, per-seed scores) and each included report cell: file
  name, seed, the result's content and the bytes of its predictions file;
* `n_resamples`, `seed`, STATS_VERSION and the numpy, scipy and statsmodels versions.

The flags that change what is computed (bootstrap interval, example-level test, ASO) end
the file name; an entry computed with more serves a request for less. Writes are atomic
(`fileio.write_atomic`); an entry that does not parse, names another key or fails its
checksum is recomputed and written over, never trusted. A results folder that cannot be
written is read as it is, with one warning. `rm -r .stats-cache` is always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from encoder_eval.cells.predictions import predictions_path
from encoder_eval.core.errors import one_line
from encoder_eval.core.fileio import MissingFile, read_bytes, write_atomic
from encoder_eval.core.results import STATS_CACHE_DIR, LoadedResult

# Bump it on ANY change to what `verdicts.compare_cells` computes or to the statistics it
# calls (`core/stats.py`, `core/metrics.py` scoring): every cached row is then recomputed.
STATS_VERSION = 3  # 3: each task's resampling its own stream (stats.task_seed); notes x100
CACHE_SCHEMA = "encoder-eval-stats-cache"


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


class ComparisonCache:
    """The cached rows of one results folder (`directory` is its `.stats-cache/`); also
    holds this run's rows in memory, so a read-only folder still computes each row once.
    `computed` and `reused` count the rows of this run."""

    def __init__(self, directory: str | os.PathLike, warn: Callable[[str], None] | None = None):
        # `warn(message)` prints "warning: message" (`errors.warn_once`); default: stderr.
        self.directory = Path(directory)
        self.warn = warn
        self.writable = True
        self.computed = 0
        self.reused = 0
        self._memory: dict[str, tuple[RowFlags, dict]] = {}
        self._listing: set[str] | None = None
        self._sides: dict[tuple[str, str], dict | None] = {}

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
        *,
        n_resamples: int,
        seed: int,
    ) -> str | None:
        """The entry name of (A, B, task) under these inputs; None when one cannot be read.
        `metric` describes how the task is scored (its metric and language rule)."""
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
            "n_resamples": n_resamples,
            "seed": seed,
        }
        return _sha256(_canonical(material))

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
        if key in self._memory and self._memory[key][0].covers(flags):
            return json.loads(json.dumps(self._memory[key][1]))  # a copy: rows are mutated
        names = self._names()
        for have in sorted(ALL_FLAGS, key=lambda f: f.bits.count("1")):
            path = self._path(key, have)
            if path.name in names and have.covers(flags):
                row = self._read(path, key, have)
                if row is not None:
                    return row
        return None

    def _read(self, path: Path, key: str, flags: RowFlags) -> dict | None:
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            return None
        if (
            not isinstance(doc, dict)
            or doc.get("schema") != CACHE_SCHEMA
            or doc.get("stats_version") != STATS_VERSION
            or doc.get("key") != key
            or doc.get("flags") != flags.bits
            or not isinstance(doc.get("row"), dict)
            or doc.get("checksum") != _sha256(_canonical(doc["row"]))
        ):
            return None
        return doc["row"]

    def put(self, key: str, flags: RowFlags, row: dict) -> None:
        """Keep `row` for this run and, when the folder can be written, on disk."""
        old = self._memory.get(key)
        if old is None or not old[0].covers(flags):
            self._memory[key] = (flags, json.loads(json.dumps(row)))
        if not self.writable:
            return
        try:
            text = json.dumps(
                {
                    "schema": CACHE_SCHEMA,
                    "stats_version": STATS_VERSION,
                    "key": key,
                    "flags": flags.bits,
                    "checksum": _sha256(_canonical(row)),
                    "row": row,
                },
                allow_nan=True,
            )
        except (TypeError, ValueError):
            return  # a value JSON cannot hold: this row is not kept
        try:
            _write_entry(self._path(key, flags), text + "\n")
        except OSError as exc:
            self.writable = False
            message = one_line(
                f"cannot write the statistics cache {self.directory} "
                f"({exc.strerror or exc}); computing without it"
            )
            (self.warn or (lambda m: print(f"warning: {m}", file=sys.stderr)))(message)


def _write_entry(path: Path, text: str) -> None:
    """Write one entry atomically, making the cache folder first (OSError when the results
    folder cannot be written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def open_cache(
    results_dirs: str | os.PathLike | list,
    *,
    enabled: bool = True,
    warn: Callable[[str], None] | None,
) -> ComparisonCache | None:
    """The comparison cache of a table's results folder, the first of several (None when
    `enabled` is False: `--no-cache`)."""
    if not isinstance(results_dirs, (str, os.PathLike)):
        results_dirs = results_dirs[0]
    return ComparisonCache(Path(results_dirs) / STATS_CACHE_DIR, warn) if enabled else None
