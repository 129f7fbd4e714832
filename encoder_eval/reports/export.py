"""Results in other tools' formats: EuroEval's benchmark-result records, and one JSON Lines
row per report example.

`euroeval_records` turns each (model, task) cell of an accepted `summarize` table into one
record of the kind EuroEval appends to `euroeval_benchmark_results.jsonl` (its
`BenchmarkResult`: dataset, task, dataset_languages, model, results {raw, total}, ...), so a
table made here can be placed beside EuroEval's. `example_rows` flattens the cells'
predictions files (`encoder_eval.cells.predictions`) into one row per example and seed, the
shape pandas, DuckDB or a spreadsheet read directly. docs/export.md documents both and says
where EuroEval's schema was read. The command is `encoder_eval.export`.
"""

from __future__ import annotations

import json
import math
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
from encoder_eval.data.tasks import TASK_KNOBS
from encoder_eval.plans.experiment import redact_data
from encoder_eval.reports.table import Table
from encoder_eval.reports.verdicts import included_cells

FORMATS = ("euroeval", "examples")
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


def _model_name(results: list[LoadedResult], model: str) -> str:
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
        "model": _model_name(results, model),
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
