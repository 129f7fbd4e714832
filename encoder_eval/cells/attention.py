"""Which attention kernel a cell ran, and the cuDNN attention setting a GPU cell starts with
(issue 49, item 1).

`observe_backend` watches one training forward: every call of
`torch.nn.functional.scaled_dot_product_attention` (SDPA) is answered by torch's own kernel
choice for its arguments (`torch._fused_sdp_choice`: flash, mem_efficient, cudnn, math) under
the autocast then in force, so the result records the kernel that ran on its device, shapes
and dtype (`recipe.attn_backend`). Kernels differ in their low bits, so the comparability
rule treats the backend as it treats `attn_implementation` (`core/comparability.py`). A model
that calls no SDPA records its attention implementation (`eager`, `flash_attention_2`), a
compiled model (`--compile`) None: its kernels are inductor's.

`sdpa_environment` is what a cell sets before its first CUDA step where it applies:
`TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1` (pytorch/pytorch PR #155958, merged 2025-08-15, so
torch 2.9 and newer: cuDNN's attention reuses one execution plan across sequence lengths
instead of building one per (batch, length)). Unmeasured on our cells; PR #190388's discussion says it covers the
no-bias BSHD case, so masked batches may still build per width (docs/cells.md).
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from encoder_eval.cells.devices import attn_implementation

# torch.nn.attention.SDPBackend's values, by the names the result records.
SDPA_NAMES = {
    -1: "error",
    0: "math",
    1: "flash",
    2: "mem_efficient",
    3: "cudnn",
    4: "overrideable",
}

# Environment a CUDA cell sets unless the user set it (name -> (value, first torch version
# that reads it)).
SDPA_ENVIRONMENT = {"TORCH_CUDNN_SDPA_AVOID_RECOMPILE": ("1", (2, 9))}


def _torch_version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def sdpa_environment(
    device_type: str, torch_version: str, hip: str | None, environ=os.environ
) -> dict[str, str]:
    """The variables of `SDPA_ENVIRONMENT` a cell on `device_type` sets: on CUDA (not ROCm,
    which has no cuDNN) with a torch that reads them, and only those the user did not set."""
    if device_type != "cuda" or hip:
        return {}
    version = _torch_version(torch_version)
    return {
        name: value
        for name, (value, since) in SDPA_ENVIRONMENT.items()
        if version >= since and name not in environ
    }


def apply_sdpa_environment(device: torch.device) -> dict[str, str]:
    """Set `sdpa_environment` for this cell (a warm worker puts the environment back between
    units, and the next cell sets it again); returns every `SDPA_ENVIRONMENT` variable in
    force now, the user's included: what the result records (`recipe.attn_environment`)."""
    hip = getattr(torch.version, "hip", None)
    os.environ.update(sdpa_environment(device.type, torch.__version__, hip))
    if device.type != "cuda":
        return {}
    return {name: os.environ[name] for name in SDPA_ENVIRONMENT if name in os.environ}


def _choice(args: tuple, kwargs: dict) -> str:
    """torch's SDPA kernel for these arguments, as the call under autocast would get them."""
    query = args[0] if args else kwargs.get("query")
    device_type = query.device.type if isinstance(query, torch.Tensor) else "cpu"
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)

        def cast(x):
            return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        args = tuple(cast(a) for a in args)
        kwargs = {k: cast(v) for k, v in kwargs.items()}
    with torch.no_grad():
        return SDPA_NAMES.get(int(torch._fused_sdp_choice(*args, **kwargs)), "unknown")


class _Watch(TorchFunctionMode):
    """Records torch's kernel choice at each SDPA call; passes every call through unchanged."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is nn.functional.scaled_dot_product_attention:
            try:
                self.seen.add(_choice(args, kwargs))
            except Exception:  # a backend torch cannot answer for: the call still runs
                self.seen.add("unknown")
        return func(*args, **kwargs)


@contextlib.contextmanager
def observe_backend(model: nn.Module, into: list):
    """Run the block (one training forward and backward of `model`) watching its SDPA calls;
    append to `into` the backend it ran: the kernels chosen (`+`-joined when several), else
    the model's attention implementation (`eager` when it has none)."""
    watch = _Watch()
    with watch:
        yield
    if watch.seen:
        into.append("+".join(sorted(watch.seen)))
    else:
        impl = attn_implementation(model)
        into.append("eager" if impl in (None, "sdpa") else impl)
