"""The per-dataset steps a task row names: how a row becomes model input, and how a
dataset's own schema becomes rows the generic reading understands.

A task row (`encoder_eval.data.tasks.TaskKnobs`) names each step by a key of one of these
tables, so the row stays plain data: `FORMATTERS` (a row -> its text and optional second
text, for inputs no field holds as is: WiC's marked words, WSC's marked spans, SeaHorse's
summary and article), `LABEL_MAPS` (a row -> its label, for datasets whose raw label is not
0..num_labels-1), `ROW_GROUPINGS` (a split's rows -> one row per example, for datasets
stored with several rows per example or several examples per row) and `HUB_READERS` (a Hub
dataset held as files that `datasets` does not read as a table).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from encoder_eval.core.errors import HarnessError
from encoder_eval.data import marco_bm25


def wic_inputs(row: dict) -> tuple[str, str]:
    """WiC: mark the target word in each sentence with asterisks; the two sentences form a pair."""

    def mark(text: str, start: int, end: int) -> str:
        return f"{text[:start]}*{text[start:end]}*{text[end:]}"

    s1 = mark(row["sentence1"], int(row["start1"]), int(row["end1"]))
    s2 = mark(row["sentence2"], int(row["start2"]), int(row["end2"]))
    return s1, s2


def wsc_inputs(row: dict) -> tuple[str, None]:
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


def seahorse_inputs(row: dict) -> tuple[str, str | None]:
    """SeaHorse: the summary, paired with its source article when the dataset carries one."""
    article = row.get("article") or row.get("text")
    return str(row["summary"] or ""), (str(article) if article else None)


def seahorse_target(row: dict) -> float:
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


def seahorse_long_to_wide(rows: list[dict], where: str) -> list[dict]:
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
    "wic": wic_inputs,
    "wsc": wsc_inputs,
    "seahorse": seahorse_inputs,
}

# Label conversions, by name, for datasets whose raw label is not 0..num_labels-1.
LABEL_MAPS: dict[str, Callable[[dict], Any]] = {
    "stars_minus_one": lambda row: int(row["stars"]) - 1 if "stars" in row else int(row["label"]),
    "seahorse_yes_share": seahorse_target,
}


def ms_marco_passages(rows: list[dict], where: str) -> list[dict]:
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
    "seahorse_long_to_wide": seahorse_long_to_wide,
    "ms_marco_passages": ms_marco_passages,
}

# Hub readers, by name, for datasets held as files rather than a table: (split, revision)
# -> the split's rows (ms_marco_bm25: Tevatron's MS MARCO files, `marco_bm25`).
HUB_READERS: dict[str, Callable[[str, str | None], list[dict]]] = {
    "msmarco_passage_files": marco_bm25.read_split,
}
