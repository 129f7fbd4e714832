"""Handing freed heap memory back to the operating system between CPU ranking chunks.

glibc's malloc keeps memory that a process frees in its heap for reuse; a ranking step
frees and allocates activations of many different sizes (one chunk of query groups after
another, each in length-sorted pieces), and the heap they fragment is never returned, so
the process's resident memory grows by about a gigabyte over what it holds live (MiniLM,
groups of 36: peak RSS 3.15 GB, 2.58 GB with a trim after each chunk; bench/README.md,
bench_rank.py). `malloc_trim(0)` returns the free pages; elsewhere than glibc this is a
no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl, Windows)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Return the heap's free pages to the operating system; False where that is not
    possible here (not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
