"""Valid result JSON dicts built directly, for fast tests of selection and aggregation."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from encoder_eval.protocol import LR_GRID, PROTOCOL_RECIPE, off_protocol_reasons
from encoder_eval.results import SCHEMA_NAME, SCHEMA_VERSION, result_filename, validate_result
from encoder_eval.tasks import task_knobs


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
) -> dict:
    """A result that passes `validate_result`; `score` is dev.mean (select) or report.mean."""
    lr = LR_GRID[lr_key]
    rec = {**PROTOCOL_RECIPE.to_dict(), "effective_batch": 32, "micro_batch": 32,
           "grad_accumulation": 1, "eval_batch": 128, "warmup_steps": 100,
           "optimizer": "AdamW", "schedule": "linear warmup, linear decay",
           "pair_format": "pair", "batching": "length-grouped", "mode": "auto"}  # fmt: skip
    rec.update(recipe or {})
    if on_protocol is None:
        from encoder_eval.protocol import Recipe

        fields = {k: rec[k] for k in PROTOCOL_RECIPE.to_dict()}
        reasons = off_protocol_reasons(Recipe(**fields), lr, seed, phase)
    else:
        reasons = [] if on_protocol else ["forced off-protocol for a test"]
    ok = status == "ok"
    data = {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "cell": {
            "model": model,
            "task": task,
            "lr": lr,
            "lr_key": lr_key,
            "seed": seed,
            "phase": phase,
        },  # fmt: skip
        "status": status,
        "metric": task_knobs(task).metric,
        "dev": {"per_language": {"en": score}, "mean": score} if ok else None,
        "report": {
            "split": task_knobs(task).report_split,
            "per_language": {"en": score},
            "mean": score,
        }
        if ok and phase == "report"
        else None,  # fmt: skip
        "training": {"steps": 10, "diverged_at_step": None if ok else 3},
        "recipe": rec,
        "protocol": {"on_protocol": not reasons, "off_protocol_reasons": reasons},
        "provenance": {
            "software": {"transformers": transformers, "torch": "2.4"},
            "model_revision": revision,
        },
    }
    errors = validate_result(data)
    assert not errors, errors
    return data


def write_result(directory: Path, data: dict) -> Path:
    cell = data["cell"]
    path = Path(directory) / result_filename(cell["model"], cell["task"], cell["lr"], cell["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_many(directory: Path, results: list[dict]) -> list[Path]:
    return [write_result(directory, copy.deepcopy(r)) for r in results]
