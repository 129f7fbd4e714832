"""Decoder-only checkpoints adapted into encoders (`--mode decoder-adapted`): the masking is
proven on tiny Llama-, Qwen2- and Gemma-3-style decoders built here, under eager and sdpa
attention; pooling, the pair separator, the refusals and the run path are checked on the same
models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import read_json
from tiny_models import (
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    LAYERS,
    MAX_LENGTH,
    byte_level_bpe,
    corpus,
)
from tokenizers import (
    Tokenizer,
    decoders,
    processors,
)
from transformers import (
    AutoModel,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from encoder_eval import run
from encoder_eval.cells import encoding
from encoder_eval.core import comparability
from encoder_eval.core.errors import EXIT_INPUT_ERROR, EXIT_OK, HarnessError
from encoder_eval.core.protocol import Recipe, loader_label
from encoder_eval.core.results import validate_result
from encoder_eval.data import models as model_registry
from encoder_eval.data.loaders import PooledClassifier, load_model, pool, verify_attention
from encoder_eval.data.models import ModelEntry, loader_settings

ARCHS = ("llama", "qwen2", "gemma3")
IMPLEMENTATIONS = ("eager", "sdpa")
CLS = "single_label_classification"


def _bpe(specials: list[str]) -> Tokenizer:
    """A byte-level BPE tokenizer trained on the tiny corpus, like a decoder's."""
    tok = byte_level_bpe(specials, corpus())
    tok.decoder = decoders.ByteLevel()
    return tok


def build_decoder(arch: str, out: Path) -> Path:
    """A tiny decoder saved like a Hub checkpoint (a *ForCausalLM with its tokenizer).

    llama: `<s> A <s> B` (the real Llama tokenizer's pair template), no pad token.
    qwen2: no pair template at all (the texts are just joined), `<|endoftext|>` as eos and pad.
    """
    if arch in ("llama", "gemma3"):
        s, e = ("<s>", "</s>") if arch == "llama" else ("<bos>", "<eos>")
        tok = _bpe(["<unk>", s, e] if arch == "llama" else ["<pad>", e, s, "<unk>"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{s}:0 $A:0",
            pair=f"{s}:0 $A:0 {s}:1 $B:1",
            special_tokens=[(s, tok.token_to_id(s))],
        )
        specials = {"bos_token": s, "eos_token": e, "unk_token": "<unk>"}
        if arch == "gemma3":
            specials["pad_token"] = "<pad>"
    else:
        tok = _bpe(["<|endoftext|>"])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=MAX_LENGTH,
                                   padding_side="right", truncation_side="right",
                                   model_input_names=["input_ids", "attention_mask"], **specials)  # fmt: skip
    fast.save_pretrained(out)
    common = dict(vocab_size=len(fast), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=1, intermediate_size=INTERMEDIATE,
                  max_position_embeddings=MAX_LENGTH, eos_token_id=fast.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, bos_token_id=fast.bos_token_id))
    elif arch == "gemma3":
        # A sliding window narrower than the test inputs: its local layers are causal *and*
        # windowed in the decoder's own masking.
        config = Gemma3TextConfig(**common, head_dim=HIDDEN // HEADS, sliding_window=4,
                                  bos_token_id=fast.bos_token_id, pad_token_id=fast.pad_token_id)  # fmt: skip
        model = Gemma3ForCausalLM(config)
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, pad_token_id=fast.pad_token_id))
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def decoders_dir(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {arch: build_decoder(arch, root / f"tiny-{arch}") for arch in ARCHS}


def _wrapped(path: Path, attention: str, implementation: str) -> PooledClassifier:
    body = AutoModel.from_pretrained(path, attn_implementation=implementation)
    assert body.config._attn_implementation == implementation
    return PooledClassifier(body, HIDDEN, 2, attention=attention).eval()


def _ids(seed: int, n: int = 9) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(5, 600, (n,), generator=gen).tolist()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_bidirectional_attention_lets_token_0_see_later_tokens_and_causal_does_not(
    decoders_dir, arch, implementation
):
    seed = 1234
    print(f"seed {seed}")
    ids = _ids(seed)
    changed = [*ids[:-1], ids[-1] + 1]
    batch = torch.tensor([ids, changed])
    mask = torch.ones_like(batch)
    with torch.no_grad():
        bi = _wrapped(decoders_dir[arch], "bidirectional", implementation).hidden_states(
            batch, mask
        )
        causal = _wrapped(decoders_dir[arch], "causal", implementation).hidden_states(batch, mask)
    # Under bidirectional attention every earlier position sees the changed last token...
    for pos in range(len(ids) - 1):
        assert (bi[0, pos] - bi[1, pos]).abs().max() > 1e-4, pos
    # ...under causal attention none does, and token 0 is exactly the same.
    assert torch.allclose(causal[0, :-1], causal[1, :-1], atol=1e-6)
    assert (causal[0, -1] - causal[1, -1]).abs().max() > 1e-4  # the change itself is seen


@pytest.mark.parametrize("arch", ARCHS)
def test_the_loaded_body_carries_the_checkpoint_weights(decoders_dir, arch):
    saved = AutoModel.from_pretrained(decoders_dir[arch]) if arch != "gemma3" else None
    loaded = load_model(str(decoders_dir[arch]), "decoder-adapted", 2, CLS)
    reference = (saved if saved is not None else Gemma3ForCausalLM.from_pretrained(
        decoders_dir[arch]).get_decoder()).state_dict()  # fmt: skip
    body = loaded.model.body.state_dict()
    assert set(body) == set(reference)
    assert all(torch.equal(body[k], reference[k]) for k in reference)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("attention", ("bidirectional", "causal"))
@pytest.mark.parametrize("arch", ARCHS)
def test_right_padding_never_changes_the_real_tokens(decoders_dir, arch, attention, implementation):
    model = _wrapped(decoders_dir[arch], attention, implementation)
    ids_a, ids_b = _ids(7, 9), _ids(8, 5)
    pad = 3
    batch = torch.tensor([ids_a, [*ids_b, *[pad] * 4]])
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    with torch.no_grad():
        padded = model.hidden_states(batch, mask)
        alone_b = model.hidden_states(torch.tensor([ids_b]), torch.ones(1, 5, dtype=torch.long))
        more = model.hidden_states(torch.tensor([[*ids_b, *[pad] * 8]]),
                                   torch.tensor([[1] * 5 + [0] * 8]))  # fmt: skip
    assert torch.allclose(padded[1, :5], alone_b[0], atol=1e-5)
    assert torch.allclose(more[0, :5], alone_b[0], atol=1e-5)


def test_eager_and_sdpa_agree_under_the_full_mask(decoders_dir):
    batch = torch.tensor([_ids(3), [*_ids(4, 6), 3, 3, 3]])
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    with torch.no_grad():
        eager = _wrapped(decoders_dir["llama"], "bidirectional", "eager").hidden_states(batch, mask)
        sdpa = _wrapped(decoders_dir["llama"], "bidirectional", "sdpa").hidden_states(batch, mask)
    assert torch.allclose(eager[0], sdpa[0], atol=1e-5)
    assert torch.allclose(eager[1, :6], sdpa[1, :6], atol=1e-5)


def test_last_token_pooling_picks_the_last_real_token_with_right_padding(decoders_dir):
    hidden = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert torch.equal(pool(hidden, mask, "last"), torch.stack([hidden[0, 2], hidden[1, 4]]))
    # Through a decoder: the padded example's pooled vector is its unpadded last state.
    model = _wrapped(decoders_dir["qwen2"], "causal", "sdpa")
    model.pooling = "last"
    ids = _ids(11, 4)
    with torch.no_grad():
        batch = torch.tensor([_ids(12, 7), [*ids, 0, 0, 0]])
        mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
        pooled = model.pooled(model.hidden_states(batch, mask), mask)
        alone = model.hidden_states(torch.tensor([ids]), torch.ones(1, 4, dtype=torch.long))
    assert torch.allclose(pooled[1], alone[0, 3], atol=1e-5)
    assert not torch.allclose(pooled[1], alone[0, 2], atol=1e-3)


def test_attention_pooling_is_learned_and_ignores_padding(decoders_dir):
    body = AutoModel.from_pretrained(decoders_dir["llama"])
    model = PooledClassifier(body, HIDDEN, 2, pooling="attention", attention="bidirectional")
    hidden = torch.randn(2, 6, HIDDEN, generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])
    pooled = model.pooled(hidden, mask)
    # Padding states (here garbage) do not enter the weighted sum.
    garbage = hidden.clone()
    garbage[0, 4:] = 1e3
    assert torch.allclose(model.pooled(garbage, mask)[0], pooled[0], atol=1e-5)
    # A weighted mean of the real states: with a zero query, the plain mean.
    with torch.no_grad():
        model.pool_query.zero_()
    assert torch.allclose(model.pooled(hidden, mask), pool(hidden, mask, "mean"), atol=1e-5)
    with torch.no_grad():
        model.pool_query.normal_()
    model.pooled(hidden, mask).sum().backward()
    assert model.pool_query.grad is not None and model.pool_query.grad.abs().sum() > 0


def test_causal_with_first_token_pooling_is_refused():
    with pytest.raises(HarnessError, match="token 0 attends only to itself.*--pooling last"):
        loader_settings("decoder-adapted", "causal", "first")
    assert loader_settings("decoder-adapted", "bidirectional", "first")["pooling"] == "first"


def test_settings_defaults_and_refusals():
    assert loader_settings("decoder-adapted") == {
        "attention": "bidirectional", "pooling": "mean", "head_dropout": 0.1, "body_dropout": None,
    }  # fmt: skip
    assert loader_settings("auto") == {"attention": None, "pooling": None, "head_dropout": None,
                                       "body_dropout": None}  # fmt: skip
    with pytest.raises(HarnessError, match="--body-dropout applies to --mode decoder-adapted"):
        loader_settings("auto", body_dropout=0.2)
    with pytest.raises(HarnessError, match="--body-dropout 1.0 must be a number in"):
        loader_settings("decoder-adapted", body_dropout=1.0)
    with pytest.raises(HarnessError, match="--pooling applies to --mode decoder-adapted only"):
        loader_settings("auto", pooling="last")
    with pytest.raises(
        HarnessError, match="unknown pooling 'lats'. Valid poolings: attention, first, last, mean"
    ):
        loader_settings("decoder-adapted", pooling="lats")
    with pytest.raises(HarnessError, match="--head-dropout 1.5 must be a number in"):
        loader_settings("decoder-adapted", head_dropout=1.5)


def test_body_dropout_sets_the_bodys_dropout_and_it_acts_in_training(decoders_dir):
    """--body-dropout, the seed's ablation axis: every attention module of the tiny Llama body
    reads the new rate (the checkpoint's is 0.0), and in training mode two forwards of one
    input then differ, where the checkpoint's own rate gives the same logits twice."""
    ids = torch.tensor([_ids(3)])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    logits = {}
    for rate in (None, 0.5):
        loaded = load_model(str(decoders_dir["llama"]), "decoder-adapted", 2,
                            "single_label_classification", head_dropout=0.0, body_dropout=rate)  # fmt: skip
        body = loaded.model.body
        rates = {m.attention_dropout for m in body.modules() if hasattr(m, "attention_dropout")}
        assert rates == {0.0 if rate is None else rate}
        assert body.config.attention_dropout == (0.0 if rate is None else rate)
        loaded.model.train()
        with torch.no_grad():
            logits[rate] = [loaded.model(**batch).logits for _ in range(2)]
    assert torch.equal(*logits[None])
    assert not torch.equal(*logits[0.5])


def test_a_registry_row_with_bad_settings_is_refused(monkeypatch):
    monkeypatch.setitem(model_registry.MODEL_REGISTRY, "bad-decoder",
                        ModelEntry("org/dec", "decoder-adapted", attention="causal", pooling="first"))  # fmt: skip
    with pytest.raises(HarnessError, match="model 'bad-decoder' in the registry: causal"):
        model_registry.model_entry("bad-decoder")
    assert model_registry.model_entry("xlm-r-base").attention is None  # old rows stay valid


def test_auto_mode_refuses_a_decoder_and_points_to_the_new_mode(decoders_dir):
    with pytest.raises(HarnessError, match=r"is a decoder \(LlamaForCausalLM\), not an encoder;"
                       r".*use --mode decoder-adapted"):  # fmt: skip
        load_model(str(decoders_dir["llama"]), "auto", 2, CLS)


def test_the_causal_pitfall_warns_and_is_recorded(decoders_dir):
    with pytest.warns(UserWarning, match="causal attention with mean pooling.*seed's pitfall"):
        loaded = load_model(str(decoders_dir["qwen2"]), "decoder-adapted", 2, CLS,
                            attention="causal", pooling="mean")  # fmt: skip
    assert "causal attention with mean pooling" in loaded.recorded["pooling_pitfall"]
    loaded = load_model(str(decoders_dir["qwen2"]), "decoder-adapted", 2, CLS,
                        attention="causal", pooling="last")  # fmt: skip
    assert loaded.recorded["pooling_pitfall"] is None
    assert loaded.model.dropout.p == 0.1 and loaded.model.attention == "causal"


def test_verify_attention_refuses_an_encoder_loaded_as_a_causal_decoder(tiny_models):
    from transformers import AutoTokenizer

    body = AutoModel.from_pretrained(tiny_models["bert"])
    model = PooledClassifier(body, HIDDEN, 2, attention="causal", pooling="last")
    with pytest.raises(HarnessError, match="is not a causal decoder"):
        verify_attention(model, AutoTokenizer.from_pretrained(tiny_models["bert"]), "tiny-bert")


def test_pairs_get_an_explicit_separator_when_the_tokenizer_has_no_template(decoders_dir):
    qwen = load_model(str(decoders_dir["qwen2"]), "decoder-adapted", 2, CLS)
    tok = qwen.tokenizer
    assert qwen.recorded["pair_separator"] == "<|endoftext|>"
    assert qwen.recorded["pair_template"] == "added"
    a, b = "The service was slow.", "Le service était lent."
    plain_a = tok(a, add_special_tokens=False)["input_ids"]
    plain_b = tok(b, add_special_tokens=False)["input_ids"]
    assert tok(a)["input_ids"] == plain_a  # single texts are unchanged
    split = {"text": [a], "text_pair": [b], "label": [0]}
    enc = encoding.encode(tok, split, 128, qwen.input_names)
    assert enc.features["input_ids"][0] == [*plain_a, tok.eos_token_id, *plain_b]
    assert enc.features["attention_mask"][0] == [1] * enc.lengths[0]  # the separator is real
    # Truncation keeps the separator and both texts.
    long = {"text": [a * 20], "text_pair": [b * 20], "label": [0]}
    ids = encoding.encode(tok, long, 24, qwen.input_names).features["input_ids"][0]
    assert (
        len(ids) == 24 and ids.count(tok.eos_token_id) == 1 and 2 < ids.index(tok.eos_token_id) < 21
    )
    llama = load_model(str(decoders_dir["llama"]), "decoder-adapted", 2, CLS)
    assert llama.recorded["pair_separator"] is None
    assert llama.recorded["pair_template"] == "tokenizer"  # its own `<s> A <s> B`


def test_loader_label_makes_the_settings_part_of_the_loader():
    auto = Recipe().to_dict()
    assert loader_label(auto) == "auto"
    mean = Recipe(mode="decoder-adapted", attention="bidirectional", pooling="mean",
                  head_dropout=0.1).to_dict()  # fmt: skip
    last = dict(mean, pooling="last")
    assert loader_label(mean) == (
        "decoder-adapted (attention=bidirectional, head_dropout=0.1, pooling=mean)"
    )
    a, b = comparability.cell_setup({"recipe": mean}), comparability.cell_setup({"recipe": last})
    assert comparability.setup_differences(a, b, "select has") == [
        "mode decoder-adapted (attention=bidirectional, head_dropout=0.1, pooling=mean) "
        "(select has decoder-adapted (attention=bidirectional, head_dropout=0.1, pooling=last))"
    ]


def _run(tmp_path: Path, mirror: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "cell.json"
    rc = run.main(["--task", "glue_rte", "--lr", "1e-4", "--seed", "45", "--allow-off-protocol",
                   "--max-steps", "3", "--max-seq-len", "64", "--bsz", "8", "--device", "cpu",
                   "--progress", "quiet", "--data-dir", str(mirror), "--out-json", str(out),
                   "--no-cache", *args])  # fmt: skip
    return rc, read_json(out) if out.exists() else None


def test_both_decoders_train_through_the_run_path_and_record_their_settings(
    decoders_dir, small_mirror, tmp_path, monkeypatch
):
    # Llama by flags; Qwen2 by a registry row.
    rc, llama = _run(tmp_path / "llama", small_mirror, "--model-path", str(decoders_dir["llama"]),
                     "--model-key", "tiny-llama", "--mode", "decoder-adapted", "--attention",
                     "bidirectional", "--pooling", "attention", "--head-dropout", "0.2",
                     "--body-dropout", "0.3")  # fmt: skip
    assert rc == EXIT_OK
    monkeypatch.setitem(model_registry.MODEL_REGISTRY, "tiny-qwen2",
                        ModelEntry(str(decoders_dir["qwen2"]), "decoder-adapted",
                                   attention="causal", pooling="last"))  # fmt: skip
    rc, qwen = _run(tmp_path / "qwen", small_mirror, "--model-key", "tiny-qwen2")
    assert rc == EXIT_OK
    for result, expected in (
        (llama, {"attention": "bidirectional", "pooling": "attention", "head_dropout": 0.2,
                 "body_dropout": 0.3, "pair_separator": None, "pair_template": "tokenizer"}),
        (qwen, {"attention": "causal", "pooling": "last", "head_dropout": 0.1,
                "body_dropout": None, "pair_separator": "<|endoftext|>", "pair_template": "added"}),
    ):  # fmt: skip
        assert validate_result(result) == []
        assert result["status"] == "ok" and result["training"]["steps"] == 3
        assert result["recipe"]["mode"] == "decoder-adapted"
        assert {k: result["recipe"][k] for k in expected} == expected
        assert result["recipe"]["pooling_pitfall"] is None
        assert result["recipe"]["attn_implementation"] == "sdpa"
        assert result["training"]["final_loss"] is not None
        assert 0.0 <= result["report"]["mean"] <= 1.0
    print(json.dumps({"llama": llama["report"]["mean"], "qwen2": qwen["report"]["mean"]}))


def test_both_decoders_train_a_ranking_cell_on_ms_marco(decoders_dir, tmp_path_factory, tmp_path):
    """Decoder-adapted cross-encoders on the real ms_marco rows (a slice of the mirror): the
    listwise loss over query groups, one logit through the pooled head, MRR@10 scored."""
    from conftest import write_small_mirror

    mirror = write_small_mirror(tmp_path_factory.mktemp("marco"),
                                {"ms_marco": {"train.jsonl": 100, "validation.jsonl": 60}})  # fmt: skip
    for name, extra in (("llama", ["--pooling", "mean"]),
                        ("qwen2", ["--attention", "causal", "--pooling", "last"])):  # fmt: skip
        out = tmp_path / f"{name}.json"
        rc = run.main(["--task", "ms_marco", "--model-path", str(decoders_dir[name]),
                       "--model-key", f"tiny-{name}", "--mode", "decoder-adapted", *extra,
                       "--lr", "1e-4", "--seed", "45", "--allow-off-protocol", "--max-steps",
                       "2", "--bsz", "2", "--max-seq-len", "64", "--device", "cpu",
                       "--progress", "quiet", "--data-dir", str(mirror), "--out-json",
                       str(out), "--no-cache"])  # fmt: skip
        assert rc == EXIT_OK, name
        result = read_json(out)
        assert validate_result(result) == []
        assert result["metric"] == "mrr_at_10" and result["training"]["steps"] == 2
        assert result["recipe"]["mode"] == "decoder-adapted"
        assert result["ranking"]["group_size_used"] == 20  # the mirror has 20 candidates
        assert 0.0 <= result["report"]["mean"] <= 1.0


def test_run_refuses_bad_decoder_flags_with_one_line(decoders_dir, small_mirror, tmp_path, capsys):
    path = str(decoders_dir["qwen2"])
    rc, out = _run(tmp_path, small_mirror, "--model-path", path, "--mode", "decoder-adapted",
                   "--attention", "causal", "--pooling", "first")  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_INPUT_ERROR and out is None
    assert len(err) == 1 and err[0].startswith("error: causal attention with first-token pooling")
    rc, out = _run(tmp_path, small_mirror, "--model-path", path, "--pooling", "last")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_INPUT_ERROR and out is None
    assert err == ["error: --pooling applies to --mode decoder-adapted only (the mode is auto); "
                   "drop it or use --mode decoder-adapted"]  # fmt: skip
    rc, out = _run(tmp_path, small_mirror, "--model-path", path)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_INPUT_ERROR and out is None and "use --mode decoder-adapted" in err[-1]
