"""User tasks: task tables written in a TOML or YAML file, checked and turned into TaskKnobs.

A task file holds one table, `tasks`, with a table of fields per task:

    [tasks.glue_wnli]                      # TOML          tasks:              # YAML
    hf_path = "nyu-mll/glue"                               glue_wnli:
    inputs = ["sentence1", "sentence2"]                      hf_path: nyu-mll/glue
    ...                                                      inputs: [sentence1, sentence2]

`FIELDS` lists every field with what it holds (docs/tasks.md, "Adding a task", says the same for
users). This module reads and checks them; `register_task_files` / `register_task_rows` then put
the checked tasks into the registry (`tasks.add_user_task`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from encoder_eval.core.errors import HarnessError, quote, unknown_name
from encoder_eval.core.fileio import (
    DamagedFile,
    MissingFile,
    UnreadableFile,
    parse_toml,
    parse_yaml,
    read_bytes,
)
from encoder_eval.core.metrics import METRIC_SPECS
from encoder_eval.core.problems import CLASSIFICATION, REGRESSION, SINGLE_LABEL, short_name
from encoder_eval.data import tasks
from encoder_eval.data.revisions import default_revisions

# A task file defines classification and regression tasks: their metrics score examples.
METRICS = tuple(name for name, spec in METRIC_SPECS.items() if spec.granularity == "pointwise")

# field -> what it holds, in the order a task table is usually written
FIELDS: dict[str, str] = {
    "description": "one line saying what the task is",
    "bucket": "the --tasks group it joins (default user: none)",
    "data_dir": "a folder of <split>[.<lang>].jsonl files, relative to the task file's folder "
    "(without data_dir and hf_path: the mirror's folder --data-dir DIR/<key>/)",
    "hf_path": "a Hugging Face Hub dataset id",
    "hf_config": "the Hub dataset's config",
    "hf_lang_configs": "language -> Hub config (default: each language is a config)",
    "revision": "the Hub dataset's revision (branch, tag or commit) to read",
    "hub_splits": "our split name (train, validation, test) -> the dataset's split name",
    "inputs": "the input field, or a list of two for a text pair",
    "label_field": "the field holding the label (default label)",
    "labels": "the class names, in class-id order (gives num_labels)",
    "num_labels": "the number of classes",
    "problem": "classification (default) or regression",
    "metric": "the task's one metric",
    "report_split": "test (a labelled test split) or validation (dev, marked * in tables)",
    "languages": "the languages loaded and scored (default [en])",
    "euro_languages": "the languages averaged into the headline score (default: all)",
    "language_field": "the field naming each row's language, when one file holds them all",
}
PROBLEMS = {CLASSIFICATION: SINGLE_LABEL, REGRESSION: REGRESSION}  # ranking is built in only
BUCKETS = ("user", "glue", "superglue", "multilingual")
SPLITS = ("train", "validation", "test")
REPORT_SPLITS = ("test", "validation")
REGRESSION_METRICS = ("spearman",)  # the metrics here that score real-valued predictions
KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
FORMATS = (".toml", ".yaml", ".yml")
LAYOUT = "[tasks.NAME] (TOML) or tasks: {NAME: {...}} (YAML)"


@dataclass(frozen=True)
class UserTask:
    """One checked task table: its key, its knobs, and the Hub revision it asks for."""

    key: str
    knobs: tasks.TaskKnobs
    revision: str | None
    source: str


def read_task_file(path: str | os.PathLike) -> dict[str, Any]:
    """The `tasks` table of a task file (TOML by `.toml`, YAML by `.yaml`/`.yml`)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise HarnessError(
            f"task file {path}: cannot tell its format from {path.suffix or 'no extension'!r}; "
            "name it .toml, .yaml or .yml"
        )
    try:
        raw = read_bytes(path)
    except MissingFile:
        raise HarnessError(f"task file {path} does not exist") from None
    except UnreadableFile as exc:
        raise HarnessError(f"task file {exc}") from None
    try:
        doc = parse_toml(raw, path) if path.suffix.lower() == ".toml" else parse_yaml(raw, path)
    except DamagedFile as exc:
        raise HarnessError(f"task file {exc}") from None
    if not isinstance(doc, dict) or not doc:
        raise HarnessError(f"task file {path} holds no tasks table; write {LAYOUT}")
    extra = sorted(str(k) for k in set(doc) - {"tasks"})
    if extra:
        raise HarnessError(
            f"task file {path}: {unknown_name('top-level key', extra[0], ['tasks'])}; a task "
            f"file holds only the tasks table: {LAYOUT}"
        )
    return doc["tasks"]


def parse_task_rows(rows: Any, source: str) -> list[UserTask]:
    """Check task tables `{key: {field: value}}` read from `source` against the registry.

    Every field of every task is checked, and all the problems found are raised at once
    (one error naming the file, and per problem the task, the field and the valid values);
    a key that is a built-in task or a group, or a user task defined otherwise before, is
    refused, as is a Hub revision other than the one its dataset is already read at.
    Relative `data_dir`s are read from `source`'s folder.
    """
    if not isinstance(rows, dict) or not rows:
        raise HarnessError(f"{source}: the tasks table defines no task; write {LAYOUT}")
    revisions = default_revisions()
    readers = {
        repo: [k for k, v in tasks.TASK_KNOBS.items() if v.hf_path == repo] for repo in revisions
    }
    out: list[UserTask] = []
    errors: list[HarnessError] = []
    for key, table in rows.items():
        found = len(errors)
        try:
            _check_key(str(key), source)
        except HarnessError as exc:
            errors.append(exc)
        task = _parse_one(str(key), table, source, errors)
        if task is None or len(errors) > found:
            continue
        try:
            _check_redefinition(task, source)
        except HarnessError as exc:
            errors.append(exc)
            continue
        repo = task.knobs.hf_path
        if (
            repo
            and task.revision is not None
            and revisions.get(repo, task.revision) != task.revision
        ):
            pins = '{"' + repo + '": "<sha>"}'
            errors.append(
                HarnessError(
                    f"{source}: task {task.key!r}, field 'revision': {repo} is read at "
                    f"{revisions[repo] or 'its default branch'} by {', '.join(readers[repo])}, and "
                    f"a run reads one revision of a dataset; drop revision here (this task then "
                    f"reads that one too), or pin it for every task with "
                    f"ENCODER_EVAL_DATASET_REVISIONS='{pins}'"
                )
            )
            continue
        if repo:
            if repo not in revisions or task.revision is not None:
                revisions[repo] = task.revision
            readers.setdefault(repo, []).append(task.key)
        out.append(task)
    if errors:
        raise _problems(errors, source)
    return out


def _problems(errors: list[HarnessError], source: str) -> HarnessError:
    """One error for all the problems of a task file: the one alone, or their count and each
    numbered, on one line, the file named once."""
    if len(errors) == 1:
        return errors[0]
    prefix = f"{source}: "
    parts = [f"[{n}] {str(e).removeprefix(prefix)}" for n, e in enumerate(errors, start=1)]
    return HarnessError(f"{prefix}{len(errors)} problems: {' '.join(parts)}")


def _check_key(key: str, source: str) -> None:
    """Refuse a key that is not a plain name, or names a group or a built-in task."""
    where = f"{source}: task {quote(key)}"
    if not KEY.fullmatch(key):
        raise HarnessError(
            f"{where}: a task name is 1-64 letters, digits, '_' or '-', starting with a letter or "
            "digit (it becomes part of result file names)"
        )
    if key.lower() in tasks.TASK_GROUPS:
        raise HarnessError(
            f"{where}: the name is a --tasks group ({', '.join(tasks.TASK_GROUPS)}); pick another"
        )
    normal = key.lower().replace("-", "_")
    if normal in tasks.BUILTIN_TASKS:
        raise HarnessError(
            f"{where}: the name is the built-in task {normal!r}'s; a task file adds tasks and "
            "cannot replace one: pick another name"
        )


def _check_redefinition(task: UserTask, source: str) -> None:
    """Refuse a user task registered before under the same key with other fields."""
    key, where = task.key, f"{source}: task {task.key!r}"
    earlier = tasks.TASK_KNOBS.get(key)
    if earlier is not None and replace(earlier, source=None) != replace(task.knobs, source=None):
        fields = earlier.__dataclass_fields__
        differ = [
            f for f in fields if f != "source" and getattr(earlier, f) != getattr(task.knobs, f)
        ]
        raise HarnessError(
            f"{where}: a task of that name is defined already, differently "
            f"({', '.join(differ)}), in {earlier.source or 'another file'}; "
            "define each task once"
        )


class _Table:
    """One task table being read: typed getters whose errors name the file, task and field."""

    def __init__(self, source: str, key: str, table: dict):
        self.source, self.key, self.table = source, key, table

    def fail(self, field: str, problem: str) -> HarnessError:
        return HarnessError(f"{self.source}: task {self.key!r}, field {field!r}: {problem}")

    def get(self, field: str) -> Any:
        return self.table.get(field)  # YAML's `field:` (null) counts as not given

    def text(self, field: str, default: str | None = None) -> str | None:
        value = self.get(field)
        if value is None:
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(field, f"{quote(value)} is not a non-empty string")
        return value

    def texts(self, field: str, least: int = 1, most: int | None = None) -> tuple[str, ...] | None:
        value = self.get(field)
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
            raise self.fail(field, f"{quote(value)} is not a list of non-empty strings")
        if len(set(items)) != len(items):
            raise self.fail(field, f"{quote(value)} names one value twice")
        if len(items) < least or (most is not None and len(items) > most):
            between = "or" if most is not None and most - least == 1 else "to"
            count = f"{least} or more" if most is None else f"{least} {between} {most}"
            raise self.fail(field, f"{quote(value)} holds {len(items)}; give {count}")
        return tuple(items)

    def choice(self, field: str, valid: tuple[str, ...] | dict, default: str) -> str:
        value = self.get(field)
        if value is None:
            return default
        if not isinstance(value, str) or value not in valid:
            raise self.fail(field, str(unknown_name(field.replace("_", " "), str(value), valid)))
        return value

    def mapping(self, field: str, keys: tuple[str, ...]) -> dict[str, str]:
        value = self.get(field)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(
            isinstance(v, str) and v.strip() for v in value.values()
        ):
            raise self.fail(field, f"{quote(value)} is not a table of names")
        for k in value:
            if k not in keys:
                raise self.fail(field, str(unknown_name("key", str(k), keys)))
        return {str(k): v for k, v in value.items()}


def _parse_one(key: str, table: Any, source: str, errors: list[HarnessError]) -> UserTask | None:
    """Check one task table's fields and build its TaskKnobs; each problem found is added to
    `errors` (the checks of fields that do not depend on a bad one go on), and None returned."""
    if not isinstance(table, dict):
        errors.append(
            HarnessError(
                f"{source}: task {key!r} is {quote(table)}, not a table of fields; write {LAYOUT}"
            )
        )
        return None
    t = _Table(source, key, table)
    found = len(errors)
    for field in table:
        if field not in FIELDS:
            errors.append(
                HarnessError(f"{source}: task {key!r}: {unknown_name('field', str(field), FIELDS)}")
            )

    def attempt(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except HarnessError as exc:
            errors.append(exc)
            return None

    problem, inputs, labels, num_labels = attempt(lambda: _classes(t)) or (None,) * 4
    metric = attempt(lambda: _metric(t, problem, num_labels))
    report_split = attempt(lambda: _report_split(t))
    languages, euro, language_field = attempt(lambda: _languages(t)) or (None,) * 3
    hf_path, data_dir, lang_configs = (
        attempt(lambda: _location(t, source, languages, language_field)) or (None,) * 3
    )
    bucket = attempt(lambda: t.choice("bucket", BUCKETS, "user"))
    label_field = attempt(lambda: t.text("label_field", "label"))
    hf_config = attempt(lambda: t.text("hf_config"))
    hub_splits = attempt(lambda: t.mapping("hub_splits", SPLITS))
    description = attempt(lambda: t.text("description", ""))
    revision = attempt(lambda: t.text("revision"))
    if len(errors) > found:
        return None
    knobs = tasks.TaskKnobs(
        bucket=bucket,
        hf_path=hf_path,
        inputs=inputs,
        label_field=label_field,
        num_labels=num_labels,
        problem=problem,
        metric=metric,
        report_split=report_split,
        languages=languages,
        euro_languages=euro,
        hf_config=hf_config,
        hf_lang_configs=lang_configs,
        hub_splits=hub_splits,
        language_field=language_field,
        description=description,
        data_dir=data_dir,
        label_names=labels or (),
        revision=revision,
        source=source,
    )
    return UserTask(key, knobs, revision, source)


def _classes(t: _Table) -> tuple[str, tuple[str, ...], tuple[str, ...] | None, int]:
    """The task's problem kind, inputs, class names and number of outputs."""
    problem = PROBLEMS[t.choice("problem", PROBLEMS, CLASSIFICATION)]
    inputs = t.texts("inputs", 1, 2)
    if inputs is None:
        raise t.fail("inputs", "missing; give the input field, or a list of two for a text pair")
    labels = t.texts("labels", 2)
    num_labels = t.get("num_labels")
    if num_labels is not None and (isinstance(num_labels, bool) or not isinstance(num_labels, int)):
        raise t.fail("num_labels", f"{quote(num_labels)} is not a whole number")
    if problem == REGRESSION:
        if labels is not None:
            raise t.fail(
                "labels",
                "a regression task has no classes: remove labels (its "
                "target is the number in label_field)",
            )
        if num_labels not in (None, 1):
            raise t.fail(
                "num_labels",
                f"{num_labels} for a regression task; remove it (a regression has one output)",
            )
        num_labels = 1
    else:
        if labels is None and num_labels is None:
            raise t.fail(
                "labels", "missing; give labels (the class names, in class-id order) or num_labels"
            )
        if labels is not None and num_labels is not None and num_labels != len(labels):
            raise t.fail(
                "num_labels",
                f"{num_labels}, but labels names {len(labels)} classes "
                f"({', '.join(labels)}); give one of the two",
            )
        num_labels = len(labels) if labels is not None else num_labels
        if num_labels < 2:
            raise t.fail(
                "num_labels",
                f"{num_labels}; a classification task has 2 classes or "
                "more (for a numeric target, set problem = regression)",
            )
    return problem, inputs, labels, num_labels


def _metric(t: _Table, problem: str | None, num_labels: int | None) -> str:
    """The task's metric; checked against its problem kind and classes when those are known."""
    metric = t.get("metric")
    if metric is None:
        raise t.fail("metric", f"missing; give one of {', '.join(METRICS)}")
    metric = t.choice("metric", METRICS, "")
    if problem is None:
        return metric
    allowed = (
        REGRESSION_METRICS
        if problem == REGRESSION
        else tuple(m for m in METRICS if m not in REGRESSION_METRICS)
    )
    if metric not in allowed:
        kind = short_name(problem)
        raise t.fail(
            "metric",
            f"{metric} does not score a {kind} task; valid for {kind}: {', '.join(allowed)}",
        )
    if metric == "f1" and num_labels != 2:
        raise t.fail(
            "metric",
            f"f1 is the F1 of class 1 of a two-class task, and this task "
            f"has {num_labels} classes; use macro_f1 or accuracy",
        )
    return metric


def _report_split(t: _Table) -> str:
    """The split the task reports: test or validation."""
    if t.get("report_split") is None:
        raise t.fail(
            "report_split",
            "missing; give test (a labelled test split) or "
            "validation (dev, when the test labels are hidden)",
        )
    return t.choice("report_split", REPORT_SPLITS, "")


def _languages(t: _Table) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """The languages loaded, those in the headline mean, and the field naming a row's one."""
    languages = t.texts("languages") or ("en",)
    euro = t.texts("euro_languages") or languages
    outside = [lang for lang in euro if lang not in languages]
    if outside:
        raise t.fail(
            "euro_languages", f"{', '.join(outside)} not in languages ({', '.join(languages)})"
        )
    return languages, euro, t.text("language_field")


def _location(
    t: _Table, source: str, languages: tuple[str, ...] | None, language_field: str | None
) -> tuple[str | None, Path | None, dict[str, str]]:
    """Where the rows are: the Hub dataset, the task's own folder, and the Hub config per
    language (checked against `languages` when those are known)."""
    hf_path = t.text("hf_path")
    data_dir = _data_dir(t, source)  # with neither, the task is read from --data-dir DIR/<key>/
    hub_only = [
        f
        for f in ("hf_config", "hf_lang_configs", "revision", "hub_splits")
        if t.get(f) is not None
    ]
    if hub_only and hf_path is None:
        raise t.fail(hub_only[0], "is for a Hub dataset, and hf_path is not given")
    if languages is None:
        return hf_path, data_dir, {}
    lang_configs = t.mapping("hf_lang_configs", languages)
    if hf_path and len(languages) > 1 and not language_field and not lang_configs:
        lang_configs = {lang: lang for lang in languages}
    return hf_path, data_dir, lang_configs


def _data_dir(t: _Table, source: str) -> Path | None:
    """The task's own data folder, absolute; a relative one is read from the task file's folder."""
    value = t.text("data_dir")
    if value is None:
        return None
    base = Path(source).parent
    path = Path(os.path.abspath(base / Path(value).expanduser()))
    if not path.is_dir():
        raise t.fail(
            "data_dir",
            f"{path} is not a folder (a relative data_dir is read from "
            f"the task file's folder, {os.path.abspath(base)})",
        )
    return path


def register_task_files(paths: list[str] | None) -> list[str]:
    """Register the tasks defined in user task files (TOML or YAML); returns their keys.

    Each file is checked whole before its tasks join the registry; registering a file again
    is a no-op.
    """
    keys: list[str] = []
    for path in paths or []:
        keys.extend(k for k in register_task_rows(read_task_file(path), str(path)) if k not in keys)
    return keys


def register_task_rows(rows: dict, source: str) -> list[str]:
    """Register user tasks given as task tables `{key: {field: value}}` (a task file's
    `tasks` table, or one embedded in another file), read from the file `source`, against
    whose folder a relative `data_dir` is read; returns their keys.

    A user task then is a registry row like a built-in one (`tasks.add_user_task`).
    """
    parsed = parse_task_rows(rows, source)  # every table checked before any is registered
    for task in parsed:
        tasks.add_user_task(task.key, task.knobs)
    return [task.key for task in parsed]
