"""Evaluation during training (issue 27 item 2): a real `Trainer` run of a tiny decoder on the
capability suite's Markov chain, saving a checkpoint every few steps; the callback writes a
receipt per save and the regression report, and a checkpoint corrupted on disk (replaced by
untrained weights) is flagged on perplexity: a warning, or the run stops there."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from test_capability import VOCAB, tiny_decoder
from transformers import Trainer, TrainerCallback, TrainingArguments

from encoder_eval.cells import capability
from encoder_eval.cells.capability import sample_markov
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.receipt import load_receipts
from encoder_eval.plans.tracking import build_setup
from encoder_eval.reports import checkpoint_eval
from encoder_eval.reports.checkpoint_eval import (
    CheckpointEvalCallback,
    evaluate_saved_checkpoint,
)


class Corrupt(TrainerCallback):
    """Replaces the checkpoint saved at `step` with untrained weights (a broken save)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            tiny_decoder(1).save_pretrained(f"{args.output_dir}/checkpoint-{self.step}")
        return control


def _train(tmp_path, callback: CheckpointEvalCallback, max_steps: int, corrupt_at: int):
    rng = np.random.default_rng(123)
    seqs = sample_markov(VOCAB, 32 * max_steps, capability.SEQUENCE_LENGTH, rng)[0]
    data = [{"input_ids": torch.as_tensor(s), "labels": torch.as_tensor(s)} for s in seqs]
    args = TrainingArguments(
        output_dir=str(tmp_path / "train"), max_steps=max_steps, save_steps=10,
        save_strategy="steps", per_device_train_batch_size=32, learning_rate=1e-2,
        report_to=[], use_cpu=True, save_only_model=True, disable_tqdm=True,
        logging_strategy="no", seed=0,
    )  # fmt: skip
    trainer = Trainer(model=tiny_decoder(), args=args, train_dataset=data,
                      callbacks=[Corrupt(corrupt_at), callback])  # fmt: skip
    trainer.train()
    return trainer


def _setup():
    return build_setup("synthetic", [], n_examples=64)


def test_a_receipt_per_save_and_a_warning_when_a_checkpoint_regressed(tmp_path, caplog) -> None:
    out = tmp_path / "track"
    cb = CheckpointEvalCallback(_setup(), out, device="cpu")
    with caplog.at_level(logging.WARNING, logger=checkpoint_eval.__name__):
        trainer = _train(tmp_path, cb, max_steps=30, corrupt_at=30)
    assert trainer.state.global_step == 30  # warned, not stopped
    receipts = load_receipts(out)
    assert [(r.checkpoint_id, r.metadata["step"]) for r in receipts] == [
        ("checkpoint-10", 10), ("checkpoint-20", 20), ("checkpoint-30", 30)]  # fmt: skip
    assert all(r.setup["kind"] == "synthetic" for r in receipts)
    ppl = [r.task("perplexity").score for r in receipts]
    assert ppl[1] < ppl[0] < ppl[2]  # trained further, then the broken save
    report = json.loads((out / "regression.json").read_text())
    assert report["checkpoints"] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    flagged = {(f["task"], f["checkpoint_id"]) for f in report["flags"]}
    assert ("perplexity", "checkpoint-30") in flagged
    assert all(c == "checkpoint-30" for _, c in flagged)
    assert [o.should_stop for o in cb.outcomes] == [False, False, True]
    assert cb.outcomes[0].report is None  # one receipt: nothing to compare yet
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("checkpoint-30 regressed" in m and "perplexity" in m for m in warned), warned
    assert not any("stopping" in m for m in warned)
    assert (out / "regression.md").read_text().count("**REGRESSED**") == len(flagged)


def test_on_regression_stop_ends_the_run_at_the_regressed_checkpoint(tmp_path) -> None:
    out = tmp_path / "track"
    cb = CheckpointEvalCallback(_setup(), out, on_regression="stop", device="cpu")
    trainer = _train(tmp_path, cb, max_steps=40, corrupt_at=20)
    assert trainer.state.global_step == 20
    assert [r.checkpoint_id for r in load_receipts(out)] == [
        "checkpoint-10", "checkpoint-20"]  # fmt: skip
    assert cb.outcomes[-1].regressed[0].task == "perplexity"


def test_the_plain_function_for_custom_loops_and_its_refusals(tmp_path) -> None:
    """A custom loop saves with save_pretrained and calls the function; a second call on the
    same save keeps the receipt; bad options are refused with one message."""
    model = tiny_decoder()
    model.save_pretrained(tmp_path / "step-5")
    first = evaluate_saved_checkpoint(tmp_path / "step-5", _setup(), tmp_path / "t", step=5,
                                      device="cpu")  # fmt: skip
    assert first.report is None and not first.should_stop
    again = evaluate_saved_checkpoint(tmp_path / "step-5", _setup(), tmp_path / "t", step=5,
                                      device="cpu")  # fmt: skip
    assert again.receipt.scores() == first.receipt.scores()
    with pytest.raises(HarnessError, match="not a folder"):
        evaluate_saved_checkpoint(tmp_path / "nope", _setup(), tmp_path / "t", step=6)
    with pytest.raises(HarnessError, match="on_regression"):
        CheckpointEvalCallback(_setup(), tmp_path / "t", on_regression="halt")
