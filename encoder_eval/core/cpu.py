"""Whether this CPU computes bf16 natively, and the one warning when it does not.

bf16 autocast (the protocol's precision) is fast on a CPU with AVX512-BF16 or AMX; on one
without (most laptops: AVX2 only) PyTorch emulates it and a forward+backward runs 5-8x
slower than fp32 (issue 29: MiniLM on 8x128 tokens, 40-42 s in bf16 against 6-8 s in
fp32). `cpu_native_bf16` is the one place that decides; `warn_slow_bf16` prints the line
a cell or probe gives before its first step. Nothing here is imported before it is needed:
the timed probe imports torch.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

from encoder_eval.core import process_state

# The /proc/cpuinfo flags of an x86 CPU with native bf16 arithmetic.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# What issue 29 measured on a CPU without them (AVX2 only): bf16 autocast against fp32.
REPORTED_SLOWDOWN = "5-8x"
# A timed probe calls bf16 native when its matmul is at most this many times fp32's.
_PROBE_RATIO = 2.0
_WARNED: set[str] = set()  # the devices this process has warned for (one line each)
process_state.set_clearer("slow-bf16 warnings (core/cpu.py)", _WARNED)


def native_bf16_from_cpuinfo(text: str) -> bool | None:
    """True when `text` (the content of /proc/cpuinfo) lists a native-bf16 flag, False
    when it lists x86 flags without one, None when it has no x86 `flags` line (another
    platform: the caller measures instead)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return any(flag in value.split() for flag in NATIVE_BF16_FLAGS)
    return None


def _timed_probe() -> bool:
    """Whether a bf16 matmul runs at most `_PROBE_RATIO` times as long as the fp32 one
    (about 0.1 s; for CPUs whose flags do not say)."""
    import torch

    a = torch.randn(256, 256)
    b = torch.randn(256, 256)

    def best(x, y) -> float:
        x @ y  # warm-up
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t0)
        return min(times)

    fp32 = best(a, b)
    bf16 = best(a.bfloat16(), b.bfloat16())
    return bf16 <= _PROBE_RATIO * max(fp32, 1e-9)


@functools.cache
def cpu_native_bf16() -> bool:
    """Whether this machine's CPU runs bf16 natively: its x86 flags when /proc/cpuinfo has
    them, else a short timed bf16-against-fp32 matmul; decided once per process."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    known = native_bf16_from_cpuinfo(text)
    return _timed_probe() if known is None else known


def is_bf16(precision: str) -> bool:
    """Whether a precision (a `Precision`, a word, or what a result records) runs bf16."""
    from encoder_eval.core.protocol import Precision

    return Precision.of(precision) is Precision.BF16


def slow_bf16_warning(device_type: str, precision: str) -> str | None:
    """The warning line for bf16 autocast on a CPU without native bf16, else None."""
    if device_type != "cpu" or not is_bf16(precision) or cpu_native_bf16():
        return None
    return (
        f"warning: this CPU has no native bf16 ({' or '.join(NATIVE_BF16_FLAGS)}): bf16 "
        f"autocast runs about {REPORTED_SLOWDOWN} slower than fp32 here (issue 29's "
        "measurement); --precision fp32 is that much faster, but off-protocol"
    )


def warn_slow_bf16(device_type: str, precision: str) -> None:
    """Print `slow_bf16_warning` to stderr, once per process."""
    line = slow_bf16_warning(device_type, precision)
    if line is not None and device_type not in _WARNED:
        _WARNED.add(device_type)
        print(line, file=sys.stderr, flush=True)


def resolve_precision(word: str, device: str) -> tuple[str, str | None]:
    """The precision a cell runs for the `--precision` word `word` on `device` (auto, cuda
    or cpu), bf16 or fp32, and the note saying why when auto chose fp32: auto is fp32 on a
    CPU without native bf16 (`cpu_native_bf16`), else bf16. Every command resolves its
    word here (`run`, `probe`, `track`, `demo`; a `sweep` passes auto on to its cells)."""
    from encoder_eval.core.protocol import Precision

    word = Precision.of(word).value
    if word != Precision.AUTO:
        return word, None
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not cpu_native_bf16():
        return "fp32", (
            f"note: this CPU has no native bf16 ({' or '.join(NATIVE_BF16_FLAGS)}), where bf16 "
            f"autocast runs {REPORTED_SLOWDOWN} slower than fp32: --precision auto runs fp32 "
            "(off-protocol for a fine-tuned cell); --precision bf16 runs the protocol's precision"
        )
    return "bf16", None
