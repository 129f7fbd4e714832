"""The 17 tasks: registry, loading through a mirror (real data where present), bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest
from mirror_helpers import (
    MASSIVE_EURO,
    MASSIVE_LOCALES,
    MASSIVE_SIZES,
    SEAHORSE_LONG_QUESTIONS,
    massive_mirror,
    shared_data,
    split_mirror,
    write_jsonl,
)

from encoder_eval.core import metrics
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import REGRESSION, SINGLE_LABEL
from encoder_eval.data import formatters, revisions, sources, task_loading, tasks
from encoder_eval.data.revisions import dataset_revisions
from encoder_eval.data.sources import data_provenance, read_jsonl
from encoder_eval.data.task_loading import concat_and_shuffle, load_task, rows_to_split
from encoder_eval.data.tasks import TASK_KNOBS

MULTILINGUAL = ("xnli", "paws_x", "amazon_reviews_multi", "massive_intent", "seahorse")
GLUE = ("glue_cola", "glue_sst2", "glue_mrpc", "glue_stsb", "glue_qqp", "glue_mnli", "glue_qnli",
        "glue_rte")  # fmt: skip
SUPERGLUE = ("sg_boolq", "sg_cb", "sg_wic", "sg_wsc")
REAL_TASKS = MULTILINGUAL + GLUE + SUPERGLUE  # the suite; `synthetic_*` tasks are extra

# Each task's one primary metric (issue 2, item 4).
PRIMARY_METRIC = {
    **dict.fromkeys(MULTILINGUAL + GLUE + SUPERGLUE, "accuracy"),
    "glue_cola": "mcc",
    "glue_mrpc": "f1",
    "glue_qqp": "f1",
    "glue_stsb": "spearman",
    "seahorse": "spearman",
    "sg_cb": "macro_f1",
}

# Row counts of the real mirror (../shared/data/SOURCES.md; `wc -l`), per split and language.
EN = "en"
REAL_ROWS = {
    "glue_cola": {"train": {EN: 8551}, "validation": {EN: 1043}},
    "glue_sst2": {"train": {EN: 20000}, "validation": {EN: 872}},
    "glue_mrpc": {"train": {EN: 3667}, "validation": {EN: 408}},
    "glue_stsb": {"train": {EN: 5749}, "validation": {EN: 1500}},
    "glue_qqp": {"train": {EN: 8999}, "validation": {EN: 1000}},
    "glue_mnli": {"train": {EN: 8999}, "validation": {EN: 1000}},
    "glue_qnli": {"train": {EN: 8999}, "validation": {EN: 5463}},
    "glue_rte": {"train": {EN: 2490}, "validation": {EN: 277}},
    "sg_boolq": {"train": {EN: 32}, "validation": {EN: 3270}},
    "sg_cb": {"train": {EN: 250}, "validation": {EN: 56}},
    "sg_wic": {"train": {EN: 5428}, "validation": {EN: 638}},
    "sg_wsc": {"train": {EN: 554}, "validation": {EN: 104}},
    "amazon_reviews_multi": {
        "train": dict.fromkeys(("de", "en", "es", "fr"), 1280),
        "validation": dict.fromkeys(("de", "en", "es", "fr"), 1280),
        "test": dict.fromkeys(("de", "en", "es", "fr"), 5000),
    },
}
# Validation-only tasks: rows per language of the real validation files.
REAL_VALIDATION_ONLY = {
    "xnli": dict.fromkeys(("bg", "de", "el", "en", "es", "fr", "ru"), 2490),
    "paws_x": dict.fromkeys(("de", "en", "es", "fr"), 2000),
    "seahorse": {None: 8968},
}
PAIR_TASKS = {
    "xnli", "paws_x", "glue_mrpc", "glue_stsb", "glue_qqp", "glue_mnli", "glue_qnli",
    "glue_rte", "sg_boolq", "sg_cb", "sg_wic",
}  # fmt: skip


def _quiet_load(task: str, data_dir, **kw):
    """load_task, without the warnings for non-Euro languages a small mirror lacks."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*mirror has no .*skipped")
        return load_task(task, data_dir, **kw)


@cache
def _real(task: str):
    return _quiet_load(task, shared_data())


@pytest.fixture(scope="module")
def split_mirrors(tmp_path_factory) -> tuple[Path, dict]:
    """xnli, paws_x and seahorse with train/validation/test cut from their real validation."""
    root = tmp_path_factory.mktemp("split-mirror")
    counts = {task: split_mirror(task, root) for task in REAL_VALIDATION_ONLY}
    return root, counts


@pytest.fixture(scope="module")
def massive(tmp_path_factory) -> Path:
    return massive_mirror(tmp_path_factory.mktemp("massive"))


def _splits_of(result) -> dict[str, dict[str, dict]]:
    train, val, test, _, _ = result
    return {"train": {"*": train}, "validation": val, "test": test}


def _check_columns(task: str, split: dict, where: str) -> None:
    knobs = TASK_KNOBS[task]
    n = len(split["label"])
    assert n > 0, where
    assert len(split["text"]) == n and all(isinstance(t, str) for t in split["text"]), where
    # Real data has a few empty texts (22 SeaHorse summaries); nearly all are non-empty.
    assert sum(bool(t.strip()) for t in split["text"]) >= 0.99 * n, where
    if task in PAIR_TASKS:
        assert len(split["text_pair"]) == n, where
        assert all(isinstance(t, str) and t for t in split["text_pair"]), where
    else:
        assert "text_pair" not in split, where
    if knobs.problem == REGRESSION:
        assert all(isinstance(v, float) for v in split["label"]), where
    else:
        assert all(type(v) is int and 0 <= v < knobs.num_labels for v in split["label"]), where


# ----------------------------------------------------------------------------- the registry


def test_seventeen_tasks_under_the_issue_names_in_their_buckets():
    suite = {t for t, k in TASK_KNOBS.items() if k.bucket not in ("synthetic", "ranking")}
    assert suite == set(REAL_TASKS) and len(suite) == 17
    # Outside the suite only the Hub's MS MARCO tasks read the Hub (synthetic and mirror
    # tasks do not).
    hub_outside = {t for t in set(TASK_KNOBS) - suite if TASK_KNOBS[t].hf_path}
    assert hub_outside == {"ms_marco_v21", "ms_marco_bm25"}
    buckets = {b: sorted(t for t, k in TASK_KNOBS.items() if k.bucket == b) for b in
               ("multilingual", "glue", "superglue")}  # fmt: skip
    assert buckets == {"multilingual": sorted(MULTILINGUAL), "glue": sorted(GLUE),
                       "superglue": sorted(SUPERGLUE)}  # fmt: skip
    assert [len(v) for v in buckets.values()] == [5, 8, 4]
    assert all(callable(task_loading.loader_for(t)) for t in TASK_KNOBS)
    assert tasks.MULTILINGUAL_TASKS == MULTILINGUAL


def test_the_registries_import_without_the_heavy_libraries():
    """`--help` and `list` read the task and model registries: importing them in a fresh
    process pulls in none of torch, transformers, datasets, the Hub client or numpy (the
    reading and loading of task data live in other modules)."""
    heavy = ("torch", "transformers", "datasets", "huggingface_hub", "numpy", "sklearn", "scipy")
    code = (
        "import sys, encoder_eval.data.tasks, encoder_eval.data.models\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert proc.stdout.strip() == "", f"imported: {proc.stdout.strip()}"


@pytest.mark.parametrize("task", sorted(REAL_TASKS))
def test_knobs_are_consistent(task):
    k = TASK_KNOBS[task]
    assert k.metric == PRIMARY_METRIC[task] and k.metric in metrics.METRICS
    assert k.problem in (SINGLE_LABEL, REGRESSION)
    assert (k.problem == REGRESSION) == (k.num_labels == 1)
    assert k.euro_languages and set(k.euro_languages) <= set(k.languages)
    assert len(set(k.languages)) == len(k.languages)
    assert k.hf_path and k.hf_path in dataset_revisions()
    if k.bucket == "multilingual":
        assert k.report_split == "test"
        assert k.language_field or set(k.hf_lang_configs) == set(k.languages)
    else:
        assert k.report_split == "validation"  # dev, marked * in tables
        assert k.hf_config and k.languages == ("en",)
    if len(k.inputs) == 1 and k.inputs[0] in formatters.FORMATTERS:
        assert k.pair_format == k.inputs[0]


def test_hub_ids_and_configs():
    assert {TASK_KNOBS[t].hf_path for t in GLUE} == {"nyu-mll/glue"}
    assert {TASK_KNOBS[t].hf_path for t in SUPERGLUE} == {"aps/super_glue"}
    assert TASK_KNOBS["glue_mnli"].hub_splits["validation"] == "validation_matched"
    assert TASK_KNOBS["sg_wsc"].hf_config == "wsc.fixed"


# ----------------------------------------------------------------------------- real data


@pytest.mark.parametrize("task", sorted(REAL_ROWS))
def test_real_mirror_task_loads_with_expected_sizes(task):
    data = shared_data()
    expected = REAL_ROWS[task]
    knobs = TASK_KNOBS[task]
    # The counts above are SOURCES.md's; the files must still have them.
    for split, per_lang in expected.items():
        for lang, n in per_lang.items():
            name = sources.mirror_file(data, task, split, lang if knobs.multilingual else None)
            assert sum(1 for _ in open(name, encoding="utf-8")) == n, name
    train, val, test, num_labels, problem = _real(task)
    assert (num_labels, problem) == (knobs.num_labels, knobs.problem)
    assert len(train["label"]) == sum(expected["train"].values())
    assert {lang: len(s["label"]) for lang, s in val.items()} == expected["validation"]
    if knobs.report_split == "test":
        assert {lang: len(s["label"]) for lang, s in test.items()} == expected["test"]
    else:
        assert test is val
    for name, per_lang in _splits_of(_real(task)).items():
        for lang, split in per_lang.items():
            _check_columns(task, split, f"{task} {name} {lang}")
    if problem == SINGLE_LABEL:  # every class is seen in training and in validation
        assert set(train["label"]) == set(range(num_labels))
        for split in val.values():
            assert set(split["label"]) == set(range(num_labels))


@pytest.mark.parametrize("task", sorted(REAL_ROWS))
def test_loading_is_deterministic(task):
    again = _quiet_load(task, shared_data())
    assert again == _real(task)


def test_real_languages_are_the_euro_set_present():
    assert set(_real("amazon_reviews_multi")[1]) == {"de", "en", "es", "fr"}
    assert set(TASK_KNOBS["amazon_reviews_multi"].euro_languages) == {"de", "en", "es", "fr"}


def test_multilingual_train_is_shuffled_not_concatenated():
    data = shared_data()
    task = "amazon_reviews_multi"
    train = _real(task)[0]
    plain = [rows_to_split(task, read_jsonl(data / task / f"train.{lang}.jsonl"), "x")
             for lang in ("de", "en", "es", "fr")]  # fmt: skip
    concatenated = {k: [v for s in plain for v in s[k]] for k in plain[0]}
    assert train != concatenated
    # ... but it is a permutation of it, and the fixed seed's permutation.
    assert sorted(train["text"]) == sorted(concatenated["text"])
    assert train == concat_and_shuffle(plain)
    assert concat_and_shuffle(plain, seed=1) != train


def test_stsb_labels_are_float_scores():
    data = shared_data()
    train, val, *_ = _real("glue_stsb")
    rows = read_jsonl(data / "glue_stsb" / "validation.jsonl")
    assert val["en"]["label"] == [float(r["label"]) for r in rows]
    assert all(0.0 <= v <= 5.0 for v in train["label"] + val["en"]["label"])
    assert len(set(train["label"])) > 50  # real scores, not classes


def test_amazon_stars_become_labels_0_to_4():
    data = shared_data()
    _, val, test, *_ = _real("amazon_reviews_multi")
    for lang in ("de", "en", "es", "fr"):
        rows = read_jsonl(data / "amazon_reviews_multi" / f"validation.{lang}.jsonl")
        assert val[lang]["label"] == [r["stars"] - 1 for r in rows]
        assert val[lang]["text"] == [r["review_body"] for r in rows]
        assert sorted(set(test[lang]["label"])) == [0, 1, 2, 3, 4]
        assert test[lang]["label"].count(0) == 1000  # official MARC test: 1,000 per star


def test_amazon_mteb_rows_load_too(tmp_path):
    """mteb/AmazonReviewsClassification rows carry text/label (label = stars - 1)."""
    for split in ("train", "validation", "test"):
        for lang in ("de", "en", "es", "fr"):
            rows = [{"id": f"{lang}{i}", "text": f"review {i} ({lang})", "label": i % 5,
                     "label_text": str(i % 5)} for i in range(10)]  # fmt: skip
            write_jsonl(tmp_path / "amazon_reviews_multi" / f"{split}.{lang}.jsonl", rows)
    train, val, test, num_labels, _ = _quiet_load("amazon_reviews_multi", tmp_path)
    assert num_labels == 5 and set(val) == set(test) == {"de", "en", "es", "fr"}
    assert val["de"]["label"] == [i % 5 for i in range(10)]
    assert val["de"]["text"][3] == "review 3 (de)"
    assert len(train["label"]) == 40


def test_wic_marks_the_target_word_in_both_sentences():
    data = shared_data()
    for split, loaded in (("train", _real("sg_wic")[0]), ("validation", _real("sg_wic")[1]["en"])):
        rows = read_jsonl(data / "sg_wic" / f"{split}.jsonl")
        for row, text, pair in zip(rows, loaded["text"], loaded["text_pair"], strict=True):
            for sentence, start, end, marked in (
                (row["sentence1"], row["start1"], row["end1"], text),
                (row["sentence2"], row["start2"], row["end2"], pair),
            ):
                target = sentence[start:end]
                assert marked == f"{sentence[:start]}*{target}*{sentence[end:]}"
                assert re.fullmatch(r"[\w'-]+", target), (target, sentence)
                assert marked.count("*") == sentence.count("*") + 2
    assert _real("sg_wic")[1]["en"]["text"][0] == "An emerging professional *class*."


def test_wsc_marks_noun_and_pronoun_at_their_word_indices():
    data = shared_data()
    for split, loaded in (("train", _real("sg_wsc")[0]), ("validation", _real("sg_wsc")[1]["en"])):
        rows = read_jsonl(data / "sg_wsc" / f"{split}.jsonl")
        assert "text_pair" not in loaded
        for row, text in zip(rows, loaded["text"], strict=True):
            assert text.replace("*", "").replace("#", "") == row["text"].replace("*", "")
            # Spans may overlap ("*#their# mothers*"): read each without the other's marks.
            noun = re.search(r"\*([^*]+)\*", text.replace("#", "")).group(1)
            pronoun = re.search(r"#([^#]+)#", text.replace("*", "")).group(1)
            for marked, span in ((noun, row["span1_text"]), (pronoun, row["span2_text"])):
                span = " ".join(span.split())  # one span text holds a line break
                assert marked.lower().startswith(span.lower()), (marked, row)
                assert len(marked.split(" ")) == len(span.split(" ")), (marked, row)


def test_wsc_off_by_one_span_is_realigned_like_wsc_fixed():
    row = {"text": "Some day they might want to use it , but not now.", "span1_index": 2,
           "span2_index": 6, "span1_text": "they", "span2_text": "it", "label": 0}  # fmt: skip
    text, pair = formatters.wsc_inputs(row)
    assert pair is None
    assert text == "Some day *they* might want to use #it# , but not now."
    multi = {**row, "span1_index": 0, "span1_text": "Some day"}
    assert formatters.wsc_inputs(multi)[0].startswith("*Some day* they")


# ----------------------------------------------------------------------------- split mirrors


@pytest.mark.parametrize("task", sorted(REAL_VALIDATION_ONLY))
def test_validation_only_tasks_load_from_a_seeded_split(task, split_mirrors):
    root, all_counts = split_mirrors
    counts = all_counts[task]
    knobs = TASK_KNOBS[task]
    # The split used every real validation row, once.
    for lang, n in REAL_VALIDATION_ONLY[task].items():
        assert sum(counts[s][lang] for s in counts) == n
    train, val, test, num_labels, problem = _quiet_load(task, root)
    assert (num_labels, problem) == (knobs.num_labels, knobs.problem)
    assert knobs.report_split == "test"
    if knobs.language_field:  # seahorse: one file, split by worker_lang
        rows = read_jsonl(root / task / "validation.jsonl")
        assert {r[knobs.language_field] for r in rows} <= set(knobs.languages)
        assert set(val) == set(test) == set(knobs.languages)
        for name, part in (("train", {"*": train}), ("validation", val), ("test", test)):
            assert sum(len(s["label"]) for s in part.values()) == counts[name][None]
    else:
        present = set(REAL_VALIDATION_ONLY[task])
        assert set(val) == set(test) == present == set(knobs.euro_languages)
        assert len(train["label"]) == sum(counts["train"].values())
        for lang in present:
            assert len(val[lang]["label"]) == counts["validation"][lang]
            assert len(test[lang]["label"]) == counts["test"][lang]
    for name, per_lang in _splits_of((train, val, test, 0, "")).items():
        for lang, split in per_lang.items():
            _check_columns(task, split, f"{task} {name} {lang}")
    assert _quiet_load(task, root) == (train, val, test, num_labels, problem)


def test_xnli_skips_missing_non_euro_languages_with_a_warning(split_mirrors):
    root, _ = split_mirrors
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_task("xnli", root)
    messages = {str(w.message) for w in caught}
    assert "xnli: mirror has no train.ar.jsonl; language 'ar' skipped" in messages
    skipped = set(TASK_KNOBS["xnli"].languages) - set(TASK_KNOBS["xnli"].euro_languages)
    assert len(messages) == 3 * len(skipped)  # train, validation, test


def test_xnli_train_mixes_languages(split_mirrors):
    root, _ = split_mirrors
    train = _quiet_load("xnli", root)[0]
    plain = [rows_to_split("xnli", read_jsonl(root / "xnli" / f"train.{lang}.jsonl"), "x")
             for lang in ("bg", "de", "el", "en", "es", "fr", "ru")]  # fmt: skip
    assert train != {k: [v for s in plain for v in s[k]] for k in plain[0]}
    first_100 = train["text"][:100]
    assert any(t in plain[0]["text"] for t in first_100)  # bg is not all at the end
    assert any(t in plain[-1]["text"] for t in first_100)  # nor ru


@pytest.mark.parametrize("task", MULTILINGUAL)
def test_multilingual_train_is_a_seeded_shuffle_of_all_languages(task, split_mirrors, massive):
    root = {"amazon_reviews_multi": shared_data(), "massive_intent": massive}.get(
        task, split_mirrors[0]
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*mirror has no .*skipped")
        per_lang = sources.read_split(task, "train", root)
    plain = [rows_to_split(task, rows, where) for rows, where in per_lang.values()]
    assert len(plain) > 1
    concatenated = {k: [v for s in plain for v in s[k]] for k in plain[0]}
    train = _quiet_load(task, root)[0]
    assert train != concatenated
    assert train == concat_and_shuffle(plain)
    pairs = sorted(zip(*concatenated.values(), strict=True))
    assert sorted(zip(*train.values(), strict=True)) == pairs  # same rows, all languages


def test_seahorse_target_is_the_share_of_yes(split_mirrors):
    root, _ = split_mirrors
    rows = read_jsonl(root / "seahorse" / "validation.jsonl")
    val = _quiet_load("seahorse", root)[1]
    for lang, split in val.items():
        mine = [r for r in rows if r["worker_lang"] == lang]
        expected = [sum(r[f"question{i}"] == "Yes" for i in range(1, 7)) / 6 for r in mine]
        assert split["label"] == pytest.approx(expected)
        assert split["text"] == [r["summary"] for r in mine]
    labels = [v for s in val.values() for v in s["label"]]
    assert min(labels) == 0.0 and max(labels) == 1.0 and len(set(labels)) == 7
    assert formatters.seahorse_target({"question1": "No", "question2": ""}) == 0.0
    assert formatters.seahorse_target({f"question{i}": " yes " for i in range(1, 7)}) == 1.0
    assert formatters.seahorse_target({"question1": "Yes", "question2": "Unsure"}) == 1 / 6


def test_seahorse_pairs_the_article_when_rows_have_one(tmp_path):
    row = {"worker_lang": "de", "summary": "kurz", "article": "lang", "question1": "Yes"}
    split = rows_to_split("seahorse", [row, {**row, "article": "noch"}], "x")
    assert split["text"] == ["kurz", "kurz"] and split["text_pair"] == ["lang", "noch"]


# The Hub copy tasksource/seahorse_summarization_evaluation@c641c22 (card: gem_id, worker_lang,
# model, article, summary, question, answer; 334,806/49,265/101,652 rows): one row per answered
# question, `question` its text, `answer` "Yes" or "No"; blank and "Unsure" answers are absent.
SEAHORSE_CARD_VALIDATION_ROWS = 49265


def _with_article(rows: list[dict]) -> list[dict]:
    return [{**r, "article": f"The article {r['gem_id']} ({r['worker_lang']})."} for r in rows]


def _seahorse_long(wide: list[dict], question_major: bool = False) -> list[dict]:
    """Wide SeaHorse rows melted into the Hub copy's long schema, one row per Yes/No answer."""
    cells = [(i, q) for q in range(6) for i in range(len(wide))] if question_major else [
        (i, q) for i in range(len(wide)) for q in range(6)]  # fmt: skip
    long = []
    for i, q in cells:
        row, answer = wide[i], wide[i][f"question{q + 1}"]
        if answer in ("Yes", "No"):
            long.append({"gem_id": row["gem_id"], "worker_lang": row["worker_lang"],
                         "model": row["model"], "article": row.get("article"),
                         "summary": row["summary"], "question": SEAHORSE_LONG_QUESTIONS[q],
                         "answer": answer})  # fmt: skip
    return long


def test_seahorse_long_melt_of_the_real_validation_has_the_cards_row_count():
    """Dropping blank and Unsure answers reproduces the Hub card's 49,265 validation rows."""
    wide = read_jsonl(shared_data() / "seahorse" / "validation.jsonl")
    assert len(_seahorse_long(wide)) == SEAHORSE_CARD_VALIDATION_ROWS


def test_seahorse_long_schema_loads_like_the_wide_schema(split_mirrors, tmp_path, monkeypatch):
    """Hub rows and a mirror in the long schema give the wide schema's texts, pairs, targets."""
    root, _ = split_mirrors
    wide = {s: _with_article(read_jsonl(root / "seahorse" / f"{s}.jsonl")[:n])
            for s, n in (("train", 900), ("validation", 300), ("test", 300))}  # fmt: skip
    for split, rows in wide.items():
        write_jsonl(tmp_path / "wide" / "seahorse" / f"{split}.jsonl", rows)
        write_jsonl(tmp_path / "long" / "seahorse" / f"{split}.jsonl", _seahorse_long(rows))
    expected = load_task("seahorse", tmp_path / "wide")
    labels = [v for s in expected[1].values() for v in s["label"]]
    assert len(set(labels)) == 7 and all("text_pair" in s for s in expected[1].values())
    assert load_task("seahorse", tmp_path / "long") == expected

    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    asked = []

    def hub(task, split, lang, revision=None):
        asked.append((task, split, lang))
        return _seahorse_long(wide[split])

    monkeypatch.setattr(sources, "read_hub_rows", hub)
    assert load_task("seahorse") == expected
    assert asked == [("seahorse", s, None) for s in ("train", "validation", "test")]
    # Any row order regroups to the same examples (the order of their first row).
    _, val, test, *_ = expected
    question_major = rows_to_split("seahorse", _seahorse_long(wide["test"], True), "x")
    flat = {k: [v for lang in test for v in test[lang][k]] for k in ("text", "text_pair", "label")}
    assert sorted(zip(*question_major.values(), strict=True)) == sorted(
        zip(flat["text"], flat["label"], flat["text_pair"], strict=True))  # fmt: skip


def test_seahorse_long_rows_regroup_with_missing_questions_counting_zero():
    base = {"gem_id": "g1", "worker_lang": "de", "model": "m", "article": "A", "summary": "S"}
    cited = "Q4. " + SEAHORSE_LONG_QUESTIONS[3][:-1] + ", as defined in Rashkin et al. (2021)."
    rows = [
        {**base, "question": SEAHORSE_LONG_QUESTIONS[0], "answer": "Yes"},
        {**base, "summary": "T", "question": "question1", "answer": "No"},  # 2-6 skipped
        {**base, "question": "The summary is grammatically correct. ", "answer": "yes"},
        {**base, "question": cited, "answer": "Yes"},
        {**base, "question": 5, "answer": "No"},
        {**base, "question": "conciseness", "answer": "Unsure"},
    ]
    grouped = formatters.seahorse_long_to_wide(rows, "x")
    assert [(g["summary"], [g[f"question{i}"] for i in range(1, 7)]) for g in grouped] == [
        ("S", ["Yes", "", "yes", "Yes", "No", "Unsure"]),
        ("T", ["No", "", "", "", "", ""]),
    ]
    split = rows_to_split("seahorse", rows, "x")
    assert split == {"text": ["S", "T"], "label": [0.5, 0.0], "text_pair": ["A", "A"]}
    wide = {**base, **{f"question{i}": "Yes" for i in range(1, 7)}}
    assert formatters.seahorse_long_to_wide([wide], "x") == [wide]  # the wide schema passes
    with pytest.raises(HarnessError, match=r"x: row 1: question 'How long\?' is none of Sea"):
        rows_to_split("seahorse", [{**base, "question": "How long?", "answer": "Yes"}], "x")
    with pytest.raises(HarnessError, match=r"row 1: answer '1' is not Yes, No or Unsure"):
        rows_to_split("seahorse", [{**base, "question": "question2", "answer": "1"}], "x")
    with pytest.raises(HarnessError, match=r"row 2: question3 is answered twice for one summ"):
        rows_to_split("seahorse", [rows[2], rows[2]], "x")


def test_massive_trains_on_all_51_locales_and_averages_the_euro_set(massive, monkeypatch):
    """The specification: every language's train split, every locale scored, Euro averaged."""
    knobs = TASK_KNOBS["massive_intent"]
    assert knobs.languages == MASSIVE_LOCALES and len(MASSIVE_LOCALES) == 51
    assert knobs.euro_languages == MASSIVE_EURO
    assert knobs.hf_lang_configs == {loc: loc for loc in MASSIVE_LOCALES}
    train, val, test, *_ = load_task("massive_intent", massive)
    assert {t.split("]")[0][1:] for t in train["text"]} == set(MASSIVE_LOCALES)
    assert list(val) == list(test) == list(MASSIVE_LOCALES)
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    asked = []

    def hub(task, split, lang, revision=None):
        asked.append((split, lang))
        return read_jsonl(sources.mirror_file(massive, task, split, lang))

    monkeypatch.setattr(sources, "read_hub_rows", hub)
    assert load_task("massive_intent") == (train, val, test, 60, SINGLE_LABEL)
    assert asked == [(s, loc) for s in ("train", "validation", "test") for loc in MASSIVE_LOCALES]


def test_massive_mirror_with_some_non_euro_locales_skips_the_rest(tmp_path):
    some = MASSIVE_EURO + ("ja-JP", "sw-KE")
    massive_mirror(tmp_path, locales=some)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, val, test, *_ = load_task("massive_intent", tmp_path)
    assert set(val) == set(test) == set(some)
    assert len(train["label"]) == MASSIVE_SIZES["train"] * len(some)
    skipped = {str(w.message) for w in caught}
    assert "massive_intent: mirror has no train.af-ZA.jsonl; language 'af-ZA' skipped" in skipped
    assert len(skipped) == 3 * (51 - len(some))


def test_massive_synthetic_mirror_in_the_real_schema(massive):
    train, val, test, num_labels, problem = load_task("massive_intent", massive)
    assert (num_labels, problem) == (60, SINGLE_LABEL)
    assert set(val) == set(test) == set(MASSIVE_LOCALES)
    assert set(TASK_KNOBS["massive_intent"].languages) == set(MASSIVE_LOCALES)
    assert len(train["label"]) == MASSIVE_SIZES["train"] * len(MASSIVE_LOCALES)
    assert all(len(s["label"]) == MASSIVE_SIZES["test"] for s in test.values())
    assert set(train["label"]) == set(range(60))
    assert val["de-DE"]["text"][0].startswith("[de-DE] please ")
    rows = read_jsonl(massive / "massive_intent" / "test.fr-FR.jsonl")
    assert test["fr-FR"]["label"] == [r["intent"] for r in rows]
    assert test["fr-FR"]["text"] == [r["utt"] for r in rows]
    locales_seen = [t.split("]")[0][1:] for t in train["text"][:50]]
    assert len(set(locales_seen)) > 4  # shuffled across locales
    assert load_task("massive_intent", massive) == (train, val, test, num_labels, problem)


def test_select_phase_does_not_read_the_test_split(massive, tmp_path):
    for path in (massive / "massive_intent").glob("*.jsonl"):
        if not path.name.startswith("test."):
            (tmp_path / "massive_intent").mkdir(exist_ok=True)
            (tmp_path / "massive_intent" / path.name).write_bytes(path.read_bytes())
    train, val, test, *_ = load_task("massive_intent", tmp_path, with_test=False)
    assert test == {} and set(val) == set(MASSIVE_LOCALES)
    with pytest.raises(HarnessError, match=r"test\.de-DE\.jsonl"):
        _quiet_load("massive_intent", tmp_path)  # after skipping af-ZA .. da-DK


def test_data_dir_from_the_environment(massive, monkeypatch):
    monkeypatch.setenv("ENCODER_EVAL_DATA_DIR", str(massive))
    assert load_task("massive_intent")[3] == 60
    assert data_provenance("massive_intent")["source"] == "mirror"


# ----------------------------------------------------------------------------- bad input


def _mirror(tmp_path: Path, task: str, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / task).mkdir(parents=True, exist_ok=True)
        (tmp_path / task / name).write_text(text, encoding="utf-8")
    return tmp_path


def _lines(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = _lines({"sentence": "fine.", "label": 1}, {"sentence": "also fine.", "label": 0})


def test_unknown_task_lists_valid_names_and_suggests_one():
    with pytest.raises(HarnessError) as err:
        load_task("glue_sst")
    message = str(err.value)
    assert "unknown task 'glue_sst'" in message
    assert "Did you mean 'glue_sst2'?" in message
    assert all(name in message for name in TASK_KNOBS)
    with pytest.raises(HarnessError, match="Did you mean 'paws_x'"):
        tasks.task_knobs("pawsx")
    with pytest.raises(HarnessError, match="unknown task"):
        data_provenance("nope")


def test_invalid_json_names_file_and_line(tmp_path):
    bad = GOOD + '{"sentence": "broken", "label": 1\n'
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": bad, "validation.jsonl": GOOD})
    with pytest.raises(HarnessError) as err:
        load_task("glue_cola", root)
    assert f"{root / 'glue_cola' / 'train.jsonl'}:3: invalid JSON" in str(err.value)
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD + "[1, 2]\n"})
    with pytest.raises(HarnessError, match=r"train\.jsonl:3: expected a JSON object"):
        load_task("glue_cola", root)


def test_blank_lines_are_skipped(tmp_path):
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD + "\n\n", "validation.jsonl": GOOD})
    assert len(load_task("glue_cola", root)[0]["label"]) == 2


def test_missing_field_names_file_row_and_field(tmp_path):
    rows = _lines({"sentence": "ok", "label": 1}, {"text": "wrong field", "label": 0})
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": rows, "validation.jsonl": GOOD})
    with pytest.raises(HarnessError) as err:
        load_task("glue_cola", root)
    message = str(err.value)
    assert str(root / "glue_cola" / "train.jsonl") in message
    assert "row 2 has no field 'sentence'" in message
    root = _mirror(tmp_path, "glue_mrpc", {"train.jsonl": _lines({"sentence1": "a", "label": 1})})
    with pytest.raises(HarnessError, match="row 1 has no field 'sentence2'"):
        load_task("glue_mrpc", root)
    root = _mirror(
        tmp_path, "glue_rte", {"train.jsonl": _lines({"sentence1": "a", "sentence2": "b"})}
    )
    with pytest.raises(HarnessError, match="row 1 has no field 'label'"):
        load_task("glue_rte", root)


def test_label_out_of_range(tmp_path):
    rows = GOOD + _lines({"sentence": "three classes?", "label": 2})
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": rows, "validation.jsonl": GOOD})
    with pytest.raises(HarnessError) as err:
        load_task("glue_cola", root)
    assert "train.jsonl: row 3: label 2 is outside 0..1" in str(err.value)
    assert "hidden" not in str(err.value)
    rows = _lines({"sentence": "x", "label": "1"})
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": rows})
    with pytest.raises(HarnessError, match="row 1: label '1' is not an integer class id"):
        load_task("glue_cola", root)
    rows = _lines({"sentence1": "a", "sentence2": "b", "label": "high"})
    root = _mirror(tmp_path, "glue_stsb", {"train.jsonl": rows})
    with pytest.raises(HarnessError, match="label 'high' is not a number"):
        load_task("glue_stsb", root)
    ok = _lines({"review_body": "gut", "stars": 5})
    root = _mirror(tmp_path, "amazon_reviews_multi", {"train.de.jsonl": _lines(
        {"review_body": "zu gut", "stars": 6}), "train.en.jsonl": ok, "train.es.jsonl": ok,
        "train.fr.jsonl": ok})  # fmt: skip
    with pytest.raises(HarnessError, match=r"train\.de\.jsonl: row 1: label 5 is outside 0\.\.4"):
        _quiet_load("amazon_reviews_multi", root)


def test_label_minus_one_mentions_hidden_test_labels(tmp_path):
    rows = _lines({"sentence1": "a", "sentence2": "b", "label": -1})
    root = _mirror(tmp_path, "glue_rte", {"train.jsonl": rows})
    with pytest.raises(HarnessError) as err:
        load_task("glue_rte", root)
    assert "row 1: label -1 is outside 0..1 (-1 marks a hidden test label)" in str(err.value)


def test_empty_split_says_which(tmp_path):
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD, "validation.jsonl": "\n"})
    with pytest.raises(
        HarnessError, match=r"task 'glue_cola': the validation \(en\) split is empty"
    ):
        load_task("glue_cola", root)


def test_empty_language_file_says_which(massive, tmp_path):
    for path in (massive / "massive_intent").glob("*.jsonl"):
        (tmp_path / "massive_intent").mkdir(exist_ok=True)
        text = "" if path.name == "test.pl-PL.jsonl" else path.read_text()
        (tmp_path / "massive_intent" / path.name).write_text(text)
    with pytest.raises(HarnessError, match=r"the test \(pl-PL\) split is empty"):
        load_task("massive_intent", tmp_path)


def test_single_class_split_is_refused_before_training(tmp_path):
    ones = _lines({"sentence": "fine.", "label": 1}, {"sentence": "also fine.", "label": 1})
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": ones, "validation.jsonl": GOOD})
    with pytest.raises(HarnessError) as err:
        load_task("glue_cola", root)
    message = str(err.value)
    assert message.startswith("task 'glue_cola': the train split of language 'en' holds a "
                              "single class (all 2 labels are 1)")  # fmt: skip
    assert str(root / "glue_cola" / "train.jsonl") in message and "seeded sample" in message
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD, "validation.jsonl": ones})
    with pytest.raises(HarnessError, match=r"the validation split of language 'en' holds a sin"):
        load_task("glue_cola", root, with_test=False)
    ok = _lines({"review_body": "gut", "stars": 5}, {"review_body": "schlecht", "stars": 1})
    one = _lines({"review_body": "gut", "stars": 5}, {"review_body": "sehr gut", "stars": 5})
    files = {f"{s}.{lang}.jsonl": ok for s in ("train", "validation", "test")
             for lang in ("de", "en", "es", "fr")}  # fmt: skip
    root = _mirror(tmp_path / "m", "amazon_reviews_multi", {**files, "test.fr.jsonl": one})
    assert _quiet_load("amazon_reviews_multi", root, with_test=False)[1]["fr"]["label"] == [4, 0]
    with pytest.raises(HarnessError, match=r"the test split of language 'fr' holds a single"):
        _quiet_load("amazon_reviews_multi", root)


def test_constant_target_is_refused_before_training(tmp_path):
    pairs = [{"sentence1": f"a{i}", "sentence2": "b", "label": 2.5} for i in range(3)]
    root = _mirror(tmp_path, "glue_stsb", {"train.jsonl": _lines(*pairs)})
    with pytest.raises(HarnessError) as err:
        load_task("glue_stsb", root)
    assert str(err.value).startswith("task 'glue_stsb': the train split of language 'en' has a "
                                     "constant target (all 3 targets are 2.5)")  # fmt: skip
    # SeaHorse rows the loader cannot read a rating from (the old failure: every target 0).
    rows = [{"gem_id": f"g{i}", "worker_lang": lang, "summary": "s", "score": 1}
            for i in range(2) for lang in TASK_KNOBS["seahorse"].languages]  # fmt: skip
    root = _mirror(tmp_path, "seahorse", {"train.jsonl": _lines(*rows)})
    with pytest.raises(HarnessError, match=r"train split of language 'de' has a constant target "
                                           r"\(all 2 targets are 0\.0\)"):  # fmt: skip
        load_task("seahorse", root)


@pytest.mark.parametrize("task", [t for t, k in TASK_KNOBS.items() if k.bucket == "synthetic"])
def test_synthetic_tasks_still_load(task):
    train, val, test, num_labels, problem = load_task(task)
    for split in (train, *val.values(), *test.values()):
        assert len(set(split["label"])) > 1


def test_missing_split_file_says_which_and_how_to_fix(tmp_path, monkeypatch):
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD})
    monkeypatch.delenv("HF_HUB_OFFLINE")  # online: the Hub command that writes it is offered
    with pytest.raises(HarnessError) as err:
        load_task("glue_cola", root)
    message = str(err.value)
    assert "no validation.jsonl for task 'glue_cola'" in message
    assert str(root / "glue_cola" / "validation.jsonl") in message
    assert "found: train.jsonl" in message
    assert f"encoder-eval prefetch --tasks glue_cola --out {root}" in message
    with pytest.raises(HarnessError, match="no train.jsonl .* found: no task directory"):
        load_task("glue_rte", root)


def test_a_misspelt_data_dir_names_the_missing_folder_and_offline_offers_no_hub_command(
    tmp_path, monkeypatch
):
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    misspelt = tmp_path / "mirorr"
    with pytest.raises(HarnessError) as err:
        load_task("glue_cola", misspelt)
    assert str(err.value) == (
        f"the data mirror {misspelt} (--data-dir, or ENCODER_EVAL_DATA_DIR) is not a folder; "
        f"check the path: a mirror holds a folder per task, such as {misspelt / 'glue_cola'}/"
    )
    with pytest.raises(HarnessError) as err:  # the mirror is there, the split is not
        load_task("glue_cola", root)
    assert "prefetch" not in str(err.value)
    assert str(err.value).endswith(f"Copy the task's files into {root / 'glue_cola'}/ (a "
                                   "mirror keeps a task's files in a folder named after the "
                                   "task key).")  # fmt: skip


def test_missing_euro_language_file_is_an_error(split_mirrors, tmp_path):
    root, _ = split_mirrors
    for path in (root / "paws_x").glob("*.jsonl"):
        if ".fr." not in path.name:
            (tmp_path / "paws_x").mkdir(exist_ok=True)
            (tmp_path / "paws_x" / path.name).write_bytes(path.read_bytes())
    with pytest.raises(HarnessError, match=r"no train\.fr\.jsonl for task 'paws_x'"):
        _quiet_load("paws_x", tmp_path)


def test_invalid_revision_override(monkeypatch):
    monkeypatch.setenv("ENCODER_EVAL_DATASET_REVISIONS", "{nyu-mll/glue: abc}")
    with pytest.raises(HarnessError, match="ENCODER_EVAL_DATASET_REVISIONS is not valid JSON"):
        dataset_revisions()
    monkeypatch.setenv("ENCODER_EVAL_DATASET_REVISIONS", '["abc"]')
    with pytest.raises(HarnessError, match="must be a JSON object"):
        dataset_revisions()


def test_revision_override_is_visible_in_hub_provenance(monkeypatch):
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    monkeypatch.delenv("ENCODER_EVAL_DATASET_REVISIONS", raising=False)
    asked = _fake_hub_commits(monkeypatch)
    assert dataset_revisions()["nyu-mll/glue"] is None
    assert dataset_revisions()["AmazonScience/massive"] == "refs/convert/parquet"
    head = data_provenance("glue_cola")
    assert head == {"source": "hub", "dataset": "nyu-mll/glue", "revision": HEAD_SHA,
                    "revision_requested": None, "identity": f"hub:nyu-mll/glue@{HEAD_SHA}"}  # fmt: skip
    assert asked == [("nyu-mll/glue", None)]
    sha = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("ENCODER_EVAL_DATASET_REVISIONS", json.dumps({"nyu-mll/glue": sha}))
    assert dataset_revisions()["nyu-mll/glue"] == sha
    assert dataset_revisions()["aps/super_glue"] is None  # others keep their default
    pinned = data_provenance("glue_cola")
    assert pinned["revision"] == pinned["revision_requested"] == sha  # a commit needs no lookup
    assert pinned["identity"] == f"hub:nyu-mll/glue@{sha}" != head["identity"]
    assert data_provenance("sg_cb")["revision"] == HEAD_SHA
    assert revisions.default_revisions()["nyu-mll/glue"] is None  # the task rows are untouched


HEAD_SHA = "c641c22879b601fb2edaa0a3f0edf3a68e5f5d23"


@pytest.fixture(autouse=True)
def _fresh_revision_cache():
    """Resolved dataset commits are cached per process; each test starts and ends empty."""
    revisions.resolve_dataset_revision.cache_clear()
    yield
    revisions.resolve_dataset_revision.cache_clear()


def _fake_hub_commits(monkeypatch, sha: str = HEAD_SHA) -> list:
    """Replace the one Hub call that resolves a dataset revision; returns what it was asked."""
    asked = []

    def resolve(repo, revision):
        asked.append((repo, revision))
        return sha

    monkeypatch.setattr(revisions, "_hub_dataset_sha", resolve)
    return asked


def test_hub_rows_are_read_at_the_commit_the_provenance_records(monkeypatch):
    """What a result records as the data's commit is the commit the loader read (item 8)."""
    import datasets

    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    monkeypatch.delenv("ENCODER_EVAL_DATASET_REVISIONS", raising=False)
    _fake_hub_commits(monkeypatch)
    loads = []

    def load_dataset(path, config=None, split=None, revision=None):
        loads.append((path, config, split, revision))
        label = len(loads) % 2
        return [{"sentence": f"row {i} of {split}", "label": (i + label) % 2} for i in range(4)]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    prov = data_provenance("glue_cola")
    load_task("glue_cola")
    assert loads and {rev for *_, rev in loads} == {prov["revision"]} == {HEAD_SHA}


def test_an_unresolvable_hub_revision_is_an_error_naming_the_fixes(monkeypatch, tmp_path):
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    monkeypatch.delenv("ENCODER_EVAL_DATASET_REVISIONS", raising=False)

    def offline(repo, revision):
        raise OSError("offline")

    monkeypatch.setattr(revisions, "_hub_dataset_sha", offline)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(HarnessError, match="cannot resolve nyu-mll/glue@main.*--data-dir"):
        data_provenance("glue_rte")
    # Offline, the ref the Hugging Face cache stored when the data was downloaded answers.
    ref = tmp_path / "hub" / "datasets--nyu-mll--glue" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text(HEAD_SHA)
    revisions.resolve_dataset_revision.cache_clear()
    assert data_provenance("glue_rte")["revision"] == HEAD_SHA


# ----------------------------------------------------------------------------- provenance


def test_content_hash_changes_when_a_mirror_file_changes(tmp_path):
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD, "validation.jsonl": GOOD})
    first = data_provenance("glue_cola", root)
    assert first["source"] == "mirror" and first["dataset"] == "nyu-mll/glue"
    assert re.fullmatch(r"[0-9a-f]{64}", first["sha256"])
    assert first["identity"] == f"mirror:sha256:{first['sha256']}"
    assert data_provenance("glue_cola", root) == first
    (root / "glue_cola" / "validation.jsonl").write_text(
        GOOD + _lines({"sentence": "new", "label": 0})
    )
    second = data_provenance("glue_cola", root)
    assert second["sha256"] != first["sha256"]
    (root / "glue_cola" / "validation.jsonl").rename(root / "glue_cola" / "test.jsonl")
    assert data_provenance("glue_cola", root)["sha256"] not in (first["sha256"], second["sha256"])


def test_manifest_entry_is_used_when_present(tmp_path):
    root = _mirror(tmp_path, "glue_cola", {"train.jsonl": GOOD, "validation.jsonl": GOOD})
    _mirror(tmp_path, "glue_rte", {"train.jsonl": GOOD})
    entry = {"dataset": "nyu-mll/glue", "revision": "a" * 40, "revision_requested": None,
             "files": {"train.jsonl": {"rows": 2, "sha256": "b" * 64}}}  # fmt: skip
    manifest = {"schema": "encoder-eval-mirror", "version": 1, "tasks": {"glue_cola": entry}}
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    prov = data_provenance("glue_cola", root)
    assert prov["revision"] == "a" * 40 and prov["manifest"]["dataset"] == "nyu-mll/glue"
    # The identity is the content actually there, whatever the manifest claims.
    assert prov["identity"] == f"mirror:sha256:{prov['sha256']}"
    # A task the manifest does not list, or an unreadable manifest: the content hash alone.
    assert "revision" not in data_provenance("glue_rte", root)
    (root / "MANIFEST.json").write_text("{not json")
    assert data_provenance("glue_cola", root) == {
        k: v for k, v in prov.items() if k not in ("manifest", "revision")
    }
