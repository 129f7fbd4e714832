"""Embedding extraction: pooling, joint pairs, length-sorted batches, bf16, the disk cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import KINDS, REMOTE_KIND

from encoder_eval.cells import embed as E
from encoder_eval.core.errors import HarnessError
from encoder_eval.data.loaders import load_encoder

CPU = torch.device("cpu")
TEXTS = [
    "the cat sat",
    "a much longer sentence about the dog that ran across the whole garden today",
    "hi",
    "le chat est sur la table et le chien dort",
    "this is fine",
    "one two three four five six",
    "x",
]
PAIRS = ["a reply", "yes", "another rather long second text of the pair here", "no", "b", "c d",
         "e f g"]  # fmt: skip


def _loaded(tiny_models, kind):
    return load_encoder(str(tiny_models[kind]), trust_remote_code=kind == REMOTE_KIND)


def _one_by_one(loaded, split, pooling: str) -> np.ndarray:
    """The reference: each example alone (no padding at all), fp32, plain transformers."""
    rows = []
    pairs = split.get("text_pair")
    for i, text in enumerate(split["text"]):
        args = (text, pairs[i]) if pairs else (text,)
        enc = loaded.tokenizer(*args, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            hidden = loaded.model(**{k: enc[k] for k in loaded.input_names}).last_hidden_state[0]
        rows.append({"mean": hidden.mean(0), "first": hidden[0], "last": hidden[-1]}[pooling])
    return torch.stack(rows).numpy()


@pytest.mark.parametrize("kind", [*KINDS, REMOTE_KIND])
@pytest.mark.parametrize("pair", [False, True])
def test_batched_fp32_embeddings_equal_one_example_at_a_time(tiny_models, kind, pair):
    loaded = _loaded(tiny_models, kind)
    split = {"text": TEXTS, **({"text_pair": PAIRS} if pair else {})}
    setup = E.EmbedSetup(max_seq_len=64, precision="fp32", batch_size=3)
    out, hits = E.embed_split(loaded, split, E.POOLINGS, setup, CPU)
    assert hits == 0
    for pooling in E.POOLINGS:
        assert out[pooling].dtype == np.float32 and out[pooling].shape == (len(TEXTS), 32)
        np.testing.assert_allclose(out[pooling], _one_by_one(loaded, split, pooling),
                                   atol=2e-5, rtol=1e-4)  # fmt: skip
    assert not np.allclose(out["mean"], out["first"])


def test_pairs_are_encoded_jointly_like_fine_tuning(tiny_models):
    from encoder_eval.cells.encoding import encode

    loaded = _loaded(tiny_models, "bert")
    enc = encode(loaded.tokenizer, {"text": TEXTS, "text_pair": PAIRS, "label": [0] * 7}, 64,
                 loaded.input_names)  # fmt: skip
    sep = loaded.tokenizer.sep_token_id
    assert all(ids.count(sep) == 2 for ids in enc.features["input_ids"])  # one sequence each
    assert any(1 in types for types in enc.features["token_type_ids"])


def test_bf16_autocast_is_close_to_fp32_and_returns_fp32(tiny_models):
    loaded = _loaded(tiny_models, "bert")
    split = {"text": TEXTS}
    fp32, _ = E.embed_split(loaded, split, ("mean",), E.EmbedSetup(64, "fp32"), CPU)
    bf16, _ = E.embed_split(loaded, split, ("mean",), E.EmbedSetup(64, "bf16"), CPU)
    assert bf16["mean"].dtype == np.float32
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    diff = np.abs(bf16["mean"] - fp32["mean"]).max()
    assert 0 < diff < 0.1, diff  # bf16 rounds (so it ran), but stays near the fp32 vectors


def test_length_sorted_batches_cover_every_example_once_longest_first():
    lengths = [5, 1, 9, 9, 3, 7, 2]
    batches = E.length_sorted_batches(lengths, 3)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(7))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    assert [len(b) for b in batches] == [3, 3, 1]


def test_cache_hits_return_the_same_vectors_and_keys_change_with_inputs(tiny_models, tmp_path):
    loaded = _loaded(tiny_models, "bert")
    split = {"text": TEXTS}
    setup = E.EmbedSetup(max_seq_len=64, precision="fp32")
    first, hits = E.embed_split(loaded, split, ("mean", "first"), setup, CPU, tmp_path)
    assert hits == 0 and len(list(tmp_path.glob("*.vectors"))) == 2
    again, hits = E.embed_split(loaded, split, ("mean", "first"), setup, CPU, tmp_path)
    assert hits == 2
    for name in ("mean", "first"):
        assert np.array_equal(first[name], again[name])
    key = E.cache_key(loaded, split, "mean", setup, CPU)
    other_model = _loaded(tiny_models, "xlm-roberta")
    assert len({
        key,
        E.cache_key(loaded, split, "first", setup, CPU),
        E.cache_key(loaded, {"text": [*TEXTS[:-1], "y"]}, "mean", setup, CPU),
        E.cache_key(loaded, split, "mean", E.EmbedSetup(max_seq_len=32, precision="fp32"), CPU),
        E.cache_key(loaded, split, "mean", E.EmbedSetup(max_seq_len=64, precision="bf16"), CPU),
        E.cache_key(other_model, split, "mean", setup, CPU),
    }) == 6  # fmt: skip
    # The labels are not part of what an embedding depends on.
    assert E.cache_key(loaded, {**split, "label": [1] * 7}, "mean", setup, CPU) == key


def test_a_torn_cache_entry_is_a_miss(tiny_models, tmp_path):
    loaded = _loaded(tiny_models, "bert")
    split = {"text": TEXTS}
    setup = E.EmbedSetup(max_seq_len=64, precision="fp32")
    good, _ = E.embed_split(loaded, split, ("mean",), setup, CPU, tmp_path)
    path = tmp_path / f"{E.cache_key(loaded, split, 'mean', setup, CPU)}.vectors"
    path.write_bytes(path.read_bytes()[:40])
    again, hits = E.embed_split(loaded, split, ("mean",), setup, CPU, tmp_path)
    assert hits == 0 and np.array_equal(good["mean"], again["mean"])


def test_unknown_pooling_lists_the_valid_ones(tiny_models):
    loaded = _loaded(tiny_models, "bert")
    with pytest.raises(HarnessError, match="Valid poolings: first, last, mean"):
        E.embed_split(loaded, {"text": TEXTS}, ("cls",), E.EmbedSetup(), CPU)
    with pytest.raises(HarnessError, match="Valid precisions: bf16, fp32"):
        E.EmbedSetup(precision="fp16")


def test_load_encoder_returns_the_frozen_fp32_body(tiny_models):
    loaded = _loaded(tiny_models, "deberta-v2")
    assert not loaded.model.training
    assert all(not p.requires_grad and p.dtype == torch.float32
               for p in loaded.model.parameters())  # fmt: skip
    assert loaded.revision.startswith("sha256:") and loaded.source == "local"
    with pytest.raises(HarnessError, match="beyond"):
        load_encoder(str(tiny_models["bert"]), max_seq_len=10_000)
