"""The table's row of one model as the Hub's model-page evaluation results.

The Hub shows a model's scores from YAML files in its repository's `.eval_results/`
folder: a list of entries, each `dataset` (`id`, `task_id`, optional `revision`), `value`,
optional `date`, `source` (`url`, `name`) and `notes` (the Hub's "Evaluation Results"
documentation, docs/hub/eval-results.md and eval_results.yaml of huggingface/hub-docs).
`hub_files` writes one file per task of the table: the task's Hub dataset and config, the
mean over the report seeds (x100, as the table prints it), the std and seeds in the notes,
the protocol and harness version in `source`. A table with problems is written only when
the caller allows it (`--allow-partial`), and then every entry says so. Nothing local
goes in (paths redacted as `push` redacts them). `export --format hub-eval-results` writes
the files; `push --to-model` opens a pull request with them (`share.upload_eval_results`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import yaml

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.metrics import metric_spec
from encoder_eval.core.results import LoadedResult
from encoder_eval.data.tasks import task_knobs
from encoder_eval.plans.experiment import redact_data
from encoder_eval.reports.export import HARNESS_NAME, hub_revision, model_name
from encoder_eval.reports.share import EVAL_RESULTS_DIR, local_roots, scrub_text
from encoder_eval.reports.table import Table
from encoder_eval.reports.verdicts import included_cells

PROTOCOL_NAME = "encoder-eval protocol"
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


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
    parts = [
        f"{spec.label} x100 on the {knobs.report_split} split ({langs}); mean of "
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
    table: Table, model: str, task: str, results: list[LoadedResult], source_url: str
) -> dict:
    """The `.eval_results` entry of one cell (see the module's docstring)."""
    cell = table.cells[(model, task)]
    knobs = task_knobs(task)
    dataset: dict = {"id": knobs.hf_path, "task_id": knobs.hf_config or task}
    if revision := hub_revision(results):
        dataset["revision"] = revision
    entry: dict = {"dataset": dataset, "value": round(100 * cell.mean, 2)}
    created = sorted(str(r.data["created_at"]) for r in results if r.data.get("created_at"))
    if created:
        entry["date"] = created[-1][:10]
    entry["source"] = {
        "url": source_url,
        "name": f"{PROTOCOL_NAME} ({HARNESS_NAME} {_versions(results)})",
    }
    entry["notes"] = _notes(table, model, task, results)
    return entry


def hub_files(
    table: Table,
    results: list[LoadedResult],
    model: str,
    *,
    source_url: str,
    results_dir: str | os.PathLike | list | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """The `.eval_results` files of `model`'s row: file name (`<task>.yaml`) -> YAML text,
    one entry each, in table order. A task without a Hub dataset, or without a score, is
    left out with a warning. The caller has already refused a table with problems unless
    `--allow-partial`."""
    warn = warn or (lambda message: None)
    check_source_url(source_url)
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
        entry, _ = redact_data(hub_entry(table, model, task, cells.get((model, task), []),
                                         source_url))  # fmt: skip
        entry["source"]["url"] = source_url  # given on the command line: published as is
        entry["notes"] = scrub_text(entry["notes"], roots)
        files[f"{task}.yaml"] = yaml.safe_dump(
            [entry], sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000
        )
    if not files:
        raise HarnessError(f"{model} has no score on a task with a Hub dataset: nothing to write")
    return files
