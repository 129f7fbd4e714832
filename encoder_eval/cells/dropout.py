"""Dropout masks drawn in parallel on the CPU: the same dropout, a fraction of the time.

PyTorch draws a CPU dropout mask one element at a time from its one Mersenne Twister
(`bernoulli_` takes MKL's vectorised path on Intel CPUs only); on an AMD CPU a MiniLM
training step spent about a quarter of its time there (bench/README.md, "Dropout masks").
Inside `parallel_dropout()` every `torch.nn.functional.dropout` in training, and every
`scaled_dot_product_attention` with `dropout_p > 0`, draws its mask as uniform numbers in
`STREAMS` fixed slices, each from its own generator seeded from PyTorch's default CPU
generator, the slices filled by a thread pool. The dropout is the same (keep with
probability 1 - p, scale kept values by 1 / (1 - p), save a bool mask for the backward);
the attention follows PyTorch's own CPU math path (fp32, safe softmax), the path that
dropout forces anyway. Only the random numbers differ from PyTorch's, and they depend on
the seed alone: the slices are fixed by the tensor's size, not by the thread count, and
their seeds come from the default generator, which `seed_everything`, the resume state
and activation checkpointing already save and restore (a checkpointed forward re-enters
the context when it is recomputed: `active`). GPUs draw masks in parallel
already, so the cell uses this on the CPU only (`train._accumulate`).
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.nn import functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode

# Slices a large mask is cut into, each from its own generator: a fixed number, so that the
# random numbers do not depend on how many threads fill them.
STREAMS = 8
# Elements below which a slice is not worth a thread of its own.
MIN_SLICE = 1 << 16

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_pool_pid: int | None = None
_pool_lock = threading.Lock()


def _generators() -> list[torch.Generator]:
    gens = getattr(_local, "generators", None)
    if gens is None:
        gens = _local.generators = [torch.Generator() for _ in range(STREAMS)]
    return gens


def _executor() -> ThreadPoolExecutor:
    """The process's pool (a new one in a forked child: threads do not survive a fork)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=STREAMS, thread_name_prefix="dropout")
            _pool_pid = os.getpid()
        return _pool


def uniform(shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """fp32 uniform numbers in [0, 1) of `shape`, filled in fixed slices from generators
    seeded by the default CPU generator (the same numbers for the same seed, whatever the
    thread count)."""
    n = math.prod(shape)
    slices = max(1, min(STREAMS, n // MIN_SLICE))
    seeds = torch.randint(0, 2**62, (slices,), dtype=torch.int64).tolist()
    out = torch.empty(n, dtype=torch.float32)
    bounds = [n * i // slices for i in range(slices + 1)]
    gens = _generators()

    def fill(first: int, step: int) -> None:
        for i in range(first, slices, step):
            gens[i].manual_seed(seeds[i])
            out[bounds[i] : bounds[i + 1]].uniform_(generator=gens[i])

    workers = min(slices, torch.get_num_threads())
    if workers <= 1:
        fill(0, 1)
    else:
        list(_executor().map(fill, range(workers), [workers] * workers))
    return out.view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), keeping only the bool mask for the backward (as native dropout)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * keep * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None, None


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of `x` with a mask from `uniform`."""
    if p <= 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    keep = uniform(x.shape) >= p
    return _MaskedScale.apply(x, keep.to(x.device), 1.0 / (1.0 - p))


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """Scaled dot-product attention with dropout, as PyTorch's CPU math path computes it
    (query and key each scaled by sqrt(scale), fp32, safe softmax: a row with every key
    masked attends to nothing), the dropout mask from `uniform`."""
    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        q, k, v = query.float(), key.float(), value.float()
        root = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.size(-1)))
        scores = (q * root) @ (k * root).transpose(-2, -1)
        if is_causal:
            causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask.float()
        probs = torch.softmax(scores, dim=-1)
        probs = torch.where(scores.isneginf().all(-1, keepdim=True), 0.0, probs)
        out = dropout(probs, dropout_p) @ v
    return out.to(dtype)


class _ParallelDropout(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            bound = _bind(("input", "p", "training", "inplace"), (None, 0.5, True, False),
                          args, kwargs)  # fmt: skip
            if bound["training"] and not bound["inplace"] and bound["p"] > 0:
                return dropout(bound["input"], bound["p"])
        elif func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            bound = _bind(names, (None, None, None, None, 0.0, False, None), args, kwargs)
            extra = set(kwargs) - set(names)
            if (
                bound["dropout_p"] > 0
                and not (extra - {"enable_gqa"})
                and not kwargs.get("enable_gqa")
            ):
                return attention(*(bound[n] for n in names))
        return func(*args, **kwargs)


def _bind(names: tuple[str, ...], defaults: tuple, args: tuple, kwargs: dict) -> dict:
    bound = dict(zip(names, defaults, strict=True))
    bound.update(zip(names, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in bound})
    return bound


def parallel_dropout() -> TorchFunctionMode:
    """The context in which training-mode dropout (and attention dropout) draws its masks
    with `uniform`; enter it around a CPU training step."""
    return _ParallelDropout()


def active() -> bool:
    """Whether `parallel_dropout` is in force here. A forward that activation checkpointing
    recomputes in the backward must enter it again when it was in force at the original
    forward (the backward does not run under the forward's modes)."""
    from torch.overrides import _get_current_function_mode_stack

    return any(isinstance(m, _ParallelDropout) for m in _get_current_function_mode_stack())
