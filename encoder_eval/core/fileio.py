"""Every file the harness writes or parses goes through here: atomic writes, temporaries,
safe names, and the one JSON/TOML/YAML reader.

A writer puts its bytes into a hidden temporary `.encoder-eval-tmp-<name>.<random>` beside
the target, fsyncs it, renames it over the target and fsyncs the directory, so a reader sees
either the old file or the whole new one, never a torn one. A writer killed before the
rename leaves its temporary behind; `clean_stale_temporaries` removes those, and only those
(the prefix is the harness's own: another program's `.tmp-*` files are never touched).

A reader calls `read_json` / `read_toml` (or `parse_json` / `parse_yaml` on text it has):
every way a file can fail becomes one typed error naming the file, never a traceback:
`MissingFile` (no file), `UnreadableFile` (it exists but cannot be read: permissions, an
I/O error, a stale NFS handle; not the file's fault, so never moved aside or written over)
and `DamagedFile` (it reads but does not parse: bad syntax, invalid UTF-8, a number too
long or out of range, nesting too deep, YAML anchors and aliases).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from encoder_eval.core.errors import HarnessError, one_line

# The prefix of the harness's temporaries: no other program writes it, so the cleaner only
# ever removes the harness's own leftovers.
TMP_PREFIX = ".encoder-eval-tmp-"


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# What an ordinary `open()` would give under the process umask (mkstemp gives 0600): results,
# mirrors and caches are for the whole team.
FILE_MODE = _default_file_mode()


def temporary_name(target: str | os.PathLike) -> str:
    """The prefix of a temporary for `target`: `TMP_PREFIX<name>.` (mkstemp adds the random
    part)."""
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
    text = (
        json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False, separators=separators)
        + "\n"
    )
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


def _cannot_create_in(directory: Path, what: str) -> str | None:
    """Why a file (`what` "file") or a folder ("directory") cannot be created in `directory`,
    found by creating one and removing it (permission bits, a read-only mount, /proc: what
    `os.access` misses, root's override included); None when it can."""
    try:
        if what == "directory":
            os.rmdir(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=directory))
        else:
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=directory)
            os.close(fd)
            os.unlink(tmp)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_output_dir(
    directory: str | os.PathLike, flag: str, value: str | os.PathLike | None = None
) -> None:
    """Refuse, before any work, an output directory that cannot be written: one that exists
    and takes no new file, or a missing one whose nearest existing ancestor is a file or
    takes no new folder (a missing directory is fine: the writer creates it). The one
    HarnessError names `flag` and the value the user gave (`value`, default `directory`)."""
    path = Path(directory).absolute()
    shown = f"{flag} {value if value is not None else directory}"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise HarnessError(
            f"{shown}: output directory {path} cannot be created: {existing} is "
            f"a file; choose another {flag}"
        )
    why = _cannot_create_in(existing, "file" if existing == path else "directory")
    if why is not None:
        where = "is not writable" if existing == path else f"cannot be created in {existing}"
        raise HarnessError(
            f"{shown}: output directory {path} {where} ({why}); choose another {flag}"
        )


def check_output_file(path: str | os.PathLike, flag: str, *, create_dirs: bool = False) -> None:
    """Refuse, before any work, an output file that could not be written at the end: a
    directory in its place, a directory that does not exist (unless `create_dirs`: the
    writer creates it) or cannot be written (`check_output_dir`). Every command checks its
    output paths here, so an unwritable one costs one `error:` line, not the work."""
    target = Path(path).absolute()
    if target.is_dir():
        raise HarnessError(f"{flag} {path} is a directory; give a file name")
    if not create_dirs and not target.parent.is_dir():
        raise HarnessError(f"{flag} {path}: its directory {target.parent} does not exist")
    check_output_dir(target.parent, flag, path)


def check_not_input(
    path: str | os.PathLike,
    flag: str,
    *,
    inputs: tuple[str | os.PathLike | None, ...] = (),
    results_dirs: tuple[str | os.PathLike | None, ...] = (),
    kept: Callable[[Path], bool] = lambda path: True,
) -> None:
    """Refuse, before any work, an output path that would replace what the command reads:
    one of `inputs` (the same file by any name: a symlink, a hard link), or a file of one
    of `results_dirs` that `kept` says the folder keeps (`plans.experiment` passes the
    results folder's rule: result candidates, predictions, experiment.toml...)."""
    target = Path(path).absolute()
    real = target.resolve()
    for given in inputs:
        if given is None:
            continue
        source = Path(given)
        same = source.resolve() == real or (
            target.exists() and source.exists() and os.path.samefile(source, target)
        )
        if same:
            raise HarnessError(
                f"{flag} {path} is one of this command's inputs ({given}); writing it "
                f"would replace what was read: choose another {flag}"
            )
    for folder in results_dirs:
        if folder is not None and real.parent == Path(folder).resolve() and kept(real):
            raise HarnessError(
                f"{flag} {path} would replace a file the results folder {folder} keeps "
                "(a cell's result, its predictions or TREC run, experiment.toml): choose "
                "another name or folder"
            )


@contextlib.contextmanager
def output_errors(path: str | os.PathLike, flag: str = "--out") -> Iterator[None]:
    """Turn an OSError of writing `path` (a full disk, a quota, a read-only remount) into
    one HarnessError line: the atomic writers leave the old file, if any, as it was."""
    try:
        yield
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise HarnessError(
            f"{flag} {path} could not be written ({why}); nothing was written and any file "
            "already there is unchanged"
        ) from None


def write_output(text: str, out: str | os.PathLike | None, flag: str = "--out") -> None:
    """A command's output: written atomically to `out` (saying so), else to stdout; a write
    that fails is one `error:` line (`output_errors`)."""
    if out:
        with output_errors(out, flag):
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
        raise HarnessError(
            f"{what} {shown} is not valid UTF-8; the launch scripts and "
            "records are UTF-8 text: rename it"
        ) from None


# ----------------------------------------------------------------------------- reading


class FileProblem(HarnessError):
    """A file a reader could not use; `reason` says why without the path, str() is
    `<path> <verb> <reason>` ("x.json is not valid JSON (...)")."""

    verb = ""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path, self.reason = str(path), one_line(reason, 300)
        super().__init__(" ".join(filter(None, (self.path, self.verb, self.reason))))


class MissingFile(FileProblem):
    """There is no file at the path."""


class UnreadableFile(FileProblem):
    """The file exists but cannot be read (permissions, an I/O error, a stale NFS handle):
    its content may be fine, so it is never treated as damaged."""


class DamagedFile(FileProblem):
    """The file reads but does not parse (syntax, encoding, a number too long or out of
    range, nesting too deep, YAML anchors): its content is damaged or hostile."""

    verb = "is"


# The most `read_bytes` reads (a file larger is refused unread): generous, since the
# predictions of a ranking cell at the protocol's depth (ms_marco_bm25: 6,980 queries x
# 1,000 candidates) run to hundreds of MB, yet bounded, so no reader is asked to hold more.
MAX_READ_BYTES = 2 << 30


def read_bytes(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (default
    `MAX_READ_BYTES`); MissingFile or UnreadableFile (with the reason) when it has none.

    Anything else named like a file is refused unread: a FIFO (opened without blocking, so
    a reader never waits on a writer that will not come), a device such as a symlink to
    /dev/zero (which would never end) or a directory."""
    limit = MAX_READ_BYTES if limit is None else limit
    try:
        # io.open: the seam tests fail I/O at; O_NONBLOCK only matters for a FIFO's open
        opener = lambda name, flags: os.open(name, flags | os.O_NONBLOCK)  # noqa: E731
        with io.open(path, "rb", opener=opener) as handle:  # noqa: UP020
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UnreadableFile(path, f"is not a regular file ({_file_type(info.st_mode)})")
            if info.st_size > limit:
                raise UnreadableFile(
                    path, f"is {info.st_size:,} bytes, more than the {limit:,} a reader reads"
                )
            chunks, total, want = [], 0, min(info.st_size, limit) + 1
            while chunk := handle.read(want):  # the size it has, and what it grows by
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    raise UnreadableFile(path, f"grew past the {limit:,} bytes a reader reads")
                want = min(1 << 20, limit + 1 - total)
            return b"".join(chunks)
    except FileNotFoundError:
        raise MissingFile(path, "does not exist") from None
    except IsADirectoryError:
        raise UnreadableFile(path, "is a directory, not a file") from None
    except OSError as exc:
        raise UnreadableFile(path, f"cannot be read ({exc.strerror or exc})") from None


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "a special file"


def _decode(data: bytes | str, source: str | os.PathLike) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DamagedFile(source, f"not UTF-8 text (byte {exc.start})") from None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: bytes | str, source: str | os.PathLike) -> Any:
    """JSON `data` read from `source` (a path, or a name such as an environment variable);
    DamagedFile naming `source` for anything that is not strict JSON: bad syntax, invalid
    UTF-8, NaN or Infinity, a number out of range or too long, nesting too deep."""
    text = _decode(data, source)
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        # Some of json's messages end in "at" already ("Unterminated string starting at").
        where = f"at line {exc.lineno} column {exc.colno}"
        reason = f"not valid JSON ({exc.msg.removesuffix(' at')} {where})"
    except RecursionError:
        reason = "not valid JSON (nested too deeply)"
    except ValueError as exc:  # an integer of too many digits, a float out of range, NaN
        reason = f"not valid JSON ({str(exc).split(';')[0]})"
    raise DamagedFile(source, reason)


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document in `path`, by `parse_json`; MissingFile, UnreadableFile or
    DamagedFile naming the file when there is none."""
    return parse_json(read_bytes(path), path)


def parse_toml(data: bytes | str, source: str | os.PathLike) -> dict:
    """The TOML document `data` read from `source`; DamagedFile naming it when it does not
    parse (syntax, encoding, an integer too long, nesting too deep)."""
    import tomllib

    text = _decode(data, source)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = f"not valid TOML: {exc}"
    except RecursionError:
        reason = "not valid TOML: nested too deeply"
    except ValueError as exc:  # an integer of too many digits
        reason = f"not valid TOML: {str(exc).split(';')[0]}"
    raise DamagedFile(source, reason)


def read_toml(path: str | os.PathLike) -> dict:
    """The TOML document in `path`, by `parse_toml`; MissingFile, UnreadableFile or
    DamagedFile naming the file when there is none."""
    return parse_toml(read_bytes(path), path)


def parse_yaml(data: bytes | str, source: str | os.PathLike) -> Any:
    """The YAML document `data` read from `source`, by PyYAML's safe loader with anchors and
    aliases refused (a few hundred bytes of aliases expand to gigabytes); DamagedFile naming
    `source` when it does not parse."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):  # noqa: ANN001, ANN202 (PyYAML's hook)
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = event.start_mark
                raise DamagedFile(
                    source,
                    f"YAML with an anchor or alias (line {mark.line + 1}), "
                    "which is not allowed: write each value out in full",
                )
            return super().compose_node(parent, index)

    try:
        return yaml.load(data, Loader=NoAliasLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        reason = f"not valid YAML: {' '.join(str(exc).split())}"
    except RecursionError:
        reason = "not valid YAML: nested too deeply"
    except ValueError as exc:  # an integer of too many digits
        reason = f"not valid YAML: {str(exc).split(';')[0]}"
    raise DamagedFile(source, reason)
