"""Divergence: a cell whose loss becomes NaN or inf is recorded `diverged` with its step;
`select`, `summarize` and `status` count it and never average it.

Real ways to diverge: a huge learning rate (off the grid, so `--allow-off-protocol`),
and, for cells that must sit at a grid learning rate, training labels or a regression head
bias so large that the squared error overflows float32 to inf on the first step.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest
import torch
from fault_helpers import SHRINK, py, read_json, sh

from encoder_eval.cells import cell_config, train
from encoder_eval.core.protocol import LR_GRID, Recipe
from encoder_eval.core.results import read_result, result_filename, validate_result
from encoder_eval.data.loaders import load_model

MODEL, TASK = "tiny", "glue_stsb"


def test_huge_lr_is_recorded_diverged_with_its_step(tmp_path, tiny_models, small_mirror):
    # The CLI refuses lr >= 1 as a typo, so a learning rate this large only reaches a cell
    # through the library; the loss then overflows after a few steps.
    cfg = cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task=TASK, lr=1e6, seed=45, model_key=MODEL,
        recipe=Recipe(max_steps=30, warmup_ratio=0.0, max_seq_len=128, early_stop=False),
        data_dir=str(small_mirror), device="cpu", progress="quiet",
        out_json=str(tmp_path / result_filename(MODEL, TASK, 1e6, 45)),
    )  # fmt: skip
    train.run_cell(cfg)
    data = read_json(cfg.out_json)
    assert validate_result(data) == [] and data["status"] == "diverged"
    step = data["training"]["diverged_at_step"]
    assert isinstance(step, int) and 1 <= step <= 30
    assert data["training"]["steps"] == step - 1  # the diverging update is never applied
    assert data["dev"] is None and data["report"] is None  # never scored
    assert data["protocol"]["on_protocol"] is False


def test_cli_cell_whose_loss_overflows_is_recorded_diverged(tmp_path, tiny_models, small_mirror):
    mirror = _poisoned_mirror(small_mirror, tmp_path / "poisoned")
    out = tmp_path / "cell.json"
    proc = sh(py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", MODEL,
                 "--task", TASK, "--lr", "3.59e-05", "--seed", "45", "--data-dir", mirror,
                 *SHRINK, "--out-json", out, "--progress", "json"), tmp_path)  # fmt: skip
    data = read_json(out)
    assert validate_result(data) == [] and data["status"] == "diverged"
    assert data["training"]["diverged_at_step"] == 1 and data["training"]["steps"] == 0
    assert data["dev"] is None and data["report"] is None
    assert f"diverged: {MODEL} {TASK} lr=3.59e-05 seed=45 spearman=- steps=0" in proc.stdout


def _poisoned_mirror(src: Path, dest: Path) -> Path:
    """The stsb slice with training labels near 1e20 (varied, so the loader accepts them):
    (pred - label)^2 overflows float32 to inf on the first step."""
    (dest / TASK).mkdir(parents=True)
    for f in (src / TASK).glob("*.jsonl"):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        if f.name == "train.jsonl":
            rows = [{**r, "label": 1e20 * (1 + r["label"])} for r in rows]
        (dest / TASK / f.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


def _poisoned_model(path: str):
    """The tiny model with its regression head's bias at 1e30: (pred - y)^2 overflows to inf
    in the first loss, on the same data and model revision as the healthy cells."""
    loaded = load_model(path, "auto", 1, "regression", max_seq_len=128)
    with torch.no_grad():
        loaded.model.classifier.bias.fill_(1e30)
    return loaded


@pytest.fixture(scope="module")
def sweep_with_divergence(tmp_path_factory, tiny_models, small_mirror):
    """Real select and report cells at grid LRs, one of each phase diverged."""
    root = tmp_path_factory.mktemp("divergence")
    recipe = Recipe(max_steps=4, max_seq_len=128, warmup_ratio=0.0)
    plan = {  # (phase, lr key, seed) -> diverges?
        ("select", "lr03", 42): False, ("select", "lr03", 43): False,
        ("select", "lr06", 42): False, ("select", "lr06", 43): True,
        ("report", "lr03", 45): False, ("report", "lr03", 46): False,
        ("report", "lr03", 47): True,
    }  # fmt: skip
    for (phase, key, seed), bad in plan.items():
        rdir = root / phase
        rdir.mkdir(exist_ok=True)
        lr = LR_GRID[key]
        train.run_cell(cell_config.CellConfig(
            model_path=str(tiny_models["bert"]), task=TASK, lr=lr, seed=seed, model_key=MODEL,
            phase=phase, recipe=recipe, device="cpu", progress="quiet",
            data_dir=str(small_mirror),
            out_json=str(rdir / result_filename(MODEL, TASK, lr, seed)),
        ), loaded=_poisoned_model(str(tiny_models["bert"])) if bad else None)  # fmt: skip
    return root


def _result(root: Path, phase: str, key: str, seed: int) -> dict:
    data, why = read_result(root / phase / result_filename(MODEL, TASK, LR_GRID[key], seed))
    assert data is not None, why
    return data


def test_the_forced_cells_are_diverged_at_step_one(sweep_with_divergence):
    for phase, key, seed in (("select", "lr06", 43), ("report", "lr03", 47)):
        data = _result(sweep_with_divergence, phase, key, seed)
        assert data["status"] == "diverged" and data["training"]["diverged_at_step"] == 1
        assert data["dev"] is None and data["report"] is None


def test_select_counts_the_diverged_seed_and_never_averages_it(sweep_with_divergence, tmp_path):
    root = sweep_with_divergence
    out = tmp_path / "selection.json"
    proc = sh(py("encoder_eval.select", "--results-dir", root / "select", "--out", out,
                 "--lr-keys", "lr03,lr06", "--seeds", "42,43"), tmp_path)  # fmt: skip
    entry = json.loads(out.read_text())["pairs"][MODEL][TASK]
    assert entry["diverged_by_lr"] == {"lr06": [43]}
    assert entry["dev_mean_by_lr"]["lr06"] is None  # not the mean of the seed that finished
    assert entry["lr_key"] == "lr03"  # lr06 is ineligible, whatever its seed 42 scored
    lr03 = [_result(root, "select", "lr03", s)["dev"]["mean"] for s in (42, 43)]
    assert entry["dev_mean"] == pytest.approx(math.fsum(lr03) / 2, abs=0, rel=1e-15)
    assert re.search(r"lr06=-", proc.stdout)


def test_status_counts_the_diverged_cell_as_finished(sweep_with_divergence, tmp_path):
    proc = sh(py("encoder_eval.status", "--phase", "select", "--model", f"{MODEL}=org/tiny",
                 "--tasks", TASK, "--lr-keys", "lr03,lr06", "--seeds", "42,43",
                 "--results-dir", sweep_with_divergence / "select"), tmp_path)  # fmt: skip
    assert re.search(r"done\s+3\b", proc.stdout) and re.search(r"diverged\s+1\b", proc.stdout)
    assert f"{MODEL}/{TASK}/lr06/s43" in proc.stdout


def test_summarize_refuses_a_diverged_seed_and_never_averages_it(sweep_with_divergence, tmp_path):
    root = sweep_with_divergence
    sel = tmp_path / "selection.json"
    # The real selection of this shrunken sweep: lr06 has a diverged seed, so lr03 is chosen.
    sh(py("encoder_eval.select", "--results-dir", root / "select", "--lr-keys", "lr03,lr06",
          "--seeds", "42,43", "--out", sel), tmp_path)  # fmt: skip
    assert json.loads(sel.read_text())["pairs"][MODEL][TASK]["lr_key"] == "lr03"
    base = ["encoder_eval.summarize", "--results-dir", root / "report", "--selection", sel]
    refused = sh(py(*base), tmp_path, ok=(1,))
    assert "[diverged] 1 report seed(s) diverged (counted, never averaged)" in refused.stderr
    name = result_filename(MODEL, TASK, LR_GRID["lr03"], 47)
    assert re.search(rf"{re.escape(name)} \(diverged at step 1\)", refused.stderr)
    table = json.loads(sh(py(*base, "--allow-partial", "--format", "json"), tmp_path).stdout)
    cell = table["rows"][0]["cells"][TASK]
    ok = [_result(root, "report", "lr03", s)["report"]["mean"] for s in (45, 46)]
    assert cell["n"] == 2 and cell["seeds"] == [45, 46] and cell["diverged_seeds"] == [47]
    assert cell["mean"] == pytest.approx(statistics.mean(ok), abs=0, rel=1e-15)
    assert cell["std"] == pytest.approx(statistics.stdev(ok), rel=1e-12)
    assert any("[diverged]" in note for note in table["footnotes"])
