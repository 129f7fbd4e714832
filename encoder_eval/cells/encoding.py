"""Tokenised splits: texts become token ids once, without padding; precision becomes a context.

Below the kinds, the training loop and the embedder, so all three tokenise and autocast
the same way. `Encoded` holds one split; `encode` tokenises (pairs jointly, truncating
both texts where it can); `encode_cached` goes through the tokenisation cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from pathlib import Path

import torch

from encoder_eval.core.metrics import RankGroups
from encoder_eval.data import tokencache


@dataclass
class Encoded:
    """A tokenised split: one list of token ids per example (no padding), plus labels; for
    a ranking split also each example's query, candidate id and first-stage rank."""

    features: dict[str, list[list[int]]]
    labels: list
    lengths: list[int]
    query_ids: list[str] | None = None
    doc_ids: list[str] | None = None
    first_stage_ranks: list[int] | None = None

    @property
    def rank_groups(self) -> RankGroups | None:
        """What a grouped metric needs beside scores and labels; None for other splits."""
        if self.query_ids is None:
            return None
        return RankGroups(self.query_ids, self.first_stage_ranks)


def with_rank_columns(enc: Encoded, split: dict) -> Encoded:
    """`enc` with a ranking split's query, candidate and first-stage columns (kept out of
    the tokenisation cache, which holds model inputs only); other splits unchanged."""
    if "query_id" not in split:
        return enc
    return dataclass_replace(
        enc,
        query_ids=list(split["query_id"]),
        doc_ids=list(split["doc_id"]),
        first_stage_ranks=list(split["first_stage_rank"]),
    )


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
