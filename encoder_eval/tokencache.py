"""A tokenisation cache shared by every cell of a sweep on one machine.

Tokenising a large task (MNLI: 390k pairs) costs tens of seconds per cell, and a sweep
runs the same (task, tokenizer, max length) hundreds of times. Entries are keyed by a
hash of the tokenizer's identity, the max length, the input names and the split's content
itself (texts and labels), so a changed dataset revision, mirror file, tokenizer or max
length can never hit a stale entry. Writers write a temporary file and rename it into
place: two processes filling the same entry at once both succeed and leave one whole file.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

from .fileio import atomic_open, clean_stale_temporaries

CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """`$ENCODER_EVAL_CACHE_DIR`, else `~/.cache/encoder_eval/tokens`."""
    env = os.environ.get("ENCODER_EVAL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "encoder_eval" / "tokens"


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
    for part in (str(CACHE_VERSION), tokenizer_fp, str(max_len), ",".join(input_names),
                 split_fingerprint(split)):  # fmt: skip
        h.update(part.encode() + b"\x00")
    return h.hexdigest()


def load(cache_dir: Path, key: str):
    """The cached value for `key`, or None (missing, torn or unreadable entries are misses)."""
    path = Path(cache_dir) / f"{key}.pkl"
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError):
        return None


def store(cache_dir: Path, key: str, value) -> None:
    """Write an entry atomically; a failure to write only costs the next cell a miss."""
    cache_dir = Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(cache_dir, older_than_s=3600)
        with atomic_open(cache_dir / f"{key}.pkl", "wb") as handle:
            pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        pass
