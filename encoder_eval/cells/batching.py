"""How a cell forms its batches: one epoch of training batches (length-grouped or random,
`train_batches`, `epoch_batches`), a batch's tensors (`collate_batch`), their widths bucketed for a
compiled model (`Shapes`, `bucket_width`), the evaluation batch by device and the micro-batch
an out-of-memory retry falls back to."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import nn

from encoder_eval.cells.encoding import Encoded
from encoder_eval.cells.kinds import Kind
from encoder_eval.core.protocol import Recipe


def collate_batch(
    enc: Encoded, idx: list[int], pad_id: int, device, kind: Kind, shapes: Shapes | None = None
) -> dict:
    """The batch of examples `idx` for `kind` (the one call `predict` batches through, so a
    benchmark can count the tokens of every batch), its width bucketed by `shapes`."""
    batch = kind.collate(enc, idx, pad_id, device)
    return batch if shapes is None else shapes.pad(batch, enc, pad_id)


def bucket_width(width: int, multiple: int | None, cap: int) -> int:
    """The width a batch whose longest row has `width` tokens is padded to: rounded up to a
    multiple of `multiple` (`Recipe.pad_multiple`; None or 1 leaves it), at most `cap` (the
    recipe's max_seq_len, which truncation already bounds every row by), never below `width`."""
    if not multiple or multiple <= 1:
        return width
    return max(width, min(cap, -(-width // multiple) * multiple))


@dataclass(frozen=True)
class Shapes:
    """How a cell shapes its batches for speed (issue 38, item 7): widths padded up to a
    multiple of `pad_multiple` tokens, at most `cap`, so a compiled model meets a few shapes
    instead of one per width; and whether the compiled model replays CUDA graphs (`graphs`),
    where each forward starts a new graph step. Padding is invisible to the model: the
    attention mask hides it, as it hides the padding to a batch's longest row."""

    pad_multiple: int | None = None
    cap: int = 0
    graphs: bool = False

    def pad(self, batch: dict, enc: Encoded, pad_id: int) -> dict:
        """`batch` (a `Kind.collate` batch of `enc`) with its model inputs right-padded to
        `bucket_width`: input ids with the pad id, every other input with 0, as
        `kinds.pad_features` pads; labels untouched."""
        width = batch["input_ids"].shape[-1]
        extra = bucket_width(width, self.pad_multiple, self.cap) - width
        if extra <= 0:
            return batch
        for name in enc.features:
            if name in batch:
                fill = pad_id if name == "input_ids" else 0
                batch[name] = nn.functional.pad(batch[name], (0, extra), value=fill)
        return batch

    def step_begin(self) -> None:
        """Before each forward: with CUDA graphs, mark a new step, so a replay never
        overwrites outputs a step before it still reads."""
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()


def train_batches(lengths: list[int], batch_size: int, rng: random.Random, grouped: bool):
    """One epoch of training batches (lists of example indices), deterministic given `rng`.

    Length-grouped: shuffle, cut into mega-batches of 50 batches, sort each by length,
    cut into batches and shuffle the batch order; padding then wastes little compute while
    every epoch still sees a fresh random grouping.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if not grouped:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    mega = batch_size * 50
    batches = []
    for start in range(0, len(order), mega):
        chunk = sorted(order[start : start + mega], key=lambda i: -lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


# Evaluation batch by device type. Batches are length-sorted, so padding is small either
# way; a GPU is fastest with large batches, while on the CPU (bf16 autocast, MiniLM, RTE
# dev) batches of 8-32 scored the split in 1.7-1.9 s against 3.0 s with 128. Predictions
# do not depend on it beyond bf16 rounding (max |logit difference| 6e-4, same argmax).
EVAL_BATCH_SIZE = {"cuda": 128, "cpu": 16}


def smaller_divisor(batch_size: int, most: int) -> int:
    """The largest divisor of `batch_size` that is at most `most` (at least 1): a micro-batch
    that still cuts every full batch evenly."""
    return next(d for d in range(max(1, most), 0, -1) if batch_size % d == 0)


def epoch_batches(enc: Encoded, kind: Kind, recipe: Recipe, rng: random.Random) -> list[list]:
    """One epoch of training batches of the kind's units (examples, or query groups), each
    batch `recipe.batch_size` units, length-grouped by a unit's tokens unless the recipe
    says random; deterministic given `rng`."""
    units = kind.units(enc, rng, recipe)
    lengths = [sum(enc.lengths[i] for i in kind.members(u)) for u in units]
    order = train_batches(lengths, recipe.batch_size, rng, recipe.batching == "length-grouped")
    return [[units[i] for i in batch] for batch in order]
