"""Where and how a cell's arithmetic runs: the device (`resolve_device`), bf16 on it
(`check_bf16`), seeding, torch.compile (`compile_model`, `forget_compiled`), the random state
and memory a retry puts back or frees, and the process's start-up time and peak memory."""

from __future__ import annotations

import contextlib
import gc
import random
import sys
import time

import numpy as np
import torch
from torch import nn

from encoder_eval.cells.cell_config import (
    CellConfig,
    _label,
)
from encoder_eval.core import cpu, heap
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
def _compile_failures(cfg: CellConfig):
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
            f"{_label(cfg)}: torch.compile failed ({type(exc).__name__}: {text}); the cell "
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


def _rng_state(device: torch.device) -> tuple:
    """The random state a step draws from (dropout): the CPU generator's, and the device's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _release_cached_memory(device: torch.device) -> None:
    """Hand the caching allocator's free blocks back after an out-of-memory error, so a
    retry at a smaller batch starts from unfragmented memory."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


_UNIT_START: list[float] = []  # set by a warm worker as each unit arrives (`mark_unit_start`)


def mark_unit_start() -> None:
    """From now on, `_seconds_since_process_start` counts from this moment: a warm worker
    calls it as each unit arrives, so a unit's start-up figure is what that unit paid (in a
    fresh process: its imports and set-up), not the worker's age."""
    _UNIT_START[:] = [time.time()]


def _seconds_since_process_start() -> float | None:
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
