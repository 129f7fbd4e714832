"""The attention kernel a cell ran (issue 49, item 1): recorded in the result
(`recipe.attn_backend`), compared as `attn_implementation` is (an older result without it
compares on the rest), and the cuDNN attention variable a CUDA cell sets where it applies."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from encoder_eval.cells import attention, cell_config, train
from encoder_eval.core import comparability
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import load_results, result_filename, validate_result
from encoder_eval.reports.table import _recipe_problems

OLD = Path(__file__).parent / "fixtures" / "a4b0e90"  # results of an older harness


@pytest.fixture(scope="module")
def result(tiny_models, small_mirror, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("backend")
    cfg = cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4, seed=45,
        model_key="tiny", recipe=Recipe(max_steps=2, max_seq_len=64, precision="fp32",
                                        limit=32), device="cpu", progress="quiet",
        data_dir=str(small_mirror),
        out_json=str(out / result_filename("tiny", "glue_rte", 1e-4, 45)),
    )  # fmt: skip
    return train.run_cell(cfg)


def test_a_cell_records_the_sdpa_kernel_torch_chose_for_it(result):
    recipe = result["recipe"]
    assert recipe["attn_implementation"] == "sdpa"
    # On the CPU torch has two SDPA kernels: its flash kernel and the math one.
    assert recipe["attn_backend"] in ("flash", "math"), recipe["attn_backend"]
    assert recipe["attn_environment"] == {}  # no cuDNN on the CPU: nothing set
    assert validate_result(result) == []
    assert comparability.cell_setup(result)["attn_backend"] == recipe["attn_backend"]


def test_the_backend_observed_is_torchs_own_choice_and_eager_without_sdpa(tiny_models):
    from transformers import AutoModelForSequenceClassification

    ids = torch.randint(5, 90, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    seen = []
    for implementation in ("sdpa", "eager"):
        model = AutoModelForSequenceClassification.from_pretrained(
            tiny_models["bert"], num_labels=2, attn_implementation=implementation
        ).eval()
        with attention.observe_backend(model, seen), torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    q = torch.randn(4, 2, 12, 8)
    bias = torch.zeros(4, 1, 12, 12)
    expected = attention.SDPA_NAMES[int(torch._fused_sdp_choice(q, q, q, bias))]
    assert seen == [expected, "eager"]


def test_an_older_result_without_the_backend_still_compares(result):
    """Absent reads as unknown: an older result compares on the rest, both ways; two
    recorded backends that differ are a difference, as two attention implementations are."""
    old = json.loads(next((OLD / "sel").glob("*.json")).read_text())
    assert "attn_backend" not in old["recipe"] and validate_result(old) == []
    new = {**old, "recipe": {**old["recipe"], "attn_backend": "flash"}}
    old_setup, new_setup = comparability.cell_setup(old), comparability.cell_setup(new)
    assert "attn_backend" not in old_setup
    assert comparability.setup_differences(new_setup, old_setup, "has") == []
    assert comparability.setup_differences(old_setup, new_setup, "has") == []
    cudnn = comparability.cell_setup({**old, "recipe": {**old["recipe"], "attn_backend": "cudnn"}})
    assert comparability.setup_differences(cudnn, new_setup, "has") == [
        "attn_backend cudnn (has flash)"
    ]
    bad = {**result, "recipe": {**result["recipe"], "attn_backend": 3}}
    assert validate_result(bad) == ["recipe.attn_backend is 3, not a string or null"]


def test_a_table_mixes_old_results_with_new_ones_but_never_two_backends(tmp_path):
    """The old fixture's four select cells, two rewritten as today's harness records them:
    no problem; one of those two with another kernel: the table names it."""
    for path in (OLD / "sel").glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    cells = sorted(load_results(tmp_path, phase="select"), key=lambda c: c.path.name)
    assert len(cells) == 4
    for cell, backend in zip(cells[:2], ("math", "math"), strict=True):
        cell.data["recipe"]["attn_backend"] = backend
    assert not [p for p in _recipe_problems(cells) if "attention" in p.message]
    cells[1].data["recipe"]["attn_backend"] = "cudnn"
    problems = [p for p in _recipe_problems(cells) if "attention kernel" in p.message]
    assert len(problems) == 1 and "cudnn in 1 cell(s)" in problems[0].message


@pytest.mark.parametrize(
    ("device", "version", "hip", "environ", "expected"),
    [
        ("cuda", "2.11.0+cu128", None, {}, {"TORCH_CUDNN_SDPA_AVOID_RECOMPILE": "1"}),
        ("cuda", "2.9.1", None, {}, {"TORCH_CUDNN_SDPA_AVOID_RECOMPILE": "1"}),
        ("cuda", "2.8.0+cu126", None, {}, {}),  # a torch that does not read it
        ("cuda", "2.11.0+rocm6.4", "6.4", {}, {}),  # ROCm: no cuDNN
        ("cpu", "2.13.0+cpu", None, {}, {}),
        ("cuda", "2.11.0", None, {"TORCH_CUDNN_SDPA_AVOID_RECOMPILE": "0"}, {}),  # the user's
    ],
)
def test_the_cudnn_attention_default_applies_only_where_it_can(
    device, version, hip, environ, expected
):
    assert attention.sdpa_environment(device, version, hip, environ) == expected


def test_a_cpu_cell_sets_no_attention_variable(monkeypatch):
    monkeypatch.delenv("TORCH_CUDNN_SDPA_AVOID_RECOMPILE", raising=False)
    assert attention.apply_sdpa_environment(torch.device("cpu")) == {}
    assert "TORCH_CUDNN_SDPA_AVOID_RECOMPILE" not in __import__("os").environ


def test_recipe_dataclass_is_untouched_by_the_recorded_entries():
    """The backend and its environment are recorded beside the recipe, not Recipe entries:
    they are what ran, not what was asked for."""
    names = {f.name for f in dataclasses.fields(Recipe)}
    assert not names & {"attn_backend", "attn_environment"}
