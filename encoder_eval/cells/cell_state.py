"""A cell between its setup and its result: what it resolved before its first step
(`ResolvedCell`: task, device, model, tokenised splits, schedule, and its dev scorer, which retries
an evaluation out of memory at a smaller batch), the evaluation forward pass (`predict`),
and what the training loop hands on to scoring (`Trained`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from encoder_eval.cells import trackers
from encoder_eval.cells.batching import (
    Shapes,
    collate_batch,
)
from encoder_eval.cells.cell_config import (
    CellConfig,
    cell_label,
)
from encoder_eval.cells.devices import release_cached_memory
from encoder_eval.cells.encoding import Encoded, autocast
from encoder_eval.cells.graph_step import GraphStep
from encoder_eval.cells.kinds import Kind
from encoder_eval.cells.resume import LoopState
from encoder_eval.core import device as gpu
from encoder_eval.data.loaders import LoadedModel
from encoder_eval.data.tasks import TaskKnobs


@torch.no_grad()
def predict(
    model,
    enc: Encoded,
    pad_id: int,
    device,
    precision: str,
    batch_size: int,
    kind: Kind,
    shapes: Shapes | None = None,
):
    """Predictions for every example, in the split's original order. Batches are
    length-sorted, longest first, so an evaluation that runs out of memory does so at its
    first batch, not its last; `shapes` buckets their widths."""
    model.eval()
    order = sorted(range(len(enc.labels)), key=lambda i: -enc.lengths[i])
    preds: list = [None] * len(order)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = collate_batch(enc, idx, pad_id, device, kind, shapes)
        batch.pop("labels")
        if shapes is not None:
            shapes.step_begin()
        with autocast(device, precision):
            logits = model(**batch).logits
        for i, value in zip(idx, kind.predictions(logits), strict=True):
            preds[i] = value
    model.train()
    return preds


@dataclass
class ResolvedCell:
    """Everything a cell resolves before its first step (`_setup`), and the dev scorer."""

    cfg: CellConfig
    knobs: TaskKnobs
    kind: Kind
    device: torch.device
    peak_scope: str  # what peak_memory_bytes covers: "cell" or "process" (reset_peak_memory)
    process_cell: int  # its number among the cells its process started (devices.count_cell)
    eval_batch: int
    loaded: LoadedModel
    model: nn.Module
    pad_id: int
    prov: dict
    tokenise: Callable[[dict], Encoded]
    enc_train: Encoded
    enc_val: dict[str, Encoded]
    test_splits: dict[str, dict]
    loop_languages: list[str]  # the dev languages each evaluation during training scores
    micro: int
    accum: int
    steps_per_epoch: int
    max_steps: int
    warmup: int
    every: int
    t0: float
    shapes: Shapes = field(default_factory=Shapes)  # bucketed widths, CUDA graphs
    compile_mode: str | None = None  # torch.compile's mode (`Recipe.compile`), else None
    # The SDPA kernel of the first training forward (`attention.observe_backend`; empty until
    # it ran, and with --compile), and the cuDNN attention variables in force.
    attn_backend: list[str] = field(default_factory=list)
    attn_environment: dict[str, str] = field(default_factory=dict)
    # --graph-step: the cell's graph step (None: off, or fallen back before its first step),
    # and what the result records of it (`recipe.graph_step_run`).
    graph: GraphStep | None = None
    graph_run: dict | None = None
    dev_eval_seconds: float = 0.0  # time spent scoring dev, in the loop and at the end
    reporter: trackers.Reporter | None = None  # --report-to: the cell's tracker runs

    last_dev_predictions: dict = field(default_factory=dict)  # of the last `dev_scores`
    # The evaluation batch in use: `eval_batch` until out of memory halves it (for the rest of
    # the cell), and how many times it did (`training.eval_batch_used`, `eval_oom_retries`).
    eval_batch_used: int = 0
    eval_oom_retries: int = 0

    def predict(self, enc: Encoded) -> list:
        """Predictions for every example of `enc`. Out of memory, the split is scored again
        from its start with the evaluation batch halved, so each split's predictions come
        from one batch size; out of memory at a batch of 1 re-raises, saying so."""
        while True:
            size = self.eval_batch_used or self.eval_batch
            try:
                return predict(
                    self.model,
                    enc,
                    self.pad_id,
                    self.device,
                    self.cfg.recipe.precision,
                    size,
                    self.kind,
                    self.shapes,
                )
            except Exception as exc:
                if not gpu.is_out_of_memory(exc):
                    raise
                if min(size, len(enc.labels)) <= 1:
                    exc.add_note(
                        f"{cell_label(self.cfg)}: out of memory in evaluation with a batch "
                        "of 1: this model does not fit this device at this sequence "
                        "length; use a device with more memory"
                    )
                    raise
            release_cached_memory(self.device)  # outside the except block: the graph is freed
            self.eval_batch_used = max(1, min(size, len(enc.labels)) // 2)
            self.eval_oom_retries += 1
            print(
                f"warning: {cell_label(self.cfg)}: out of memory in evaluation with a batch of "
                f"{size}; scoring the split again with {self.eval_batch_used} (recorded in "
                "training.eval_oom_retries)",
                file=sys.stderr,
                flush=True,
            )

    def dev_scores(self, langs: list[str]) -> tuple[dict[str, float | None], dict[str, str]]:
        """Score the current weights on the dev split of each language in `langs` (the
        predictions are kept in `last_dev_predictions`)."""
        t = time.perf_counter()
        preds = {lang: self.predict(self.enc_val[lang]) for lang in langs}
        out = self.kind.score(self.knobs.metric, preds, {k: self.enc_val[k] for k in langs})
        self.last_dev_predictions = preds
        self.dev_eval_seconds += time.perf_counter() - t
        return out


@dataclass
class Trained:
    """What the training loop hands to scoring and the result."""

    st: LoopState
    diverged_at: int | None
    train_time: float
    first_step_s: float | None
    process_first_step_s: float | None
