"""Speed settings that must not move a score (issue 38, item 7): batch widths padded to
buckets (`--pad-multiple`) and a compiled model (`--compile`), on real tiny models.

Bucketing is checked where it acts (the model's logits on one batch, every tiny model
family) and end to end (a tiny cell with and without it, in fp32). The compiled cell runs
inductor on the CPU (a few seconds of compiling once its disk cache is warm); a compiler
that is missing or fails gives a one-line error and no result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat

import pytest
import torch

from encoder_eval.cells import batching, cell_config, devices, train
from encoder_eval.cells.encoding import encode
from encoder_eval.cells.kinds import KINDS
from encoder_eval.core import comparability
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import Recipe, recipe_fields
from encoder_eval.core.results import result_filename
from encoder_eval.data.loaders import LoadedModel, load_model
from encoder_eval.data.task_loading import load_task

FP32 = Recipe(max_steps=6, patience=3, max_seq_len=128, precision="fp32")


@pytest.fixture(scope="module")
def undropped(tiny_models, tmp_path_factory) -> dict:
    """The tiny BERT with every dropout off: a bucket's wider tensors make dropout draw its
    masks over more positions (other random numbers for the real ones, as another
    micro-batch does), so only without dropout must training itself come out the same."""
    path = tmp_path_factory.mktemp("undropped") / "bert"
    shutil.copytree(tiny_models["bert"], path)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (path / "config.json").write_text(json.dumps(config))
    return {"bert": path}


def _cell(root, tiny_models, small_mirror, name: str, **recipe) -> cell_config.CellConfig:
    (root / name).mkdir()
    return cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4, seed=45, model_key="tiny",
        recipe=dataclasses.replace(FP32, **recipe), device="cpu", progress="quiet",
        data_dir=str(small_mirror), out_json=str(root / name / result_filename(
            "tiny", "glue_rte", 1e-4, 45)),
    )  # fmt: skip


def _watched(models: dict, widths: list) -> LoadedModel:
    """The tiny BERT of `models` loaded as a cell loads it, with a forward pre-hook that
    appends the width of every batch the model is given to `widths`; its head seeded as the
    cell would seed it."""
    devices.seed_everything(45)
    loaded = load_model(str(models["bert"]), "auto", 2, "single_label_classification",
                        max_seq_len=128, model_label="tiny")  # fmt: skip
    loaded.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[-1]),
        with_kwargs=True,
    )
    return loaded


def test_bucket_width_rounds_up_to_the_multiple_within_the_cap():
    assert [batching.bucket_width(w, 32, 256) for w in (1, 32, 33, 70, 250, 256)] == [
        32, 32, 64, 96, 256, 256]  # fmt: skip
    assert batching.bucket_width(70, 64, 100) == 100  # the cap, not 128
    assert batching.bucket_width(70, None, 256) == 70 and batching.bucket_width(70, 1, 256) == 70
    assert batching.bucket_width(130, 64, 128) == 130  # never narrower than the batch


@pytest.mark.parametrize("family", ["bert", "xlm-roberta", "deberta-v2", "modernbert"])
def test_bucket_padding_leaves_every_real_logit_as_it_was(family, tiny_models, small_mirror):
    """The padding a bucket adds is masked: the logits of a batch padded to its longest row
    and of the same batch padded to a multiple of 32 agree to float noise (fp32)."""
    loaded = load_model(str(tiny_models[family]), "auto", 2, "single_label_classification",
                        max_seq_len=128, model_label=family)  # fmt: skip
    model, tok = loaded.model.eval(), loaded.tokenizer
    split = load_task("glue_rte", str(small_mirror), with_test=False)[0]
    enc = encode(tok, split, 128, loaded.input_names)
    # Eight examples of varied lengths, the longest not a multiple of 32: the bucket pads.
    by_length = sorted(range(len(enc.labels)), key=lambda i: enc.lengths[i])
    idx = next(by_length[k : k + 8] for k in range(len(by_length) - 7)
               if enc.lengths[by_length[k + 7]] % 32 and enc.lengths[by_length[k]] < 100)  # fmt: skip
    kind = KINDS["classification"]
    shapes = batching.Shapes(32, 128)
    plain = batching.collate_batch(enc, idx, tok.pad_token_id, "cpu", kind)
    bucketed = batching.collate_batch(enc, idx, tok.pad_token_id, "cpu", kind, shapes)
    width = plain["input_ids"].shape[1]
    assert bucketed["input_ids"].shape[1] == batching.bucket_width(width, 32, 128) > width
    assert (bucketed["input_ids"][:, width:] == tok.pad_token_id).all()
    assert (bucketed["attention_mask"][:, width:] == 0).all()
    assert torch.equal(plain.pop("labels"), bucketed.pop("labels"))
    with torch.no_grad():
        a, b = model(**plain).logits, model(**bucketed).logits
    assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()


def test_a_bucketed_cell_trains_and_scores_as_one_padded_to_its_longest_rows(
    undropped, small_mirror, tmp_path
):
    """Six fp32 steps, their dev evaluations and the report split, with and without
    --pad-multiple 32 (no dropout: see `undropped`): the same scores, losses equal to float
    noise; the setting is recorded, and it is a cell entry, so the two cells compare."""
    plain_widths, bucket_widths = [], []
    plain = train.run_cell(_cell(tmp_path, undropped, small_mirror, "plain"),
                           loaded=_watched(undropped, plain_widths))  # fmt: skip
    bucketed = train.run_cell(_cell(tmp_path, undropped, small_mirror, "b32", pad_multiple=32),
                              loaded=_watched(undropped, bucket_widths))  # fmt: skip
    # The widths the model saw (training and evaluation): a multiple of 32 or the cap with
    # the setting, the batches' own widths without it (so a setting cut off before it
    # reaches the cell fails here).
    assert bucket_widths and all(w % 32 == 0 or w == 128 for w in bucket_widths), bucket_widths
    assert any(w % 32 for w in plain_widths), plain_widths
    assert len(set(bucket_widths)) < len(set(plain_widths))
    assert bucketed["recipe"]["pad_multiple"] == 32 and plain["recipe"]["pad_multiple"] is None
    assert bucketed["dev"] == plain["dev"]
    assert bucketed["report"] == plain["report"]
    for a, b in zip(plain["training"]["dev_history"], bucketed["training"]["dev_history"],
                    strict=True):  # fmt: skip
        assert a["dev"] == b["dev"] and a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    assert bucketed["training"]["train_tokens_per_s"] > 0  # real tokens, padding not counted
    assert "pad_multiple" in recipe_fields("cell") and "compile" in recipe_fields("cell")
    assert comparability.cell_setup(bucketed) == comparability.cell_setup(plain)


@pytest.mark.slow  # 15 s with inductor's disk cache warm; 1-2 min of compiling when cold
def test_a_compiled_cell_on_the_cpu_scores_as_the_eager_one(tiny_models, small_mirror, tmp_path):
    """--compile with inductor on the CPU (fp32, buckets of 32): the same dev predictions as
    the eager cell and losses within float noise (dropout draws the same numbers); the mode
    is recorded, and the compiled graphs are dropped when the cell ends."""
    eager = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "eager", pad_multiple=32))
    compiled = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "compiled",
                                    pad_multiple=32, compile=True))  # fmt: skip
    assert compiled["recipe"]["compile"] is True and compiled["recipe"]["compile_mode"] == "default"
    assert eager["recipe"]["compile_mode"] is None
    assert compiled["dev"]["per_language"] == eager["dev"]["per_language"]
    for a, b in zip(eager["training"]["dev_history"], compiled["training"]["dev_history"],
                    strict=True):  # fmt: skip
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
    # A compiled cell runs inductor's kernels: no SDPA backend recorded, so it compares on
    # the rest (`comparability.RECORDED_LATER`).
    assert compiled["recipe"]["attn_backend"] is None and eager["recipe"]["attn_backend"]
    setups = comparability.cell_setup(compiled), comparability.cell_setup(eager)
    assert comparability.setup_differences(*setups, "has") == []
    assert comparability.setup_differences(*setups[::-1], "has") == []


def test_compile_without_a_cpp_compiler_is_a_one_line_error(tiny_models, small_mirror, tmp_path):
    import torch._inductor.config as inductor

    cfg = _cell(tmp_path, tiny_models, small_mirror, "nocxx", compile=True)
    with inductor.patch({"cpp.cxx": (str(tmp_path / "no-such-c++"),)}):
        with pytest.raises(HarnessError, match="needs a C.. compiler") as err:
            train.run_cell(cfg)
    assert "\n" not in str(err.value)
    assert not os.path.exists(cfg.out_json)


def test_a_compiler_that_fails_at_the_first_step_is_a_one_line_error(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    """A C++ compiler that answers --version but compiles nothing: inductor fails at the
    first forward; the cell stops with an error naming --compile, never trains on eagerly."""
    import torch._inductor.codecache as codecache
    import torch._inductor.config as inductor

    broken = tmp_path / "broken-c++"
    broken.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo broken 1.0; exit 0; }\n'
                      'echo "broken: cannot compile" >&2; exit 1\n')  # fmt: skip
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(codecache.CppCodeCache, "cache", {})  # no kernel this process built
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = _cell(tmp_path, tiny_models, small_mirror, "broken", compile=True)
    patch = {
        "cpp.cxx": (str(broken),),
        "fx_graph_cache": False,  # no compiled graph from the disk cache
        "compile_threads": 1,  # built in this process, with this configuration
    }
    with inductor.patch(patch):
        with pytest.raises(HarnessError, match="torch.compile failed.*without --compile") as err:
            train.run_cell(cfg)
    assert "\n" not in str(err.value)
    assert not os.path.exists(cfg.out_json)
