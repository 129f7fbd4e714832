"""The Recipe is the one definition of comparability: scopes, signature, off-protocol rules."""

from __future__ import annotations

import pytest

from encoder_eval.core.protocol import (
    CELL,
    MODEL,
    PROTOCOL_RECIPE,
    TABLE,
    Recipe,
    off_protocol_reasons,
    recipe_fields,
    signature,
)


def test_every_recipe_entry_has_exactly_one_scope():
    scoped = recipe_fields(TABLE) + recipe_fields(MODEL) + recipe_fields(CELL)
    assert sorted(scoped) == sorted(PROTOCOL_RECIPE.to_dict())
    assert {"batching", "eval_every_max", "eval_batch_size", "selection_split"} <= set(
        recipe_fields(TABLE)
    )
    assert recipe_fields(MODEL) == ("mode", "attention", "pooling", "head_dropout",
                                    "body_dropout")  # fmt: skip
    assert recipe_fields(CELL) == (
        "micro_batch", "pad_multiple", "compile", "graph_step", "deterministic"
    )  # fmt: skip


def test_signature_ignores_per_cell_entries_and_keeps_table_ones():
    a = Recipe(micro_batch=8).to_dict() | {"eval_batch": 16, "warmup_steps": 3}
    b = Recipe().to_dict() | {"eval_batch": 128, "warmup_steps": 99}
    assert signature(a) == signature(b)
    assert signature(Recipe(batching="random").to_dict()) != signature(b)
    assert signature(Recipe(mode="liquid-bidir").to_dict(), MODEL) != signature(b, MODEL)


def test_a_recipe_recorded_before_an_entry_existed_reads_as_its_default():
    old = {
        k: v
        for k, v in Recipe().to_dict().items()
        if k not in ("eval_every_max", "eval_batch_size")
    }
    assert signature(old) == signature(Recipe().to_dict())


def test_off_protocol_checks_only_checked_entries():
    assert off_protocol_reasons(Recipe(mode="liquid-bidir", micro_batch=4, selection_split="holdout",
                                       eval_batch_size=64), 3.59e-05, 45, "report") == []  # fmt: skip
    reasons = off_protocol_reasons(
        Recipe(batching="random", eval_every_max=50), 3.59e-05, 45, "report"
    )
    assert reasons == ["batching=random (protocol: length-grouped)",
                       "eval_every_max=50 (protocol: 500)"]  # fmt: skip


def test_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="unknown scope"):
        recipe_fields("task")
