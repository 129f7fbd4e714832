"""The table's row of one model as the Hub's model-page evaluation results.

The Hub shows a model's scores from YAML files in its repository's `.eval_results/`
folder: a list of entries, each `dataset` (`id`, `task_id`, optional `revision`), `value`,
optional `date`, `source` (`url`, `name`) and `notes` (the Hub's "Evaluation Results"
documentation, docs/hub/eval-results.md and eval_results.yaml of huggingface/hub-docs).
`hub_files` writes one file per task of the table: where the entry points (`hub_target`:
the task's own Hub dataset and config, a row of a benchmark table such as MTEB's, or the
protocol's own benchmark dataset), the mean over the report seeds (x100, as the table
prints it, signed: MCC and Spearman run from -100 to 100), the std and seeds in the
notes, the protocol and harness version in `source` (with `user`/`org` when given).
`link_notes` says which entries will not link to a leaderboard and why: the Hub links an
entry only when `dataset.id` is a Benchmark dataset and `task_id` an id of its
`eval.yaml`. `benchmark_files` writes that dataset for the protocol itself (its card and
an `eval.yaml` naming the suite's tasks), for `push --benchmark-repo`. A table with problems is written only when
the caller allows it (`--allow-partial`), and then every entry says so. Nothing local
goes in (paths redacted as `push` redacts them). `export --format hub-eval-results` writes
the files; `push --to-model` opens a pull request with them (`share.upload_eval_results`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import NamedTuple

import yaml

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import FileProblem, read_toml
from encoder_eval.core.metrics import metric_spec
from encoder_eval.core.results import LoadedResult
from encoder_eval.data.tasks import group_tasks, task_knobs
from encoder_eval.plans.experiment import redact_data
from encoder_eval.reports.export import HARNESS_NAME, hub_revision, model_name
from encoder_eval.reports.share import EVAL_RESULTS_DIR, local_roots, scrub_text
from encoder_eval.reports.table import Table
from encoder_eval.reports.verdicts import included_cells

PROTOCOL_NAME = "encoder-eval protocol"
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a Hub user or org name
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")

# Benchmarks an entry can point at instead of the task's own Hub dataset (none of ours is
# known to be a Benchmark): benchmark name -> our task key -> row. A row is plain data:
# `dataset`, a Hub dataset that publishes an `eval.yaml`, and `task_id`, an id of that
# file, plus `note`, what differs between our score and the benchmark's (it goes into the
# entry's notes and the export's output). A row without `dataset` says why the task has
# none (`why`). A task with no row keeps its own dataset and does not link. `--benchmark-map
# FILE` adds or replaces rows from a TOML file of the same shape
# (`[mteb.glue_sst2] dataset = "...", task_id = "..."`); docs/export.md.
# MTEB: its `eval.yaml` tasks are named by the MTEB task name (mteb's `HFEvalMeta`,
# `push_eval_to_hub`, embeddings-benchmark/mteb#4114); read in mteb's code, not checked on
# the Hub, which this harness cannot reach from its tests.
_MTEB_PROBE = (
    "MTEB scores a frozen embedding with a logistic-regression classifier on its own "
    "splits and languages; this is a fine-tuned model: the same data, not the same protocol"
)
HUB_BENCHMARKS: dict[str, dict[str, dict[str, str]]] = {
    "mteb": {
        "amazon_reviews_multi": {
            "dataset": "mteb/AmazonReviewsClassification",
            "task_id": "AmazonReviewsClassification",
            "note": f"accuracy, as MTEB's main score; {_MTEB_PROBE}",
        },
        "massive_intent": {
            "dataset": "mteb/amazon_massive_intent",
            "task_id": "MassiveIntentClassification",
            "note": f"accuracy, as MTEB's main score; {_MTEB_PROBE}; that this dataset "
            "publishes an eval.yaml is not known",
        },
        "xnli": {
            "why": "MTEB's XNLI is a pair classification scored by average precision, not accuracy"
        },
        "paws_x": {
            "why": "MTEB's PawsXPairClassification is scored by average precision, not accuracy"
        },
        "glue_stsb": {
            "why": "MTEB's STSBenchmark scores the test split, ours GLUE's validation split"
        },
    },
}


class HubTarget(NamedTuple):
    """Where a task's entry points: `dataset.id` and `task_id`, whether the dataset is a
    revision of the data the cells read (then `dataset.revision` is theirs), whether it is
    known to link to a leaderboard, and why not (or what to know when it does)."""

    dataset: str
    task_id: str
    own_data: bool
    links: bool
    why: str | None = None


def load_benchmark_map(path: str | os.PathLike | None) -> dict[str, dict[str, dict[str, str]]]:
    """`HUB_BENCHMARKS` with the rows of the TOML file `path` added (a row there replaces
    ours). Each row: `dataset` (org/name) and `task_id` strings, optional `note`; or
    `why` alone."""
    table = {
        name: {t: dict(row) for t, row in rows.items()} for name, rows in HUB_BENCHMARKS.items()
    }
    if path is None:
        return table
    try:  # a regular file of bounded size only: a FIFO or /dev/zero is refused unread
        data = read_toml(path)
    except FileProblem as exc:
        raise HarnessError(f"--benchmark-map: {exc}") from None
    for name, rows in data.items():
        if not isinstance(rows, dict) or "/" in name:
            raise HarnessError(f"--benchmark-map {path}: [{name}] must be a table of task rows")
        for task, row in rows.items():
            ok = isinstance(row, dict) and all(isinstance(v, str) for v in row.values())
            keys = set(row) if isinstance(row, dict) else set()
            if not ok or not (
                ({"dataset", "task_id"} <= keys <= {"dataset", "task_id", "note"})
                or keys == {"why"}
            ):
                raise HarnessError(
                    f"--benchmark-map {path}: [{name}.{task}] needs dataset and task_id "
                    "(strings; note optional), or why alone"
                )
            if "dataset" in row and not _REPO_ID.fullmatch(row["dataset"]):
                raise HarnessError(
                    f"--benchmark-map {path}: [{name}.{task}] dataset {row['dataset']!r} "
                    "is not a Hub dataset id (org/name)"
                )
            table.setdefault(name, {})[task] = dict(row)
    return table


def check_benchmark(benchmark: str | None, table: dict | None = None) -> None:
    """`--benchmark`: a benchmark table's name, or the protocol's benchmark dataset as
    org/name."""
    table = HUB_BENCHMARKS if table is None else table
    if benchmark is None or benchmark in table or _REPO_ID.fullmatch(benchmark):
        return
    raise HarnessError(
        f"--benchmark {benchmark!r} is neither a benchmark table ({', '.join(sorted(table))}; "
        "--benchmark-map adds others) nor the protocol's benchmark dataset as org/name"
    )


def add_hub_entry_arguments(p: argparse.ArgumentParser, who: str) -> None:
    """The flags of the Hub's `.eval_results` entries beyond `--source-url` (export
    hub-eval-results, push --to-model): where the entries point and whom `source` names."""
    p.add_argument(
        "--benchmark",
        metavar="NAME|ORG/NAME",
        help=f"{who}: point entries at a benchmark's Hub dataset and task ids: a table "
        "(mteb), or the protocol's own benchmark dataset as org/name (push "
        "--benchmark-repo makes it); default: each task's own dataset, which does not link "
        "to a leaderboard",
    )
    p.add_argument(
        "--benchmark-map",
        metavar="FILE",
        help=f"{who}: a TOML file of benchmark rows ([NAME.TASK] dataset, task_id, note) "
        "added to the built-in table",
    )
    p.add_argument("--source-user", help=f"{who}: the Hub user name each entry's source names")
    p.add_argument("--source-org", help=f"{who}: the Hub org name each entry's source names")


def check_hub_entry_arguments(args: argparse.Namespace, allowed: bool, owner: str) -> dict | None:
    """Refuse the entry flags (`add_hub_entry_arguments`) unless `allowed` (`owner` says
    which mode they belong to); else check them and return the benchmark table
    (`load_benchmark_map`)."""
    names = ("benchmark", "benchmark_map", "source_user", "source_org")
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None)]
    if not allowed:
        if given:
            raise HarnessError(f"{', '.join(given)}: for {owner}")
        return None
    check_source_names(args.source_user, args.source_org)
    table = load_benchmark_map(args.benchmark_map)
    check_benchmark(args.benchmark, table)
    return table


def check_source_names(user: str | None, org: str | None) -> None:
    """`--source-user` / `--source-org`: Hub user and org names, published as given."""
    for flag, name in (("--source-user", user), ("--source-org", org)):
        if name is not None and not _HUB_NAME.fullmatch(name):
            raise HarnessError(
                f"{flag} {name!r} is not a Hub user or org name (letters, digits, '-', '_', '.')"
            )


def hub_target(task: str, benchmark: str | None, table: dict | None = None) -> HubTarget:
    """Where `task`'s entry points (see `HubTarget`): with no `benchmark`, the task's own
    Hub dataset and config (none of them is known to be a Benchmark); with a benchmark
    table's name, its row for the task when it has one (else the task's own dataset, and
    the row's `why`); with org/name, the protocol's benchmark dataset, `task_id` the task
    key, for the suite's tasks (it links once the Hub accepts that dataset as a
    Benchmark)."""
    table = HUB_BENCHMARKS if table is None else table
    knobs = task_knobs(task)
    own = HubTarget(str(knobs.hf_path), knobs.hf_config or task, True, False)
    if benchmark is None:
        return own._replace(
            why=f"{knobs.hf_path} is not known to be a Hub Benchmark (an eval.yaml the Hub "
            "accepted); give --benchmark (a table, e.g. mteb, or the protocol's benchmark "
            "dataset)"
        )
    if benchmark in table:
        row = table[benchmark].get(task)
        if row is None:
            return own._replace(why=f"{benchmark} has no row for {task} (--benchmark-map adds one)")
        if "dataset" not in row:
            return own._replace(why=f"{benchmark} has no task for {task}: {row['why']}")
        return HubTarget(row["dataset"], row["task_id"], False, True, row.get("note"))
    if task not in group_tasks("all"):
        return own._replace(
            why=f"{task} is not a task of the protocol's benchmark {benchmark} (its eval.yaml "
            "names the suite's tasks)"
        )
    return HubTarget(
        benchmark,
        task,
        False,
        False,
        f"links once the Hub accepts {benchmark} as a Benchmark (push --benchmark-repo "
        f"{benchmark} writes its eval.yaml; the Hub allow-lists benchmarks on request)",
    )


def check_source_url(url: str | None) -> str:
    """The `source.url` of the entries: required (the Hub refuses a source without one),
    an https link, one line: it is published as given."""
    if url is None:
        raise HarnessError(
            "give --source-url https://...: the link each entry names as its source, where "
            "the results can be read (e.g. the dataset repository `push --repo` made, or a "
            "paper); the Hub refuses an entry without one"
        )
    if not url or not url.startswith("https://") or any(c.isspace() for c in url):
        raise HarnessError(
            f"--source-url {url!r} must be an https:// link to where the results can be "
            "read (e.g. the dataset repository `push --repo` made, or a paper)"
        )
    return url


def one_model(table: Table, model: str | None) -> str:
    """The model whose row becomes the entries: `model`, or the table's only one."""
    if model is not None:
        if model not in table.models:
            raise HarnessError(
                f"model {model!r} is not in the table (it has {', '.join(table.models)})"
            )
        return model
    if len(table.models) != 1:
        raise HarnessError(
            "the Hub's results describe one model and the table has "
            f"{len(table.models)} ({', '.join(table.models)}); name one (export: "
            "--models NAME; push: --model NAME)"
        )
    return table.models[0]


def check_model_repo(table: Table, results: list[LoadedResult], model: str, repo: str) -> None:
    """Refuse to put `model`'s scores on the page of `repo` when its cells recorded
    (`run --record-model-path`) that they ran another Hub model."""
    cells = included_cells(table, results)
    ran = model_name([r for (m, _), rs in cells.items() if m == model for r in rs], model)
    if ran != model and ran != repo:
        raise HarnessError(
            f"the cells of {model} ran the Hub model {ran}, not {repo}: its scores belong "
            f"on {ran}'s page (--to-model {ran})"
        )


def _versions(results: list[LoadedResult]) -> str:
    found = sorted(
        {
            str(v)
            for r in results
            if (v := ((r.data.get("provenance") or {}).get("software") or {}).get("harness"))
        }
    )
    return ", ".join(found) or "unknown version"


def _notes(table: Table, model: str, task: str, results: list[LoadedResult]) -> str:
    cell = table.cells[(model, task)]
    knobs = task_knobs(task)
    spec = metric_spec(cell.metric)
    seeds = sorted(cell.scores)
    std = "n/a (one seed)" if cell.std is None else f"{100 * cell.std:.2f}"
    langs = ", ".join(knobs.euro_languages)
    scale = f"{spec.label} x100"
    if spec.score_range and spec.score_range[0] < 0:  # MCC, Spearman: signed, as printed
        scale += f" (from {100 * spec.score_range[0]:g} to {100 * spec.score_range[1]:g})"
    parts = [
        f"{scale} on the {knobs.report_split} split ({langs}); mean of "
        f"{cell.n} fine-tuning seed(s) ({', '.join(map(str, seeds))}), std {std}"
    ]
    if cell.lr is not None:
        parts.append(f"learning rate {cell.lr:g} (selected on the select-phase seeds)")
    revisions = {(r.data.get("provenance") or {}).get("model_revision") for r in results}
    if len(revisions) == 1 and (rev := revisions.pop()):
        parts.append(f"model revision {rev}")
    if cell.n != len(table.expected_seeds):
        parts.append(f"PARTIAL: {cell.n} of {len(table.expected_seeds)} seeds")
    if cell.off_protocol:
        parts.append("OFF-PROTOCOL cells")
    if table.problems:
        problems = "; ".join(f"{p.message} [{p.rule}]" for p in table.problems)
        parts.append(f"NOT A PROTOCOL TABLE (exported with --allow-partial): {problems}")
    return "; ".join(parts)


def hub_entry(
    table: Table,
    model: str,
    task: str,
    results: list[LoadedResult],
    source_url: str,
    *,
    target: HubTarget | None = None,
    source_user: str | None = None,
    source_org: str | None = None,
) -> dict:
    """The `.eval_results` entry of one cell (see the module's docstring). `value` is the
    table's mean x100 as it prints it, signed (MCC and Spearman can be below 0; the notes
    give the range). `dataset.revision` is the commit the cells read when the entry points
    at their own dataset; pointing at a benchmark's, it goes into the notes instead."""
    cell = table.cells[(model, task)]
    target = target or hub_target(task, None)
    dataset: dict = {"id": target.dataset, "task_id": target.task_id}
    notes = _notes(table, model, task, results)
    if revision := hub_revision(results):
        if target.own_data:
            dataset["revision"] = revision
        else:
            knobs = task_knobs(task)
            notes += f"; data {knobs.hf_path} revision {revision}"
    if not target.own_data and target.links and target.why:
        notes += f"; {target.why}"
    entry: dict = {"dataset": dataset, "value": round(100 * cell.mean, 2)}
    created = sorted(str(r.data["created_at"]) for r in results if r.data.get("created_at"))
    if created:
        entry["date"] = created[-1][:10]
    entry["source"] = {
        "url": source_url,
        "name": f"{PROTOCOL_NAME} ({HARNESS_NAME} {_versions(results)})",
    }
    if source_user:
        entry["source"]["user"] = source_user
    if source_org:
        entry["source"]["org"] = source_org
    entry["notes"] = notes
    return entry


def hub_files(
    table: Table,
    results: list[LoadedResult],
    model: str,
    *,
    source_url: str,
    results_dir: str | os.PathLike | list | None = None,
    warn: Callable[[str], None] | None = None,
    benchmark: str | None = None,
    benchmark_map: dict | None = None,
    source_user: str | None = None,
    source_org: str | None = None,
) -> dict[str, str]:
    """The `.eval_results` files of `model`'s row: file name (`<task>.yaml`) -> YAML text,
    one entry each, in table order, pointing where `hub_target` says (`benchmark`, rows
    from `benchmark_map`, default `HUB_BENCHMARKS`). A task without a Hub dataset, or
    without a score, is left out with a warning. The caller has already refused a table
    with problems unless `--allow-partial`; `link_notes` says which files link."""
    warn = warn or (lambda message: None)
    check_source_url(source_url)
    check_source_names(source_user, source_org)
    check_benchmark(benchmark, benchmark_map)
    cells = included_cells(table, results)
    folders = results_dir if isinstance(results_dir, list) else [results_dir]
    roots = local_roots(*folders)
    files: dict[str, str] = {}
    for task in table.tasks:
        cell = table.cells.get((model, task))
        if cell is None or cell.mean is None:
            warn(f"warning: {model}/{task} has no score; no Hub result written for it")
            continue
        if task_knobs(task).hf_path is None:
            warn(f"warning: task {task} has no Hub dataset; no Hub result written for it")
            continue
        if not _FILE_NAME.fullmatch(task):
            raise HarnessError(f"task {task!r} cannot name a file of {EVAL_RESULTS_DIR}/")
        target = hub_target(task, benchmark, benchmark_map)
        entry, _ = redact_data(hub_entry(table, model, task, cells.get((model, task), []),
                                         source_url, target=target, source_user=source_user,
                                         source_org=source_org))  # fmt: skip
        entry["source"]["url"] = source_url  # given on the command line: published as is
        entry["notes"] = scrub_text(entry["notes"], roots)
        files[f"{task}.yaml"] = yaml.safe_dump(
            [entry], sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000
        )
    if not files:
        raise HarnessError(f"{model} has no score on a task with a Hub dataset: nothing to write")
    return files


def link_notes(
    files: dict[str, str], benchmark: str | None = None, benchmark_map: dict | None = None
) -> list[str]:
    """One line per file of `hub_files` that will not link to a leaderboard, and why, or
    that links with something to know (a benchmark row's note); and one per entry whose
    value is below 0 (MCC, Spearman), which a reader that takes every value for a 0-100
    percentage refuses or misreads."""
    lines = []
    for name, text in files.items():
        (entry,) = yaml.safe_load(text)
        target = hub_target(name.removesuffix(".yaml"), benchmark, benchmark_map)
        where = f"{entry['dataset']['id']} task {entry['dataset']['task_id']}"
        if not target.links:
            lines.append(f"note: {name} ({where}) will not link to a leaderboard: {target.why}")
        elif target.why:
            lines.append(f"note: {name} links to {where}: {target.why}")
        if entry["value"] < 0:
            lines.append(
                f"note: {name}: value {entry['value']} is below 0 (a signed metric x100, "
                "as the table prints it); a reader that takes values for 0-100 "
                "percentages refuses or misreads it"
            )
    return lines


def benchmark_files(version: str | None = None) -> dict[str, str]:
    """The protocol as a Hub benchmark dataset: `eval.yaml` (the Hub's benchmark file:
    `name`, `description`, `evaluation_framework`, `tasks` with one `id` per task of the
    suite, the ids `--benchmark ORG/NAME` entries name) and `README.md`, its card (what
    each task reads and scores, how to point entries here, and that the Hub links them
    only once it has accepted the dataset as a Benchmark). The data stay in the tasks' own
    datasets; the card names them."""
    from encoder_eval import __version__

    version = version or __version__
    tasks = group_tasks("all")
    description = (
        "Fine-tuning protocol of encoder-eval-harness: each model is fine-tuned on each "
        "task with the learning rate selected on three seeds, then reported as the mean "
        "over five fresh seeds, on the split and metric the card lists per task. Scores "
        "are x100; MCC and Spearman run from -100 to 100."
    )
    eval_yaml = yaml.safe_dump(
        {
            "name": PROTOCOL_NAME,
            "description": description,
            "evaluation_framework": HARNESS_NAME,
            "tasks": [{"id": task} for task in tasks],
        },
        sort_keys=False,
        allow_unicode=True,
        width=88,
    )
    rows = []
    for task in tasks:
        knobs = task_knobs(task)
        spec = metric_spec(knobs.metric)
        low, high = spec.score_range or (0.0, 1.0)
        split = knobs.hub_splits.get(knobs.report_split, knobs.report_split)
        config = knobs.hf_config or ("per language" if knobs.hf_lang_configs else "default")
        rows.append(
            f"| `{task}` | [{knobs.hf_path}](https://huggingface.co/datasets/{knobs.hf_path}) "
            f"| {config} | {split} | {spec.label} | {100 * low:g} to {100 * high:g} |"
        )
    card = "\n".join(
        [
            "---",
            f"pretty_name: {PROTOCOL_NAME}",
            "tags:",
            "- benchmark",
            "- evaluation",
            f"- {HARNESS_NAME}",
            "---",
            "",
            f"# {PROTOCOL_NAME}",
            "",
            description,
            "",
            f"This repository holds no data: each task reads the Hub dataset below. Its "
            f"`eval.yaml` names the {len(tasks)} tasks, so that every model's results meet "
            "on one leaderboard. A model's `.eval_results/<task>.yaml` entry points here "
            "with `dataset.id` this repository and `task_id` the task key "
            "(`encoder-eval export --format hub-eval-results --benchmark ORG/NAME`).",
            "",
            "The Hub links an entry to a leaderboard only once it has accepted this "
            "dataset as a Benchmark (it validates `eval.yaml` at push time and allow-lists "
            "benchmarks on request; see the Hub's Evaluation Results documentation). Until "
            "then the entries show on each model page without a leaderboard.",
            "",
            "| task | data | config | split | metric | range (x100) |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Written by {HARNESS_NAME} {version}.",
            "",
        ]
    )
    return {"README.md": card, "eval.yaml": eval_yaml}
