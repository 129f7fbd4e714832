"""The task suite: how each task is read (Hub or offline mirror) and turned into model inputs.

A task is one row of `TASK_KNOBS` (plain data: where the data lives, which fields are the
inputs, the metric, the report split, the languages) and one entry of `LOADERS` (a function
returning `(train_dict, per_lang_val, per_lang_test, num_labels, problem)`). Every loader
reads rows with Hugging Face field names, from the Hub or from a mirror directory laid out
as `<task>/<split>[.<lang>].jsonl` (a user task may name its own folder of
`<split>[.<lang>].jsonl` instead), and runs the same post-processing after, so a mirror
and the Hub give the same inputs. User tasks, written in task files (`encoder_eval.data.taskfile`),
join the registry through `register_task_files` / `register_task_rows`.

A split is a dict of columns: `text` (list[str]), `text_pair` (list[str], pair tasks only)
and `label` (list[int] or list[float]). A ranking split (problem type `RANKING`) holds one
row per (query, candidate) pair, with `text` the query, `text_pair` the candidate, `label`
its relevance (0 or 1), and the columns `query_id`, `doc_id` and `first_stage_rank`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import random
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.fileio import DamagedFile, FileProblem, parse_json, read_json
from encoder_eval.core.problems import RANKING, REGRESSION, SINGLE_LABEL
from encoder_eval.data import marco_bm25, synthetic
from encoder_eval.data.holdout import apply_selection_split
from encoder_eval.data.splits import LoaderResult, Split

TRAIN_SHUFFLE_SEED = (
    20240531  # fixed: the multilingual train concatenation is the same for every cell
)


@dataclass(frozen=True)
class TaskKnobs:
    """Everything the harness knows about a task, as data.

    `inputs` says how a row becomes model input: ``("field",)`` for one text,
    ``("a", "b")`` for a pair, or the name of a special formatter (``"wic"``, ``"wsc"``,
    ``"seahorse"``). `languages` are the languages loaded and scored; `euro_languages`
    those averaged into the headline score. `hub_splits` maps our split names
    (train/validation/test) to the dataset's own. `row_grouping` names a step in
    `ROW_GROUPINGS` that turns the rows read into one row per example first, for datasets
    stored with several rows per example. `hub_reader` names a reader in `HUB_READERS` for
    a Hub dataset held as files that `datasets` does not read as a table. `data_dir` is a
    user task's own folder of `<split>[.<lang>].jsonl` files, read instead of
    `<data-dir>/<task>/` and the Hub; `label_names` are its class names, in class-id order
    (a row's label may be one of them).
    """

    bucket: str  # multilingual | glue | superglue | synthetic | user
    hf_path: str | None
    inputs: tuple[str, ...]
    label_field: str
    num_labels: int
    problem: str
    metric: str
    report_split: str  # "test" (labelled test) or "validation" (dev, marked * in tables)
    languages: tuple[str, ...] = ("en",)
    euro_languages: tuple[str, ...] = ("en",)
    hf_config: str | None = None  # single-language tasks
    hf_lang_configs: dict[str, str] = field(default_factory=dict)  # multilingual: lang -> config
    hub_splits: dict[str, str] = field(default_factory=dict)
    language_field: str | None = None  # one file holding all languages, split by this field
    label_map: str | None = None  # name of a label conversion in LABEL_MAPS
    field_aliases: dict[str, str] = field(default_factory=dict)  # other name -> our field
    row_grouping: str | None = None  # name of a step in ROW_GROUPINGS: rows -> examples
    hub_reader: str | None = None  # name of a reader in HUB_READERS: Hub files, not a table
    description: str = ""
    data_dir: Path | None = None  # a user task's own data folder
    label_names: tuple[str, ...] = ()
    # Ranking tasks: the fields naming a row's query and candidate, and its first-stage rank
    # (which breaks score ties); metrics recorded beside the primary one.
    query_field: str | None = None
    doc_field: str | None = None
    first_stage_field: str | None = None
    first_stage_name: str | None = None
    secondary_metrics: tuple[str, ...] = ()
    # How tables name the task (default: its key), and how many training examples its full
    # Hub split holds (from the dataset card; `math.inf` for a split larger than any step cap
    # reads, None when unknown): `estimate` sizes the protocol from it.
    label: str = ""
    train_rows: int | float | None = None
    # The Hub dataset's revision this task reads (None: the head; see `dataset_revisions`),
    # and the task file that defined a user task (None: built in).
    revision: str | None = None
    source: str | None = None

    @property
    def multilingual(self) -> bool:
        return len(self.languages) > 1 or self.bucket == "multilingual"

    @property
    def pair_format(self) -> str:
        """A short, recorded description of how an example becomes model input."""
        if len(self.inputs) == 1 and self.inputs[0] in FORMATTERS:
            return self.inputs[0]
        return "single" if len(self.inputs) == 1 else "pair"


def _wic_inputs(row: dict) -> tuple[str, str]:
    """WiC: mark the target word in each sentence with asterisks; the two sentences form a pair."""

    def mark(text: str, start: int, end: int) -> str:
        return f"{text[:start]}*{text[start:end]}*{text[end:]}"

    s1 = mark(row["sentence1"], int(row["start1"]), int(row["end1"]))
    s2 = mark(row["sentence2"], int(row["start2"]), int(row["end2"]))
    return s1, s2


def _wsc_inputs(row: dict) -> tuple[str, None]:
    """WSC: mark the candidate noun with *..* and the pronoun with #..# (word indices).

    Indices count words of the text split on single spaces; a span covers as many words as
    its text has (split on any whitespace: a few span texts hold a line break). Where the word at a span's index does not
    start with the span's text (the original SuperGLUE files have a few such off-by-one
    spans, which `wsc.fixed` on the Hub corrects), the nearest word within 3 that does is
    marked instead, so a mirror of the original files gives the Hub's input.
    """
    words = row["text"].split(" ")
    spans = [
        (
            _wsc_align(words, int(row["span1_index"]), str(row["span1_text"])),
            len(str(row["span1_text"]).split()),
            "*",
        ),
        (
            _wsc_align(words, int(row["span2_index"]), str(row["span2_text"])),
            len(str(row["span2_text"]).split()),
            "#",
        ),
    ]
    for start, length, mark in spans:
        if not 0 <= start < len(words):
            raise ValueError(f"span index {start} outside the text's {len(words)} words")
        end = min(start + length, len(words)) - 1
        words[start] = mark + words[start]
        words[end] = words[end] + mark
    return " ".join(words), None


def _wsc_align(words: list[str], index: int, span_text: str) -> int:
    """The index of the span's first word: `index` if it matches, else the nearest match."""
    first = (span_text.split() or [""])[0].lower()

    def matches(i: int) -> bool:
        return 0 <= i < len(words) and words[i].lower().startswith(first)

    if not first or matches(index):
        return index
    for distance in (1, 2, 3):
        for i in (index - distance, index + distance):
            if matches(i):
                return i
    return index


SEAHORSE_QUESTIONS = tuple(f"question{i}" for i in range(1, 7))


def _seahorse_inputs(row: dict) -> tuple[str, str | None]:
    """SeaHorse: the summary, paired with its source article when the dataset carries one."""
    article = row.get("article") or row.get("text")
    return str(row["summary"] or ""), (str(article) if article else None)


def _seahorse_target(row: dict) -> float:
    """SeaHorse target: share of 'Yes' over the six quality questions (blank/No/Unsure = 0)."""
    return sum(str(row.get(q, "")).strip().lower() == "yes" for q in SEAHORSE_QUESTIONS) / 6.0


# The long schema (the Hub copy, one row per answered question) names a question by its text,
# which the dataset card words as below; `questionN`, `qN`, `N` and the short names work too.
SEAHORSE_QUESTION_NAMES = (
    ("comprehensible", "The summary can be read and understood by the rater."),
    ("repetition", "The summary is free of unnecessarily repeated information."),
    ("grammar", "The summary is grammatically correct."),
    (
        "attribution",
        "All the information in the summary is fully attributable to the source article.",
    ),
    ("main ideas", "The summary captures the main idea(s) of the source article."),
    ("conciseness", "The summary concisely represents the information in the source article."),
)
SEAHORSE_EXAMPLE_KEY = ("summary", "article", "worker_lang", "model", "gem_id")


def _words(text: Any) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", str(text).lower()))


def _seahorse_question(value: Any) -> str | None:
    """The wide-schema column (`question1`..`question6`) a long-schema `question` value names."""
    words = _words(value)
    for number, (short, text) in enumerate(SEAHORSE_QUESTION_NAMES, start=1):
        if words in (f"question{number}", f"question {number}", f"q{number}", str(number)):
            return f"question{number}"
        if words == short or _words(text) in words:  # the card adds a citation to one text
            return f"question{number}"
    return None


def _seahorse_long_to_wide(rows: list[dict], where: str) -> list[dict]:
    """SeaHorse rows in the long schema regrouped to one wide row per rated summary.

    A long row (`question`, `answer`, no `question1`..`question6`) joins the example keyed by
    `SEAHORSE_EXAMPLE_KEY`; examples keep the order of their first row, and wide rows pass
    through unchanged. A question without a row stays blank, which the target counts as 0,
    as it counts a blank in the wide schema: the long copy leaves out the blank answers
    (questions 2-6 after a "No" to question 1) and the "Unsure" ones, both 0 in the wide one.
    """
    out: list[dict] = []
    examples: dict[tuple, dict] = {}
    columns: dict[str, str | None] = {}  # a split repeats six question texts over its rows
    for number, row in enumerate(rows, start=1):
        if "question" not in row or "answer" not in row or SEAHORSE_QUESTIONS[0] in row:
            out.append(row)
            continue
        question = str(row["question"])
        if question not in columns:
            columns[question] = _seahorse_question(question)
        column = columns[question]
        if column is None:
            raise HarnessError(
                f"{where}: row {number}: question {row['question']!r} is none of SeaHorse's six "
                f"({'; '.join(text for _, text in SEAHORSE_QUESTION_NAMES)})"
            )
        answer = "" if row["answer"] is None else str(row["answer"]).strip()
        if answer.lower() not in ("yes", "no", "unsure", ""):
            raise HarnessError(
                f"{where}: row {number}: answer {row['answer']!r} is not Yes, No or Unsure"
            )
        key = tuple(row.get(name) for name in SEAHORSE_EXAMPLE_KEY)
        example = examples.get(key)
        if example is None:
            example = {name: row.get(name) for name in SEAHORSE_EXAMPLE_KEY}
            example.update(dict.fromkeys(SEAHORSE_QUESTIONS, ""))
            examples[key] = example
            out.append(example)
        elif example[column]:
            raise HarnessError(
                f"{where}: row {number}: {column} is answered twice for one summary (gem_id "
                f"{row.get('gem_id')!r}, model {row.get('model')!r}, worker_lang "
                f"{row.get('worker_lang')!r}); the long schema cannot tell two ratings of one "
                "summary apart: remove the repeated rows, or use the wide schema"
            )
        example[column] = answer
    return out


FORMATTERS: dict[str, Callable[[dict], tuple[str, str | None]]] = {
    "wic": _wic_inputs,
    "wsc": _wsc_inputs,
    "seahorse": _seahorse_inputs,
}

# Label conversions, by name, for datasets whose raw label is not 0..num_labels-1.
LABEL_MAPS: dict[str, Callable[[dict], Any]] = {
    "stars_minus_one": lambda row: int(row["stars"]) - 1 if "stars" in row else int(row["label"]),
    "seahorse_yes_share": _seahorse_target,
}


def _ms_marco_passages(rows: list[dict], where: str) -> list[dict]:
    """microsoft/ms_marco rows (one per query, its retrieved passages in `passages`: lists
    `is_selected`, `passage_text`, `url`) expanded to one ranking row per (query, passage):
    `query_id, query, passage_id, passage, label, retrieval_rank`, the passage's id and rank
    its 1-based place in the list (the dataset gives passages no ids). Rows already expanded
    (a mirror written before) pass through."""
    out = []
    for number, row in enumerate(rows, start=1):
        if "passages" not in row:
            out.append(row)
            continue
        passages, missing = row["passages"], [k for k in ("query_id", "query") if k not in row]
        if isinstance(passages, list):  # a sequence of structs read as a list of dicts
            passages = {
                k: [p.get(k) for p in passages if isinstance(p, dict)]
                for k in ("passage_text", "is_selected")
            }
        lists = isinstance(passages, dict) and all(
            isinstance(passages.get(k), list) for k in ("passage_text", "is_selected")
        )
        if missing or not lists:
            raise HarnessError(
                f"{where}: row {number} is not in the microsoft/ms_marco schema (query_id, "
                "query, and passages holding the lists passage_text and is_selected)"
            )
        texts, selected = passages["passage_text"], passages["is_selected"]
        if len(texts) != len(selected):
            raise HarnessError(
                f"{where}: row {number}: {len(texts)} passages but "
                f"{len(selected)} is_selected labels"
            )
        for i, (text, label) in enumerate(zip(texts, selected, strict=True), start=1):
            out.append(
                {
                    "query_id": row["query_id"],
                    "query": row["query"],
                    "passage_id": f"{row['query_id']}-{i}",
                    "passage": text,
                    "label": label,
                    "retrieval_rank": i,
                }
            )
    return out


# Row groupings, by name, for datasets that store one example over several rows (or, for
# ms_marco_v21, several ranking rows in one).
ROW_GROUPINGS: dict[str, Callable[[list[dict], str], list[dict]]] = {
    "seahorse_long_to_wide": _seahorse_long_to_wide,
    "ms_marco_passages": _ms_marco_passages,
}

# Hub readers, by name, for datasets held as files rather than a table: (split, revision)
# -> the split's rows (ms_marco_bm25: Tevatron's MS MARCO files, `marco_bm25`).
HUB_READERS: dict[str, Callable[[str, str | None], list[dict]]] = {
    "msmarco_passage_files": marco_bm25.read_split,
}

_GLUE = "nyu-mll/glue"
_SUPERGLUE = "aps/super_glue"
_XNLI_LANGS = (
    "ar",
    "bg",
    "de",
    "el",
    "en",
    "es",
    "fr",
    "hi",
    "ru",
    "sw",
    "th",
    "tr",
    "ur",
    "vi",
    "zh",
)
# The 51 locales of MASSIVE 1.0 (the loading script's _LANGUAGE_PAIRS, each a config of
# AmazonScience/massive); the Hub's v1.1 script adds ca-ES, which is not among them.
_MASSIVE_LOCALES = (
    "af-ZA",
    "am-ET",
    "ar-SA",
    "az-AZ",
    "bn-BD",
    "cy-GB",
    "da-DK",
    "de-DE",
    "el-GR",
    "en-US",
    "es-ES",
    "fa-IR",
    "fi-FI",
    "fr-FR",
    "he-IL",
    "hi-IN",
    "hu-HU",
    "hy-AM",
    "id-ID",
    "is-IS",
    "it-IT",
    "ja-JP",
    "jv-ID",
    "ka-GE",
    "km-KH",
    "kn-IN",
    "ko-KR",
    "lv-LV",
    "ml-IN",
    "mn-MN",
    "ms-MY",
    "my-MM",
    "nb-NO",
    "nl-NL",
    "pl-PL",
    "pt-PT",
    "ro-RO",
    "ru-RU",
    "sl-SL",
    "sq-AL",
    "sv-SE",
    "sw-KE",
    "ta-IN",
    "te-IN",
    "th-TH",
    "tl-PH",
    "tr-TR",
    "ur-PK",
    "vi-VN",
    "zh-CN",
    "zh-TW",
)
_MASSIVE_EURO = ("de-DE", "en-US", "es-ES", "fr-FR", "it-IT", "nl-NL", "pl-PL", "pt-PT")


def _glue(config: str, inputs: tuple[str, ...], num_labels: int, metric: str, **kw) -> TaskKnobs:
    return TaskKnobs(
        bucket="glue",
        hf_path=_GLUE,
        hf_config=config,
        inputs=inputs,
        label_field="label",
        num_labels=num_labels,
        problem=kw.pop("problem", SINGLE_LABEL),
        metric=metric,
        report_split="validation",
        **kw,
    )


def _superglue(
    config: str, inputs: tuple[str, ...], num_labels: int, metric: str, **kw
) -> TaskKnobs:
    return TaskKnobs(
        bucket="superglue",
        hf_path=_SUPERGLUE,
        hf_config=config,
        inputs=inputs,
        label_field="label",
        num_labels=num_labels,
        problem=SINGLE_LABEL,
        metric=metric,
        report_split="validation",
        **kw,
    )


TASK_KNOBS: dict[str, TaskKnobs] = {
    # --- multilingual: train splits of all languages concatenated; report = labelled test
    "xnli": TaskKnobs(
        label="XNLI", train_rows=5_890_530,
        bucket="multilingual", hf_path="facebook/xnli", inputs=("premise", "hypothesis"),
        label_field="label", num_labels=3, problem=SINGLE_LABEL, metric="accuracy",
        report_split="test", languages=_XNLI_LANGS,
        euro_languages=("bg", "de", "el", "en", "es", "fr", "ru"),
        hf_lang_configs={lang: lang for lang in _XNLI_LANGS},
    ),
    "paws_x": TaskKnobs(
        label="PAWS-X", train_rows=math.inf,
        bucket="multilingual", hf_path="google-research-datasets/paws-x",
        inputs=("sentence1", "sentence2"), label_field="label", num_labels=2,
        problem=SINGLE_LABEL, metric="accuracy", report_split="test",
        languages=("de", "en", "es", "fr", "ja", "ko", "zh"), euro_languages=("de", "en", "es", "fr"),
        hf_lang_configs={lang: lang for lang in ("de", "en", "es", "fr", "ja", "ko", "zh")},
    ),
    "amazon_reviews_multi": TaskKnobs(
        label="Amazon-Reviews", train_rows=1_200_000,
        # The original amazon_reviews_multi is defunct; mteb's parquet copy has text/label
        # (label = stars - 1). Mirrors in the original schema (review_body/stars) also load.
        bucket="multilingual", hf_path="mteb/AmazonReviewsClassification", inputs=("review_body",),
        field_aliases={"text": "review_body"},
        label_field="stars", num_labels=5, problem=SINGLE_LABEL, metric="accuracy",
        report_split="test", languages=("de", "en", "es", "fr", "ja", "zh"),
        euro_languages=("de", "en", "es", "fr"), label_map="stars_minus_one",
        hf_lang_configs={lang: lang for lang in ("de", "en", "es", "fr", "ja", "zh")},
    ),
    "massive_intent": TaskKnobs(
        label="MASSIVE-Intent", train_rows=587_214,
        # A loading-script dataset: read through the Hub's parquet conversion (see
        # its `revision`), which keeps `utt` and the 60-way `intent` class ids.
        bucket="multilingual", hf_path="AmazonScience/massive", inputs=("utt",),
        label_field="intent", num_labels=60, problem=SINGLE_LABEL, metric="accuracy",
        report_split="test", languages=_MASSIVE_LOCALES, euro_languages=_MASSIVE_EURO,
        hf_lang_configs={loc: loc for loc in _MASSIVE_LOCALES},
        # Loading scripts are gone from `datasets` >= 4; the parquet conversion branch remains.
        revision="refs/convert/parquet",
    ),
    "seahorse": TaskKnobs(
        label="SeaHorse", train_rows=math.inf,
        # Google's TSVs are wide (gem_id, worker_lang, summary, model, question1..6); this Hub
        # copy is long (gem_id, worker_lang, model, article, summary, question, answer; one row
        # per answered question) and is regrouped to the wide rows. Both schemas load.
        bucket="multilingual", hf_path="tasksource/seahorse_summarization_evaluation",
        inputs=("seahorse",),
        label_field="question1", num_labels=1, problem=REGRESSION, metric="spearman",
        report_split="test", languages=("de", "en-US", "es-ES", "ru", "tr", "vi"),
        euro_languages=("de", "en-US", "es-ES", "ru"), language_field="worker_lang",
        label_map="seahorse_yes_share", row_grouping="seahorse_long_to_wide",
    ),
    # --- GLUE: report split is dev (test labels are hidden)
    "glue_cola": _glue("cola", ("sentence",), 2, "mcc", label="CoLA", train_rows=8_551),
    "glue_sst2": _glue("sst2", ("sentence",), 2, "accuracy", label="SST-2", train_rows=67_349),
    "glue_mrpc": _glue("mrpc", ("sentence1", "sentence2"), 2, "f1", label="MRPC", train_rows=3_668),
    "glue_stsb": _glue("stsb", ("sentence1", "sentence2"), 1, "spearman", problem=REGRESSION, label="STS-B", train_rows=5_749),
    "glue_qqp": _glue("qqp", ("question1", "question2"), 2, "f1", label="QQP", train_rows=363_846),
    "glue_mnli": _glue(
        "mnli", ("premise", "hypothesis"), 3, "accuracy",
        hub_splits={"validation": "validation_matched", "test": "test_matched"},
        label="MNLI", train_rows=392_702,
    ),
    "glue_qnli": _glue("qnli", ("question", "sentence"), 2, "accuracy", label="QNLI", train_rows=104_743),
    "glue_rte": _glue("rte", ("sentence1", "sentence2"), 2, "accuracy", label="RTE", train_rows=2_490),
    # --- SuperGLUE
    "sg_boolq": _superglue("boolq", ("question", "passage"), 2, "accuracy", label="BoolQ", train_rows=9_427),
    "sg_cb": _superglue("cb", ("premise", "hypothesis"), 3, "macro_f1", label="CB", train_rows=250),
    "sg_wic": _superglue("wic", ("wic",), 2, "accuracy", label="WiC", train_rows=5_428),
    "sg_wsc": _superglue("wsc.fixed", ("wsc",), 2, "accuracy", label="WSC", train_rows=554),
    # --- SYNTHETIC (generated by encoder_eval/data/synthetic.py; for the demo and install checks)
    "synthetic_sentiment": TaskKnobs(
        bucket="synthetic", hf_path=None, inputs=("sentence",), label_field="label",
        num_labels=2, problem=SINGLE_LABEL, metric="accuracy", report_split="test",
        description="SYNTHETIC single-sentence sentiment, SST-2 schema",
    ),
    "synthetic_nli": TaskKnobs(
        bucket="synthetic", hf_path=None, inputs=("premise", "hypothesis"), label_field="label",
        num_labels=3, problem=SINGLE_LABEL, metric="accuracy", report_split="test",
        description="SYNTHETIC sentence-pair inference, MNLI schema",
    ),
    "synthetic_rating": TaskKnobs(
        bucket="synthetic", hf_path=None, inputs=("sentence",), label_field="label",
        num_labels=1, problem=REGRESSION, metric="spearman", report_split="test",
        description="SYNTHETIC single-sentence rating 0-5 (regression)",
    ),
    # --- RANKING: re-rank a first stage's candidates per query; kept out of the suite average
    "ms_marco": TaskKnobs(
        bucket="ranking", hf_path=None, inputs=("query", "passage"), label_field="label",
        num_labels=1, problem=RANKING, metric="mrr_at_10", report_split="validation",
        query_field="query_id", doc_field="passage_id", first_stage_field="bm25_rank",
        first_stage_name="bm25", secondary_metrics=("ndcg_at_10",),
        description="MS MARCO passage re-ranking of BM25 top-k candidates (mirror only)",
        label="MS-MARCO",
    ),
    # The Hub's MS MARCO v2.1 (the QA release): per query the ~10 passages Bing retrieved,
    # `is_selected` the relevance; no BM25 list, so its depth (10) is off-protocol (1,000).
    "ms_marco_v21": TaskKnobs(
        bucket="ranking", hf_path="microsoft/ms_marco", hf_config="v2.1",
        revision="a47ee7aae8d7d466ba15f9f0bfac3b3681087b3a", inputs=("query", "passage"),
        label_field="label", num_labels=1, problem=RANKING, metric="mrr_at_10",
        report_split="validation", query_field="query_id", doc_field="passage_id",
        first_stage_field="retrieval_rank", first_stage_name="bing",
        secondary_metrics=("ndcg_at_10",), row_grouping="ms_marco_passages",
        description="MS MARCO v2.1 passage re-ranking of the ~10 Bing passages per query (Hub)",
        label="MS-MARCO-v2.1", train_rows=808_731,
    ),
    # MS MARCO passage ranking at the protocol's depth: the dev queries with BM25's top
    # 1,000 from Tevatron's files (`marco_bm25`), training queries with BM25 negatives.
    "ms_marco_bm25": TaskKnobs(
        bucket="ranking", hf_path=marco_bm25.REPO, revision=marco_bm25.REVISION,
        inputs=("query", "passage"), label_field="label", num_labels=1, problem=RANKING,
        metric="mrr_at_10", report_split="validation", query_field="query_id",
        doc_field="passage_id", first_stage_field="bm25_rank", first_stage_name="bm25",
        secondary_metrics=("ndcg_at_10",), hub_reader="msmarco_passage_files",
        description="MS MARCO passage re-ranking of BM25's top 1,000 per dev query (Hub files)",
        label="MS-MARCO-BM25",
    ),
}  # fmt: skip

BUILTIN_TASKS = frozenset(TASK_KNOBS)  # the package's own; a task file cannot redefine them
MULTILINGUAL_TASKS = tuple(k for k, v in TASK_KNOBS.items() if v.bucket == "multilingual")
# Names `--tasks` accepts for several tasks at once; "all" is the 17-task suite (no synthetic,
# no ranking).
SUITE_BUCKETS = ("multilingual", "glue", "superglue")
# Buckets that are a group of their own, outside "all" and outside a table's Average.
SEPARATE_BUCKETS = ("ranking",)
TASK_GROUPS: tuple[str, ...] = ("all", *SUITE_BUCKETS, *SEPARATE_BUCKETS)

# The benchmark scores of the seed paper (arXiv:2503.02656): the macro-average of the task
# metrics over a fixed task set, defined only when every task of the set has a score.
# GLUE: the eight GLUE tasks of the suite (no WNLI); SuperGLUE: the four of the suite,
# ReCoRD excluded as the seed requires (COPA, MultiRC and RTE are not in the suite).
BENCHMARK_SCORES: dict[str, tuple[str, ...]] = {
    "glue_score": ("glue_cola", "glue_sst2", "glue_mrpc", "glue_stsb", "glue_qqp", "glue_mnli",
                   "glue_qnli", "glue_rte"),
    "superglue_score": ("sg_boolq", "sg_cb", "sg_wic", "sg_wsc"),
}  # fmt: skip
BENCHMARK_LABELS = {"glue_score": "GLUE score", "superglue_score": "SuperGLUE score"}


def in_suite_average(task: str) -> bool:
    """Whether a task counts in a table's overall Average (ranking tasks do not)."""
    return task_knobs(task).bucket not in SEPARATE_BUCKETS


def group_tasks(group: str) -> list[str]:
    """The tasks of a group name, in registry order (user tasks of that bucket included)."""
    buckets = SUITE_BUCKETS if group == "all" else (group,)  # SEPARATE_BUCKETS: not in all
    return [k for k, v in TASK_KNOBS.items() if v.bucket in buckets]


def resolve_task_names(names: list[str] | None) -> list[str]:
    """Expand `--tasks` (task keys and group names) into task keys, order kept, each once;
    None or empty means the multilingual group. Unknown names raise with the valid ones."""
    out: list[str] = []
    for name in names or ["multilingual"]:
        if name not in TASK_GROUPS and name not in TASK_KNOBS:
            raise _unknown_task(name, f"--tasks also takes a group: {', '.join(TASK_GROUPS)}")
        expanded = group_tasks(name) if name in TASK_GROUPS else [name]
        out.extend(t for t in expanded if t not in out)
    return out


ADD_TASK_HINT = (
    "To add a task, define it in a task file (--tasks-file; docs/tasks.md, 'Adding a task')"
)


def _unknown_task(name: str, also: str = "") -> HarnessError:
    return unknown_name("task", name, TASK_KNOBS, f"{ADD_TASK_HINT}{'; ' + also if also else ''}")


def add_user_task(key: str, knobs: TaskKnobs) -> bool:
    """Add a user task (parsed by `encoder_eval.data.taskfile`, its `source` and `revision`
    in its knobs) to the registry; False when the key was registered before (the same
    definition: `taskfile` refuses a different one)."""
    if key in TASK_KNOBS:
        return False
    TASK_KNOBS[key] = knobs
    return True


def default_revisions() -> dict[str, str | None]:
    """The Hub revision each dataset is read at, from the task rows (None: the head); when
    several tasks read one dataset, the one a row names (a run reads one revision of it)."""
    revisions: dict[str, str | None] = {}
    for knobs in TASK_KNOBS.values():
        repo = knobs.hf_path
        if repo and (knobs.revision is not None or repo not in revisions):
            revisions[repo] = knobs.revision
    return revisions


def task_label(name: str) -> str:
    """How tables name a task: its row's label, else its key."""
    knobs = TASK_KNOBS.get(name)
    return (knobs.label if knobs is not None else "") or name


def task_knobs(name: str) -> TaskKnobs:
    """Return a task's knobs, or raise an error listing the valid names."""
    if name not in TASK_KNOBS:
        raise _unknown_task(name)
    return TASK_KNOBS[name]


def dataset_revisions() -> dict[str, str | None]:
    """The dataset revisions in effect: `default_revisions` updated by the environment
    override."""
    revisions = default_revisions()
    raw = os.environ.get("ENCODER_EVAL_DATASET_REVISIONS")
    if raw:
        try:
            override = parse_json(raw, "ENCODER_EVAL_DATASET_REVISIONS")
        except DamagedFile as exc:
            raise HarnessError(
                f'{exc}; set it to an object such as {{"nyu-mll/glue": "<sha>"}}'
            ) from None
        if not isinstance(override, dict):
            raise HarnessError("ENCODER_EVAL_DATASET_REVISIONS must be a JSON object")
        revisions.update(override)
    return revisions


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE says this machine must not reach the Hub (then no message
    suggests a command that reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The mirror directory in effect: the argument, else ENCODER_EVAL_DATA_DIR, else None (Hub)."""
    chosen = data_dir if data_dir is not None else os.environ.get("ENCODER_EVAL_DATA_DIR")
    return Path(chosen) if chosen else None


# ----------------------------------------------------------------------------- reading rows


def mirror_file(data_dir: Path, task: str, split: str, lang: str | None) -> Path:
    """Where a mirror keeps one split (of one language): `<task>/<split>[.<lang>].jsonl`."""
    return split_file(Path(data_dir) / task, split, lang)


def split_file(folder: Path, split: str, lang: str | None) -> Path:
    """The file of one split (of one language) in a task's data folder."""
    return Path(folder) / (f"{split}.{lang}.jsonl" if lang else f"{split}.jsonl")


def task_data_folder(task: str, data_dir: Path | None) -> Path | None:
    """The folder a task's rows are read from: the task's own `data_dir`, else its folder in
    the mirror `data_dir` (named after the task key), else None (the Hub)."""
    knobs = task_knobs(task)
    if knobs.data_dir is not None:
        return knobs.data_dir
    return Path(data_dir) / task if data_dir is not None else None


def file_languages(task: str) -> tuple[str | None, ...]:
    """The languages a split is stored under, one file (and one Hub read) each.

    `(None,)` means one file for the whole split: single-language tasks, and tasks whose
    rows carry their language in `language_field`.
    """
    knobs = task_knobs(task)
    if knobs.language_field:
        return (None,)
    return knobs.languages if knobs.hf_lang_configs or len(knobs.languages) > 1 else (None,)


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSON-lines file; an invalid line is an error naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = parse_json(line, f"{path}:{number}")
            except DamagedFile as exc:
                raise HarnessError(f"{path}:{number}: invalid JSON ({exc.reason})") from None
            if not isinstance(row, dict):
                raise HarnessError(f"{path}:{number}: expected a JSON object per line")
            rows.append(row)
    return rows


def read_hub_rows(
    task: str, split: str, lang: str | None, revision: str | None = None
) -> list[dict]:
    """Read the raw rows of one split (of one language) from the Hugging Face Hub.

    The one place rows come from the Hub: the loaders and `encoder_eval.prefetch` both call
    it. `revision` defaults to the revision in effect (`dataset_revisions()`).
    """
    return _read_hub(task_knobs(task), split, lang, revision, task=task)


def _read_hub(
    knobs: TaskKnobs, split: str, lang: str | None, revision: str | None = None, task: str = ""
) -> list[dict]:
    """Read one split from the Hugging Face Hub at the dataset revision in effect."""
    import datasets  # imported here: the mirror path does not need it

    config = knobs.hf_lang_configs.get(lang, lang) if lang and knobs.hf_lang_configs else None
    config = config or knobs.hf_config
    if revision is None:
        revision = _resolved_revision(knobs, task)
    hub_split = knobs.hub_splits.get(split, split)
    try:
        if knobs.hub_reader:
            return HUB_READERS[knobs.hub_reader](split, revision)
        ds = datasets.load_dataset(knobs.hf_path, config, split=hub_split, revision=revision)
    except HarnessError:  # the reader's own message about a file it read
        raise
    except Exception as exc:  # network, auth or missing-config errors all end the same way
        raise HarnessError(
            f"could not load {knobs.hf_path} ({config or 'default'}, {hub_split}) from the Hub: "
            f"{type(exc).__name__}: {exc}. If this machine cannot reach the Hub, run "
            f"`encoder-eval prefetch --tasks {task or '<task>'} --out DIR` on one that "
            "can and pass --data-dir DIR (or set ENCODER_EVAL_DATA_DIR) here."
        ) from None
    return [dict(r) for r in ds]


def read_split(task: str, split: str, data_dir: Path | None) -> dict[str, tuple[list[dict], str]]:
    """Read one split of a task as {language: (rows, where)}, from the mirror or the Hub."""
    knobs = task_knobs(task)
    out: dict[str, tuple[list[dict], str]] = {}
    if knobs.bucket == "synthetic":
        return {knobs.languages[0]: (synthetic.generate_rows(task, split), f"synthetic:{task}")}
    folder = task_data_folder(task, data_dir)
    if knobs.language_field:
        # One file with all languages: split it by the language field.
        if folder is not None:
            path = split_file(folder, split, None)
            rows, where = _read_mirror_file(path, task, split), str(path)
        else:
            rows, where = read_hub_rows(task, split, None), f"{knobs.hf_path}:{split}"
        for lang in knobs.languages:
            out[lang] = ([r for r in rows if r.get(knobs.language_field) == lang], where)
        return out
    for lang in file_languages(task):
        if folder is not None:
            path = split_file(folder, split, lang)
            if lang and lang not in knobs.euro_languages and not path.exists():
                # A mirror may hold a subset of the languages, never less than the Euro set.
                warnings.warn(
                    f"{task}: mirror has no {path.name}; language {lang!r} skipped", stacklevel=2
                )
                continue
            out[lang or knobs.languages[0]] = (_read_mirror_file(path, task, split), str(path))
        else:
            rows = read_hub_rows(task, split, lang)
            out[lang or knobs.languages[0]] = (rows, f"{knobs.hf_path}:{lang or ''}:{split}")
    return out


def _read_mirror_file(path: Path, task: str, split: str) -> list[dict]:
    if not path.exists():
        have = sorted(p.name for p in path.parent.glob("*.jsonl")) if path.parent.exists() else []
        if task_knobs(task).data_dir is not None:
            where = "the task's data_dir"
            fix = (
                f"Put the {split} rows there as {path.name} (one JSON object per line), or "
                f"change data_dir in {task_knobs(task).source or 'its task file'}."
            )
        else:
            mirror = path.parent.parent
            if not mirror.is_dir():  # a misspelt --data-dir: say that, not what it lacks
                raise HarnessError(
                    f"the data mirror {mirror} (--data-dir, or ENCODER_EVAL_DATA_DIR) is not "
                    f"a folder; check the path: a mirror holds a folder per task, such as "
                    f"{mirror / task}{os.sep}"
                )
            where = "the data mirror"
            fix = (
                f"Write it with `encoder-eval prefetch --tasks {task} --out "
                f"{path.parent.parent}` (a mirror keeps a task's files in a folder named after "
                "the task key)."
            )
            if task_knobs(task).hf_path is None or hub_offline():  # no Hub command to offer
                fix = (
                    f"Copy the task's files into {path.parent}{os.sep} (a mirror keeps a "
                    "task's files in a folder named after the task key)."
                )
        raise HarnessError(
            f"{where} has no {path.name} for task {task!r} (looked at {path}; "
            f"found: {', '.join(have) or 'no task directory'}). {fix}"
        )
    return read_jsonl(path)


# ----------------------------------------------------------------------------- rows -> inputs


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


def data_provenance(task: str, data_dir: str | os.PathLike | None = None) -> dict:
    """Where a task's data comes from, resolved: the Hub commit, or the content hash of the
    folder read (the task's folder in the mirror, or a user task's own `data_dir`).

    Called before a cell trains (a cell never trains and then fails on bookkeeping). For
    the Hub it resolves the revision in effect to a commit, which `read_hub_rows` then
    loads, so the commit recorded is the commit read. `identity` is one string that two
    cells share exactly when they read the same data from the same kind of source.
    """
    knobs = task_knobs(task)
    data_dir = resolve_data_dir(data_dir)
    if knobs.bucket == "synthetic":
        version = synthetic.GENERATOR_VERSION
        return {
            "source": "synthetic",
            "generator_version": version,
            "identity": f"synthetic:{task}:v{version}",
        }
    folder = task_data_folder(task, data_dir)
    if folder is None and knobs.hf_path is None:
        raise HarnessError(
            f"task {task!r} is read from a data mirror only; pass --data-dir DIR "
            f"(or set ENCODER_EVAL_DATA_DIR) with its files in DIR/{task}/"
        )
    if folder is None:
        requested = dataset_revisions().get(knobs.hf_path) if knobs.hf_path else None
        sha = _resolved_revision(knobs, task)
        return {
            "source": "hub",
            "dataset": knobs.hf_path,
            "revision": sha,
            "revision_requested": requested,
            "identity": f"hub:{knobs.hf_path}@{sha}",
        }
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.jsonl")):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    out = {
        "source": "mirror",
        "dataset": knobs.hf_path,
        "sha256": digest.hexdigest(),
        "identity": f"mirror:sha256:{digest.hexdigest()}",
    }
    manifest = data_dir / "MANIFEST.json" if knobs.data_dir is None else None
    if manifest is not None and manifest.exists():
        try:
            entry = read_json(manifest).get("tasks", {}).get(task)
        except (FileProblem, AttributeError):
            entry = None
        if isinstance(entry, dict):
            out["manifest"] = {
                k: entry.get(k) for k in ("dataset", "revision", "revision_requested")
            }
            out["revision"] = entry.get("revision")
    return out


_SHA = re.compile(r"[0-9a-f]{40}")


@functools.cache
def resolve_dataset_revision(repo: str, revision: str | None) -> str:
    """The commit a Hub dataset revision (None: the default branch) points to, asked once per
    process so that what is recorded and what is loaded are the same commit.

    Online it asks the Hub; offline (HF_HUB_OFFLINE) it reads the ref the local Hugging Face
    cache stored when the dataset was downloaded. A revision that is already a commit is its
    own answer. Unresolvable is an error: a result must name the data it read.
    """
    if revision and _SHA.fullmatch(revision):
        return revision
    try:
        return _hub_dataset_sha(repo, revision)
    except Exception as exc:  # offline, unknown repo or revision, no network
        cached = _cached_dataset_ref(repo, revision or "main")
        if cached:
            return cached
        raise HarnessError(
            f"cannot resolve {repo}@{revision or 'main'} to a commit ({type(exc).__name__}: {exc})"
        ) from None


def _resolved_revision(knobs: TaskKnobs, task: str) -> str:
    """The commit of the task's dataset revision in effect; the error says how to go offline."""
    try:
        return resolve_dataset_revision(knobs.hf_path, dataset_revisions().get(knobs.hf_path))
    except HarnessError as exc:
        raise HarnessError(
            f"{exc}. If this machine cannot reach the Hub, run `encoder-eval prefetch "
            f"--tasks {task} --out DIR` on one that can and pass --data-dir DIR (or set "
            "ENCODER_EVAL_DATA_DIR) here; to read a known commit, pin it with "
            "ENCODER_EVAL_DATASET_REVISIONS."
        ) from None


def _hub_dataset_sha(repo: str, revision: str | None) -> str:
    """The Hub's answer for a dataset revision's commit (the one network call; tests replace it)."""
    from huggingface_hub import HfApi

    return HfApi().dataset_info(repo, revision=revision).sha


def _cached_dataset_ref(repo: str, revision: str) -> str | None:
    """The commit the local Hugging Face cache recorded for `repo@revision`, if any."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return None
    ref = Path(HF_HUB_CACHE) / ("datasets--" + repo.replace("/", "--")) / "refs" / revision
    try:
        sha = ref.read_text().strip()
    except OSError:
        return None
    return sha if _SHA.fullmatch(sha) else None
