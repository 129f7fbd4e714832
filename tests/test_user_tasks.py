"""User tasks: a task written in a TOML or YAML file runs like a built-in one.

The worked example is GLUE WNLI (examples/tasks/glue_wnli.toml), which is not in the suite.
No WNLI data is on disk, so the tests write a small mirror in the dataset's schema
(sentence1, sentence2, label 0 not_entailment / 1 entailment, idx) from sentence pairs
written for these tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, read_json
from fault_helpers import py, sh

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import SINGLE_LABEL
from encoder_eval.data import revisions, task_loading, tasks
from encoder_eval.data.sources import data_provenance
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.taskfile import (
    parse_task_rows,
    read_task_file,
    register_task_files,
    register_task_rows,
)
from encoder_eval.data.tasks import TASK_KNOBS

EXAMPLE = REPO / "examples" / "tasks" / "glue_wnli.toml"

# (sentence1, the right reading, the wrong reading): each gives an entailment (1) and a
# not_entailment (0) row, as WNLI pairs a Winograd sentence with each resolution of its pronoun.
SCHEMAS = [
    ("The vase fell off the table because it was wobbly.",
     "The table was wobbly.", "The vase was wobbly."),
    ("Maria thanked her neighbour because she had watered the plants.",
     "The neighbour had watered the plants.", "Maria had watered the plants."),
    ("The car overtook the tractor because it was moving slowly.",
     "The tractor was moving slowly.", "The car was moving slowly."),
    ("Tom lent his umbrella to Ben because he was going out in the rain.",
     "Ben was going out in the rain.", "Tom was going out in the rain."),
    ("The box would not go through the door because it was too narrow.",
     "The door was too narrow.", "The box was too narrow."),
    ("The teacher praised the student because she had solved the puzzle.",
     "The student had solved the puzzle.", "The teacher had solved the puzzle."),
    ("The cat could not reach the shelf because it was too high.",
     "The shelf was too high.", "The cat was too high."),
    ("Lena called her brother because she needed a lift to the station.",
     "Lena needed a lift to the station.", "Her brother needed a lift to the station."),
    ("The bridge could not hold the lorry because it was too heavy.",
     "The lorry was too heavy.", "The bridge was too heavy."),
    ("The coach shouted at the players because they were late again.",
     "The players were late again.", "The coach was late again."),
    ("The ice melted on the pavement because it was warm.",
     "The pavement was warm.", "The ice was warm."),
    ("Omar beat Felix at chess because he had practised all summer.",
     "Omar had practised all summer.", "Felix had practised all summer."),
    ("The kettle was filled from the jug until it was empty.",
     "The jug was empty.", "The kettle was empty."),
    ("The baker gave the child a roll because he was hungry.",
     "The child was hungry.", "The baker was hungry."),
    ("The ladder did not reach the window because it was too short.",
     "The ladder was too short.", "The window was too short."),
    ("Priya apologised to Julia because she had forgotten the meeting.",
     "Priya had forgotten the meeting.", "Julia had forgotten the meeting."),
    ("The boat could not pass under the bridge because it was too tall.",
     "The boat was too tall.", "The bridge was too tall."),
    ("The nurse woke the patient because it was time for his medicine.",
     "It was time for the patient's medicine.", "It was time for the nurse's medicine."),
    ("The rope held the climber because it was strong.",
     "The rope was strong.", "The climber was strong."),
    ("Sara waved at Nina, but she did not see her.",
     "Nina did not see Sara.", "Sara did not see Nina."),
]  # fmt: skip
TRAIN_SCHEMAS = 14  # the first 14 schemas (28 rows) train; the other 6 (12 rows) are dev


def wnli_rows(schemas) -> list[dict]:
    """Rows in the GLUE WNLI schema; the two readings of a schema alternate in order."""
    rows = []
    for number, (sentence, right, wrong) in enumerate(schemas):
        pairs = [(right, 1), (wrong, 0)] if number % 2 else [(wrong, 0), (right, 1)]
        for hypothesis, label in pairs:
            rows.append({"sentence1": sentence, "sentence2": hypothesis, "label": label,
                         "idx": len(rows)})  # fmt: skip
    return rows


def write_wnli(folder: Path, label=lambda row: row["label"], lang: str | None = None) -> Path:
    """Write train and validation files of WNLI rows into `folder` (`<split>[.<lang>].jsonl`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, schemas in (
        ("train", SCHEMAS[:TRAIN_SCHEMAS]),
        ("validation", SCHEMAS[TRAIN_SCHEMAS:]),
    ):
        lines = [json.dumps({**row, "label": label(row)}) for row in wnli_rows(schemas)]
        file = f"{name}.{lang}.jsonl" if lang else f"{name}.jsonl"
        (folder / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def content_identity(folder: Path) -> str:
    """The identity a folder of split files should be recorded under, computed here on its own:
    sha256 over each file's name and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.jsonl")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"mirror:sha256:{digest.hexdigest()}"


@pytest.fixture(autouse=True)
def registry(task_registry):
    """Each test starts from the built-in registry (conftest.task_registry)."""
    yield


# A valid task table with its own data folder; the error cases below change one thing each.
BASE = {
    "description": "WNLI from a local folder",
    "data_dir": "data",
    "inputs": ["sentence1", "sentence2"],
    "labels": ["not_entailment", "entailment"],
    "metric": "accuracy",
    "report_split": "validation",
}

TOML_TEXT = """\
[tasks.my_wnli]
description = "WNLI from a local folder"
data_dir = "data"
inputs = ["sentence1", "sentence2"]
labels = ["not_entailment", "entailment"]
metric = "accuracy"
report_split = "validation"
"""


def test_toml_and_yaml_files_give_the_same_knobs(tmp_path):
    write_wnli(tmp_path / "data")
    (tmp_path / "t.toml").write_text(TOML_TEXT)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"tasks": {"my_wnli": BASE}}))
    (tmp_path / "t.yml").write_text(
        "tasks:\n  my_wnli:\n    description: WNLI from a local folder\n    data_dir: data\n"
        "    inputs: [sentence1, sentence2]\n    labels: [not_entailment, entailment]\n"
        "    metric: accuracy\n    report_split: validation\n"
    )
    knobs = [parse_task_rows(read_task_file(tmp_path / f), str(tmp_path / f))[0].knobs
             for f in ("t.toml", "t.yaml", "t.yml")]  # fmt: skip
    assert [k.source for k in knobs] == [str(tmp_path / f) for f in ("t.toml", "t.yaml", "t.yml")]
    knobs = [dataclasses.replace(k, source=None) for k in knobs]  # each records its own file
    assert knobs[0] == knobs[1] == knobs[2]
    k = knobs[0]
    assert k.data_dir == tmp_path / "data"  # relative to the task file's folder
    assert (k.inputs, k.num_labels, k.problem, k.metric, k.report_split) == (
        ("sentence1", "sentence2"), 2, SINGLE_LABEL, "accuracy", "validation")  # fmt: skip
    assert k.label_names == ("not_entailment", "entailment") and k.bucket == "user"
    assert k.languages == k.euro_languages == ("en",) and k.hf_path is None


def test_the_wnli_example_parses_into_the_glue_schema():
    (task,) = parse_task_rows(read_task_file(EXAMPLE), str(EXAMPLE))
    k = task.knobs
    assert task.key == "glue_wnli" and task.revision is None
    assert (k.hf_path, k.hf_config) == ("nyu-mll/glue", "wnli")
    assert k.inputs == ("sentence1", "sentence2") and k.label_field == "label"
    assert k.label_names == ("not_entailment", "entailment") and k.num_labels == 2
    assert (k.metric, k.report_split, k.bucket, k.data_dir) == ("accuracy", "validation", "user",
                                                                None)  # fmt: skip


# id -> (change to BASE: fields to set, or None to delete; regex of the one error message)
BAD_FIELDS = {
    "unknown-field": (
        {"lables": ["a", "b"]},
        r"unknown field 'lables'\. Did you mean 'labels'\? Valid fields: .*data_dir",
    ),
    "unknown-field-no-match": ({"dataset": "x"}, r"unknown field 'dataset'\. Valid fields: "),
    "bad-metric": (
        {"metric": "acuracy"},
        r"field 'metric': unknown metric 'acuracy'\. Did you mean 'accuracy'\? "
        r"Valid metrics: accuracy, f1, macro_f1, mcc, spearman",
    ),
    "bad-problem": (
        {"problem": "classify"},
        r"field 'problem': unknown problem 'classify'\..* Valid problems: "
        r"classification, regression",
    ),
    "bad-report-split": (
        {"report_split": "dev"},
        r"field 'report_split': unknown report split 'dev'\..*Valid report "
        r"splits: test, validation",
    ),
    "bad-bucket": (
        {"bucket": "synthetic"},
        r"field 'bucket': unknown bucket 'synthetic'\..*Valid buckets: glue, "
        r"multilingual, superglue, user",
    ),
    "missing-inputs": ({"inputs": None}, r"field 'inputs': missing; give the input field"),
    "three-inputs": ({"inputs": ["a", "b", "c"]}, r"field 'inputs': .* holds 3; give 1 or 2"),
    "input-not-text": ({"inputs": 3}, r"field 'inputs': 3 is not a list of non-empty strings"),
    "labels-vs-num-labels": (
        {"num_labels": 3},
        r"field 'num_labels': 3, but labels names 2 classes "
        r"\(not_entailment, entailment\); give one of the two",
    ),
    "no-labels": (
        {"labels": None},
        r"field 'labels': missing; give labels \(the class names, in class-id "
        r"order\) or num_labels",
    ),
    "one-label": (
        {"labels": None, "num_labels": 1},
        r"field 'num_labels': 1; a classification task has 2 classes or more",
    ),
    "num-labels-text": (
        {"labels": None, "num_labels": "2"},
        r"field 'num_labels': '2' is not a whole number",
    ),
    "label-twice": ({"labels": ["yes", "yes"]}, r"field 'labels': .* names one value twice"),
    "regression-with-labels": (
        {"problem": "regression", "metric": "spearman"},
        r"field 'labels': a regression task has no classes",
    ),
    "regression-with-accuracy": (
        {"problem": "regression", "labels": None},
        r"field 'metric': accuracy does not score a regression task; "
        r"valid for regression: spearman",
    ),
    "classification-with-spearman": (
        {"metric": "spearman"},
        r"field 'metric': spearman does not score a classification "
        r"task; valid for classification: accuracy, f1, macro_f1, mcc",
    ),
    "f1-three-classes": (
        {"labels": ["a", "b", "c"], "metric": "f1"},
        r"field 'metric': f1 is the F1 of class 1 of a two-class task",
    ),
    "missing-metric": ({"metric": None}, r"field 'metric': missing; give one of accuracy, "),
    "missing-report-split": ({"report_split": None}, r"field 'report_split': missing; give test"),
    "euro-not-in-languages": (
        {"languages": ["de", "fr"], "euro_languages": ["de", "en"]},
        r"field 'euro_languages': en not in languages \(de, fr\)",
    ),
    "data-dir-missing": (
        {"data_dir": "nowhere"},
        r"field 'data_dir': .*nowhere is not a folder \(a relative data_dir is "
        r"read from the task file's folder",
    ),
    "revision-without-hub": (
        {"revision": "main"},
        r"field 'revision': is for a Hub dataset, and hf_path is not given",
    ),
    "revision-against-suite": (
        {"hf_path": "nyu-mll/glue", "revision": "abc123"},
        r"field 'revision': nyu-mll/glue is read at its default branch by "
        r"glue_cola, .*ENCODER_EVAL_DATASET_REVISIONS",
    ),
    "bad-hub-split": (
        {"hf_path": "me/wnli", "hub_splits": {"dev": "validation"}},
        r"field 'hub_splits': unknown key 'dev'\..*Valid keys: test, train, "
        r"validation",
    ),
    "description-not-text": ({"description": 7}, r"field 'description': 7 is not a non-empty"),
}


@pytest.mark.parametrize("change,message", BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_each_bad_field_gives_its_message(tmp_path, change, message):
    write_wnli(tmp_path / "data")
    table = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump({"tasks": {"my_wnli": table}}))
    before = dict(TASK_KNOBS)
    with pytest.raises(HarnessError, match=message) as err:
        register_task_files([str(path)])
    assert str(err.value).startswith(f"{path}: task 'my_wnli'")  # the file and the task
    assert "\n" not in str(err.value)
    assert TASK_KNOBS == before  # nothing of a refused file is registered


def test_every_problem_of_a_task_file_is_reported_at_once(tmp_path):
    """A newcomer fixes a task file in one pass: each task's problems, of every task, in one
    error that names the file once and numbers the problems."""
    write_wnli(tmp_path / "data")
    table = {
        "my_wnli": {**BASE, "metric": "acc", "report_split": None, "lables": ["a", "b"]},
        "glue_rte": BASE,  # a built-in task's name
        "other": {**BASE, "inputs": None, "languages": ["de"], "euro_languages": ["en"]},
        "fine": BASE,
    }
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps({"tasks": table})), sort_keys=False))
    before = dict(TASK_KNOBS)
    with pytest.raises(HarnessError) as err:
        register_task_files([str(path)])
    message = str(err.value)
    assert message.startswith(f"{path}: 6 problems: [1] task 'my_wnli': unknown field 'lables'")
    assert message.count(str(path)) == 1 and "\n" not in message
    for number, problem in enumerate([
        "task 'my_wnli': unknown field 'lables'. Did you mean 'labels'?",
        "task 'my_wnli', field 'metric': unknown metric 'acc'",
        "task 'my_wnli', field 'report_split': missing",
        "task 'glue_rte': the name is the built-in task 'glue_rte''s",
        "task 'other', field 'inputs': missing",
        "task 'other', field 'euro_languages': en not in languages (de)",
    ], start=1):  # fmt: skip
        assert f"[{number}] {problem}" in message, problem
    assert TASK_KNOBS == before  # nothing of a refused file is registered, "fine" neither


@pytest.mark.parametrize(
    "key,message",
    [
        ("glue_rte", r"task 'glue_rte': the name is the built-in task 'glue_rte''s; a task file "
                     r"adds tasks and cannot replace one"),
        ("GLUE-RTE", r"the name is the built-in task 'glue_rte''s"),
        ("glue", r"the name is a --tasks group \(all, multilingual, glue, superglue, ranking\)"),
        ("my task", r"a task name is 1-64 letters, digits, '_' or '-'"),
    ],
)  # fmt: skip
def test_a_name_that_shadows_or_cannot_be_a_file_name_is_refused(tmp_path, key, message):
    write_wnli(tmp_path / "data")
    with pytest.raises(HarnessError, match=message) as err:
        register_task_rows({key: BASE}, str(tmp_path / "tasks.toml"))
    assert str(err.value).startswith(f"{tmp_path / 'tasks.toml'}: task {key!r}")
    assert TASK_KNOBS["glue_rte"].hf_path == "nyu-mll/glue"


def test_a_task_defined_twice_differently_is_refused_and_the_same_twice_is_a_no_op(tmp_path):
    write_wnli(tmp_path / "data")
    first = str(tmp_path / "a.toml")
    assert register_task_rows({"my_wnli": BASE}, first) == ["my_wnli"]
    assert register_task_rows({"my_wnli": dict(BASE)}, str(tmp_path / "b.toml")) == ["my_wnli"]
    assert tasks.TASK_KNOBS["my_wnli"].source == first
    with pytest.raises(HarnessError, match=rf"defined already, differently \(metric\), in {first}"):
        register_task_rows({"my_wnli": {**BASE, "metric": "macro_f1"}}, str(tmp_path / "b.toml"))
    assert TASK_KNOBS["my_wnli"].metric == "accuracy"


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("t.json", "{}", r"cannot tell its format from '\.json'; name it \.toml, \.yaml or \.yml"),
        ("t.toml", "[tasks.x\n", r"t\.toml is not valid TOML: "),
        ("t.yaml", "tasks: [a, b\n", r"t\.yaml is not valid YAML: "),
        ("t.toml", "[task.my_wnli]\nmetric = 'accuracy'\n",
         r"unknown top-level key 'task'\. Did you mean 'tasks'\?.*a task file holds only the "
         r"tasks table"),
        ("t.yaml", "", r"holds no tasks table; write \[tasks\.NAME\] \(TOML\)"),
        ("t.toml", "[tasks]\n", r"the tasks table defines no task"),
        ("t.yaml", "tasks:\n  my_wnli: accuracy\n", r"task 'my_wnli' is 'accuracy', not a table"),
    ],
)  # fmt: skip
def test_a_bad_task_file_is_refused_naming_it(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(HarnessError, match=message) as err:
        register_task_files([str(path)])
    assert str(path) in str(err.value)
    with pytest.raises(HarnessError, match=r"task file .*nope\.toml does not exist"):
        register_task_files([str(tmp_path / "nope.toml")])


def test_a_user_task_joins_the_registry_and_its_bucket_only(tmp_path):
    write_wnli(tmp_path / "data")
    suite = tasks.group_tasks("all")
    assert len(suite) == 17
    keys = register_task_rows(
        {"my_wnli": BASE, "glue_like": {**BASE, "bucket": "glue"},
         "hub_task": {**BASE, "data_dir": None, "hf_path": "me/my-data", "revision": "v1.0"}},
        str(tmp_path / "tasks.toml"),
    )  # fmt: skip
    assert keys == ["my_wnli", "glue_like", "hub_task"]
    assert all(k in TASK_KNOBS and callable(task_loading.loader_for(k)) for k in keys)
    assert revisions.default_revisions()["me/my-data"] == "v1.0"
    assert revisions.dataset_revisions()["me/my-data"] == "v1.0"
    assert tasks.group_tasks("all") == [*suite, "glue_like"]
    assert tasks.group_tasks("glue")[-1] == "glue_like"
    assert "my_wnli" not in tasks.resolve_task_names(["all", "glue", "superglue", "multilingual"])
    assert tasks.resolve_task_names(["my_wnli", "glue_rte"]) == ["my_wnli", "glue_rte"]


def test_unknown_task_suggests_the_prefixed_name_and_says_how_to_add_one():
    for typed, meant in (
        ("rte", "glue_rte"),
        ("cb", "sg_cb"),
        ("SST-2", None),
        ("mnli", "glue_mnli"),
    ):
        with pytest.raises(HarnessError) as err:
            tasks.task_knobs(typed)
        message = str(err.value)
        assert (f"Did you mean {meant!r}?" in message) if meant else "Did you mean" not in message
    with pytest.raises(HarnessError) as err:
        load_task("wnli")
    message = str(err.value)
    assert message.startswith("unknown task 'wnli'. To add a task, define it in a task file "
                              "(--tasks-file; docs/tasks.md, 'Adding a task').")  # fmt: skip
    assert "Did you mean" not in message  # neither xnli nor qnli: another dataset
    assert all(name in message for name in TASK_KNOBS)
    with pytest.raises(HarnessError, match=r"--tasks also takes a group: all, multilingual"):
        tasks.resolve_task_names(["wnli"])
    register_task_files([str(EXAMPLE)])
    with pytest.raises(HarnessError, match=r"Did you mean 'glue_wnli'\?"):
        tasks.task_knobs("wnli")


def test_a_user_task_loads_from_its_own_data_dir(tmp_path):
    data = write_wnli(tmp_path / "wnli data")
    path = tmp_path / "tasks.toml"
    path.write_text(TOML_TEXT.replace('"data"', '"wnli data"'))
    register_task_files([str(path)])
    elsewhere = tmp_path / "mirror"  # --data-dir does not change where this task reads
    elsewhere.mkdir()
    for data_dir in (None, elsewhere):
        train, val, test, num_labels, problem = load_task("my_wnli", data_dir)
        assert (num_labels, problem) == (2, SINGLE_LABEL)
        assert len(train["label"]) == 2 * TRAIN_SCHEMAS and sorted(set(train["label"])) == [0, 1]
        assert train["text"][0] == SCHEMAS[0][0] and train["text_pair"][0] == SCHEMAS[0][2]
        assert list(val) == ["en"] and len(val["en"]["label"]) == 12
        assert test == val  # report split validation: dev is reported
        prov = data_provenance("my_wnli", data_dir)
        assert prov["source"] == "mirror" and prov["identity"] == content_identity(data)
        assert "manifest" not in prov
    (data / "validation.jsonl").write_text((data / "train.jsonl").read_text())
    assert data_provenance("my_wnli")["identity"] == content_identity(data)  # content, not path
    assert content_identity(data) != prov["identity"]


def test_a_task_without_data_dir_or_hf_path_reads_its_mirror_folder(tmp_path):
    """README: "The mirror passed with --data-dir DIR: the task's files are in DIR/<task key>/"."""
    from encoder_eval.cli import _task_rows

    register_task_rows({"my_wnli": {**BASE, "data_dir": None}}, str(tmp_path / "tasks.toml"))
    mirror = tmp_path / "mirror"
    write_wnli(mirror / "my_wnli")
    train, val, _, num_labels, _ = load_task("my_wnli", mirror)
    assert len(train["label"]) == 2 * TRAIN_SCHEMAS and len(val["en"]["label"]) == 12
    assert data_provenance("my_wnli", mirror)["identity"] == content_identity(mirror / "my_wnli")
    row = next(r for r in _task_rows() if r["task"] == "my_wnli")
    assert row["source"] == "mirror (--data-dir DIR/<task>/)"
    with pytest.raises(HarnessError, match=r"task 'my_wnli' is read from a data mirror only; "
                       r"pass --data-dir DIR .* with its files in DIR/my_wnli/"):  # fmt: skip
        data_provenance("my_wnli", None)
    with pytest.raises(HarnessError, match=r"has no train\.jsonl for task 'my_wnli'"):
        load_task("my_wnli", tmp_path)  # a mirror without the task's folder


def test_label_names_in_the_rows_are_read_as_class_ids(tmp_path):
    names = ("not_entailment", "entailment")
    data = write_wnli(tmp_path / "data", label=lambda row: names[row["label"]])
    register_task_rows({"my_wnli": BASE}, str(tmp_path / "tasks.toml"))
    train, *_ = load_task("my_wnli")
    assert train["label"] == [r["label"] for r in wnli_rows(SCHEMAS[:TRAIN_SCHEMAS])]
    (data / "train.jsonl").write_text(json.dumps({**wnli_rows(SCHEMAS)[0], "label": "maybe"}))
    with pytest.raises(HarnessError, match=r"train\.jsonl: row 1: label 'maybe' is not an integer "
                       r"class id nor one of not_entailment, entailment"):  # fmt: skip
        load_task("my_wnli")


def test_a_missing_split_in_the_tasks_data_dir_names_the_task_file(tmp_path):
    data = write_wnli(tmp_path / "data")
    (data / "validation.jsonl").unlink()
    path = str(tmp_path / "tasks.toml")
    register_task_rows({"my_wnli": BASE}, path)
    with pytest.raises(HarnessError, match=rf"the task's data_dir has no validation\.jsonl for "
                       rf"task 'my_wnli' .* or change data_dir in {path}"):  # fmt: skip
        load_task("my_wnli")


def test_the_wnli_example_loads_from_the_standard_mirror_layout(tmp_path):
    register_task_files([str(EXAMPLE)])
    mirror = tmp_path / "mirror"
    write_wnli(mirror / "glue_wnli")  # a mirror folder is named after the task key
    train, val, test, num_labels, _ = load_task("glue_wnli", mirror)
    assert len(train["label"]) == 28 and len(val["en"]["label"]) == 12 and num_labels == 2
    prov = data_provenance("glue_wnli", mirror)
    assert prov["identity"] == content_identity(mirror / "glue_wnli")
    assert prov["dataset"] == "nyu-mll/glue"
    with pytest.raises(HarnessError, match=r"data mirror has no train\.jsonl for task 'glue_wnli'.*"
                       r"a mirror keeps a task's files in a folder named after the task key"):  # fmt: skip
        load_task("glue_wnli", tmp_path)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model("bert", tmp_path_factory.mktemp("bert"), num_labels=None)


def test_run_with_the_wnli_task_file_writes_a_valid_result(tiny_bert, tmp_path):
    from encoder_eval.core.results import validate_result

    mirror = tmp_path / "mirror"
    write_wnli(mirror / "glue_wnli")
    out = tmp_path / "cell.json"
    cmd = [sys.executable, "-m", "encoder_eval.run", "--task", "glue_wnli",
           "--model-path", str(tiny_bert), "--model-key", "tiny", "--lr", "1.67e-05",
           "--seed", "45", "--max-steps", "3", "--max-seq-len", "64", "--data-dir", str(mirror),
           "--device", "cpu", "--out-json", str(out), "--progress", "quiet"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "unknown task 'glue_wnli'" in proc.stderr  # no task file
    assert "--tasks-file" in proc.stderr and not out.exists()
    proc = subprocess.run(cmd + ["--tasks-file", "examples/tasks/glue_wnli.toml"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = read_json(out)
    assert validate_result(result) == []
    assert result["status"] == "ok" and result["cell"]["task"] == "glue_wnli"
    assert result["metric"] == "accuracy" and result["report"]["split"] == "validation"
    assert result["training"]["steps"] == 3
    data = result["provenance"]["data"]
    assert data["source"] == "mirror"
    assert data["identity"] == content_identity(mirror / "glue_wnli")


def test_the_docs_show_the_example_as_it_is(tmp_path):
    """docs/tasks.md ("Adding a task") shows the WNLI file in TOML and in YAML: both are that
    task."""
    import re

    section = (REPO / "docs" / "tasks.md").read_text()
    blocks = dict(re.findall(r"```(toml|yaml)\n(.*?)```", section, flags=re.S))
    (example,) = parse_task_rows(read_task_file(EXAMPLE), str(EXAMPLE))
    for kind, text in blocks.items():
        path = tmp_path / f"readme.{kind}"
        path.write_text(text)
        (shown,) = parse_task_rows(read_task_file(path), str(path))
        assert shown.key == example.key
        differ = [f for f in example.knobs.__dataclass_fields__
                  if f != "source"  # each records the file it was read from
                  and getattr(shown.knobs, f) != getattr(example.knobs, f)]  # fmt: skip
        assert differ == ([] if kind == "toml" else ["description"]), kind
    assert sorted(blocks) == ["toml", "yaml"]


def test_a_task_of_two_languages_reads_a_file_per_language(tmp_path):
    data = tmp_path / "data"
    for lang in ("de", "en"):
        write_wnli(data, lang=lang)
    register_task_rows({"my_wnli": {**BASE, "languages": ["de", "en"], "euro_languages": ["de"]}},
                       str(tmp_path / "tasks.toml"))  # fmt: skip
    assert TASK_KNOBS["my_wnli"].multilingual
    train, val, _, _, _ = load_task("my_wnli")
    assert sorted(val) == ["de", "en"] and len(train["label"]) == 2 * 2 * TRAIN_SCHEMAS
    (data / "validation.de.jsonl").unlink()  # a Euro language may not be missing
    with pytest.raises(HarnessError, match=r"has no validation\.de\.jsonl for task 'my_wnli'"):
        load_task("my_wnli")


def test_a_hub_task_of_several_languages_reads_a_config_per_language(tmp_path):
    hub = {**BASE, "data_dir": None, "hf_path": "me/nli", "languages": ["de", "en"]}
    rows = {"per_config": hub, "one_file": {**hub, "language_field": "lang"},
            "named": {**hub, "hf_lang_configs": {"de": "german", "en": "english"}}}  # fmt: skip
    parsed = {t.key: t.knobs for t in parse_task_rows(rows, str(tmp_path / "t.toml"))}
    assert parsed["per_config"].hf_lang_configs == {"de": "de", "en": "en"}
    assert parsed["one_file"].hf_lang_configs == {}
    assert parsed["named"].hf_lang_configs == {"de": "german", "en": "english"}
    with pytest.raises(HarnessError, match=r"field 'hf_lang_configs': unknown key 'fr'"):
        parse_task_rows({"x": {**hub, "hf_lang_configs": {"fr": "french"}}}, "t.toml")


def test_run_refuses_a_bad_task_file_in_one_line(tmp_path, capsys):
    from encoder_eval import run

    argv = ["--task", "glue_wnli", "--model-path", str(tmp_path), "--lr", "1.67e-05",
            "--seed", "45", "--out-json", str(tmp_path / "cell.json")]  # fmt: skip
    assert run.main(argv + ["--tasks-file", str(tmp_path / "nope.toml")]) == 2
    (tmp_path / "bad.toml").write_text("[tasks.glue_wnli]\nmetric = 'acc'\n")
    assert run.main(argv + ["--tasks-file", str(EXAMPLE), "--tasks-file",
                            str(tmp_path / "bad.toml")]) == 2  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"error: task file {tmp_path / 'nope.toml'} does not exist"
    assert lines[1].startswith(f"error: {tmp_path / 'bad.toml'}: 3 problems: [1] task "
                               "'glue_wnli', field 'inputs'")  # fmt: skip
    assert len(lines) == 2 and not (tmp_path / "cell.json").exists()


def _ee(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`encoder-eval ARGS` (as `python -m encoder_eval`) in `cwd`; it must exit 0."""
    return sh(py("encoder_eval", *args), cwd)


@pytest.mark.slow
def test_a_task_file_runs_the_whole_protocol_with_the_shrinking_flags_given_once(
    tiny_bert, tmp_path
):
    """Done-when of the architecture issue: a task the package does not know, from a file,
    through select sweep -> select -> report sweep -> summarize -> status, where only the
    first command names the model, task file, grid subset, step cap, data and device."""
    mirror = tmp_path / "mirror"
    write_wnli(mirror / "glue_wnli")
    _ee("sweep", "--phase", "select", "--tasks-file", str(EXAMPLE), "--tasks", "glue_wnli",
        "--model", f"tiny={tiny_bert}", "--lr-keys", "lr03,lr06", "--seeds", "42,43",
        "--max-steps", "3", "--max-seq-len", "64", "--data-dir", str(mirror),
        "--device", "cpu", "--out-dir", "runs/select", "--results-dir", "results/select",
        cwd=tmp_path)  # fmt: skip
    sh(["bash", "runs/select/run_all.sh"], tmp_path)
    _ee("select", "--results-dir", "results/select", "--out", "selection.json", cwd=tmp_path)
    _ee("sweep", "--phase", "report", "--selection", "selection.json", "--out-dir",
        "runs/report", "--results-dir", "results/report", cwd=tmp_path)  # fmt: skip
    sh(["bash", "runs/report/run_all.sh"], tmp_path)
    table = _ee("summarize", "--results-dir", "results/report", "--allow-partial",
                "--format", "json", cwd=tmp_path)  # fmt: skip
    status = _ee("status", "--results-dir", "results/report", cwd=tmp_path)

    selected = read_json(tmp_path / "selection.json")["pairs"]["tiny"]["glue_wnli"]["lr_key"]
    written = sorted((tmp_path / "results" / "report").glob("tiny_glue_wnli_*.json"))
    report = [p for p in written if not p.name.endswith(".predictions.json")]
    assert [p.name for p in report] == [f"tiny_glue_wnli_{selected}_s{s}.json"
                                        for s in (45, 46, 47, 48, 49)]  # fmt: skip
    # Each report cell wrote its per-example predictions beside it (the default).
    assert [p.name for p in written if p not in report] == [
        p.name.replace(".json", ".predictions.json") for p in report
    ]
    for path in report:  # the report phase ran as the select phase did, without the flags
        result = read_json(path)
        assert result["training"]["max_steps"] == 3 and result["recipe"]["max_seq_len"] == 64
        assert result["provenance"]["data"]["identity"] == content_identity(mirror / "glue_wnli")
        assert result["provenance"]["hardware"]["device"] == "cpu"
    doc = json.loads(table.stdout)
    assert [t["task"] for t in doc["tasks"]] == ["glue_wnli"]
    assert doc["rows"][0]["model"] == "tiny" and doc["rows"][0]["cells"]["glue_wnli"]["n"] == 5
    assert "done          5" in status.stdout and "missing       0" in status.stdout
