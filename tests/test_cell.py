"""One cell, for real: tiny models fine-tuned for a few steps on slices of real data."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from conftest import REPO, read_json

from encoder_eval import run as run_command
from encoder_eval.cells import batching, cell_config, cell_state, encoding, runner, train
from encoder_eval.cells.kinds import KINDS
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import result_filename, validate_result
from encoder_eval.data.loaders import load_encoder, load_model
from encoder_eval.data.task_loading import load_task

# fp32: these tests do not check precision (the bf16 ones below call autocast themselves),
# and bf16 autocast is emulated, slower, on a CPU without native bf16.
SHORT = Recipe(max_steps=6, patience=3, max_seq_len=128, precision="fp32")


def cell(tmp_path, model_path, task="glue_rte", **kw) -> cell_config.CellConfig:
    defaults = dict(
        model_path=str(model_path), task=task, lr=1e-4, seed=45, model_key="tiny",
        recipe=SHORT, device="cpu", progress="quiet",
        out_json=str(tmp_path / result_filename("tiny", task, kw.get("lr", 1e-4), 45)),
    )  # fmt: skip
    defaults.update(kw)
    return cell_config.CellConfig(**defaults)


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta", "deberta-v2", "modernbert"])
def test_auto_mode_trains_each_architecture(kind, tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models[kind], data_dir=str(small_mirror))
    result = train.run_cell(cfg)
    assert validate_result(read_json(cfg.out_json)) == []
    assert result["status"] == "ok"
    assert result["training"]["steps"] == 6
    assert 0.0 <= result["report"]["mean"] <= 1.0
    assert result["report"]["split"] == "validation"
    assert result["provenance"]["model_revision"].startswith("sha256:")
    assert result["provenance"]["model_path"] is None  # not recorded unless asked
    assert result["recipe"]["eval_batch"] == batching.EVAL_BATCH_SIZE["cpu"]


@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_liquid_bidir_mode_trains(kind, tiny_models, small_mirror, tmp_path):
    recipe = dataclasses.replace(SHORT, mode="liquid-bidir")
    cfg = cell(tmp_path, tiny_models[kind], data_dir=str(small_mirror), recipe=recipe)
    result = train.run_cell(cfg)
    assert result["status"] == "ok" and result["recipe"]["mode"] == "liquid-bidir"
    assert validate_result(result) == []


@pytest.mark.parametrize("mode", ["auto", "liquid-bidir"])
def test_remote_code_model_loads_and_trains(mode, tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models["tinyenc"], data_dir=str(small_mirror),
               recipe=dataclasses.replace(SHORT, mode=mode), trust_remote_code=True,
               task="sg_cb")  # fmt: skip
    with pytest.warns(UserWarning, match="trust_remote_code is on"):
        result = train.run_cell(cfg)
    assert result["status"] == "ok"
    assert result["provenance"]["trust_remote_code"] is True


def test_remote_code_model_refused_without_trust(tiny_models):
    with pytest.raises(HarnessError, match="trust-remote-code"):
        load_model(str(tiny_models["tinyenc"]), "auto", 2, "single_label_classification")


def test_regression_task(tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models["bert"], task="glue_stsb", data_dir=str(small_mirror))
    result = train.run_cell(cfg)
    assert result["metric"] == "spearman"
    assert -1.0 <= result["report"]["mean"] <= 1.0


def test_multilingual_task_scores_each_language(tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models["xlm-roberta"], task="amazon_reviews_multi",
               data_dir=str(small_mirror))  # fmt: skip
    result = train.run_cell(cfg)
    report = result["report"]
    assert report["split"] == "test"
    assert set(report["per_language"]) == {"de", "en", "es", "fr"}
    assert math.isclose(report["mean"], sum(report["per_language"].values()) / 4)
    assert set(result["dev"]["per_language"]) == {"de", "en", "es", "fr"}


def test_select_cell_of_multilingual_task_never_reads_test(tiny_models, small_mirror, tmp_path):
    # A mirror without any test file: a select cell must not need it.
    mirror = tmp_path / "mirror"
    src = small_mirror / "amazon_reviews_multi"
    (mirror / "amazon_reviews_multi").mkdir(parents=True)
    for f in src.glob("*.jsonl"):
        if not f.name.startswith("test."):
            (mirror / "amazon_reviews_multi" / f.name).write_bytes(f.read_bytes())
    cfg = cell(tmp_path, tiny_models["bert"], task="amazon_reviews_multi", seed=42,
               phase="select", data_dir=str(mirror))  # fmt: skip
    result = train.run_cell(cfg)
    assert result["report"] is None
    assert validate_result(read_json(cfg.out_json)) == []
    # ...while a report cell on the same mirror fails loudly, naming the missing file.
    with pytest.raises(HarnessError, match="test.de.jsonl"):
        train.run_cell(cell(tmp_path, tiny_models["bert"], task="amazon_reviews_multi",
                            data_dir=str(mirror)))  # fmt: skip


def test_autocast_bf16_activations_with_fp32_weights_and_state(tiny_models, small_mirror):
    loaded = load_model(str(tiny_models["bert"]), "auto", 2, "single_label_classification")
    model = loaded.model
    seen = []
    first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first_linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    train_split = load_task("glue_rte", small_mirror)[0]
    enc = encoding.encode(loaded.tokenizer, train_split, 64, loaded.input_names)
    kind = KINDS["classification"]
    batch = batching.collate_batch(enc, list(range(8)), loaded.tokenizer.pad_token_id, "cpu", kind)
    labels = batch.pop("labels")
    optimizer = train.build_optimizer(model, Recipe(), 1e-4)
    with encoding.autocast(torch.device("cpu"), "bf16-autocast"):
        logits = model(**batch).logits
    kind.loss(logits, labels).backward()
    optimizer.step()
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    states = [s for s in optimizer.state.values() if s]
    assert states and all(
        s["exp_avg"].dtype == torch.float32 and s["exp_avg_sq"].dtype == torch.float32
        for s in states
    )


def test_output_layer_runs_in_fp32_so_regression_predictions_are_not_rounded(tiny_models):
    loaded = load_model(str(tiny_models["bert"]), "auto", 1, "regression")
    enc = encoding.encode(loaded.tokenizer, {"text": [f"sentence number {i}" for i in range(40)],
                                          "label": [0.0] * 40}, 32, loaded.input_names)  # fmt: skip
    with torch.no_grad():
        loaded.model.classifier.bias.fill_(2.5)  # bf16 would round outputs here to 1/64 steps
    with encoding.autocast(torch.device("cpu"), "bf16-autocast"):
        batch = batching.collate_batch(enc, list(range(40)), loaded.tokenizer.pad_token_id, "cpu",
                               KINDS["regression"])  # fmt: skip
        batch.pop("labels")
        logits = loaded.model(**batch).logits
    assert logits.dtype == torch.float32
    assert len(set(logits.squeeze(-1).tolist())) >= 35  # bf16 logits would be rounded to 1/64 steps


def test_a_bf16_checkpoint_trains_from_fp32_master_weights(tiny_models, tmp_path):
    """A checkpoint stored in bf16 is cast, not refused: every parameter the optimiser will
    update is fp32 (the old `check_fp32` ran after that cast and could never fire, while the
    methodology said such a load is refused)."""
    from transformers import AutoModel, AutoTokenizer

    stored = tmp_path / "bf16"
    AutoModel.from_pretrained(tiny_models["bert"]).to(torch.bfloat16).save_pretrained(stored)
    AutoTokenizer.from_pretrained(tiny_models["bert"]).save_pretrained(stored)
    config = json.loads((stored / "config.json").read_text())
    assert (config.get("torch_dtype") or config.get("dtype")) == "bfloat16"
    for loaded in (load_model(str(stored), "auto", 2, "single_label_classification"),
                   load_encoder(str(stored))):  # fmt: skip
        assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    text = (REPO / "EVALUATION_METHODOLOGY.md").read_text(encoding="utf-8")
    assert "check_fp32" not in text and "in bf16 is refused" not in text
    assert "cast to fp32" in text


def test_same_cell_twice_gives_the_same_score(tiny_models, small_mirror, tmp_path):
    a = train.run_cell(cell(tmp_path / "a", tiny_models["bert"], data_dir=str(small_mirror),
                            out_json=None))  # fmt: skip
    b = train.run_cell(cell(tmp_path / "b", tiny_models["bert"], data_dir=str(small_mirror),
                            out_json=None))  # fmt: skip
    assert a["dev"] == b["dev"] and a["report"] == b["report"]
    assert a["training"]["final_loss"] == b["training"]["final_loss"]


def test_diverging_loss_is_recorded_not_raised(tiny_models, small_mirror, tmp_path):
    cfg = cell(tmp_path, tiny_models["bert"], task="glue_stsb", data_dir=str(small_mirror),
               lr=1e6, recipe=Recipe(max_steps=30, warmup_ratio=0.0, max_seq_len=128,
                                     precision="fp32"))  # fmt: skip
    result = train.run_cell(cfg)
    assert result["status"] == "diverged"
    assert isinstance(result["training"]["diverged_at_step"], int)
    assert result["dev"] is None and result["report"] is None
    assert validate_result(read_json(cfg.out_json)) == []


def test_cli_runs_a_cell_and_writes_valid_json(tiny_models, small_mirror, tmp_path):
    out = tmp_path / "cell.json"
    proc = subprocess.run(
        [sys.executable, "-m", "encoder_eval.run", "--model-path", str(tiny_models["bert"]),
         "--model-key", "tiny-bert", "--task", "sg_cb", "--lr", "3.59e-05", "--seed", "45",
         "--max-steps", "4", "--max-seq-len", "128", "--data-dir", str(small_mirror), "--device", "cpu",
         "--out-json", str(out), "--progress", "quiet", "--record-model-path"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = read_json(out)
    assert validate_result(data) == []
    assert data["cell"] == {"model": "tiny-bert", "task": "sg_cb", "lr": 3.59e-05,
                            "lr_key": "lr06", "seed": 45, "phase": "report"}  # fmt: skip
    assert data["protocol"]["on_protocol"] is False  # --max-steps 4 is not the protocol
    assert any("max_steps" in r for r in data["protocol"]["off_protocol_reasons"])
    assert data["provenance"]["model_path"] == str(tiny_models["bert"])


def test_cli_several_lrs_and_seeds_in_one_process_match_single_runs(
    tiny_models, small_mirror, tmp_path
):
    common = ["--model-path", str(tiny_models["bert"]), "--model-key", "tiny", "--task",
              "glue_rte", "--max-steps", "3", "--max-seq-len", "128", "--data-dir", str(small_mirror),
              "--device", "cpu", "--precision", "fp32", "--progress", "quiet",
              "--phase", "select"]  # fmt: skip
    (tmp_path / "multi").mkdir()
    (tmp_path / "single").mkdir()
    run = [sys.executable, "-m", "encoder_eval.run"]
    subprocess.run(run + common + ["--lr", "1e-4,5.99e-05", "--seed", "42,43", "--results-dir",
                                   str(tmp_path / "multi")],
                   cwd=REPO, check=True, timeout=300)  # fmt: skip
    subprocess.run(run + common + ["--lr", "5.99e-05", "--seed", "43", "--results-dir",
                                   str(tmp_path / "single")],
                   cwd=REPO, check=True, timeout=300)  # fmt: skip
    names = [
        result_filename("tiny", "glue_rte", lr, s) for lr in (1e-4, 5.99e-05) for s in (42, 43)
    ]
    assert sorted(p.name for p in (tmp_path / "multi").glob("*.json")) == sorted(names)
    name = result_filename("tiny", "glue_rte", 5.99e-05, 43)  # the last cell of the process
    multi, single = read_json(tmp_path / "multi" / name), read_json(tmp_path / "single" / name)
    assert multi["dev"] == single["dev"]
    for key in ("final_loss", "dev_history", "steps", "best_step"):
        assert multi["training"][key] == single["training"][key], key
    assert multi["cell"] == single["cell"] and multi["recipe"] == single["recipe"]


def test_a_crashing_cell_does_not_stop_the_others(tiny_models, small_mirror, tmp_path, monkeypatch):
    args = run_command.build_parser().parse_args([
        "--model-path", str(tiny_models["bert"]), "--model-key", "tiny", "--task", "glue_rte",
        "--lr", "1e-4", "--seed", "42,43,44", "--max-steps", "2", "--max-seq-len", "128",
        "--data-dir", str(small_mirror), "--device", "cpu", "--precision", "fp32",
        "--progress", "quiet", "--phase", "select", "--results-dir", str(tmp_path),
    ])  # fmt: skip
    real_run_cell = train.run_cell

    def run_cell_failing_for_43(cfg, *a, **kw):  # the fault: seed 43 runs out of memory
        if cfg.seed == 43:
            raise RuntimeError("CUDA out of memory (injected)")
        return real_run_cell(cfg, *a, **kw)

    monkeypatch.setattr(train, "run_cell", run_cell_failing_for_43)
    with pytest.raises(runner.CellsFailed, match="1 of 3 cell.*lr=0.0001 seed=43"):
        runner.run_cells(runner.plan_cells(args), log=lambda m: None)
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written == [result_filename("tiny", "glue_rte", 1e-4, s) for s in (42, 44)]


def test_sigterm_saves_state_and_the_rerun_matches_an_uninterrupted_run(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    recipe = Recipe(max_steps=12, patience=99, max_seq_len=128, precision="fp32")
    ref = train.run_cell(cell(tmp_path / "ref", tiny_models["bert"], data_dir=str(small_mirror),
                              recipe=recipe, out_json=None))  # fmt: skip
    (tmp_path / "cut").mkdir()
    cfg = cell(tmp_path / "cut", tiny_models["bert"], data_dir=str(small_mirror), recipe=recipe,
               out_json=str(tmp_path / "cut" / "cell.json"))  # fmt: skip
    calls = {"n": 0}
    real_collate = cell_state.collate_batch

    def collate_then_sigterm(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:  # a real SIGTERM, delivered mid-training
            os.kill(os.getpid(), signal.SIGTERM)
        return real_collate(*args, **kwargs)

    monkeypatch.setattr(cell_state, "collate_batch", collate_then_sigterm)
    with pytest.raises(train.Preempted):
        train.run_cell(cfg)
    monkeypatch.setattr(cell_state, "collate_batch", real_collate)
    assert not (tmp_path / "cut" / "cell.json").exists()
    resume = tmp_path / "cut" / ".resume-cell.json.pt"
    assert resume.exists()
    resumed = train.run_cell(cfg)
    assert not resume.exists()
    assert resumed["training"]["steps"] == ref["training"]["steps"] == 12
    assert resumed["dev"] == ref["dev"] and resumed["report"] == ref["report"]
    assert resumed["training"]["final_loss"] == ref["training"]["final_loss"]
    assert resumed["training"]["dev_history"] == ref["training"]["dev_history"]


# ----------------------------------------------------------------------------- issue 11


def test_a_mirror_from_the_environment_is_recorded_and_the_cell_writes(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    """ENCODER_EVAL_DATA_DIR with no MANIFEST.json: the cell used to train, then crash on
    its provenance and write nothing."""
    monkeypatch.setenv("ENCODER_EVAL_DATA_DIR", str(small_mirror))
    cfg = cell(tmp_path, tiny_models["bert"], task="sg_cb")
    result = train.run_cell(cfg)
    assert read_json(cfg.out_json) == result
    data = result["provenance"]["data"]
    assert data["source"] == "mirror" and data["identity"] == f"mirror:sha256:{data['sha256']}"
    assert result["provenance"]["dataset_revisions"] == {"aps/super_glue": None}


def test_provenance_is_resolved_before_the_first_step(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    """A cell never trains and then fails on bookkeeping: a provenance failure comes first."""
    steps = []
    monkeypatch.setattr(train, "build_optimizer", lambda *a: steps.append(a) or 1 / 0)

    def unresolvable(task, data_dir=None):
        raise HarnessError("cannot resolve nyu-mll/glue@main to a commit")

    monkeypatch.setattr(train, "data_provenance", unresolvable)
    with pytest.raises(HarnessError, match="cannot resolve"):
        train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror)))
    assert steps == []


def test_epochs_are_fractional_and_the_step_cap_is_not_an_early_stop(
    tiny_models, small_mirror, tmp_path
):
    # 64 train rows = 2 steps an epoch; 3 steps = 1.5 epochs. The learning rate is too small to
    # change a prediction, so the dev score never improves after the first evaluation: the
    # third bad evaluation comes at the last allowed step, which is the cap, not patience.
    recipe = Recipe(max_steps=3, patience=2, max_seq_len=128, precision="fp32")
    cfg = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror), recipe=recipe, lr=1e-12)
    t = train.run_cell(cfg)["training"]
    assert (t["steps"], t["steps_per_epoch"], t["epochs"]) == (3, 2, 1.5)
    assert [h["step"] for h in t["dev_history"]] == [1, 2, 3]
    assert t["early_stopped"] is False and t["stopped_by"] == "step_cap"
    # Evaluations at steps 2, 4, 6, 8: patience runs out at step 6, before the cap.
    recipe = Recipe(max_steps=8, patience=2, max_seq_len=128, precision="fp32")
    cfg = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror), recipe=recipe, lr=1e-12)
    t = train.run_cell(cfg)["training"]
    assert t["early_stopped"] is True and t["stopped_by"] == "early_stop" and t["steps"] == 6


def _cola_mirror(dest):
    from conftest import write_small_mirror

    return write_small_mirror(dest, {"glue_cola": {"train.jsonl": 64, "validation.jsonl": 32}})


def test_an_undefined_metric_is_recorded_as_undefined_not_zero(tiny_models, tmp_path, capfd):
    """A model that predicts one class everywhere has no MCC: the result says so."""
    mirror = _cola_mirror(tmp_path / "mirror")
    loaded = load_model(str(tiny_models["bert"]), "auto", 2, "single_label_classification",
                        max_seq_len=128)  # fmt: skip
    with torch.no_grad():  # a head that always says class 0, far beyond what training moves
        loaded.model.classifier.weight.zero_()
        loaded.model.classifier.bias.copy_(torch.tensor([10.0, -10.0]))
    cfg = cell(tmp_path, tiny_models["bert"], task="glue_cola", data_dir=str(mirror), lr=1e-12)
    result = train.run_cell(cfg, loaded=loaded)
    assert validate_result(result) == []
    for section in ("dev", "report"):
        assert result[section]["mean"] is None
        assert result[section]["per_language"] == {"en": None}
        assert result[section]["undefined"] == {"en": "constant predictions"}
    assert all(h["dev"] is None for h in result["training"]["dev_history"])
    assert (
        "mcc is undefined on the report split (en: constant predictions)" in capfd.readouterr().err
    )


def test_holdout_selects_on_a_slice_of_train_and_reports_the_official_dev(
    tiny_models, small_mirror, tmp_path
):
    from encoder_eval.data.holdout import HOLDOUT_KEY, holdout_indices, holdout_size

    default = load_task("glue_rte", small_mirror)
    strict = load_task("glue_rte", small_mirror, selection_split="holdout")
    train_rows, dev_rows = default[0], default[1]["en"]
    held = holdout_indices(train_rows["label"], "single_label_classification")
    assert len(held) == holdout_size(64) == 12  # 20 % of 64: the small-task share cap
    assert strict[1][HOLDOUT_KEY]["text"] == [train_rows["text"][i] for i in held]
    assert len(strict[0]["label"]) == 64 - 12
    assert not set(strict[0]["text_pair"]) & set(strict[1][HOLDOUT_KEY]["text_pair"])
    assert strict[2] == {"en": dev_rows}  # the report split is the official dev, untouched
    # Stratified: the slice's class shares follow train's (largest remainders).
    share = sum(train_rows["label"]) / 64
    assert abs(sum(strict[1][HOLDOUT_KEY]["label"]) - 12 * share) < 1
    recipe = Recipe(max_steps=4, patience=3, max_seq_len=128, selection_split="holdout")
    result = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                                 recipe=recipe))  # fmt: skip
    assert list(result["dev"]["per_language"]) == [HOLDOUT_KEY]
    assert list(result["report"]["per_language"]) == ["en"]
    assert result["recipe"]["selection_split"] == "holdout"
    assert result["protocol"]["off_protocol_reasons"] == [
        "max_steps=4 (protocol: 10000)", "max_seq_len=128 (protocol: 256)"]  # fmt: skip


# ----------------------------------------------------------------------------- issue 12

SEAHORSE_DECIDING = ["de", "en-US", "es-ES", "ru"]  # its Euro languages; tr and vi are not


@pytest.fixture(scope="module")
def seahorse_mirror(tmp_path_factory):
    """A real multilingual mirror with languages outside the Euro set: SeaHorse's first
    600 validation rows (en-US de tr es-ES ru vi), split into train/validation/test."""
    from mirror_helpers import split_mirror

    dest = tmp_path_factory.mktemp("seahorse")
    split_mirror("seahorse", dest, limit=600)
    return dest


def _languages_predicted(monkeypatch, tokenizer, input_names, splits: dict) -> list[str]:
    """Wrap `cell_state.predict` to record, per call, which language's split it scored (matched
    by the token ids of an independent tokenisation)."""
    by_ids = {}
    for lang, split in splits.items():
        enc = encoding.encode(tokenizer, split, 128, input_names)
        by_ids[tuple(map(tuple, enc.features["input_ids"]))] = lang
    seen: list[str] = []
    real_predict = cell_state.predict

    def recording_predict(model, enc, *args, **kwargs):
        seen.append(by_ids.get(tuple(map(tuple, enc.features["input_ids"])), "?"))
        return real_predict(model, enc, *args, **kwargs)

    monkeypatch.setattr(cell_state, "predict", recording_predict)
    return seen


def test_training_evaluations_score_only_the_deciding_languages_and_the_rest_once_at_the_end(
    tiny_models, seahorse_mirror, tmp_path, monkeypatch
):
    from encoder_eval.cells.kinds import kind_for
    from encoder_eval.core import metrics

    data = load_task("seahorse", seahorse_mirror, with_test=False)
    val = data[1]
    assert sorted(val) == sorted(SEAHORSE_DECIDING + ["tr", "vi"])
    loaded = load_model(str(tiny_models["bert"]), "auto", 1, "regression", max_seq_len=128)
    seen = _languages_predicted(monkeypatch, loaded.tokenizer, loaded.input_names, val)
    cfg = cell(tmp_path, tiny_models["bert"], task="seahorse", phase="select", out_json=None,
               data_dir=str(seahorse_mirror))  # fmt: skip
    result = train.run_cell(cfg, loaded=loaded, data=data)
    history = result["training"]["dev_history"]
    assert len(history) == 3  # steps 2, 4, 6
    deciding = [lang for lang in val if lang in SEAHORSE_DECIDING]
    rest = [lang for lang in val if lang not in SEAHORSE_DECIDING]
    assert seen == deciding * len(history) + rest  # tr and vi: once, after training

    dev = result["dev"]
    assert list(dev["per_language"]) == list(val)  # every language, in the split's order
    assert dev["languages_in_mean"] == deciding
    best = next(h for h in history if h["step"] == result["training"]["best_step"])
    assert dev["mean"] == best["dev"]
    # The kept weights (in `loaded.model`, restored to the best evaluation) scored afresh.
    kind = kind_for("regression")
    for lang, split in val.items():
        enc = encoding.encode(loaded.tokenizer, split, 128, loaded.input_names)
        preds = cell_state.predict(loaded.model, enc, loaded.tokenizer.pad_token_id, torch.device("cpu"),
                              SHORT.precision, result["recipe"]["eval_batch"], kind)  # fmt: skip
        assert dev["per_language"][lang] == metrics.compute_metric("spearman", preds, enc.labels)


def test_scoring_every_language_at_every_evaluation_gives_the_same_result(
    tiny_models, seahorse_mirror, tmp_path, monkeypatch
):
    data = load_task("seahorse", seahorse_mirror)
    results = {}
    for setting in ("all", "deciding"):
        loaded = load_model(str(tiny_models["bert"]), "auto", 1, "regression", max_seq_len=128)
        seen = _languages_predicted(monkeypatch, loaded.tokenizer, loaded.input_names, data[1])
        results[setting] = train.run_cell(
            cell(tmp_path, tiny_models["bert"], task="seahorse", out_json=None,
                 data_dir=str(seahorse_mirror), dev_languages=setting),
            data=data,
        )  # fmt: skip
        n_evals = len(results[setting]["training"]["dev_history"])
        dev_calls = [lang for lang in seen if lang != "?"]  # "?": the test split's
        assert len(dev_calls) == (6 * n_evals if setting == "all" else 4 * n_evals + 2)
    a, b = results["all"], results["deciding"]
    assert set(a["dev"]["per_language"]) == set(SEAHORSE_DECIDING + ["tr", "vi"])
    assert a["dev"] == b["dev"] and a["report"] == b["report"]
    for key in ("dev_history", "best_step", "steps", "final_loss"):
        assert a["training"][key] == b["training"][key], key


def test_an_unknown_dev_languages_setting_is_refused(tiny_models, small_mirror, tmp_path):
    with pytest.raises(HarnessError, match="unknown dev_languages setting 'deciders'.*all"):
        train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                            dev_languages="deciders"))  # fmt: skip


def test_the_best_checkpoint_follows_the_metric_direction(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    """The loop asks `metrics.improves`: under a lower-is-better Spearman the kept
    evaluation is the one with the lowest dev score, and by default the highest."""
    import dataclasses

    from encoder_eval.core import metrics

    recipe = Recipe(max_steps=8, patience=99, max_seq_len=128, precision="fp32")
    cfg = cell(tmp_path, tiny_models["bert"], task="glue_stsb", data_dir=str(small_mirror),
               recipe=recipe, out_json=None, lr=1e-3)  # fmt: skip
    for higher in (True, False):
        spec = dataclasses.replace(metrics.METRIC_SPECS["spearman"], higher_is_better=higher)
        monkeypatch.setitem(metrics.METRIC_SPECS, "spearman", spec)
        result = train.run_cell(cfg)
        history = result["training"]["dev_history"]
        devs = [h["dev"] for h in history]
        print("higher_is_better", higher, "dev history", devs)
        assert len(set(devs)) == len(devs) == 4  # distinct, so the choice is a real one
        want = max(devs) if higher else min(devs)
        assert result["training"]["best_step"] == history[devs.index(want)]["step"]
        assert result["dev"]["mean"] == want


def test_under_holdout_selection_dev_is_the_slice_alone(
    tiny_models, seahorse_mirror, tmp_path, monkeypatch
):
    """With --selection-split holdout the slice of train replaces every dev language and
    decides alone: each evaluation scores it, and nothing is left to score after training."""
    from encoder_eval.data.holdout import HOLDOUT_KEY

    recipe = dataclasses.replace(SHORT, selection_split="holdout")
    data = load_task("seahorse", seahorse_mirror, with_test=False, selection_split="holdout")
    assert list(data[1]) == [HOLDOUT_KEY]
    loaded = load_model(str(tiny_models["bert"]), "auto", 1, "regression", max_seq_len=128)
    seen = _languages_predicted(monkeypatch, loaded.tokenizer, loaded.input_names, data[1])
    result = train.run_cell(cell(tmp_path, tiny_models["bert"], task="seahorse", phase="select",
                                 out_json=None, recipe=recipe, data_dir=str(seahorse_mirror)),
                            loaded=loaded, data=data)  # fmt: skip
    assert seen == [HOLDOUT_KEY] * len(result["training"]["dev_history"])
    assert list(result["dev"]["per_language"]) == [HOLDOUT_KEY]
    assert result["dev"]["languages_in_mean"] == [HOLDOUT_KEY]
