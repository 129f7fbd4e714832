"""Valid result JSON dicts built through the result schema, for fast tests of selection and
aggregation."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

from encoder_eval.core import comparability
from encoder_eval.core.protocol import LR_GRID, PROTOCOL_RECIPE, off_protocol_reasons
from encoder_eval.core.results import result_filename, validate_result
from encoder_eval.core.schema import CellId, CellResult, Protocol, ScoreSection, Training
from encoder_eval.data.tasks import task_knobs
from encoder_eval.plans import selection


def make_result(
    model: str,
    task: str,
    lr_key: str,
    seed: int,
    phase: str,
    score: float | None = 0.5,
    *,
    status: str = "ok",
    recipe: dict | None = None,
    transformers: str = "4.56.2",
    revision: str = "rev-a",
    on_protocol: bool | None = None,
    data_identity: str | None = None,
    mode: str = "auto",
    trust_remote_code: bool = False,
    selection_split: str = "dev",
) -> dict:
    """A result that passes `validate_result`; `score` is dev.mean (select) or report.mean
    (None: undefined, as for a constant prediction)."""
    lr = LR_GRID[lr_key]
    rec = {**PROTOCOL_RECIPE.to_dict(), "effective_batch": 32, "micro_batch": 32,
           "grad_accumulation": 1, "eval_batch": 128, "warmup_steps": 100,
           "optimizer": "AdamW", "schedule": "linear warmup, linear decay",
           "pair_format": "pair", "batching": "length-grouped", "mode": mode,
           "selection_split": selection_split}  # fmt: skip
    rec.update(recipe or {})
    if on_protocol is None:
        from encoder_eval.core.protocol import Recipe

        fields = {k: rec[k] for k in PROTOCOL_RECIPE.to_dict()}
        reasons = off_protocol_reasons(Recipe(**fields), lr, seed, phase)
    else:
        reasons = [] if on_protocol else ["forced off-protocol for a test"]
    ok = status == "ok"
    undefined = {"en": "constant predictions"} if score is None else {}
    knobs = task_knobs(task)
    scores = ScoreSection(per_language={"en": score}, mean=score, languages_in_mean=["en"],
                          undefined=undefined)  # fmt: skip
    result = CellResult(
        cell=CellId(model=model, task=task, lr=lr, lr_key=lr_key, seed=seed, phase=phase),
        status=status,
        metric=knobs.metric,
        dev=scores if ok else None,
        report=dataclasses.replace(scores, split=knobs.report_split)
        if ok and phase == "report"
        else None,
        training=Training(steps=10, diverged_at_step=None if ok else 3),
        recipe=rec,
        protocol=Protocol(on_protocol=not reasons, off_protocol_reasons=reasons),
        provenance={
            "software": {"transformers": transformers, "torch": "2.4"},
            "model_revision": revision,
            "trust_remote_code": trust_remote_code,
            "data": {"identity": data_identity or f"hub:{knobs.hf_path}@sha-a"},
        },
        created_at="2026-01-01T00:00:00+00:00",
    )
    data = result.to_dict()
    errors = validate_result(data)
    assert not errors, errors
    return data


def make_selection(lr_keys: dict[tuple[str, str], str], **result_kw) -> dict:
    """A valid selection document choosing `lr_keys[(model, task)]`, whose select cells ran
    with what `make_result(**result_kw)` describes."""

    pairs: dict[str, dict] = {}
    for (model, task), key in lr_keys.items():
        setup = comparability.cell_setup(make_result(model, task, key, 42, "select", **result_kw))
        pairs.setdefault(model, {})[task] = {
            "lr_key": key, "lr": LR_GRID[key], "partial": False, "on_protocol": True,
            "select_setup": setup,
        }  # fmt: skip
    return {"schema": selection.SCHEMA, "version": selection.VERSION, "on_protocol": True,
            "policy": {"lr_keys": list(LR_GRID), "seeds": [42, 43, 44]}, "pairs": pairs}  # fmt: skip


def write_result(directory: Path, data: dict) -> Path:
    cell = data["cell"]
    path = Path(directory) / result_filename(cell["model"], cell["task"], cell["lr"], cell["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_many(directory: Path, results: list[dict]) -> list[Path]:
    return [write_result(directory, copy.deepcopy(r)) for r in results]


def write_cell_with_predictions(
    directory: Path,
    model: str,
    task: str,
    lr_key: str,
    seed: int,
    predictions: list,
    labels: list,
    **result_kw,
) -> Path:
    """A report result whose score is its `predictions`' metric on `labels` (one language,
    "en"), written with its predictions file, as a report cell writes both."""
    from encoder_eval.cells import predictions as preds_mod
    from encoder_eval.core import metrics

    score = metrics.compute_metric(task_knobs(task).metric, predictions, labels)
    data = make_result(model, task, lr_key, seed, "report", score, **result_kw)
    path = write_result(directory, data)
    cell = preds_mod.from_cell(data, {"en": {"predictions": predictions, "labels": labels}})
    preds_mod.write_predictions(preds_mod.predictions_path(path), cell)
    return path
