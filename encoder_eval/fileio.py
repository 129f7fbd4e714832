"""Every file the harness writes goes through here: atomic writes, temporaries, safe names.

A writer puts its bytes into a hidden temporary `.tmp-<name>.<random>` beside the target,
fsyncs it, renames it over the target and fsyncs the directory, so a reader sees either the
old file or the whole new one, never a torn one. A writer killed before the rename leaves
its temporary behind; `clean_stale_temporaries` removes those (one scheme, one cleaner).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import HarnessError

TMP_PREFIX = ".tmp-"


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# What an ordinary `open()` would give under the process umask (mkstemp gives 0600): results,
# mirrors and caches are for the whole team.
FILE_MODE = _default_file_mode()


def temporary_name(target: str | os.PathLike) -> str:
    """The prefix of a temporary for `target`: `.tmp-<name>.` (mkstemp adds the random part)."""
    return f"{TMP_PREFIX}{Path(target).name}."


def _fsync_directory(directory: Path) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the rename itself is still atomic


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "wb", *, mode_bits: int | None = None
) -> Iterator[IO]:
    """Open a temporary beside `path` for a streaming writer (torch.save, savefig, JSON
    lines); on a clean exit it is fsynced and renamed over `path`, on an exception removed.

    `mode` is "wb" or "w" (text, UTF-8); `mode_bits` overrides the team-readable file mode.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open mode must be 'wb' or 'w', not {mode!r}")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=temporary_name(path), dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE if mode_bits is None else mode_bits)
        kwargs = {"encoding": "utf-8"} if mode == "w" else {}
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def write_atomic(
    path: str | os.PathLike, data: bytes | str, *, mode_bits: int | None = None
) -> None:
    """Write `data` (bytes, or text as UTF-8) so that `path` holds its old or its whole new
    content, never part of either."""
    with atomic_open(path, "w" if isinstance(data, str) else "wb", mode_bits=mode_bits) as fh:
        fh.write(data)


def write_json_atomic(
    path: str | os.PathLike, obj: Any, *, sort_keys: bool = False, indent: int | None = 2
) -> None:
    """Write `obj` as JSON (indented unless `indent` is None; NaN and infinities refused)
    with `write_atomic`."""
    separators = None if indent is not None else (",", ":")
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False,
                      separators=separators) + "\n"  # fmt: skip
    write_atomic(path, text)


def clean_stale_temporaries(directory: str | os.PathLike, older_than_s: float = 60.0) -> int:
    """Remove temporaries a killed writer left in `directory` (not younger than
    `older_than_s`, so a live writer's is kept); returns how many were removed."""
    removed = 0
    now = time.time()
    for tmp in Path(directory).glob(TMP_PREFIX + "*"):
        try:
            if tmp.is_file() and now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
                removed += 1
        except FileNotFoundError:
            pass
    return removed


# Characters never allowed in one file-name component (path separators, control characters):
# the rule for result file names, whose names must stay what older harnesses wrote.
UNSAFE_IN_NAME = r"[/\\\x00-\x1f]"
# Everything outside a portable set: the rule for names derived for figures, logs and jobs.
UNSAFE_PORTABLE = r"[^A-Za-z0-9._-]"
# The same, keeping '+' (off-grid LR keys such as lr1e+06): the rule for sweep's log and job names.
UNSAFE_IN_LABEL = r"[^A-Za-z0-9._+-]"


def safe_filename_part(text: object, unsafe: str = UNSAFE_PORTABLE) -> str:
    """`text` as one safe file-name component: each character matching `unsafe` becomes '_',
    and a name of only dots (or none) becomes underscores, so it never names a directory."""
    cleaned = re.sub(unsafe, "_", str(text))
    return cleaned if cleaned not in ("", ".", "..") else cleaned.replace(".", "_") or "_"


def write_output(text: str, out: str | os.PathLike | None) -> None:
    """A command's output: written atomically to `out` (saying so), else to stdout."""
    if out:
        write_atomic(out, text)
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)


def check_utf8(value: str | os.PathLike, what: str) -> None:
    """Refuse a name that is not valid UTF-8 (a path whose bytes Python could only decode
    with surrogate escapes): the scripts, manifests and records that hold it are UTF-8 text.
    The error names `what` (the flag) and the value, so it is one line, not a traceback."""
    text = os.fspath(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")
        raise HarnessError(f"{what} {shown} is not valid UTF-8; the launch scripts and "
                           "records are UTF-8 text: rename it") from None  # fmt: skip
