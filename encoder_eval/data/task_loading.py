"""A task's rows turned into checked model-input splits: the loaders.

Every built-in task loads through `load_generic` or, for a ranking task, `load_ranking`
(`loader_for` picks one from the task row); each returns `(train_dict, per_lang_val,
per_lang_test, num_labels, problem)`. Rows are read by `encoder_eval.data.sources` and run
through the same post-processing after, whichever source they come from, so a mirror and
the Hub give the same inputs. A split of a language that is empty, single-class or has a
constant target is refused here, before any model work.

A split is a dict of columns: `text` (list[str]), `text_pair` (list[str], pair tasks only)
and `label` (list[int] or list[float]). A ranking split (problem type `RANKING`) holds one
row per (query, candidate) pair, with `text` the query, `text_pair` the candidate, `label`
its relevance (0 or 1), and the columns `query_id`, `doc_id` and `first_stage_rank`.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from typing import Any

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import RANKING, REGRESSION
from encoder_eval.data.formatters import FORMATTERS, LABEL_MAPS, ROW_GROUPINGS
from encoder_eval.data.holdout import apply_selection_split
from encoder_eval.data.sources import read_split, resolve_data_dir, task_data_folder
from encoder_eval.data.splits import LoaderResult, Split
from encoder_eval.data.tasks import TaskKnobs, task_knobs

TRAIN_SHUFFLE_SEED = (
    20240531  # fixed: the multilingual train concatenation is the same for every cell
)


def rows_to_split(task: str, rows: list[dict], where: str) -> Split:
    """Turn raw rows into the model-input columns, checking fields and labels as it goes."""
    knobs = task_knobs(task)
    if knobs.row_grouping:
        rows = ROW_GROUPINGS[knobs.row_grouping](rows, where)
    texts: list[str] = []
    pairs: list[str] = []
    labels: list = []
    formatter = FORMATTERS.get(knobs.inputs[0]) if len(knobs.inputs) == 1 else None
    label_of = LABEL_MAPS[knobs.label_map] if knobs.label_map else None
    for number, row in enumerate(rows, start=1):
        for alias, canonical in knobs.field_aliases.items():
            if canonical not in row and alias in row:
                row = {**row, canonical: row[alias]}
        try:
            if formatter is not None:
                text, pair = formatter(row)
            else:
                text = row[knobs.inputs[0]]
                pair = row[knobs.inputs[1]] if len(knobs.inputs) > 1 else None
            label = label_of(row) if label_of else row[knobs.label_field]
        except KeyError as exc:
            raise HarnessError(
                f"{where}: row {number} has no field {exc.args[0]!r} (task {task!r} needs "
                f"{', '.join(knobs.inputs)} and {knobs.label_field})"
            ) from None
        except (TypeError, ValueError) as exc:
            raise HarnessError(f"{where}: row {number}: {exc}") from None
        label = _check_label(knobs, label, where, number)
        texts.append("" if text is None else str(text))
        if pair is not None:
            pairs.append(str(pair))
        labels.append(label)
    if pairs and len(pairs) != len(texts):
        raise HarnessError(f"{where}: some rows have a second text and some do not")
    split: Split = {"text": texts, "label": labels}
    if pairs:
        split["text_pair"] = pairs
    return split


def _check_label(knobs: TaskKnobs, label: Any, where: str, number: int) -> int | float:
    if knobs.problem == REGRESSION:
        try:
            value = float(label)
        except (TypeError, ValueError):
            raise HarnessError(f"{where}: row {number}: label {label!r} is not a number") from None
        if not math.isfinite(value):
            raise HarnessError(f"{where}: row {number}: label {label!r} is not finite")
        return value
    if isinstance(label, str) and label in knobs.label_names:
        return knobs.label_names.index(label)
    if isinstance(label, bool) or not isinstance(label, int | float) or int(label) != label:
        raise HarnessError(
            f"{where}: row {number}: label {label!r} is not an integer class id"
            + (f" nor one of {', '.join(knobs.label_names)}" if knobs.label_names else "")
        )
    if not 0 <= int(label) < knobs.num_labels:
        hint = " (-1 marks a hidden test label)" if label == -1 else ""
        raise HarnessError(
            f"{where}: row {number}: label {label} is outside 0..{knobs.num_labels - 1}{hint}"
        )
    return int(label)


def concat_and_shuffle(splits: list[Split], seed: int = TRAIN_SHUFFLE_SEED) -> Split:
    """Concatenate splits column-wise and shuffle the rows with a fixed seed."""
    keys = splits[0].keys()
    merged: Split = {k: [v for s in splits for v in s[k]] for k in keys}
    order = list(range(len(merged["label"])))
    random.Random(seed).shuffle(order)
    return {k: [col[i] for i in order] for k, col in merged.items()}


def _nonempty(split: Split, task: str, name: str) -> Split:
    if not split["label"]:
        raise HarnessError(
            f"task {task!r}: the {name} split is empty; check its data (the mirror file under "
            "--data-dir, or the Hub dataset) holds rows for it"
        )
    return split


def _varied(split: Split, knobs: TaskKnobs, task: str, name: str, lang: str, where: str) -> Split:
    """Refuse, before any model work, a split whose labels are all one class or one value."""
    labels = split["label"]
    if len(set(labels)) > 1:
        return split
    if knobs.problem == REGRESSION:
        what = f"has a constant target (all {len(labels)} targets are {labels[0]!r})"
        why = "a regression needs targets that vary (Spearman of a constant is undefined)"
        fix = (
            "a schema the loader does not know, or a target it does not read, gives every "
            "row the same target; give the split rows whose targets differ"
        )
    else:
        what = f"holds a single class (all {len(labels)} labels are {labels[0]!r})"
        why = "a classifier needs two classes or more to learn from and to be scored on"
        fix = (
            "a mirror cut to the first rows of a file sorted by label holds one class; give "
            "the split rows of several classes, e.g. a seeded sample of the file"
        )
    raise HarnessError(
        f"task {task!r}: the {name} split of language {lang!r} {what} ({where}); {why}. "
        f"Fix its data (the mirror file under --data-dir, or the Hub dataset and revision): "
        f"{fix}"
    )


def _read_checked(
    task: str, split: str, data_dir, convert: Callable[[str, list, str], Split]
) -> dict[str, Split]:
    """Each language of `split`, read, converted by `convert(task, rows, where)` and checked
    (not empty; not single-class or constant)."""
    knobs = task_knobs(task)
    out = {}
    for lang, (rows, where) in read_split(task, split, data_dir).items():
        part = _nonempty(convert(task, rows, where), task, f"{split} ({lang})")
        out[lang] = _varied(part, knobs, task, split, lang, where)
    return out


def load_generic(
    task: str, data_dir: str | os.PathLike | None = None, with_test: bool = True
) -> LoaderResult:
    """The loader every built-in task uses: read, convert, concatenate languages for training.

    For multilingual tasks the train splits of all languages are concatenated and shuffled
    with `TRAIN_SHUFFLE_SEED`; validation and test stay per language. For tasks whose report
    split is validation, `per_lang_test` is the validation data itself. With
    `with_test=False` (select-phase cells) a labelled test split is not even read. A split
    of a language that is empty, single-class or has a constant target is an error here,
    before any model work.
    """
    knobs = task_knobs(task)
    data_dir = resolve_data_dir(data_dir)

    def per_lang(split: str) -> dict[str, Split]:
        return _read_checked(task, split, data_dir, rows_to_split)

    train_parts = per_lang("train")
    train = (
        concat_and_shuffle(list(train_parts.values()))
        if knobs.multilingual
        else (next(iter(train_parts.values())))
    )
    val = per_lang("validation")
    if knobs.report_split == "validation":
        test = val
    else:
        test = per_lang("test") if with_test else {}
    return train, val, test, knobs.num_labels, knobs.problem


def ranking_rows_to_split(task: str, rows: list[dict], where: str) -> Split:
    """Turn (query, candidate) rows into a ranking split, checking each row: the query and
    candidate texts and ids, a 0/1 relevance label, a positive integer first-stage rank, and
    no candidate twice in one query nor two candidates at one rank. Rows stored several
    candidates to a row are first expanded by the task's `row_grouping`."""
    knobs = task_knobs(task)
    if knobs.row_grouping:
        rows = ROW_GROUPINGS[knobs.row_grouping](rows, where)
    fields_needed = (
        *knobs.inputs,
        knobs.label_field,
        knobs.query_field,
        knobs.doc_field,
        knobs.first_stage_field,
    )
    split: Split = {
        k: [] for k in ("text", "text_pair", "label", "query_id", "doc_id", "first_stage_rank")
    }
    seen_docs: set = set()
    seen_ranks: set = set()
    for number, row in enumerate(rows, start=1):
        missing = [f for f in fields_needed if f not in row]
        if missing:
            raise HarnessError(
                f"{where}: row {number} has no field {missing[0]!r} (task "
                f"{task!r} needs {', '.join(fields_needed)})"
            )
        label, rank = row[knobs.label_field], row[knobs.first_stage_field]
        if label not in (0, 1) or isinstance(label, bool):
            raise HarnessError(f"{where}: row {number}: relevance label {label!r} is not 0 or 1")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise HarnessError(
                f"{where}: row {number}: {knobs.first_stage_field} {rank!r} is "
                "not a positive integer rank"
            )
        qid, doc = str(row[knobs.query_field]), str(row[knobs.doc_field])
        if (qid, doc) in seen_docs or (qid, rank) in seen_ranks:
            raise HarnessError(
                f"{where}: row {number}: query {qid} lists candidate {doc} or "
                f"rank {rank} twice; each candidate once, one per rank"
            )
        seen_docs.add((qid, doc))
        seen_ranks.add((qid, rank))
        for column, value in (
            ("text", row[knobs.inputs[0]]),
            ("text_pair", row[knobs.inputs[1]]),
            ("label", int(label)),
            ("query_id", qid),
            ("doc_id", doc),
            ("first_stage_rank", rank),
        ):
            split[column].append("" if value is None else value)
    return split


def load_ranking(
    task: str, data_dir: str | os.PathLike | None = None, with_test: bool = True
) -> LoaderResult:
    """The loader of ranking tasks: one file per split, read from the mirror (or the task's
    own data_dir), or from the Hub for a task with a Hub dataset; a split without rows, or
    without any relevant candidate, is an error."""
    knobs = task_knobs(task)
    data_dir = resolve_data_dir(data_dir)
    if task_data_folder(task, data_dir) is None and knobs.hf_path is None:
        raise HarnessError(
            f"task {task!r} is read from a data mirror only; pass --data-dir "
            f"DIR with {task}/train.jsonl and {task}/validation.jsonl (or set "
            "ENCODER_EVAL_DATA_DIR)"
        )

    def one(split: str) -> dict[str, Split]:
        return _read_checked(task, split, data_dir, ranking_rows_to_split)

    train = next(iter(one("train").values()))
    val = one("validation")
    test = val if knobs.report_split == "validation" else (one("test") if with_test else {})
    return train, val, test, knobs.num_labels, knobs.problem


def loader_for(name: str) -> Callable[..., LoaderResult]:
    """Task `name`'s loader: `load_ranking` for a ranking task, else `load_generic`, bound
    to that task (a special format is a named step of its row, not a loader of its own)."""
    load = load_ranking if task_knobs(name).problem == RANKING else load_generic
    return lambda data_dir=None, with_test=True: load(name, data_dir, with_test)


def load_task(
    task: str,
    data_dir: str | os.PathLike | None = None,
    with_test: bool = True,
    selection_split: str = "dev",
) -> LoaderResult:
    """Load a registered task by name through its loader (`loader_for`); with `selection_split`
    "holdout", dev is replaced by a fixed slice of train (`encoder_eval.data.holdout`)."""
    knobs = task_knobs(task)
    if knobs.problem == RANKING and selection_split != "dev":
        raise HarnessError(
            f"task {task!r} is a ranking task: the {selection_split} slice is "
            "drawn per example, which would split queries; use "
            "--selection-split dev"
        )
    return apply_selection_split(loader_for(task)(data_dir, with_test=with_test), selection_split)
