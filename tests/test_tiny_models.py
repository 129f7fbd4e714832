"""Checks that the locally built tiny checkpoints behave like real Hub encoders."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import hashlib  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny_models import (  # noqa: E402
    KINDS,
    MAX_LENGTH,
    REMOTE_KIND,
    build_all,
    build_remote_code_model,
    build_tiny_model,
    train_tokenizer,
)
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

ALL_KINDS = (*KINDS, REMOTE_KIND)
PAIRS = (
    ("The service was slow and the food was cold.", "Le service était lent."),
    ("Ich habe den Film sehr genossen!", "¿Puede decirme dónde está la estación?"),
)
WITH_TOKEN_TYPES = {"bert", "deberta-v2"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    return build_all(tmp_path_factory.mktemp("tiny_models"))


def _remote(kind: str) -> dict:
    return {"trust_remote_code": True} if kind == REMOTE_KIND else {}


def _encode(path: Path):
    tok = AutoTokenizer.from_pretrained(path)
    firsts, seconds = zip(*PAIRS, strict=True)
    batch = tok(list(firsts), list(seconds), padding=True, truncation=True, return_tensors="pt")
    return tok, batch


def test_offline_env_is_set():
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE


def test_build_all_returns_every_kind(tiny):
    assert set(tiny) == set(ALL_KINDS)
    for path in tiny.values():
        assert (path / "config.json").is_file()
        assert (path / "model.safetensors").is_file()
        assert (path / "tokenizer.json").is_file()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_tokenizer_pairs_and_special_ids(tiny, kind):
    tok, batch = _encode(tiny[kind])
    config = AutoConfig.from_pretrained(tiny[kind], **_remote(kind))
    assert tok.model_max_length == MAX_LENGTH
    assert 600 <= len(tok) <= 1000
    assert config.vocab_size == len(tok)
    assert config.pad_token_id == tok.pad_token_id
    assert ("token_type_ids" in batch) == (kind in WITH_TOKEN_TYPES)

    ids = batch["input_ids"][0].tolist()
    n = int(batch["attention_mask"][0].sum())
    assert ids[0] == tok.cls_token_id
    assert ids[n - 1] == tok.sep_token_id
    assert ids.count(tok.sep_token_id) == (3 if tok.cls_token == "<s>" else 2)
    for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
        assert row[mask == 0].eq(tok.pad_token_id).all()
    if kind in WITH_TOKEN_TYPES:
        types = batch["token_type_ids"][0].tolist()[:n]
        first_sep = ids.index(tok.sep_token_id)
        assert types == [0] * (first_sep + 1) + [1] * (n - first_sep - 1)
    if kind == "modernbert":
        for name in ("pad", "bos", "eos", "cls", "sep"):
            assert 0 <= getattr(config, f"{name}_token_id") < config.vocab_size
        assert config.cls_token_id == tok.cls_token_id
        assert config.sep_token_id == tok.sep_token_id
    if kind == "xlm-roberta":
        assert config.max_position_embeddings == MAX_LENGTH + tok.pad_token_id + 1

    long = tok("mot " * 500, truncation=True)["input_ids"]
    assert len(long) == MAX_LENGTH


@pytest.mark.parametrize("num_labels", [3, 1])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_forward_backward_bf16_autocast(tiny, kind, num_labels):
    tok, batch = _encode(tiny[kind])
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny[kind], num_labels=num_labels, ignore_mismatched_sizes=True, **_remote(kind)
    )
    model.train()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    if num_labels == 1:
        labels = torch.tensor([0.25, -1.5])
    else:
        labels = torch.tensor([0, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch, labels=labels)
    # Quirk: DeBERTa-v2 with problem_type=None and one label flattens its logits.
    flat = kind == "deberta-v2" and num_labels == 1
    assert out.logits.shape == ((len(PAIRS),) if flat else (len(PAIRS), num_labels))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_base_model_loads_and_fits_max_length(tiny, kind):
    tok, batch = _encode(tiny[kind])
    model = AutoModel.from_pretrained(tiny[kind], **_remote(kind)).eval()
    # A full model_max_length input must fit the position embeddings (XLM-R offset).
    longest = tok("le chat " * 200, "the cat " * 200, truncation=True, return_tensors="pt")
    assert longest["input_ids"].shape[1] == MAX_LENGTH
    with torch.no_grad():
        for inputs in (batch, longest):
            hidden = model(**inputs).last_hidden_state
            assert hidden.shape[:2] == inputs["input_ids"].shape
            assert hidden.shape[-1] == 32
            assert torch.isfinite(hidden).all()


def test_saved_head_reloads_exactly(tiny):
    path = tiny["bert"]
    a = AutoModelForSequenceClassification.from_pretrained(path)
    b = AutoModelForSequenceClassification.from_pretrained(path)
    assert a.config.num_labels == 2
    assert torch.equal(a.classifier.weight, b.classifier.weight)


def test_headless_checkpoint_takes_any_num_labels(tmp_path):
    path = build_tiny_model("deberta-v2", tmp_path / "deberta", num_labels=None)
    assert json.loads((path / "config.json").read_text())["architectures"] == ["DebertaV2Model"]
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=5)
    assert model.config.num_labels == 5


def test_remote_code_requires_trust(tiny):
    path = tiny[REMOTE_KIND]
    for auto in (AutoConfig, AutoModel, AutoModelForSequenceClassification):
        with pytest.raises(ValueError, match="trust_remote_code"):
            auto.from_pretrained(path, trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, trust_remote_code=True, num_labels=3
    )
    assert type(model).__name__ == "TinyEncForSequenceClassification"
    assert model.config.num_labels == 3
    assert type(AutoModel.from_pretrained(path, trust_remote_code=True)).__name__ == "TinyEncModel"


def _digest(path: Path) -> dict[str, str]:
    names = ("model.safetensors", "tokenizer.json")
    return {n: hashlib.sha256((path / n).read_bytes()).hexdigest() for n in names}


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_tokenizer_training_is_deterministic(tiny, tmp_path, kind):
    train_tokenizer(tmp_path, kind)
    assert (tmp_path / "tokenizer.json").read_bytes() == (
        tiny[kind] / "tokenizer.json"
    ).read_bytes()


def test_builds_are_deterministic(tiny, tmp_path):
    again = build_tiny_model("modernbert", tmp_path / "modernbert")
    assert _digest(again) == _digest(tiny["modernbert"])
    remote = build_remote_code_model(tmp_path / "remote")
    assert _digest(remote) == _digest(tiny[REMOTE_KIND])
