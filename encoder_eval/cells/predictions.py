"""Per-example predictions of a report cell: the file `compare` pairs models on.

Every report cell writes, beside its result `X.json`, the file `X.predictions.json`
(`PREDICTIONS_SUFFIX`): per language of the report split, each example's id, the model's
prediction (a class id, or a score for regression) and the gold label. An example's id is
its 0-based position in that language's report split as the loader reads it; two cells
whose results name the same `data_identity` read the same rows in the same order, so equal
ids are the same example. The file is written atomically, before the result, so a result
never points at a half-written predictions file.

`load_predictions` validates a file and `check_against_result` recomputes the cell's report
scores from it: a predictions file that does not reproduce its result's numbers (a stale
file from another run) is refused, never silently compared.

A ranking cell's file holds the same lists (a prediction is a candidate's score, a label
its 0/1 relevance) plus, per language, each candidate's `query_ids`, `doc_ids` and
`first_stage_ranks`, which its per-query metrics need. Beside it the cell also writes the
ranking as a TREC run file `X.run.trec` (`TREC_SUFFIX`): one line `qid Q0 docid rank score
run_name` per candidate, ranked as the metrics rank (score, ties by first-stage rank). Its
scores strictly decrease within a query, in that order (`trec_scores`), so that trec_eval,
which ignores the rank column and breaks ties its own way, ranks as the metrics do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from encoder_eval.core import metrics
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import (
    FileProblem,
    MissingFile,
    atomic_open,
    read_json,
    write_json_atomic,
)
from encoder_eval.core.results import PREDICTIONS_SUFFIX, TREC_SUFFIX
from encoder_eval.core.schema import (
    CellId,
    CellResult,
    all_ints,
    all_numbers,
    data_identity,
    is_number,
)

SCHEMA_NAME = "encoder-eval-predictions"
SCHEMA_VERSION = 1
# Recomputed scores must equal the recorded ones up to float summation order.
SCORE_TOLERANCE = 1e-9
RANK_FIELDS = ("query_ids", "doc_ids", "first_stage_ranks")  # a ranking language's extra lists


class PredictionsError(HarnessError, ValueError):
    """A predictions file that is missing, unreadable, invalid or out of step with its result."""


@dataclass(frozen=True)
class LanguagePredictions:
    """One language of the report split: example ids, predictions and labels, aligned."""

    ids: list[int]
    predictions: list
    labels: list
    query_ids: list[str] | None = None  # ranking cells: each candidate's query...
    doc_ids: list[str] | None = None  # ...its id...
    first_stage_ranks: list[int] | None = None  # ...and its first-stage rank (breaks ties)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def rank_groups(self) -> metrics.RankGroups | None:
        if self.query_ids is None:
            return None
        return metrics.RankGroups(self.query_ids, self.first_stage_ranks)

    def to_dict(self) -> dict:
        out = {"ids": self.ids, "predictions": self.predictions, "labels": self.labels}
        if self.query_ids is not None:
            out.update({name: getattr(self, name) for name in RANK_FIELDS})
        return out


@dataclass(frozen=True)
class CellPredictions:
    """A report cell's per-example predictions, per language, with the cell they belong to."""

    cell: CellId
    metric: str
    split: str | None
    data_identity: str
    languages: dict[str, LanguagePredictions]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "cell": self.cell.to_dict(),
            "metric": self.metric,
            "split": self.split,
            "data_identity": self.data_identity,
            "languages": {lang: p.to_dict() for lang, p in self.languages.items()},
        }

    @property
    def ranked(self) -> bool:
        """Whether these are a ranking cell's candidates (scored per query)."""
        return any(p.query_ids is not None for p in self.languages.values())

    @classmethod
    def from_dict(cls, obj: Any) -> CellPredictions:
        """The typed form of a predictions object; PredictionsError naming the first problem."""
        problem = _problem(obj)
        if problem:
            raise PredictionsError(problem)
        return cls(
            cell=CellId.from_dict(obj["cell"]),
            metric=obj["metric"],
            split=obj["split"],
            data_identity=obj["data_identity"],
            languages={
                lang: LanguagePredictions(
                    v["ids"], v["predictions"], v["labels"], *(v.get(name) for name in RANK_FIELDS)
                )
                for lang, v in obj["languages"].items()
            },
        )

    def scores(self) -> dict[str, float | None]:
        """The metric per language, recomputed from the predictions (None: undefined). A
        pointwise metric is computed by `metrics.score_array` (numpy: the same values and
        undefined cases as `compute_metric`, without scikit-learn's per-call checks, which
        cost most of a 14-model table's loading)."""
        if not self.ranked:
            return {
                lang: metrics.score_array(
                    self.metric, np.asarray(p.predictions), np.asarray(p.labels)
                )
                for lang, p in self.languages.items()
            }
        groups = {k: p.rank_groups for k, p in self.languages.items() if p.query_ids is not None}
        return metrics.score_splits(
            self.metric,
            {lang: p.predictions for lang, p in self.languages.items()},
            {lang: p.labels for lang, p in self.languages.items()},
            groups,
        )[0]


def predictions_path(result_path: str | os.PathLike) -> Path:
    """Where the predictions of the result file `result_path` live."""
    return Path(str(result_path).removesuffix(".json") + PREDICTIONS_SUFFIX)


def trec_run_path(result_path: str | os.PathLike) -> Path:
    """Where the TREC run file of the ranking result `result_path` lives."""
    return Path(str(result_path).removesuffix(".json") + TREC_SUFFIX)


def trec_scores(ranked: Sequence[float]) -> list[float]:
    """The scores to write for one query's candidates, given in ranked order: strictly
    decreasing, even read as 32-bit floats, so that trec_eval ranks them in this order.

    trec_eval ignores a run's rank column: it sorts a query's lines by score, highest
    first, and breaks a tie by document id, descending (`comp_sim_docno` in
    `form_res_rels.c` of usnistgov/trec_eval, commit f4253652c8efd0d86ddffd0d163cc0a0f813111a:
    `strcmp(p2->docno, p1->docno)` on equal `sim`). Until its commit dc0c991 (2023) that
    score was a C `float`, and pytrec_eval (terrierteam/pytrec_eval, commit
    68c150b2a8341b4655fbd545ca009cd5c5efcfc8) still builds trec_eval de6a29f8 with
    `float sim`, so two scores that differ only beyond float32's precision tie there too.
    Each candidate keeps the model's own score when it falls below the previous one's in
    float32; otherwise (a tie, or a gap float32 cannot hold) it gets the next float32
    below the previous written score. A query's scores move by at most one float32 step
    (6e-8 to 1.2e-7 relative) per nudged candidate before them, so the column keeps the
    model's scale and meaning for a tool that fuses or thresholds scores; the exact
    scores are in the predictions file."""
    out: list[float] = []
    previous = None
    for score in ranked:
        with np.errstate(over="ignore"):  # out of range: refused below
            single = np.float32(score)
        if previous is not None and not single < previous:
            single = np.nextafter(previous, np.float32(-np.inf))
            score = float(single)
        if not np.isfinite(single):
            raise PredictionsError(
                f"score {score!r} is beyond float32's range; trec_eval cannot read it"
            )
        out.append(float(score))
        previous = single
    return out


def trec_lines(preds: CellPredictions) -> list[str]:
    """The TREC run of a ranking cell's predictions: per query, its candidates ranked by
    score (highest first, ties by first-stage rank), as `qid Q0 docid rank score run_name`,
    the scores made strictly decreasing in that order (`trec_scores`). The run name is the
    cell (model_task_lrkey_sSEED)."""
    c = preds.cell
    run = f"{c.model}_{c.task}_{c.lr_key}_s{c.seed}"
    lines = []
    for p in preds.languages.values():
        for qid, order in metrics.ranked_order(p.predictions, p.rank_groups).items():
            scores = trec_scores([p.predictions[i] for i in order])
            for position, (i, score) in enumerate(zip(order, scores, strict=True), start=1):
                lines.append(f"{qid} Q0 {p.doc_ids[i]} {position} {score!r} {run}")
    return lines


def write_trec_run(path: str | os.PathLike, preds: CellPredictions) -> None:
    """Write the TREC run file of a ranking cell's predictions atomically; an id holding
    whitespace (which would split a TREC line) is refused."""
    c = preds.cell
    for value in (
        c.model,
        c.task,
        *(x for p in preds.languages.values() for x in (*p.query_ids, *p.doc_ids)),
    ):
        if not str(value) or any(ch.isspace() for ch in str(value)):
            raise PredictionsError(
                f"id {value!r} is empty or holds whitespace; a TREC run file cannot hold it"
            )
    with atomic_open(path, "w") as handle:
        handle.write("".join(line + "\n" for line in trec_lines(preds)))


def from_cell(result: dict, per_language: dict[str, dict]) -> CellPredictions:
    """The predictions of a cell just scored: `per_language` maps a language to its
    "predictions" and "labels" lists (in report-split order, which gives the ids), and for
    a ranking cell its "query_ids", "doc_ids" and "first_stage_ranks"."""
    report = result.get("report") or {}
    return CellPredictions(
        cell=CellId.from_dict(result["cell"]),
        metric=result["metric"],
        split=report.get("split"),
        data_identity=data_identity(result.get("provenance") or {}),
        languages={
            lang: LanguagePredictions(
                ids=list(range(len(v["labels"]))),
                predictions=list(v["predictions"]),
                labels=list(v["labels"]),
                **{name: list(v[name]) for name in RANK_FIELDS if name in v},
            )
            for lang, v in per_language.items()
        },
    )


def write_predictions(path: str | os.PathLike, preds: CellPredictions) -> None:
    """Write `preds` atomically (no indentation: the file is data, not for reading)."""
    problem = _problem(preds.to_dict())
    if problem:  # a bug in the caller; never write a file `load_predictions` would refuse
        raise PredictionsError(f"refusing to write invalid predictions to {path}: {problem}")
    write_json_atomic(path, preds.to_dict(), indent=None)


def load_predictions(path: str | os.PathLike) -> CellPredictions:
    """Read and validate one predictions file; PredictionsError says what is wrong."""
    path = Path(path)
    try:
        obj = read_json(path)
    except MissingFile:
        raise PredictionsError(f"{path}: no predictions file") from None
    except FileProblem as exc:
        raise PredictionsError(f"{path}: unreadable predictions file ({exc.reason})") from None
    try:
        return CellPredictions.from_dict(obj)
    except PredictionsError as exc:
        raise PredictionsError(f"{path}: {exc}") from None


def check_against_result(preds: CellPredictions, result: CellResult) -> list[str]:
    """Every way `preds` disagrees with the result it sits beside: another cell, metric,
    split or data, or per-language scores that do not recompute to the recorded ones."""
    problems = []
    if preds.cell != result.cell:
        problems.append(f"belongs to cell {preds.cell.to_dict()}, not {result.cell.to_dict()}")
    if preds.metric != result.metric:
        problems.append(f"metric {preds.metric!r}, the result's is {result.metric!r}")
    if preds.data_identity != result.data_identity:
        problems.append(f"read data {preds.data_identity!r}, the result {result.data_identity!r}")
    if problems or result.report is None:
        return problems
    if preds.split != result.report.split:
        problems.append(f"split {preds.split!r}, the result's is {result.report.split!r}")
    recorded = result.report.per_language
    if set(preds.languages) != set(recorded):
        problems.append(f"languages {sorted(preds.languages)}, the result's are {sorted(recorded)}")
        return problems
    for lang, score in preds.scores().items():
        want = recorded[lang]
        same = (score is None and want is None) or (
            score is not None and is_number(want) and abs(score - want) <= SCORE_TOLERANCE
        )
        if not same:
            problems.append(f"{lang}: predictions score {score}, the result records {want}")
    return problems


def _problem(obj: Any) -> str | None:
    """The first way `obj` fails the predictions schema, or None when it is valid."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if obj.get("schema") != SCHEMA_NAME:
        return f"schema is {obj.get('schema')!r}, expected {SCHEMA_NAME!r}"
    if obj.get("schema_version") != SCHEMA_VERSION:
        return f"schema_version {obj.get('schema_version')!r}, this harness reads {SCHEMA_VERSION}"
    try:
        CellId.from_dict(obj.get("cell"))
    except (KeyError, TypeError, AttributeError):
        return "cell: not a cell id (model, task, lr, lr_key, seed, phase)"
    if obj.get("metric") not in metrics.METRIC_SPECS:
        return f"metric {obj.get('metric')!r} is not one of {', '.join(metrics.METRIC_SPECS)}"
    if not isinstance(obj.get("data_identity"), str):
        return "data_identity: not a string"
    langs = obj.get("languages")
    if not isinstance(langs, dict) or not langs:
        return "languages: not a non-empty object"
    for lang, v in langs.items():
        if not isinstance(v, dict) or not all(
            isinstance(v.get(k), list) for k in ("ids", "predictions", "labels")
        ):
            return f"languages.{lang}: needs lists ids, predictions and labels"
        n = {len(v["ids"]), len(v["predictions"]), len(v["labels"])}
        if len(n) != 1 or not v["ids"]:
            return f"languages.{lang}: ids, predictions and labels differ in length or are empty"
        if not all_ints(v["ids"]):
            return f"languages.{lang}: ids must be integers"
        if len(set(v["ids"])) != len(v["ids"]):
            return f"languages.{lang}: ids repeat"
        for key in ("predictions", "labels"):
            if not all_numbers(v[key]):
                return f"languages.{lang}.{key}: every entry must be a finite number"
        if metrics.METRIC_SPECS[obj["metric"]].granularity == "grouped":
            for key in RANK_FIELDS:
                if not isinstance(v.get(key), list) or len(v[key]) != len(v["ids"]):
                    return f"languages.{lang}.{key}: a ranking cell needs one entry per candidate"
    return None
