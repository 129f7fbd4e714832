"""Kinds of cell: what differs between fine-tuning a classifier and a regressor, as hooks.

The training loop in `train.py` batches, computes the loss and turns logits into
predictions only through a cell's `Kind`, so it has no branch per kind. A new kind
(ranking, probing) is a new `Kind` row in `KINDS` and, when it comes from a new problem
type, a row in `PROBLEM_KINDS`; the loop does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .errors import unknown_name
from .tasks import REGRESSION, SINGLE_LABEL

if TYPE_CHECKING:
    from .train import Encoded


def pad_features(enc: Encoded, idx: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """The model inputs of examples `idx`, right-padded to the longest of them (input ids
    with the tokenizer's pad id, every other feature with 0)."""
    width = max(enc.lengths[i] for i in idx)
    batch = {}
    for name, seqs in enc.features.items():
        fill = pad_id if name == "input_ids" else 0
        rows = [seqs[i] + [fill] * (width - len(seqs[i])) for i in idx]
        batch[name] = torch.tensor(rows, dtype=torch.long)
    return batch


def _collate_with(label_dtype: torch.dtype):
    def collate(enc: Encoded, idx: list[int], pad_id: int, device) -> dict[str, torch.Tensor]:
        batch = pad_features(enc, idx, pad_id)
        batch["labels"] = torch.tensor([enc.labels[i] for i in idx], dtype=label_dtype)
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    return collate


# The loss is computed in fp32 whatever the autocast precision of the forward pass.
def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float(), labels)


def _squared_error(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(logits.float().squeeze(-1), labels)


def _argmax(logits: torch.Tensor) -> list:
    return logits.float().argmax(-1).cpu().tolist()


def _squeeze(logits: torch.Tensor) -> list:
    return logits.float().squeeze(-1).cpu().tolist()


@dataclass(frozen=True)
class Kind:
    """The hooks of one kind of cell.

    `collate(enc, idx, pad_id, device)`: the batch of examples `idx` on `device`, model
    inputs plus `labels`. `loss(logits, labels)`: the mean training loss, in fp32.
    `predictions(logits)`: one prediction per row of logits, as plain Python values that
    the task's metric scores. `problem`: the `problem_type` the model head is built for.
    """

    name: str
    problem: str
    collate: Callable[..., dict[str, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    predictions: Callable[[torch.Tensor], list]


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("classification", SINGLE_LABEL, _collate_with(torch.long), _cross_entropy, _argmax),
        Kind("regression", REGRESSION, _collate_with(torch.float32), _squared_error, _squeeze),
    )
}

# A task's problem type (`TaskKnobs.problem`) -> the kind of its fine-tune cells.
PROBLEM_KINDS: dict[str, str] = {SINGLE_LABEL: "classification", REGRESSION: "regression"}


def kind_for(problem: str) -> Kind:
    """The kind of cell that fine-tunes a task of problem type `problem`."""
    if problem not in PROBLEM_KINDS:
        raise unknown_name("problem type", problem, PROBLEM_KINDS)
    return KINDS[PROBLEM_KINDS[problem]]
