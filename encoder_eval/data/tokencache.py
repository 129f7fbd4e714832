"""A tokenisation cache shared by every cell of a sweep on one machine.

Tokenising a large task (MNLI: 390k pairs) costs tens of seconds per cell, and a sweep
runs the same (task, tokenizer, max length) hundreds of times. Entries are keyed by a
hash of the tokenizer's identity, the max length, the input names and the split's content
itself (texts and labels), so a changed dataset revision, mirror file, tokenizer or max
length can never hit a stale entry. Writers write a temporary file and rename it into
place: two processes filling the same entry at once both succeed and leave one whole file.

An entry is data, never code: `<key>.tokens` holds a magic line, a SHA-256 of the rest,
a JSON header (the key, array names, dtypes and shapes) and the raw little-endian numpy
arrays (token ids, lengths, labels). Nothing is unpickled; an entry that is damaged,
foreign, of an older format (the pickles of version 1 are never opened) or fails any
check is a miss. The folder is created 0700 and entries 0600, unless the user shares the
cache on purpose (`ENCODER_EVAL_CACHE_SHARED=1`, SECURITY.md); a private cache whose folder
another user could write into is not used.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import stat
import sys
from pathlib import Path

import numpy as np

from encoder_eval.core import process_state
from encoder_eval.core.fileio import (
    FILE_MODE,
    FileProblem,
    atomic_open,
    clean_stale_temporaries,
    read_bytes,
)

CACHE_VERSION = 2  # 2: numpy arrays behind a JSON header (1 was pickle; its entries are ignored)
SUFFIX = ".tokens"
MAGIC = b"encoder-eval token cache v2\n"
SHARED_ENV = "ENCODER_EVAL_CACHE_SHARED"
_DIGEST = 32  # bytes of SHA-256
_HEADER_LEN = 8  # bytes of the header's length (little-endian)
_DTYPES = ("<i4", "<i8", "<f4", "<f8")  # the only dtypes an entry may hold

# What an entry holds: {input name: one list of ids per example}, and the labels.
Entry = tuple[dict[str, list[list[int]]], list]


def default_cache_dir() -> Path:
    """`$ENCODER_EVAL_CACHE_DIR`, else `~/.cache/encoder_eval/tokens`."""
    env = os.environ.get("ENCODER_EVAL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "encoder_eval" / "tokens"


def shared() -> bool:
    """Whether the user asked for a cache shared with others (`ENCODER_EVAL_CACHE_SHARED=1`):
    folders are then created with the umask's mode and entries written team-readable."""
    return os.environ.get(SHARED_ENV, "").strip().lower() in ("1", "true", "yes")


def entry_mode() -> int:
    """The file mode of a cache entry: 0600, or the umask's mode for a shared cache."""
    return FILE_MODE if shared() else 0o600


_warned: set[str] = set()
process_state.set_clearer("token-cache warnings (data/tokencache.py)", _warned)


def usable(cache_dir: str | os.PathLike, create: bool = False) -> bool:
    """Whether `cache_dir` may be read and written: it exists (or, with `create`, is created
    now: 0700, or the umask's mode when shared) and, unless the cache is shared on purpose,
    belongs to this user and is writable by no one else; else one warning and no cache."""
    path = Path(cache_dir)
    try:
        if create and not path.is_dir():
            missing = [path, *(p for p in path.parents if not p.exists())]
            for folder in reversed(missing):  # each one the harness creates: 0700 too
                folder.mkdir(mode=0o777 if shared() else 0o700, exist_ok=True)
        st = path.stat()
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if shared() or (st.st_uid == os.getuid() and not st.st_mode & 0o022):
        return True
    if str(path) not in _warned:
        _warned.add(str(path))
        print(
            f"warning: not using the token cache {path}: another user could write into it "
            f"(mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); make it private "
            f"(chmod 700 {path}) or, to share it with your team on purpose, set "
            f"{SHARED_ENV}=1 (SECURITY.md)",
            file=sys.stderr,
        )
    return False


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides how the tokenizer maps text to ids."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Encoding with truncation=... mutates the backend's truncation/padding settings,
        # which to_str() includes; they are per-call arguments, not identity.
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        h.update(json.dumps(state, sort_keys=True).encode())
    else:  # slow tokenizers: their vocabulary and settings
        h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
        h.update(repr(getattr(tokenizer, "init_kwargs", {})).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    h.update(repr(getattr(tokenizer, "model_input_names", None)).encode())
    return h.hexdigest()


def split_fingerprint(split: dict) -> str:
    """A hash of a split's columns (texts, optional pair texts, labels)."""
    h = hashlib.sha256()
    for column in sorted(split):
        h.update(column.encode() + b"\x00")
        for value in split[column]:
            h.update(str(value).encode() + b"\x1f")
    return h.hexdigest()


def cache_key(tokenizer_fp: str, split: dict, max_len: int, input_names) -> str:
    h = hashlib.sha256()
    for part in (
        str(CACHE_VERSION),
        tokenizer_fp,
        str(max_len),
        ",".join(input_names),
        split_fingerprint(split),
    ):
        h.update(part.encode() + b"\x00")
    return h.hexdigest()


def entry_path(cache_dir: str | os.PathLike, key: str) -> Path:
    """Where the entry of `key` lives."""
    return Path(cache_dir) / f"{key}{SUFFIX}"


# ----------------------------------------------------------------------------- the container


def pack(key: str, arrays: dict[str, np.ndarray], meta: dict | None = None) -> bytes:
    """The bytes of a cache entry (also the embedding cache's): the magic line, a SHA-256 of
    the rest, then the header's length, the JSON header (`key`, `meta`, each array's name,
    dtype and shape) and the arrays' raw little-endian bytes."""
    arrays = {
        name: np.ascontiguousarray(a, dtype=np.dtype(a.dtype).newbyteorder("<"))
        for name, a in arrays.items()
    }
    header = {
        "version": CACHE_VERSION,
        "key": key,
        "meta": meta or {},
        "arrays": [
            {"name": n, "dtype": a.dtype.str, "shape": list(a.shape)} for n, a in arrays.items()
        ],
    }
    head = json.dumps(header).encode()
    rest = len(head).to_bytes(_HEADER_LEN, "little") + head
    rest += b"".join(a.tobytes() for a in arrays.values())
    return MAGIC + hashlib.sha256(rest).digest() + rest


def unpack(data: bytes, key: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """The (meta, arrays) of an entry's bytes (read-only arrays of the listed dtypes only),
    or None when they fail any check: magic, checksum, header, sizes, key. Never raises."""
    try:
        return _unpack(data, key)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, MemoryError):
        return None


def _unpack(data: bytes, key: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    start = len(MAGIC) + _DIGEST
    if len(data) < start + _HEADER_LEN or not data.startswith(MAGIC):
        return None
    rest = memoryview(data)[start:]
    if hashlib.sha256(rest).digest() != data[len(MAGIC) : start]:
        return None
    n_head = int.from_bytes(rest[:_HEADER_LEN], "little")
    if n_head > len(rest) - _HEADER_LEN:
        return None
    header = json.loads(bytes(rest[_HEADER_LEN : _HEADER_LEN + n_head]))
    if not isinstance(header, dict) or header.get("version") != CACHE_VERSION:
        return None
    meta, specs = header.get("meta"), header.get("arrays")
    if header.get("key") != key or not isinstance(meta, dict) or not isinstance(specs, list):
        return None
    payload = rest[_HEADER_LEN + n_head :]
    arrays, offset = {}, 0
    for spec in specs:
        if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPES:
            return None
        name, shape = spec.get("name"), spec.get("shape")
        if not isinstance(name, str) or name in arrays or not isinstance(shape, list):
            return None
        if len(shape) > 2 or any(type(d) is not int or not 0 <= d <= len(payload) for d in shape):
            return None
        dtype = np.dtype(spec["dtype"])
        count = math.prod(shape)
        if offset + count * dtype.itemsize > len(payload):
            return None
        flat = np.frombuffer(payload, dtype=dtype, count=count, offset=offset)
        arrays[name] = flat.reshape(shape)
        offset += count * dtype.itemsize
    return (meta, arrays) if offset == len(payload) else None


def read_entry(path: str | os.PathLike, key: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """`unpack` of the file at `path`; None for a missing or unreadable file, or one in a
    folder the cache may not use (`usable`)."""
    path = Path(path)
    if not usable(path.parent):
        return None
    try:  # a regular file only: a FIFO or a link to /dev/zero is a miss, not a hang
        data = read_bytes(path, limit=1 << 40)
    except (FileProblem, MemoryError):
        return None
    return unpack(data, key)


def write_entry(path: str | os.PathLike, data: bytes) -> None:
    """Write `pack`ed bytes to `path` atomically (creating its folder: `usable`); a failure
    to write only costs the next reader a miss."""
    path = Path(path)
    if not usable(path.parent, create=True):
        return
    try:
        clean_stale_temporaries(path.parent, older_than_s=3600)
        with atomic_open(path, "wb", mode_bits=entry_mode()) as handle:
            handle.write(data)
    except OSError:
        pass


# ----------------------------------------------------------------------------- token entries


def encode_entry(key: str, features: dict[str, list[list[int]]], labels: list) -> bytes | None:
    """The bytes of a token entry, or None for a value the format does not hold exactly
    (labels that are not all ints or all floats, features of unequal lengths)."""
    names = list(features)
    if "input_ids" not in features:
        return None
    lengths = [len(ids) for ids in features["input_ids"]]
    if any([len(ids) for ids in features[name]] != lengths for name in names):
        return None
    if all(type(x) is int for x in labels):
        label_dtype = "<i8"
    elif all(type(x) is float for x in labels):
        label_dtype = "<f8"
    else:
        return None
    total = sum(lengths)
    arrays = {
        "lengths": np.asarray(lengths, dtype="<i8"),
        "labels": np.asarray(labels, dtype=label_dtype),
    }
    for name in names:
        flat = np.fromiter(itertools.chain.from_iterable(features[name]), dtype="<i8", count=total)
        small = not flat.size or (flat.min() >= -(2**31) and flat.max() < 2**31)
        arrays[f"feature:{name}"] = flat.astype("<i4") if small else flat
    return pack(key, arrays, {"features": names})


def decode_entry(data: bytes, key: str) -> Entry | None:
    """The (features, labels) of a token entry's bytes, or None when they fail any check
    (`unpack`'s, then the arrays' names, dtypes and lengths). Never raises."""
    return _token_value(unpack(data, key))


def _token_value(unpacked: tuple[dict, dict[str, np.ndarray]] | None) -> Entry | None:
    if unpacked is None:
        return None
    meta, arrays = unpacked
    names = meta.get("features")
    if not isinstance(names, list) or "input_ids" not in names:
        return None
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        return None
    if set(arrays) != {"lengths", "labels"} | {f"feature:{n}" for n in names}:
        return None
    lengths, labels = arrays["lengths"], arrays["labels"]
    if lengths.dtype != np.int64 or lengths.ndim != 1 or labels.shape != lengths.shape:
        return None
    most = arrays["feature:input_ids"].size
    if len(lengths) and (lengths.min() < 0 or lengths.max() > most):
        return None  # (so their sum cannot overflow)
    bounds = [0, *np.cumsum(lengths).tolist()]
    features = {}
    for name in names:
        flat = arrays[f"feature:{name}"]
        if flat.dtype.kind != "i" or flat.shape != (bounds[-1],):
            return None
        ids = flat.tolist()
        features[name] = [ids[a:b] for a, b in itertools.pairwise(bounds)]
    return features, labels.tolist()


def load(cache_dir: str | os.PathLike, key: str) -> Entry | None:
    """The cached (features, labels) of `key`, or None: a missing, torn, damaged, foreign
    or old-format entry, or a folder the cache may not use (`usable`), is a miss."""
    try:
        return _token_value(read_entry(entry_path(cache_dir, key), key))
    except (ValueError, TypeError, KeyError, OverflowError, MemoryError):
        return None


def store(cache_dir: str | os.PathLike, key: str, features: dict, labels: list) -> None:
    """Write an entry atomically; a failure to write only costs the next cell a miss."""
    try:
        data = encode_entry(key, features, labels)
    except (ValueError, TypeError, OverflowError):
        return
    if data is not None:
        write_entry(entry_path(cache_dir, key), data)
