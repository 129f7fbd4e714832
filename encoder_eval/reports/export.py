"""Results in other tools' formats: EuroEval's records (Every Eval Ever, and its older
`BenchmarkResult`), the Hub's model-page results, and one JSON Lines row per report example.

`euroeval_records` turns each (model, task) cell of an accepted `summarize` table into one
record of the kind EuroEval wrote to `euroeval_benchmark_results.jsonl` before 2026-03 (its
`BenchmarkResult`: dataset, task, dataset_languages, model, results {raw, total}, ...);
`eee_records` writes the same cells as "Every Eval Ever" (EEE, schema 0.2.1) records, the
only kind EuroEval's readers and leaderboard loader accept now. `example_rows` flattens the
cells' predictions files (`encoder_eval.cells.predictions`) into one row per example and
seed, the shape pandas, DuckDB or a spreadsheet read directly. The Hub's `.eval_results/`
files are `encoder_eval.reports.hub_results`. docs/export.md documents each format and
says where its schema was read. The command is `encoder_eval.export`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator

from encoder_eval.cells.predictions import (
    PredictionsError,
    check_against_result,
    load_predictions,
    predictions_path,
)
from encoder_eval.core.metrics import metric_spec
from encoder_eval.core.results import LoadedResult
from encoder_eval.data.models import HUB_ID, is_local_model
from encoder_eval.data.tasks import TASK_KNOBS, task_knobs
from encoder_eval.plans.experiment import redact_data
from encoder_eval.reports.table import Table
from encoder_eval.reports.verdicts import included_cells

# euroeval: EEE records (what EuroEval reads now; `eee` is the same format by the name the
# schema gives it); euroeval-legacy: its older BenchmarkResult records; hub-eval-results:
# the Hub's `.eval_results/` YAML files.
FORMATS = ("euroeval", "eee", "euroeval-legacy", "hub-eval-results", "examples")
# EuroEval's task names (its `Task.name`) for our tasks that are one of its tasks; any
# other task is exported under its problem type (single_label_classification, ...).
EUROEVAL_TASKS = {
    "glue_cola": "linguistic-acceptability",
    "glue_sst2": "sentiment-classification",
    "amazon_reviews_multi": "sentiment-classification",
    "synthetic_sentiment": "sentiment-classification",
}
# The z of EuroEval's `_se` entries: they hold 1.96 x the standard error of the mean over
# iterations (the half-width of a normal 95 % interval), not the standard error itself.
EUROEVAL_Z = 1.96
UNKNOWN = -1  # an int field our results do not record (parameters, vocabulary size)
# The EEE schema version EuroEval writes and reads (`EEE_SCHEMA_VERSION`, 0.2.1), and the
# name this harness gives itself as the evaluation library of an EEE record.
# The records are valid under 0.2.1 and 0.3.0 alike (0.3.0 requires two more strings in
# `model_info.additional_details`, which 0.2.1 allows; EEE_MODEL_DEPLOYMENT).
EEE_SCHEMA_VERSION = "0.2.1"
HARNESS_NAME = "encoder-eval-harness"
# EEE 0.3.0's two required model details. `deployment_type` says who controlled the
# inference deployment: the harness loads the weights and runs them in its own process
# (transformers), so "self_deployed". `model_availability` says whether the weights are
# public: loading a checkpoint does not tell (a Hub id may be gated or private, a local
# folder anything), so "unknown" (edit it if you publish the records and know).
EEE_MODEL_DEPLOYMENT = {"deployment_type": "self_deployed", "model_availability": "unknown"}


def model_name(results: list[LoadedResult], model: str) -> str:
    """The model as EuroEval names it (a Hub id): the recorded model path when the cells
    recorded one (`run --record-model-path`) and it is a Hub id, else the model's key in
    the table. A local directory is never written: the records are meant to be shared."""
    paths = {(r.data.get("provenance") or {}).get("model_path") for r in results}
    paths.discard(None)
    if len(paths) != 1:
        return model
    path = str(paths.pop())
    hub_id = HUB_ID.fullmatch(path) and not path.startswith(("~", ".")) and not is_local_model(path)
    return path if hub_id else model


def euroeval_record(table: Table, model: str, task: str, results: list[LoadedResult]) -> dict:
    """One EuroEval `BenchmarkResult` record of a table cell: `raw` holds each report seed's
    score (as a fraction, as EuroEval's raw iteration scores), `total` the mean and the
    95 % half-width x100 (as EuroEval's totals), keyed `test_<metric>`."""
    cell = table.cells[(model, task)]
    knobs = TASK_KNOBS[task]
    key = f"test_{cell.metric}"
    seeds = sorted(cell.scores)
    raw = [{key: float(cell.scores[s])} for s in seeds]
    n = len(seeds)
    half = EUROEVAL_Z * cell.std / math.sqrt(n) if cell.std is not None else None
    total = {
        key: 100 * cell.mean,
        f"{key}_se": float("nan") if half is None else 100 * half,
        "num_failed_instances": 0.0,
    }
    first = results[0].data if results else {}
    software = (first.get("provenance") or {}).get("software") or {}
    recipe = first.get("recipe") or {}
    return {
        "dataset": task,
        "task": EUROEVAL_TASKS.get(task, knobs.problem),
        "dataset_languages": list(
            (first.get("report") or {}).get("languages_in_mean") or knobs.euro_languages
        ),
        "model": model_name(results, model),
        "results": {"raw": raw, "total": total},
        "num_model_parameters": UNKNOWN,
        "max_sequence_length": int(recipe.get("max_seq_len") or UNKNOWN),
        "vocabulary_size": UNKNOWN,
        "merge": False,
        "generative": False,
        "generative_type": None,
        "few_shot": False,
        "validation_split": knobs.report_split == "validation",
        "euroeval_version": None,
        "transformers_version": software.get("transformers"),
        "torch_version": software.get("torch"),
        # Ours, ignored by EuroEval's reader (its model drops unknown keys): what the
        # numbers are, so a record read alone still says where it came from.
        "encoder_eval": {
            "model_key": model,
            "metric": cell.metric,
            "metric_label": metric_spec(cell.metric).label,
            "report_split": knobs.report_split,
            "seeds": seeds,
            "lr_key": cell.lr_key,
            "lr": cell.lr,
            "on_protocol": not cell.off_protocol and n == len(table.expected_seeds),
            "harness_version": software.get("harness"),
        },
    }


def euroeval_records(table: Table, results: list[LoadedResult]) -> list[dict]:
    """A record per cell of `table` with at least one counted seed, in table order, with
    no local path (`experiment.redact_data`)."""
    cells = included_cells(table, results)
    return [
        redact_data(euroeval_record(table, m, t, cells.get((m, t), [])))[0]
        for m in table.models
        for t in table.tasks
        if (m, t) in table.cells and table.cells[(m, t)].mean is not None
    ]


def _eee_interval(cell) -> dict | None:
    """The table's interval of the cell (`CellStats.t_interval`: Student t on n - 1
    degrees of freedom, cut to the metric's range) as an EEE confidence interval, x100;
    None for fewer than two seeds."""
    found = cell.t_interval
    if found is None:
        return None
    method = "Student t interval of the mean over report seeds (n - 1 degrees of freedom)"
    if cell.t_interval_cut:
        method += ", cut to the metric's range"
    return {
        "lower": 100 * found[0],
        "upper": 100 * found[1],
        "confidence_level": 0.95,
        "method": method,
    }


def _source_data(task: str, results: list[LoadedResult]) -> dict:
    """Where the cell's data came from, as an EEE `source_data`: the task's Hub dataset
    (its id, config, the split the score is on, the revision the cells read when they all
    read one from the Hub), or `other` for a task with no Hub dataset."""
    knobs = task_knobs(task)
    if knobs.hf_path is None:
        return {"dataset_name": task, "source_type": "other"}
    out: dict = {
        "dataset_name": task,
        "source_type": "hf_dataset",
        "hf_repo": knobs.hf_path,
        "hf_split": knobs.hub_splits.get(knobs.report_split, knobs.report_split),
    }
    details = {}
    if knobs.hf_config:
        details["config"] = knobs.hf_config
    elif knobs.hf_lang_configs:
        details["configs"] = json.dumps(knobs.hf_lang_configs, sort_keys=True)
    if revision := hub_revision(results):
        details["revision"] = revision
    if details:
        out["additional_details"] = details
    return out


def hub_revision(results: list[LoadedResult]) -> str | None:
    """The Hub dataset commit every result of `results` read (its data identity,
    `hub:<dataset>@<commit>`), or None when one was read otherwise (a mirror) or they
    read different commits."""
    found = set()
    for r in results:
        identity = str(((r.data.get("provenance") or {}).get("data") or {}).get("identity"))
        found.add(identity.rpartition("@")[2] if identity.startswith("hub:") else None)
    return found.pop() if len(found) == 1 and None not in found else None


def eee_record(
    table: Table, model: str, task: str, results: list[LoadedResult], now: float
) -> dict:
    """One "Every Eval Ever" record (schema 0.2.1, valid under 0.3.0 too) of a table cell, as EuroEval's
    `BenchmarkResult.to_eee_dict` lays one out (src/euroeval/eee_utils.py), so that
    EuroEval's `from_eee_dict` reads back the `BenchmarkResult` fields of
    `euroeval_record`. Where EuroEval would write its own name or a null (which the
    schema's string-only `additional_details` refuse), ours differ: the evaluation library
    is this harness, a value we do not have is left out, and the interval is the table's
    (docs/export.md lists each field)."""
    legacy = euroeval_record(table, model, task, results)
    cell = table.cells[(model, task)]
    spec = metric_spec(cell.metric)
    key = f"test_{cell.metric}"
    retrieved = str(int(now))
    score = legacy["results"]["total"][key]
    uncertainty: dict = {"num_samples": cell.n}
    if cell.std is not None:
        uncertainty["standard_deviation"] = 100 * cell.std
        uncertainty["standard_error"] = {
            "value": 100 * cell.std / math.sqrt(cell.n),
            "method": "analytic (standard deviation / sqrt(n) over report seeds)",
        }
    if (ci := _eee_interval(cell)) is not None:
        uncertainty["confidence_interval"] = ci
    low, high = spec.score_range or (None, None)
    metric_config: dict = {
        "evaluation_description": f"{spec.label} x100 on the {legacy['encoder_eval']['report_split']} "
        f"split, mean over {cell.n} fine-tuning seed(s)",
        "metric_id": cell.metric,
        "metric_name": spec.label,
        "metric_unit": "percent",
        "lower_is_better": not spec.higher_is_better,
    }
    if low is not None:  # the schema asks a continuous score for both bounds
        metric_config.update(score_type="continuous", min_score=100 * low, max_score=100 * high)
    versions = {
        k: legacy[k] for k in ("transformers_version", "torch_version") if legacy[k] is not None
    }
    created = sorted(
        str(r.data["created_at"]) for r in results if r.data.get("created_at") is not None
    )
    record: dict = {
        "schema_version": EEE_SCHEMA_VERSION,
        "evaluation_id": f"{task}/{legacy['model']}/{retrieved}",
        "retrieved_timestamp": retrieved,
        "source_metadata": {
            "source_name": HARNESS_NAME,
            "source_type": "evaluation_run",
            "source_organization_name": "unknown",
            "evaluator_relationship": "other",
        },
        "model_info": {
            "name": legacy["model"],
            "id": legacy["model"],
            "additional_details": {
                "num_model_parameters": str(legacy["num_model_parameters"]),
                "max_sequence_length": str(legacy["max_sequence_length"]),
                "vocabulary_size": str(legacy["vocabulary_size"]),
                "merge": "false",
                "generative": "false",
                **EEE_MODEL_DEPLOYMENT,
            },
        },
        "eval_library": {
            "name": HARNESS_NAME,
            "version": legacy["encoder_eval"]["harness_version"] or "unknown",
            "additional_details": {
                "dataset": task,
                "languages": json.dumps(legacy["dataset_languages"], ensure_ascii=False),
                "task": legacy["task"],
                "few_shot": "false",
                "validation_split": str(legacy["validation_split"]).lower(),
                **versions,
                "raw_results": json.dumps(legacy["results"]["raw"], ensure_ascii=False),
                "encoder_eval": json.dumps(legacy["encoder_eval"], ensure_ascii=False),
            },
        },
        "evaluation_results": [
            {
                "evaluation_name": key,
                "source_data": _source_data(task, results),
                "metric_config": metric_config,
                "score_details": {
                    "score": score,
                    "details": {"num_failed_instances": "0.0"},
                    "uncertainty": uncertainty,
                },
            }
        ],
    }
    if created:
        record["evaluation_timestamp"] = created[-1]
    if "transformers_version" in versions:
        record["model_info"]["inference_engine"] = {
            "name": "transformers",
            "version": versions["transformers_version"],
        }
    return record


def eee_records(table: Table, results: list[LoadedResult], now: float | None = None) -> list[dict]:
    """An EEE record per cell of `table` with at least one counted seed, in table order,
    with no local path (`experiment.redact_data`); `now` (Unix time, default the clock)
    is the records' `retrieved_timestamp`."""
    now = time.time() if now is None else now
    cells = included_cells(table, results)
    records = []
    for m in table.models:
        for t in table.tasks:
            if (m, t) in table.cells and table.cells[(m, t)].mean is not None:
                record = redact_data(eee_record(table, m, t, cells.get((m, t), []), now))[0]
                # Made of redacted parts; redacted whole, it would read as a local path.
                name = record["model_info"]["name"]
                record["evaluation_id"] = f"{t}/{name}/{record['retrieved_timestamp']}"
                records.append(record)
    return records


def example_rows(table: Table, results: list[LoadedResult]) -> Iterator[dict]:
    """One row per example, language and seed of every cell the table counts, read from the
    cells' predictions files; a file that does not recompute its result's scores is
    refused (`check_against_result`), as `compare` refuses it."""
    cells = included_cells(table, results)
    for m in table.models:
        for t in table.tasks:
            for r in sorted(cells.get((m, t), []), key=lambda r: r.cell["seed"]):
                preds = load_predictions(predictions_path(r.path))
                problems = check_against_result(preds, r.result)
                if problems:  # a stale file from another run: never exported as this cell's
                    raise PredictionsError(f"{predictions_path(r.path)}: {'; '.join(problems)}")
                for lang, p in preds.languages.items():
                    for i in range(len(p)):
                        row = {
                            "model": m,
                            "task": t,
                            "seed": r.cell["seed"],
                            "lr_key": r.cell["lr_key"],
                            "metric": preds.metric,
                            "split": preds.split,
                            "language": lang,
                            "id": p.ids[i],
                            "gold": p.labels[i],
                            "prediction": p.predictions[i],
                        }
                        if p.query_ids is not None:
                            row.update(
                                query_id=p.query_ids[i],
                                doc_id=p.doc_ids[i],
                                first_stage_rank=p.first_stage_ranks[i],
                            )
                        yield row


def to_jsonl(rows) -> str:
    """JSON Lines: one object a line, UTF-8 as is, NaN written as EuroEval's writer writes
    it (Python's json, `NaN`)."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
