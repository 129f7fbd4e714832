"""Tokenised splits: texts become token ids once, without padding; precision becomes a context.

Below the kinds, the training loop and the embedder, so all three tokenise and autocast
the same way. `Encoded` holds one split; `encode` tokenises (pairs jointly, truncating
both texts where it can); `encode_cached` goes through the tokenisation cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from pathlib import Path

import torch

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


def autocast(device: torch.device, precision: str):
    """bf16 autocast on `device`, or none for fp32: the one place precision becomes a context."""
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16)
