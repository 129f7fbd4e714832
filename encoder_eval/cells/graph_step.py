"""One CUDA graph of the whole training step per batch shape, without torch.compile
(`Recipe.graph_step`, `--graph-step`; issue 49, item 2).

At RTE lengths a base model's GPU step is mostly the host dispatching a few thousand
operations; a CUDA graph replays them in one call. The step (forward under autocast,
loss, backward, fused AdamW) is captured once per batch shape (`--pad-multiple` makes the
widths a few buckets) and replayed with the batch copied into its static input buffers:

* the parameters, AdamW's state and the learning rate stay at fixed addresses: fused AdamW
  with `capturable=True`, its learning rate a device tensor the scheduler fills in place;
* the gradients too: they are made by the first (eager) step and never set to None while
  the graph step runs; each step zeroes them in place and its backward adds into them, so
  every shape's graph shares one set (not one per graph: 1.1 GB each for XLM-R base);
* a shape's first step runs eagerly on a side stream (the warm-up: kernels chosen, cuBLAS
  workspaces made, AdamW's state allocated), its second is captured, then replayed, so every
  step is a real step and none is run twice;
* no host synchronisation inside the step: transformers' SDPA mask preparation tests
  `torch.all(mask == 1)` on a 2-D mask (a sync); BERT-like bodies are given the same mask as
  3-D (batch, length, length), a form they take without that test (`graph_mask`).

Any failure to capture (an operation that syncs, an unsupported kernel, out of memory while
capturing) falls back to the eager step for the rest of the cell with one line saying so,
recorded in `recipe.graph_step_run`; so does a device without CUDA graphs (the CPU), a kind
whose step is not one forward of the whole batch, and a step that needs gradient
accumulation (a micro-batch smaller than the batch). The pieces that are not CUDA
(`graph_mask`, `graph_optimizer`, `StaticBatch`, `step_function`) run on the CPU, where
the step function through static buffers is the eager step bit for bit
(`tests/test_graph_step.py`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from encoder_eval.cells.devices import device_rng_state, set_device_rng_state
from encoder_eval.cells.kinds import Autocast, Kind
from encoder_eval.core.protocol import Recipe

# Kinds whose training step is one forward of the whole batch (`kinds._whole_batch_step`).
GRAPH_KINDS = ("classification", "regression")
# Bodies that take a 3-D (batch, length, length) attention mask through
# `get_extended_attention_mask`, skipping the 2-D SDPA path's `torch.all(mask == 1)`.
MASK_3D_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
# Eager warm-up steps of a new shape before it is captured (its first meeting).
WARMUP_STEPS = 1


def graph_mask(model: nn.Module, batch: dict) -> dict:
    """`batch` with its 2-D attention mask given as 3-D (`mask[:, None, :]` expanded over
    the query positions) when the model's body takes that form without a host sync; the
    same additive mask the 2-D path builds, so the same numbers (on the CPU bit for bit)."""
    mask = batch.get("attention_mask")
    config = getattr(model, "config", None)
    if mask is None or mask.dim() != 2 or getattr(config, "model_type", "") not in MASK_3D_TYPES:
        return batch
    width = mask.shape[-1]
    return {**batch, "attention_mask": mask[:, None, :].expand(-1, width, -1).contiguous()}


def graph_optimizer(
    groups: list[dict], recipe: Recipe, lr: float, device: torch.device
) -> torch.optim.AdamW:
    """Fused AdamW with `capturable=True` and the learning rate as a tensor on `device`
    (fp32 on a GPU, as the fused CUDA kernel reads it; fp64 on the CPU, as the float the
    eager optimizer is given): the arithmetic of `train.build_optimizer`'s AdamW, with every
    value a graph reads at a fixed address."""
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    rate = torch.tensor(lr, dtype=dtype, device=device)
    return torch.optim.AdamW(
        groups,
        lr=rate,
        betas=(recipe.adam_beta1, recipe.adam_beta2),
        eps=recipe.adam_eps,
        fused=True,
        capturable=True,
    )


@dataclass
class StaticBatch:
    """A batch's tensors at fixed addresses: the captured step reads these; each step's batch
    is copied in (`fill`)."""

    tensors: dict[str, torch.Tensor]

    @classmethod
    def like(cls, batch: dict) -> StaticBatch:
        return cls({k: v.clone() for k, v in batch.items()})

    def fill(self, batch: dict) -> dict[str, torch.Tensor]:
        for k, v in batch.items():
            self.tensors[k].copy_(v, non_blocking=True)
        return self.tensors


def step_function(
    kind: Kind, model: nn.Module, optimizer: torch.optim.Optimizer, in_precision: Autocast
) -> Callable[[dict], torch.Tensor]:
    """The whole training step on a (static) batch: the gradients zeroed in place (kept at
    their addresses), forward, loss and backward (`kind.train_step`, the loss scaled by 1:
    one micro-batch) and the optimizer's update; returns the loss, on the device. The batch
    dict is not changed (its labels stay)."""

    def step(batch: dict) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=False)
        loss = kind.train_step(model, dict(batch), 1.0, in_precision)
        optimizer.step()
        return loss

    return step


@dataclass
class _Shape:
    static: StaticBatch
    meetings: int = 0
    graph: object = None  # torch.cuda.CUDAGraph once captured
    loss: torch.Tensor | None = None  # the captured step's loss (its static output)


@dataclass
class GraphStep:
    """The graph step of one cell: `run` a batch, or `fallback` (why it runs eagerly)."""

    kind: Kind
    model: nn.Module
    optimizer: torch.optim.Optimizer
    in_precision: Autocast
    device: torch.device
    label: str
    fallback: str | None = None
    shapes: dict = field(default_factory=dict)
    captured: int = 0
    pool: object = None

    def __post_init__(self):
        self.step = step_function(self.kind, self.model, self.optimizer, self.in_precision)

    def hold_lr(self) -> None:
        """Every parameter group's learning rate as a tensor on the device again, after a
        resume state put back its own value (a float baked into a capture would hold for
        every replay)."""
        dtype = torch.float64 if self.device.type == "cpu" else torch.float32
        for group in self.optimizer.param_groups:
            lr = group["lr"]
            value = float(lr.item() if isinstance(lr, torch.Tensor) else lr)
            group["lr"] = torch.tensor(value, dtype=dtype, device=self.device)

    def active(self, rows: int, micro: int) -> bool:
        """Whether this step runs through the graph: not fallen back (after out of memory it
        has: the gradients its graphs write to were let go), and no accumulation."""
        return self.fallback is None and micro >= rows

    def give_up(self, why: str) -> None:
        """Run eagerly from now on, saying so once."""
        self.fallback = why
        print(
            f"warning: {self.label}: graph step off, eager steps from here on: {why}",
            file=sys.stderr,
            flush=True,
        )

    def run(self, batch: dict) -> torch.Tensor | None:
        """One training step of `batch` (a collated batch, labels included) through its
        shape's graph; its loss, on the device. None when capturing failed: the cell has
        fallen back (`fallback`) and the caller runs this step eagerly."""
        batch = graph_mask(self.model, batch)
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(batch.items()))
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape(StaticBatch.like(batch))
        shape.meetings += 1
        if shape.graph is not None:
            shape.static.fill(batch)
            shape.graph.replay()
            return shape.loss.clone()
        if shape.meetings <= WARMUP_STEPS:
            return self._warm_up(shape, batch)
        return self._capture(shape, batch)

    def _warm_up(self, shape: _Shape, batch: dict) -> torch.Tensor:
        """A real step, eager, on a side stream (what the capture will meet is made now)."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            loss = self.step(shape.static.fill(batch))
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(side)
        if loss.is_cuda:  # read on the current stream: not reused before that
            loss.record_stream(current)
        return loss

    def _capture(self, shape: _Shape, batch: dict) -> torch.Tensor | None:
        """Capture this shape's step, then replay it (the step itself); None on failure."""
        rng = device_rng_state(self.device)
        static = shape.static.fill(batch)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                loss = self.step(static)
        except Exception as exc:  # nothing captured ran: the weights and state are as before
            with contextlib.suppress(Exception):  # the random state the step starts from
                set_device_rng_state(self.device, rng)
            self.give_up(
                f"capturing failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            )
            return None
        self.pool = self.pool or graph.pool()
        shape.graph, shape.loss = graph, loss
        self.captured += 1
        graph.replay()
        return loss.clone()

    def record(self) -> dict:
        """What the result records (`recipe.graph_step_run`)."""
        return {
            "graphs": self.captured,
            "shapes": len(self.shapes),
            "fallback": self.fallback,
        }


def unavailable(device: torch.device, kind: Kind, model: nn.Module) -> str | None:
    """Why this cell cannot run the graph step at all (None: it can)."""
    if device.type != "cuda" or not hasattr(torch.cuda, "CUDAGraph"):
        return f"no CUDA graphs on {device.type}"
    if kind.name not in GRAPH_KINDS:
        return f"a {kind.name} cell's step is not one forward of the whole batch"
    return None
