"""Dropout masks drawn in parallel on the CPU (`encoder_eval.cells.dropout`): the same
dropout as PyTorch's (keep probability, scaling, gradient), attention as PyTorch's math
path computes it, and random numbers that depend on the seed alone, not on the threads."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from encoder_eval.cells import dropout

SEED = 1234


def qkv(shape=(2, 4, 16, 8)):
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(shape, generator=g) for _ in range(3)]


@pytest.mark.parametrize("case", ["none", "float-mask", "bool-mask", "causal", "scale"])
def test_attention_is_pytorchs_math_path(case):
    q, k, v = qkv()
    kw: dict = {}
    if case == "float-mask":
        mask = torch.zeros(2, 1, 1, 16)
        mask[0, ..., 10:] = float("-inf")
        kw["attn_mask"] = mask
    elif case == "bool-mask":
        mask = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(SEED)) > 0.3
        mask[0, 0, 3] = False  # a row that attends to nothing: zeros, as PyTorch's
        kw["attn_mask"] = mask
    elif case == "causal":
        kw["is_causal"] = True
    elif case == "scale":
        kw["scale"] = 0.05
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    got = dropout.attention(q, k, v, kw.get("attn_mask"), 0.0, kw.get("is_causal", False),
                            kw.get("scale"))  # fmt: skip
    assert torch.allclose(got, want.nan_to_num(0.0), atol=1e-6)


def test_dropout_keeps_one_minus_p_and_scales_the_kept():
    p, n = 0.1, 2_000_000
    torch.manual_seed(SEED)
    x = torch.ones(n, requires_grad=True)
    with dropout.parallel_dropout():
        y = F.dropout(x, p, training=True)
    kept = y > 0
    rate = kept.double().mean().item()
    # Binomial standard error at n = 2e6 is 2.1e-4; five of them.
    print(f"seed {SEED}: kept {rate:.5f} of {n} (expected {1 - p})")
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(sum y)/dx = mask / (1 - p)


def test_the_masks_depend_on_the_seed_not_on_the_threads():
    threads = torch.get_num_threads()
    shape = (64, 12, 128, 128)  # 12.6M elements: every stream in use
    draws = []
    try:
        for n in (1, 2, 3, 1):
            torch.set_num_threads(n)
            torch.manual_seed(SEED)
            draws.append(dropout.uniform(shape))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(draws[0], d) for d in draws[1:])
    torch.manual_seed(SEED + 1)
    assert not torch.equal(draws[0], dropout.uniform(shape))
    # The slices are independent streams, not one stream repeated.
    flat = draws[0].flatten()
    size = flat.numel() // dropout.STREAMS
    assert not torch.equal(flat[:1000], flat[size : size + 1000])
    assert 0.0 <= float(flat.min()) and float(flat.max()) < 1.0
    assert abs(float(flat.mean()) - 0.5) < 1e-3


def test_attention_dropout_uses_the_parallel_masks():
    q, k, v = qkv()
    p = 0.25
    torch.manual_seed(SEED)
    with dropout.parallel_dropout():
        got = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    torch.manual_seed(SEED)
    keep = dropout.uniform((2, 4, 16, 16)) >= p
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    want = (probs * keep / (1 - p)) @ v
    assert torch.allclose(got, want, atol=1e-5)


def test_only_training_dropout_is_replaced():
    x = torch.randn(100, 100)
    layer = torch.nn.Dropout(0.5)
    with dropout.parallel_dropout():
        assert torch.equal(layer.eval()(x), x)
        torch.manual_seed(SEED)
        a = layer.train()(x)
    torch.manual_seed(SEED)
    b = dropout.dropout(x, 0.5)
    assert torch.equal(a, b)
    # Outside the context, PyTorch's own masks: other numbers.
    torch.manual_seed(SEED)
    assert not torch.equal(layer(x), a)


@pytest.mark.parametrize("devices", [{"cpu"}, set()], ids=["parallel", "pytorch"])
def test_a_cpu_cell_draws_its_masks_in_parallel(devices, small_mirror, tmp_path, monkeypatch):
    """The cell's training step enters the context on the device types in
    `train.PARALLEL_DROPOUT` (the CPU), and only in training: a real tiny BERT cell."""
    from tiny_models import LAYERS, build_tiny_model

    from encoder_eval.cells import train
    from encoder_eval.core.protocol import Recipe

    model = build_tiny_model("bert", tmp_path / "bert", num_labels=None)
    draws = []
    real = dropout.uniform
    monkeypatch.setattr(dropout, "uniform", lambda shape: draws.append(shape) or real(shape))
    monkeypatch.setattr(train, "PARALLEL_DROPOUT", devices)
    cfg = train.CellConfig(model_path=str(model), task="glue_rte", lr=1e-4, seed=45,
                           model_key="tiny", recipe=Recipe(max_steps=2, max_seq_len=64),
                           data_dir=str(small_mirror), device="cpu", progress="quiet",
                           phase="select", cache_dir=None)  # fmt: skip
    result = train.run_cell(cfg)
    assert result["status"] == "ok" and result["training"]["steps"] == 2
    assert result["training"]["dropout_masks"] == ("parallel" if devices else "pytorch")
    print(f"PARALLEL_DROPOUT={devices}: {len(draws)} masks drawn")
    if devices:
        # Per step: the embeddings', each layer's attention and two hidden ones, the head's.
        assert len(draws) == 2 * (1 + 3 * LAYERS + 1)
    else:
        assert draws == []
