"""The kinds of cell: each kind's hooks on a real tokenizer and model, and the loop using
them (it has no branch of its own per kind)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from encoder_eval.cells import cell_config, encoding, kinds, train
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import RANKING, REGRESSION, SINGLE_LABEL
from encoder_eval.core.protocol import Recipe
from encoder_eval.data.loaders import load_model
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.tasks import TASK_KNOBS

CPU = torch.device("cpu")


def test_every_task_problem_has_a_kind():
    for name, knobs in TASK_KNOBS.items():
        kind = kinds.kind_for(knobs.problem)
        # A ranker's head is a one-logit (regression-type) head scoring each pair.
        assert kind.problem == (REGRESSION if knobs.problem == RANKING else knobs.problem), name
    assert kinds.kind_for(SINGLE_LABEL).name == "classification"
    assert kinds.kind_for(REGRESSION).name == "regression"
    assert kinds.kind_for(RANKING).name == "ranking"


def test_an_unknown_problem_type_names_the_valid_ones():
    with pytest.raises(HarnessError) as err:
        kinds.kind_for("regresion")
    message = str(err.value)
    assert "unknown problem type 'regresion'" in message and "Did you mean 'regression'" in message
    assert SINGLE_LABEL in message


@pytest.mark.parametrize(("name", "dtype"), [("classification", torch.long),
                                             ("regression", torch.float32)])  # fmt: skip
def test_collate_pads_to_the_longest_and_types_the_labels(name, dtype, tiny_models, small_mirror):
    loaded = load_model(str(tiny_models["bert"]), "auto", 2, SINGLE_LABEL)
    task = "glue_rte" if name == "classification" else "glue_stsb"
    enc = encoding.encode(
        loaded.tokenizer, load_task(task, small_mirror)[0], 64, loaded.input_names
    )
    idx = [3, 0, 7]
    pad = loaded.tokenizer.pad_token_id
    batch = kinds.KINDS[name].collate(enc, idx, pad, CPU)
    width = max(enc.lengths[i] for i in idx)
    assert set(batch) == set(enc.features) | {"labels"}
    assert batch["input_ids"].shape == (3, width) and batch["input_ids"].dtype == torch.long
    for row, i in enumerate(idx):
        n = enc.lengths[i]
        assert batch["input_ids"][row, :n].tolist() == enc.features["input_ids"][i]
        assert batch["input_ids"][row, n:].eq(pad).all()
        assert batch["attention_mask"][row, n:].eq(0).all()
    assert batch["labels"].dtype == dtype
    assert batch["labels"].tolist() == pytest.approx([enc.labels[i] for i in idx])


def test_losses_are_computed_in_fp32_from_bf16_logits():
    gen = torch.Generator().manual_seed(0)
    print("seed 0")
    logits = torch.randn(6, 3, generator=gen).to(torch.bfloat16)
    labels = torch.tensor([0, 2, 1, 1, 0, 2])
    loss = kinds.KINDS["classification"].loss(logits, labels)
    assert loss.dtype == torch.float32
    want = torch.nn.functional.cross_entropy(logits.float(), labels)
    assert loss.item() == want.item()
    scores = torch.randn(6, 1, generator=gen).to(torch.bfloat16)
    targets = torch.rand(6, generator=gen) * 5
    loss = kinds.KINDS["regression"].loss(scores, targets)
    assert loss.dtype == torch.float32
    assert loss.item() == ((scores.float().squeeze(-1) - targets) ** 2).mean().item()


def test_predictions_are_the_argmax_class_or_the_score():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    assert kinds.KINDS["classification"].predictions(logits) == [1, 0]
    assert kinds.KINDS["regression"].predictions(torch.tensor([[0.25], [-1.5]])) == [0.25, -1.5]


def test_the_loop_trains_and_predicts_only_through_the_kinds_hooks(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    """A kind swapped in the registry is what the cell uses: its loss is the one minimised
    and its predictions are the ones scored (here every prediction is class 1)."""
    calls = {"loss": 0, "predictions": 0}
    real = kinds.KINDS["classification"]

    def counted_loss(logits, labels):
        calls["loss"] += 1
        return real.loss(logits, labels)

    def always_one(logits):
        calls["predictions"] += 1
        return [1] * logits.shape[0]

    swapped = dataclasses.replace(real, loss=counted_loss, predictions=always_one)
    monkeypatch.setitem(kinds.KINDS, "classification", swapped)
    cfg = cell_config.CellConfig(model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4,
                           seed=45, model_key="tiny", device="cpu", progress="quiet",
                           recipe=Recipe(max_steps=2, max_seq_len=128), data_dir=str(small_mirror))  # fmt: skip
    result = train.run_cell(cfg)
    assert calls["loss"] == 2  # one per step (no gradient accumulation)
    assert calls["predictions"] > 0
    dev_labels = load_task("glue_rte", small_mirror)[1]["en"]["label"]
    share_of_ones = sum(1 for y in dev_labels if y == 1) / len(dev_labels)
    assert result["dev"]["mean"] == share_of_ones == result["report"]["mean"]


def test_ranking_fields_come_from_the_kind_and_other_kinds_have_none(tmp_path):
    """What a ranking cell's metric, predictions file and files beside the result need
    (its query columns) are the ranking kinds' hooks; a classifier adds nothing."""
    split = {"text": ["a", "b", "c"], "label": [1, 0, 1], "query_id": ["q1", "q1", "q2"],
             "doc_id": ["d1", "d2", "d3"], "first_stage_rank": [1, 2, 1]}  # fmt: skip
    enc = encoding.Encoded({"input_ids": [[1, 2]] * 3}, split["label"], [2] * 3)
    ranker, classifier = kinds.kind_for(RANKING), kinds.kind_for(SINGLE_LABEL)
    assert classifier.columns(enc, split) is enc and classifier.prediction_fields(enc) == {}
    ranked = ranker.columns(enc, split)
    assert ranker.prediction_fields(ranked) == {
        "query_ids": ["q1", "q1", "q2"], "doc_ids": ["d1", "d2", "d3"],
        "first_stage_ranks": [1, 2, 1]}  # fmt: skip
    assert ranker.groups(ranked).query_ids == ["q1", "q1", "q2"]
    assert classifier.groups(ranked) is None
    scores, undefined = ranker.score("mrr_at_10", {"en": [0.9, 0.1, 0.5]}, {"en": ranked})
    assert scores == {"en": 1.0} and undefined == {}
    out = tmp_path / "cell.json"
    assert classifier.files(out) == {} and list(ranker.files(out)) == ["TREC run"]
    assert kinds.beside_result(out) == ranker.files(out)
