"""The accelerator facts a cell acts on: is this error an out-of-memory, should a GPU be here.

`is_out_of_memory` is the one predicate the training step, the optimizer step and the
evaluation ask before they retry with a smaller batch: torch's `OutOfMemoryError` (bound
by `out_of_memory_error`, since `torch.OutOfMemoryError` exists from torch 2.5 only and
ROCm module stacks still ship 2.4), and the out-of-memory errors that arrive as a plain
`RuntimeError` (cuBLAS failing to allocate its workspace at the first backward, HIP's
`hipErrorOutOfMemory`). `expected_gpu` says why a GPU should be visible (the scheduler
allocated one, or a GPU tool answers) when `--device auto` found none, so that the cell
says so instead of fine-tuning on the CPU for days. torch is imported on use only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping

from encoder_eval.core import process_state

# Out-of-memory errors that reach Python as a RuntimeError (or a torch.AcceleratorError),
# by the words of their message: the caching allocator's own (CUDA, HIP), cuBLAS, hipBLAS
# and cuDNN failing to allocate a workspace, and the runtime's error names.
OOM_MESSAGES = (
    "CUDA out of memory",
    "HIP out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "HIPBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
    "hipErrorOutOfMemory",
)

# Environment variables whose non-empty value says a GPU was allocated to this job (Slurm's
# `--gpus`/`--gres` family) or selected for it (CUDA's and ROCm's device lists).
GPU_VARIABLES = (
    "SLURM_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
)
# Values of those variables that hide every GPU on purpose (a CPU run asked for).
_NO_GPU_VALUES = ("", "-1", "none", "nodevfiles", "0-0:none")


def out_of_memory_error() -> type[BaseException]:
    """torch's out-of-memory exception class: `torch.OutOfMemoryError` (torch >= 2.5), else
    `torch.cuda.OutOfMemoryError` (the same class, under its older name)."""
    import torch

    found = getattr(torch, "OutOfMemoryError", None)
    return found if found is not None else torch.cuda.OutOfMemoryError


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the device running out of memory (a retry at a smaller batch may
    fit): torch's out-of-memory error, or a RuntimeError whose message names one
    (`OOM_MESSAGES`)."""
    if isinstance(exc, out_of_memory_error()):
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in OOM_MESSAGES)


def _gpu_tool_answers(which: Callable[[str], str | None]) -> str | None:
    """`nvidia-smi` on PATH that lists a GPU, or `rocm-smi` on PATH (as `make install`
    decides): the tool's own words, else None."""
    smi = which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.SubprocessError):
            out = None
        if out is not None and out.returncode == 0 and "GPU" in out.stdout:
            first = out.stdout.strip().splitlines()[0]
            return f"nvidia-smi lists {first.split(' (UUID')[0]}"
    if which("rocm-smi"):
        return "rocm-smi is on PATH"
    return None


def expected_gpu(
    environ: Mapping[str, str] = os.environ, which: Callable[[str], str | None] = shutil.which
) -> str | None:
    """Why a GPU should be visible to this process (the scheduler allocated one, a device
    list names one, or `nvidia-smi`/`rocm-smi` answers), in a few words; None when nothing
    says so."""
    for name in GPU_VARIABLES:
        value = environ.get(name, "").strip()
        if value.lower() not in _NO_GPU_VALUES:
            return f"{name}={value}"
    return _gpu_tool_answers(which)


def cpu_fallback_warning(why: str) -> str:
    """The line a cell prints when `--device auto` resolved to the CPU although `why` says
    a GPU should be here."""
    import torch

    build = (
        f"HIP {torch.version.hip}"
        if getattr(torch.version, "hip", None)
        else f"CUDA {torch.version.cuda}"
        if torch.version.cuda
        else "CPU-only"
    )
    return (
        f"warning: --device auto found no usable GPU, so this cell runs on the CPU (days for "
        f"a real model), although {why}; torch {torch.__version__} is a {build} build and "
        "torch.cuda.is_available() is False: check the driver against that build (on ROCm, "
        "install PyTorch's ROCm wheel: docs/install.md); --device cuda makes this an error, "
        "--device cpu a choice"
    )


_WARNED: set[str] = set()
process_state.set_clearer("CPU-fallback warnings (core/device.py)", _WARNED)


def warn_cpu_fallback(why: str | None) -> None:
    """Print `cpu_fallback_warning` to stderr, once per process, when `why` is given."""
    if why is not None and why not in _WARNED:
        _WARNED.add(why)
        print(cpu_fallback_warning(why), file=sys.stderr, flush=True)
