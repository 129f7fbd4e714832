"""The task registry: what the harness knows about each task, as data, and the table of tasks.

A task is one row of `TASK_KNOBS` (plain data: where the data lives, which fields are the
inputs, the metric, the report split, the languages). The rest of a task's life lives in
modules named for it: the per-dataset steps a row names (`encoder_eval.data.formatters`),
where rows come from, the Hub or a mirror, and which source was read
(`encoder_eval.data.sources`), which Hub commit is read (`encoder_eval.data.revisions`), and
rows turned into checked splits (`encoder_eval.data.task_loading`: `load_task`). User tasks,
written in task files (`encoder_eval.data.taskfile`), join the registry through
`add_user_task`.

Importing this module is light (no torch, transformers or datasets): `--help` and `list`
read the registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.core import process_state
from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.problems import RANKING, REGRESSION, SINGLE_LABEL
from encoder_eval.data import marco_bm25
from encoder_eval.data.formatters import FORMATTERS


@dataclass(frozen=True)
class TaskKnobs:
    """Everything the harness knows about a task, as data.

    `inputs` says how a row becomes model input: ``("field",)`` for one text,
    ``("a", "b")`` for a pair, or the name of a special formatter (``"wic"``, ``"wsc"``,
    ``"seahorse"``). `languages` are the languages loaded and scored; `euro_languages`
    those averaged into the headline score. `hub_splits` maps our split names
    (train/validation/test) to the dataset's own. `row_grouping` names a step in
    `formatters.ROW_GROUPINGS` that turns the rows read into one row per example first, for datasets
    stored with several rows per example. `hub_reader` names a reader in `formatters.HUB_READERS` for
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
    # The Hub dataset's revision this task reads (None: the head; see `revisions.dataset_revisions`),
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
_BUILTIN_KNOBS = dict(TASK_KNOBS)


def _forget_user_tasks() -> None:
    """Put the registry back to the package's tasks: a user task file registers its tasks
    for the process that read it, and a warm worker's next unit must not see them."""
    TASK_KNOBS.clear()
    TASK_KNOBS.update(_BUILTIN_KNOBS)


process_state.register("user tasks in the task registry (data/tasks.py)", _forget_user_tasks)
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


def task_label(name: str) -> str:
    """How tables name a task: its row's label, else its key."""
    knobs = TASK_KNOBS.get(name)
    return (knobs.label if knobs is not None else "") or name


def task_knobs(name: str) -> TaskKnobs:
    """Return a task's knobs, or raise an error listing the valid names."""
    if name not in TASK_KNOBS:
        raise _unknown_task(name)
    return TASK_KNOBS[name]
