"""What one fine-tuning process of a model holds in GPU memory, before it runs.

`training_memory_bytes` = parameters x 16 bytes (fp32 weights, gradients and AdamW's two
moments) plus the activations a training step keeps for its backward at the task's
longest rows: about 34 bytes per token, layer and hidden unit under bf16 autocast (the
attention's score matrix is not kept: SDPA's fused kernels recompute it). On one H200 this
gave 6.5 GiB for XLM-R base at 256 tokens, where `bench_gpu.py` measured a peak of
6.1 GiB at RTE's lengths (mean 69 tokens); mDeBERTa's relative attention took 10.5 GiB
there against 6.5 estimated, which `core/gpu_share.py`'s headroom absorbs at K <= 4 on a
large card. Sizes come from `MODEL_SIZES` (the registry's models and the demo's, from their
published configs) or, for a model given by path, from its `config.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

ACTIVATION_BYTES_PER_TOKEN_LAYER_UNIT = 34
PARAMETER_BYTES = 16  # fp32 weights + gradients + AdamW's exp_avg and exp_avg_sq


class ModelSize(NamedTuple):
    """Parameters (the encoder and its embeddings), hidden size and layers."""

    params: int
    hidden: int
    layers: int


# Published sizes of the registry's models (data/models.py MODEL_REGISTRY) and the demo's.
MODEL_SIZES: dict[str, ModelSize] = {
    "all-minilm-l6-v2": ModelSize(22_713_216, 384, 6),
    "xlm-r-base": ModelSize(278_043_648, 768, 12),
    "xlm-r-large": ModelSize(560_142_482, 1024, 24),
    "xlm-r-xl": ModelSize(3_482_741_760, 2560, 36),
    "mdeberta-v3-base": ModelSize(278_218_752, 768, 12),
    "mgte-mlm-base": ModelSize(306_000_000, 768, 12),
    "eurobert-210m": ModelSize(210_000_000, 768, 12),
    "eurobert-610m": ModelSize(610_000_000, 1152, 26),
    "eurobert-2.1b": ModelSize(2_100_000_000, 2304, 32),
    "modernbert-base": ModelSize(149_014_272, 768, 22),
    "modernbert-large": ModelSize(394_781_696, 1024, 28),
    "lfm2.5-encoder-230m": ModelSize(230_000_000, 1024, 16),
    "lfm2.5-encoder-350m": ModelSize(350_000_000, 1024, 16),
    "lfm2.5-embedding-350m": ModelSize(350_000_000, 1024, 16),
    "lfm2.5-colbert-350m": ModelSize(350_000_000, 1024, 16),
}


def size_from_config(path: str | Path) -> ModelSize | None:
    """A model directory's size from its `config.json` (token and learned position
    embeddings plus, per layer, the attention's 4 h^2 and the MLP's 2 h x intermediate; a
    gated MLP's third matrix is not counted); None without a readable one."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        inter = int(cfg.get("intermediate_size") or 4 * hidden)
        vocab = int(cfg.get("vocab_size") or 0)
        # learned position embeddings, unless the model rotates (RoPE: no table)
        rotary = any("rope" in key for key in cfg)
        positions = 0 if rotary else int(cfg.get("max_position_embeddings") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    params = (vocab + positions) * hidden + layers * (4 * hidden * hidden + 2 * hidden * inter)
    return ModelSize(params, hidden, layers)


def model_size(key: str, path: str | None = None) -> ModelSize | None:
    """The size of model `key` (`MODEL_SIZES`), else of the directory `path`; None if unknown."""
    if key in MODEL_SIZES:
        return MODEL_SIZES[key]
    return size_from_config(path) if path else None


def training_memory_bytes(size: ModelSize, seq_len: int, batch: int) -> int:
    """GPU memory one training process of this model needs at `batch` rows of `seq_len`
    tokens (see the module's docstring for what it counts)."""
    activations = (
        ACTIVATION_BYTES_PER_TOKEN_LAYER_UNIT * seq_len * batch * size.hidden * size.layers
    )
    return size.params * PARAMETER_BYTES + activations
