"""Where and how a cell's arithmetic runs: the device (`resolve_device`), bf16 on it
(`check_bf16`), seeding, deterministic algorithms (`apply_deterministic`), torch.compile
(`compile_model`, `forget_compiled`), the random state and memory a retry puts back or frees,
the process's start-up time, and the cell's peak memory (`reset_peak_memory`, `peak_memory`).

torch's process-wide switches (TF32, deterministic algorithms, cuDNN, the SDPA backends,
the default dtype, grad mode, threads) are snapshotted when this module is first imported,
before any cell, and put back between a warm worker's units (`core/process_state.py`)."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sys
import time

import numpy as np
import torch
from torch import nn

from encoder_eval.cells.cell_config import (
    CellConfig,
    cell_label,
)
from encoder_eval.core import cpu, heap, process_state
from encoder_eval.core import device as gpu
from encoder_eval.core.errors import HarnessError


def resolve_device(device: str) -> torch.device:
    """The device a cell runs on, with its index (`cuda:0`), as the result records it.
    `auto` picks CUDA/ROCm when present, else the CPU, saying so on stderr when a GPU should
    be here (`device.expected_gpu`); `cuda` without a GPU is an error."""
    if device not in ("auto", "cuda", "cpu"):
        raise HarnessError(f"unknown device {device!r}; valid: auto, cuda, cpu")
    if device == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if device == "auto":
        gpu.warn_cpu_fallback(gpu.expected_gpu())
        return torch.device("cpu")
    why = gpu.expected_gpu()
    raise HarnessError(
        "--device cuda but no CUDA or ROCm GPU is visible to torch "
        f"{torch.__version__}{f' (although {why})' if why else ''}; check the driver against "
        "this torch build (ROCm: docs/install.md), or use --device cpu"
    )


def check_bf16(device: torch.device, precision: str) -> None:
    """Refuse bf16 autocast on a GPU torch says cannot run it, where torch would turn
    autocast off with a warning and train in fp32 while the recipe says bf16; warn on one
    that only emulates it (V100, T4 on recent torch: slow, recorded as
    `hardware.gpu_native_bf16` false)."""
    if device.type != "cuda" or not cpu.is_bf16(precision):
        return
    name = torch.cuda.get_device_name(device)
    if not torch.cuda.is_bf16_supported():
        raise HarnessError(
            f"{name} cannot run bf16 autocast (the protocol's precision), and torch would "
            "silently train in fp32; use a GPU with bf16 (Ampere or newer, MI200 or newer), "
            "or --precision fp32 (off-protocol)"
        )
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the argument: no emulation to tell apart
        native = True
    if not native and name not in _WARNED_BF16:
        _WARNED_BF16.add(name)
        print(
            f"warning: {name} has no native bf16: torch emulates bf16 autocast on it, slowly "
            "(recorded as provenance.hardware.gpu_native_bf16 false); --precision fp32 is "
            "faster there, but off-protocol",
            file=sys.stderr,
            flush=True,
        )


_WARNED_BF16: set[str] = set()  # the GPUs this process has warned for (one line each)
process_state.set_clearer("no-native-bf16 GPU warnings (cells/devices.py)", _WARNED_BF16)


# ---------------------------------------------------------- torch's process-wide switches
# (getter, setter) per switch a unit, a loader plug-in or remote code may flip, and that
# changes what a cell computes or how: put back between a warm worker's units.
def _sdp(name: str) -> tuple:
    cuda = torch.backends.cuda
    enabled, enable = (
        getattr(cuda, f"{name}_sdp_enabled", None),
        getattr(cuda, f"enable_{name}_sdp", None),
    )
    return (enabled, enable) if enabled is not None and enable is not None else None


_SWITCHES: dict[str, tuple] = {
    "matmul TF32": (
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v),
    ),
    "cuDNN TF32": (
        lambda: torch.backends.cudnn.allow_tf32,
        lambda v: setattr(torch.backends.cudnn, "allow_tf32", v),
    ),
    "float32 matmul precision": (
        torch.get_float32_matmul_precision,
        torch.set_float32_matmul_precision,
    ),
    "fp16 reduced-precision reduction": (
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", v),
    ),
    "bf16 reduced-precision reduction": (
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        lambda v: setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", v),
    ),
    "deterministic algorithms": (
        lambda: (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
    ),
    "cuDNN enabled": (
        lambda: torch.backends.cudnn.enabled,
        lambda v: setattr(torch.backends.cudnn, "enabled", v),
    ),
    "cuDNN deterministic": (
        lambda: torch.backends.cudnn.deterministic,
        lambda v: setattr(torch.backends.cudnn, "deterministic", v),
    ),
    "cuDNN benchmark": (
        lambda: torch.backends.cudnn.benchmark,
        lambda v: setattr(torch.backends.cudnn, "benchmark", v),
    ),
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "anomaly detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
    "intra-op threads": (torch.get_num_threads, torch.set_num_threads),
    **{
        f"SDPA {name} backend": pair
        for name in ("flash", "mem_efficient", "math", "cudnn")
        if (pair := _sdp(name)) is not None
    },
}


def backend_switches() -> dict[str, object]:
    """The current value of each of torch's process-wide switches this module watches."""
    return {name: get() for name, (get, _) in _SWITCHES.items()}


_FRESH_SWITCHES = backend_switches()  # as a fresh process has them, before any cell


def _reset_switches() -> None:
    now = backend_switches()
    for name, (_, put) in _SWITCHES.items():
        if now[name] != _FRESH_SWITCHES[name]:
            put(_FRESH_SWITCHES[name])


def _check_switches() -> str | None:
    now = backend_switches()
    differ = [f"{k} {now[k]!r} (fresh: {v!r})" for k, v in _FRESH_SWITCHES.items() if now[k] != v]
    return f"torch switches differ: {'; '.join(differ)}" if differ else None


process_state.register(
    "torch backend switches (cells/devices.py)", _reset_switches, _check_switches
)

# What `--deterministic` sets (docs/cells.md, "Bit-for-bit reruns"): cuBLAS reads its
# workspace setting when the process first uses it, so a warm worker runs a unit whose
# setting differs from its earlier units' in a fresh process (`run.unit_identity`).
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def apply_deterministic(on: bool) -> None:
    """`Recipe.deterministic`: deterministic algorithms (an operation without one raises),
    cuDNN without autotuning, and cuBLAS's fixed workspace; off leaves torch's defaults."""
    if not on:
        return
    os.environ.setdefault(*CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def attn_implementation(model: nn.Module) -> str | None:
    """The attention implementation the model's transformers body runs
    (`config._attn_implementation`: sdpa, eager, flash_attention_2, ...); None for a model
    without a transformers config (a loader plug-in's own module)."""
    for part in (model, getattr(model, "body", None)):
        config = getattr(part, "config", None)
        value = getattr(config, "_attn_implementation", None)
        if isinstance(value, str):
            return value
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


# torch.compile's mode by device type (`Recipe.compile`): CUDA graphs on a GPU, where a
# step's few thousand kernel launches are the host's work, replayed in one call; on the CPU
# inductor's default mode (fused C++ kernels; CUDA graphs do not exist there).
COMPILE_MODES = {"cuda": "reduce-overhead", "cpu": "default"}


def compile_model(model: nn.Module, device: torch.device) -> str:
    """torch.compile `model` in place (`nn.Module.compile`: its state dict keeps its keys,
    so best weights, resume state and predictions are untouched) and return the mode. Dynamic
    shapes are left to torch (a second width makes the graph dynamic; CUDA graphs record one
    graph per shape, which `Recipe.pad_multiple` keeps few). `fallback_random`: dropout
    draws from torch's generator as the eager model does, so the random state (seeded, put
    back by an out-of-memory retry, saved for resume) means what it means without compiling.
    What compiling needs is checked now, before any step (a clear error, not a crash later)."""
    mode = COMPILE_MODES.get(device.type, COMPILE_MODES["cuda"])
    _check_compiler(device)
    import torch._inductor

    options = {**torch._inductor.list_mode_options(mode), "fallback_random": True}
    model.compile(options=options)
    return mode


def _check_compiler(device: torch.device) -> None:
    """Refuse --compile where inductor cannot build kernels: on the CPU without a C++
    compiler, on a GPU without triton."""
    if device.type == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as exc:
            raise HarnessError(
                "--compile on the CPU needs a C++ compiler for torch's inductor, and none was "
                f"found ({type(exc).__name__}; it looks for $CXX, else g++): install one, or "
                "run without --compile (the same scores within float noise)"
            ) from exc
        return
    from torch.utils._triton import has_triton

    if not has_triton():
        raise HarnessError(
            f"--compile on {device} needs triton (installed with CUDA and ROCm torch "
            "wheels), which this environment lacks: install it, or run without --compile"
        )


def forget_compiled() -> None:
    """Drop every compiled graph of this process (and their CUDA graphs' memory): a cell
    that compiled leaves nothing to the next, whose compile reads inductor's disk cache."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


@contextlib.contextmanager
def compile_failures(cfg: CellConfig):
    """Turn a failure of torch.compile (tracing or building kernels, at the first step or at
    a new shape) into a one-line error that names the way out; never a silent fall back to
    the uncompiled model."""
    if not cfg.recipe.compile:
        yield
        return
    from torch._dynamo.exc import TorchDynamoException

    try:
        yield
    except TorchDynamoException as exc:
        if gpu.is_out_of_memory(exc):
            raise
        text = " ".join(str(exc).split())[:300] or "no message"
        raise HarnessError(
            f"{cell_label(cfg)}: torch.compile failed ({type(exc).__name__}: {text}); the cell "
            "stopped and wrote no result: run it without --compile (the same scores within "
            "float noise)"
        ) from exc


def release_memory() -> None:
    """Free what no cell holds any more: reference cycles (a model stays in one after its
    cell, through transformers' lazy import frames, until the cyclic collector runs), the
    CUDA caching allocator's free blocks and the CPU heap's free pages."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    heap.release_free_heap()


def device_rng_state(device: torch.device) -> tuple:
    """The random state a step draws from (dropout): the CPU generator's, and the device's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_device_rng_state(device: torch.device, state: tuple) -> None:
    """Put back a `device_rng_state`, so a step retried (out of memory) or captured in a graph
    draws the dropout masks the first attempt drew."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def release_cached_memory(device: torch.device) -> None:
    """Hand the caching allocator's free blocks back after an out-of-memory error, so a
    retry at a smaller batch starts from unfragmented memory."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


_UNIT_START: list[float] = []  # set by a warm worker as each unit arrives (`mark_unit_start`)
_WARM_UNIT: list[int] = []  # the unit's number in its warm worker (1: the worker's first)


def mark_unit_start(unit: int, arrived: float | None = None) -> None:
    """From now on, `seconds_since_process_start` counts from the unit's arrival
    (`arrived`, a `time.time()`; None: now): a warm worker calls it as each unit arrives,
    so a unit's start-up figure is what that unit paid (in a fresh process: its imports and
    set-up), not the worker's age. `unit` is the unit's number in this worker, which its
    results record (`warm_unit`)."""
    _UNIT_START[:] = [time.time() if arrived is None else arrived]
    _WARM_UNIT[:] = [unit]


_CELLS_STARTED: list[int] = [0]  # cells this process has started (`count_cell`)


def count_cell() -> int:
    """Count a cell starting in this process and return its number (1: the process's first).
    Not reset between a warm worker's units: what a process has met (its batch widths,
    compiled kernels, cuDNN plans) is the process's, and `estimate` reads this number
    (`training.process_cell`) to tell a process's first cell from later ones."""
    _CELLS_STARTED[0] += 1
    return _CELLS_STARTED[0]


def warm_unit() -> int | None:
    """This unit's number in its warm worker (1, 2, ...), or None in a fresh process."""
    return _WARM_UNIT[0] if _WARM_UNIT else None


def seconds_since_process_start() -> float | None:
    """Wall time since this process started (imports included), or in a warm worker since
    the unit arrived: a cell's start-up before its first step, for start-up measurements."""
    if _UNIT_START:
        return round(time.time() - _UNIT_START[0], 3)
    try:
        import psutil

        return round(time.time() - psutil.Process().create_time(), 3)
    except Exception:
        return None


def _cpu_peak_rss() -> int | None:
    try:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(kb) * 1024 if sys.platform != "darwin" else int(kb)
    except Exception:
        return None


# Writing 5 to /proc/self/clear_refs resets the process's peak resident memory (VmHWM, and
# with it getrusage's ru_maxrss) to what it holds now: Linux only, and not in every sandbox.
_CLEAR_REFS = "/proc/self/clear_refs"


def reset_peak_memory(device: torch.device) -> str:
    """Start the cell's peak-memory count now: CUDA's peak statistics, and on the CPU the
    process's peak resident memory where Linux lets it be reset. Returns what the cell's
    `peak_memory_bytes` will cover (`training.peak_memory_scope`): "cell", or "process" where
    the CPU figure could not be reset (it then includes everything the process held before,
    in a warm worker its earlier units)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cell"
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return "process"
    return "cell"


def peak_memory(device: torch.device) -> int | None:
    """The peak memory since `reset_peak_memory`: CUDA's allocated bytes on a GPU, the
    process's peak resident memory on the CPU."""
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _cpu_peak_rss()
    return int(peak) if peak else None
