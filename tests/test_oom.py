"""Out of memory costs no cell: a training step that runs out of memory is retried with the
micro-batch halved (the same effective batch), an evaluation with the evaluation batch
halved, and the cell ends as one started at those sizes would (issue 26, item 4).

No GPU runs these: the fault is injected at the narrowest seam, the model's forward, which
raises torch.OutOfMemoryError as CUDA's allocator does, on a real tiny model on the CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import read_json

from encoder_eval.cells import batching, cell_config, train
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import result_filename, validate_result

SHORT = Recipe(max_steps=6, patience=3, max_seq_len=128)


def _cell(tmp_path, tiny_models, small_mirror, recipe: Recipe, name: str) -> cell_config.CellConfig:
    (tmp_path / name).mkdir()
    out = tmp_path / name / result_filename("tiny", "glue_rte", 1e-4, 45)
    return cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4, seed=45, model_key="tiny",
        recipe=recipe, device="cpu", progress="quiet", data_dir=str(small_mirror),
        out_json=str(out),
    )  # fmt: skip


class _Device:
    """A pretend device's memory: a training forward of more than `train_rows` rows runs
    out of memory once `train_passes` of them have gone through, and an evaluation forward
    of more than `eval_rows` rows always does. Records the rows of every forward."""

    def __init__(self, train_rows: int, train_passes: int = 0, eval_rows: int | None = None):
        self.train_rows, self.train_passes, self.eval_rows = train_rows, train_passes, eval_rows
        self.seen: list[tuple[bool, int]] = []
        self.models: list[torch.nn.Module] = []

    def wrap(self, monkeypatch) -> None:
        real_load = train.load_model

        def load_model(*args, **kwargs):
            loaded = real_load(*args, **kwargs)
            model, forward = loaded.model, loaded.model.forward

            def limited_forward(*a, **kw):
                rows, training = kw["input_ids"].shape[0], model.training
                self.seen.append((training, rows))
                if training and rows > self.train_rows:
                    if self.train_passes <= 0:
                        raise torch.OutOfMemoryError("CUDA out of memory (injected)")
                    self.train_passes -= 1
                if not training and self.eval_rows is not None and rows > self.eval_rows:
                    raise torch.OutOfMemoryError("CUDA out of memory (injected)")
                return forward(*a, **kw)

            model.forward = limited_forward
            self.models.append(model)
            return loaded

        monkeypatch.setattr(train, "load_model", load_model)


def _kept(monkeypatch) -> list[torch.nn.Module]:
    """The models the cells train (their weights at the end: those the cell keeps)."""
    models, real_load = [], train.load_model

    def load_model(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        models.append(loaded.model)
        return loaded

    monkeypatch.setattr(train, "load_model", load_model)
    return models


def test_out_of_memory_halves_the_micro_batch_and_eval_batch_and_changes_nothing_else(
    tiny_models, small_mirror, tmp_path, monkeypatch, capsys
):
    # The reference: a cell started at micro-batch 8 and evaluation batch 4.
    with monkeypatch.context() as m:
        models = _kept(m)
        reference = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, dataclasses.replace(
            SHORT, micro_batch=8, eval_batch_size=4), "reference"))  # fmt: skip
    (reference_model,) = models

    # Micro-batch 16 (accumulation 2): the first step's first micro-batch goes through its
    # forward and backward, its second runs out of memory; evaluation fits 4 rows only.
    device = _Device(train_rows=8, train_passes=1, eval_rows=4)
    device.wrap(monkeypatch)
    # The evaluation batch is set (16), not left to the device's default (128 on cuda), so
    # the retries are the same wherever bench/gpu_check.py runs this test.
    cfg = _cell(tmp_path, tiny_models, small_mirror, dataclasses.replace(
        SHORT, micro_batch=16, eval_batch_size=16), "oom")  # fmt: skip
    result = train.run_cell(cfg)

    assert validate_result(read_json(cfg.out_json)) == []
    training, recipe = result["training"], result["recipe"]
    assert result["status"] == "ok" and training["steps"] == 6
    # The same effective batch; the accumulation the cell ended with is recorded.
    assert recipe["effective_batch"] == 32 and recipe["micro_batch"] == 16
    assert training["oom_retries"] == 1
    assert training["micro_batch_used"] == 8 and training["grad_accumulation_used"] == 4
    assert training["eval_oom_retries"] == 2 and training["eval_batch_used"] == 4
    assert max(rows for training_, rows in device.seen[2:] if training_) == 8
    err = capsys.readouterr().err
    assert "out of memory at step 1 with a micro-batch of 16; retrying the step with 8" in err
    assert "out of memory in evaluation with a batch of 16; scoring the split again with 8" in err

    # ...and it computed what the cell started at those sizes computed: the failed attempt's
    # gradients and random draws (dropout) left nothing behind.
    assert training["final_loss"] == reference["training"]["final_loss"]
    assert training["dev_history"] == reference["training"]["dev_history"]
    assert result["dev"]["per_language"] == reference["dev"]["per_language"]
    assert result["report"]["per_language"] == reference["report"]["per_language"]
    (model,) = device.models
    ours, theirs = model.state_dict(), reference_model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # The reference never ran out of memory, and says so.
    assert reference["training"]["oom_retries"] == 0
    assert reference["training"]["micro_batch_used"] == 8


def test_out_of_memory_at_a_micro_batch_of_1_re_raises_saying_so(
    tiny_models, small_mirror, tmp_path, monkeypatch, capsys
):
    _Device(train_rows=0).wrap(monkeypatch)  # not even one example fits
    cfg = _cell(tmp_path, tiny_models, small_mirror, dataclasses.replace(SHORT, micro_batch=2),
                "never")  # fmt: skip
    with pytest.raises(torch.OutOfMemoryError) as raised:
        train.run_cell(cfg)
    (note,) = raised.value.__notes__
    assert "out of memory at step 1 with a micro-batch of 1 (after 1 retries" in note
    assert "use a device with more memory" in note
    assert "retrying the step with 1" in capsys.readouterr().err
    assert not (tmp_path / "never" / result_filename("tiny", "glue_rte", 1e-4, 45)).exists()


def test_the_halved_micro_batch_still_divides_the_effective_batch():
    assert batching.smaller_divisor(32, 16) == 16
    assert batching.smaller_divisor(24, 6) == 6
    assert batching.smaller_divisor(24, 5) == 4  # 24 / 5 would leave a remainder
    assert batching.smaller_divisor(7, 3) == 1
    assert batching.smaller_divisor(32, 0) == 1
