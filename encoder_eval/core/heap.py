"""Memory a CPU process keeps beyond its live tensors, and the two ways the harness bounds it.

- Freed heap. glibc's malloc keeps memory that a process frees in its heap for reuse; a
  ranking step frees and allocates activations of many different sizes (one chunk of query
  groups after another, each in length-sorted pieces), and the heap they fragment is never
  returned, so the process's resident memory grows by about a gigabyte over what it holds
  live (MiniLM, groups of 36: peak RSS 3.15 GB, 2.58 GB with a trim after each chunk;
  bench/README.md, bench_rank.py). `release_free_heap` returns the free pages (glibc's
  `malloc_trim(0)`; elsewhere a no-op).
- oneDNN's primitive cache. On the CPU, PyTorch's bf16 matmuls run through oneDNN, which
  keeps a compiled kernel for each distinct problem shape, up to 1,024 of them. Length-
  grouped batches and length-sorted evaluation give nearly every batch a new width, so the
  cache fills with kernels that are rarely met again, a few hundred kilobytes each: a MiniLM
  ranking cell grew from 2.86 GB after 4 steps to 3.49 GB after 8. `limit_primitive_cache`
  caps it at `PRIMITIVE_CACHE_CAPACITY` through oneDNN's own variable, which moved neither
  a score nor the speed of a cell measurably (bench/README.md).
- Large blocks given back too soon. The resampling statistics allocate and free arrays of
  a few to a few tens of megabytes thousands of times; glibc serves each from a fresh
  `mmap` and unmaps it on free, so every batch page-faults its memory in again (a
  two-model `compare` on XNLI and QQP: 3.1 s of system time against 0.7 s with the blocks
  kept in the heap; bench/README.md). `keep_large_blocks` raises the thresholds (glibc's
  `mallopt`; elsewhere a no-op).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable

# oneDNN reads this variable once, when a process creates its first kernel.
PRIMITIVE_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
# Kernels kept: the few shapes one step and one evaluation batch use, with room to spare.
PRIMITIVE_CACHE_CAPACITY = 32


@functools.cache
def _libc(name: str) -> Callable | None:
    """The C library's function `name`, or None where it has none (glibc's malloc_trim and
    mallopt: not on macOS, musl or Windows)."""
    library = ctypes.util.find_library("c")
    if not library:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None


# glibc's mallopt parameters, and the values keep_large_blocks sets: blocks up to 32 MiB
# (glibc's largest mmap threshold) come from the heap, and up to 512 MiB of free heap top
# is kept for the next batch rather than returned at once.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
LARGE_BLOCK_BYTES = 32 * 1024 * 1024
KEPT_FREE_BYTES = 512 * 1024 * 1024


def keep_large_blocks() -> bool:
    """Serve blocks up to `LARGE_BLOCK_BYTES` from the heap and keep up to `KEPT_FREE_BYTES`
    of it free for reuse, for the many same-sized temporaries of the resampling; False
    where that is not possible here (not glibc). The peak resident memory is unchanged:
    what is kept is what the next batch takes again."""
    mallopt = _libc("mallopt")
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES)
    )


def release_free_heap() -> bool:
    """Return the heap's free pages to the operating system; False where that is not
    possible here (not glibc)."""
    trim = _libc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def limit_primitive_cache() -> str:
    """Cap oneDNN's kernel cache at `PRIMITIVE_CACHE_CAPACITY` unless the user set its
    variable; returns the value in effect. Call it before the process's first CPU matmul:
    later, oneDNN has read the variable and this changes nothing."""
    return os.environ.setdefault(PRIMITIVE_CACHE_VARIABLE, str(PRIMITIVE_CACHE_CAPACITY))
