"""Embeddings from a frozen encoder, for probing.

`embed_split` turns a task split into one fp32 vector per example:

* the encoder is loaded by `loaders.load_encoder` (fp32 weights, eval mode, no gradients);
* texts are tokenised exactly as for fine-tuning (`encoding.encode`: pairs jointly, the
  tokenizer's own pair template and truncation), through the tokenisation cache;
* batches are cut from the examples sorted by length (little padding), run under
  `torch.inference_mode()` with bf16 autocast (`precision="bf16"`) or in fp32;
* the last hidden states are pooled in fp32: `mean` over the attention mask, `first` (the
  first token, [CLS] or <s>) or `last` (the last real token);
* the vectors come back in the split's own order.

The result is cached on disk (`<cache>/embeddings/<key>.vectors`, the token cache's
checksummed container, `tokencache.pack`: data only, a damaged entry is a miss), keyed by the model's
resolved revision, the pooling, the tokenizer's fingerprint, the split's content, the
length limit, the precision and the device type, so that any change is a miss.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from encoder_eval.cells.encoding import Encoded, autocast, encode_cached
from encoder_eval.cells.kinds import pad_features
from encoder_eval.cells.probing import PRECISIONS
from encoder_eval.core import heap
from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.data.loaders import LoadedModel, pool
from encoder_eval.data.models import FIXED_POOLINGS
from encoder_eval.data.tokencache import default_cache_dir as token_cache
from encoder_eval.data.tokencache import (
    pack,
    read_entry,
    split_fingerprint,
    tokenizer_fingerprint,
    write_entry,
)

POOLINGS = FIXED_POOLINGS
EMBED_CACHE_VERSION = 1
# Examples per forward pass; batches are length-sorted, so padding is small either way. On
# this project's 2-core CPU (MiniLM, 1,500 MNLI pairs, bf16, bench/bench_embed.py) 32 ran at
# 13.2k real tokens/s against 12.0k with 16, 11.4k with 64 and 9.0k with 128.
EMBED_BATCH_SIZE = {"cuda": 256, "cpu": 32}


def check_poolings(names) -> tuple[str, ...]:
    """`names` as a tuple of valid poolings, each once in order; an empty or unknown one is
    refused naming the valid ones (the one check every entry point uses)."""
    out = tuple(dict.fromkeys(names))
    if not out:
        raise HarnessError(f"--pooling is empty; give one or more of {', '.join(POOLINGS)}")
    for name in out:
        if name not in POOLINGS:
            raise unknown_name("pooling", name, POOLINGS)
    return out


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Example indices in batches of `batch_size`, longest first (a memory problem shows
    at the first batch, not the last)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class EmbedSetup:
    """What decides the vectors beside the model, the split and the pooling."""

    max_seq_len: int = 256
    precision: str = "bf16"
    batch_size: int | None = None  # None: EMBED_BATCH_SIZE of the device type

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise unknown_name("precision", self.precision, PRECISIONS)


def cache_key(
    loaded: LoadedModel,
    split: dict,
    pooling: str,
    setup: EmbedSetup,
    device: torch.device,
    tokenizer_fp: str | None = None,
) -> str:
    """The cache entry of (model revision, pooling, tokenizer, split content, length limit,
    precision, device type). The batch size is not a part: batches are length-sorted and
    pooled per example, so it changes vectors only by bf16 rounding."""
    text = {k: split[k] for k in ("text", "text_pair") if k in split}
    h = hashlib.sha256()
    for part in (
        f"v{EMBED_CACHE_VERSION}",
        loaded.revision,
        type(loaded.model).__name__,
        pooling,
        tokenizer_fp or tokenizer_fingerprint(loaded.tokenizer),
        ",".join(loaded.input_names),
        split_fingerprint(text),
        str(setup.max_seq_len),
        setup.precision,
        device.type,
    ):
        h.update(part.encode() + b"\x00")
    return h.hexdigest()


def default_cache_dir() -> Path:
    """`embeddings/` inside the token cache's folder (`tokencache.default_cache_dir`)."""
    return token_cache() / "embeddings"


def _load_cached(path: Path, key: str, rows: int) -> np.ndarray | None:
    """The cached (rows, dim) fp32 vectors at `path`, or None (missing, damaged, foreign)."""
    unpacked = read_entry(path, key)
    value = None if unpacked is None else unpacked[1].get("vectors")
    if value is None or value.dtype != np.float32 or value.ndim != 2 or value.shape[0] != rows:
        return None
    return value.copy()  # writable, like a freshly computed one


def _store(path: Path, key: str, value: np.ndarray) -> None:
    """Write an entry; a cache that cannot be written only costs the next run a miss."""
    write_entry(path, pack(key, {"vectors": np.asarray(value, dtype=np.float32)}))


@torch.inference_mode()
def forward_pooled(
    loaded: LoadedModel,
    features: dict[str, list[list[int]]],
    lengths: list[int],
    poolings: tuple[str, ...],
    setup: EmbedSetup,
    device: torch.device,
    progress=None,
) -> dict[str, np.ndarray]:
    """{pooling: (n, dim) fp32 vectors} of tokenised examples, in their given order; one
    forward pass serves every pooling."""

    poolings = check_poolings(poolings)
    heap.limit_primitive_cache()
    model = loaded.model.to(device).eval()
    pad_id = loaded.tokenizer.pad_token_id
    enc = Encoded(features=features, labels=[0] * len(lengths), lengths=lengths)
    size = setup.batch_size or EMBED_BATCH_SIZE.get(device.type, EMBED_BATCH_SIZE["cuda"])
    batches = length_sorted_batches(lengths, size)
    out: dict[str, np.ndarray] = {}
    for number, idx in enumerate(batches, start=1):
        batch = {k: v.to(device) for k, v in pad_features(enc, idx, pad_id).items()}
        with autocast(device, setup.precision):
            hidden = model(**batch)
        hidden = hidden.last_hidden_state if hasattr(hidden, "last_hidden_state") else hidden[0]
        for name in poolings:
            vectors = pool(hidden, batch["attention_mask"], name).cpu().numpy()
            if name not in out:
                out[name] = np.empty((len(lengths), vectors.shape[1]), dtype=np.float32)
            out[name][idx] = vectors
        if progress is not None and (number % 50 == 0 or number == len(batches)):
            progress(number, len(batches))
    return {name: out.get(name, np.zeros((0, 0), np.float32)) for name in poolings}


def embed_split(
    loaded: LoadedModel,
    split: dict,
    poolings: tuple[str, ...],
    setup: EmbedSetup,
    device: torch.device,
    cache_dir: str | os.PathLike | None = None,
    token_cache_dir: str | os.PathLike | None = None,
    progress=None,
) -> tuple[dict[str, np.ndarray], int]:
    """{pooling: (n, dim) fp32 embeddings} of a split's examples (`text`, optional
    `text_pair`) and how many poolings came from the cache. `cache_dir` None: no
    embedding cache; `token_cache_dir` None: no tokenisation cache."""

    n = len(split["text"])
    fp = tokenizer_fingerprint(loaded.tokenizer)  # once: both cache keys hash it
    found: dict[str, np.ndarray] = {}
    paths: dict[str, Path] = {}
    keys: dict[str, str] = {}
    for name in poolings:
        if cache_dir is None:
            break
        key = cache_key(loaded, split, name, setup, device, fp)
        paths[name] = Path(cache_dir) / f"{key}.vectors"
        keys[name] = key
        hit = _load_cached(paths[name], key, n)
        if hit is not None:
            found[name] = hit
    todo = tuple(name for name in poolings if name not in found)
    if todo:
        labelled = split if "label" in split else {**split, "label": [0] * n}
        token_cache = None if token_cache_dir is None else Path(token_cache_dir)
        enc = encode_cached(
            loaded.tokenizer, labelled, setup.max_seq_len, loaded.input_names, token_cache, fp
        )
        made = forward_pooled(loaded, enc.features, enc.lengths, todo, setup, device, progress)
        for name, vectors in made.items():
            if name in paths:
                _store(paths[name], keys[name], vectors)
            found[name] = vectors
    return {name: found[name] for name in poolings}, len(poolings) - len(todo)
