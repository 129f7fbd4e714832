"""Tokenised splits: texts become token ids once, without padding; precision becomes a context.

Below the kinds, the training loop and the embedder, so all three tokenise and autocast
the same way. `Encoded` holds one split; `encode` tokenises (pairs jointly, truncating
both texts where it can); `encode_cached` goes through the tokenisation cache.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from pathlib import Path

import numpy as np
import torch

from encoder_eval.core.protocol import Precision
from encoder_eval.data import tokencache


@dataclass
class Encoded:
    """A tokenised split: one list of token ids per example (no padding), plus labels, plus
    `columns`: per-example values a kind of cell reads beside the model inputs (a ranking
    split's query and candidate ids: `kinds.Kind.columns`; kept out of the tokenisation
    cache, which holds model inputs only)."""

    features: dict[str, list[list[int]]]
    labels: list
    lengths: list[int]
    columns: dict[str, list] = field(default_factory=dict)
    _packed: Packed | None = field(default=None, init=False, repr=False, compare=False)

    def packed(self) -> Packed:
        """The split as arrays, made on first use and kept (`Packed`)."""
        if self._packed is None:
            self._packed = Packed.of(self.features, self.lengths)
        return self._packed


@dataclass(frozen=True)
class Packed:
    """A split's features as arrays, made once: each feature's ids of every example end to
    end (int32 when they fit), and each example's start and length. A batch is cut from it
    with a few array operations (`padded`), instead of being built from Python lists at
    every step (0.7-1.9 ms a batch, issue 38). numpy, not torch: torch's indexing kernels
    wake their thread pool even for a batch's few thousand ids, which cost 4-25 ms a batch
    with two threads on a loaded CPU."""

    flat: dict[str, np.ndarray]
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, features: dict[str, list[list[int]]], lengths: list[int]) -> Packed:
        counts = np.asarray(lengths, dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else counts
        total = int(counts.sum())
        flat = {}
        for name, seqs in features.items():
            ids = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)
            small = not ids.size or (ids.min() >= -(2**31) and ids.max() < 2**31)
            flat[name] = ids.astype(np.int32) if small else ids
        return cls(flat, starts.astype(np.int64), counts)

    def padded(self, idx: list[int], width: int, fills: dict[str, int]) -> dict[str, torch.Tensor]:
        """The examples `idx`, each feature right-padded to `width` with its fill (0 unless
        `fills` names one), as int64 tensors."""
        rows = np.asarray(idx, dtype=np.int64)
        columns = np.arange(width)
        real = columns[None, :] < self.lengths[rows][:, None]
        # A padding position reads any id (the first), then takes the fill.
        where = np.where(real, self.starts[rows][:, None] + columns[None, :], 0)
        return {
            name: torch.from_numpy(
                np.where(real, values[where], fills.get(name, 0)).astype(np.int64)
            )
            for name, values in self.flat.items()
        }


def with_columns(enc: Encoded, split: dict, names: tuple[str, ...]) -> Encoded:
    """`enc` with the split's columns `names` (those it has), for the kind that reads them."""
    present = {name: list(split[name]) for name in names if name in split}
    return dataclass_replace(enc, columns={**enc.columns, **present}) if present else enc


def encode(tokenizer, split: dict, max_len: int, input_names: tuple[str, ...]) -> Encoded:
    """Tokenise a split without padding; truncation keeps both texts of a pair where it can."""
    args = (split["text"], split["text_pair"]) if "text_pair" in split else (split["text"],)
    enc = tokenizer(*args, truncation=True, max_length=max_len, padding=False)
    features = {name: enc[name] for name in input_names if name in enc}
    lengths = [len(ids) for ids in features["input_ids"]]
    return Encoded(features=features, labels=list(split["label"]), lengths=lengths)


def encode_cached(
    tokenizer,
    split: dict,
    max_len: int,
    input_names: tuple[str, ...],
    cache_dir: Path | None,
    tokenizer_fp: str | None = None,
) -> Encoded:
    """`encode` through the tokenisation cache (no cache when `cache_dir` is None)."""
    if cache_dir is None:
        return encode(tokenizer, split, max_len, input_names)
    fp = tokenizer_fp or tokencache.tokenizer_fingerprint(tokenizer)
    key = tokencache.cache_key(fp, split, max_len, input_names)
    hit = tokencache.load(cache_dir, key)
    if hit is not None:
        features, labels = hit
        return Encoded(features, labels, [len(ids) for ids in features["input_ids"]])
    enc = encode(tokenizer, split, max_len, input_names)
    tokencache.store(cache_dir, key, enc.features, enc.labels)
    return enc


def autocast(device: torch.device, precision: str, cache: bool = True):
    """bf16 autocast on `device`, or none for fp32: the one place precision becomes a context.
    `cache` False: no cache of cast weights (a CUDA graph's capture needs it off; the same
    numbers)."""
    if Precision.of(precision) is Precision.FP32:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
