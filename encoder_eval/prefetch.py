"""`encoder-eval prefetch`: write an offline data mirror from the Hugging Face Hub.

Run it where the Hub is reachable (a login node), copy the directory to machines that
cannot reach it, and pass `--data-dir DIR` (or set `ENCODER_EVAL_DATA_DIR`) there:

    encoder-eval prefetch --tasks glue_rte,xnli --out /shared/encoder-eval-data

It reads rows through `sources.read_hub_rows`, the same function the loaders use in Hub mode,
and writes the layout the loaders read in mirror mode: `DIR/<task>/<split>.jsonl`, or
`DIR/<task>/<split>.<lang>.jsonl` for tasks read per language (a task whose rows carry their
language in a field gets one file per split holding all languages). Each file is written
to a temporary name and renamed into place, so an interrupted run never leaves half a file
under a name the loaders read. `DIR/MANIFEST.json` records, per task, the dataset, the
revision asked for, the commit it resolved to, and each file's row count and SHA-256;
results produced from the mirror carry that entry in their provenance. A second run merges
its tasks into the existing manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from encoder_eval.core import fileio
from encoder_eval.core.errors import EXIT_OK, ArgumentParser, HarnessError, report_errors
from encoder_eval.core.fileio import FileProblem, atomic_open, read_json
from encoder_eval.core.problems import RANKING
from encoder_eval.data import revisions, sources, task_loading, tasks
from encoder_eval.data.taskfile import register_task_files

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_SCHEMA = "encoder-eval-mirror"
MANIFEST_VERSION = 1
SPLITS = ("train", "validation", "test")

Log = Callable[[str], None]


def default_splits(task: str) -> tuple[str, ...]:
    """The splits the task's loader reads: train, validation, and test when it reports test."""
    knobs = tasks.task_knobs(task)
    return SPLITS if knobs.report_split == "test" else ("train", "validation")


def resolve_revision(repo: str, revision: str | None) -> str | None:
    """The commit SHA `revision` (None = the default branch) of a Hub dataset, or None when
    it cannot be resolved (the manifest then records the requested revision only)."""
    try:
        return revisions.resolve_dataset_revision(repo, revision)
    except HarnessError:
        return None


def pin_line(manifest: dict) -> str | None:
    """The shell line that pins later Hub reads to exactly the commits this mirror holds."""
    pins = {
        e["dataset"]: e["revision"]
        for e in (manifest or {}).get("tasks", {}).values()
        if isinstance(e, dict) and e.get("dataset") and e.get("revision")
    }
    if not pins:
        return None
    return "export ENCODER_EVAL_DATASET_REVISIONS=" + shlex.quote(json.dumps(pins, sort_keys=True))


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_jsonl_atomic(path: Path, rows: Iterable[dict]) -> tuple[int, str]:
    """Write rows as JSON lines to `path` atomically (`fileio.atomic_open`); return (rows,
    sha256). A row that cannot be written leaves the old file and no temporary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    count = 0
    with atomic_open(path, "wb") as handle:
        for count, row in enumerate(rows, start=1):
            try:
                text = json.dumps(row, ensure_ascii=False, default=_json_default)
            except (TypeError, ValueError) as exc:
                raise HarnessError(
                    f"{path}: row {count} cannot be written as JSON: {exc}"
                ) from None
            line = (text + "\n").encode("utf-8")
            handle.write(line)
            digest.update(line)
    return count, digest.hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    """The mirror's JSON files (keys sorted), through the one atomic writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.write_json_atomic(path, data, sort_keys=True)


def read_manifest(out: Path) -> dict:
    """The mirror's manifest, or an empty one when the directory has none yet."""
    path = Path(out) / MANIFEST_NAME
    if not path.exists():
        return {"schema": MANIFEST_SCHEMA, "version": MANIFEST_VERSION, "tasks": {}}
    try:
        data = read_json(path)
    except FileProblem as exc:
        raise HarnessError(
            f"{exc}; move it aside (the data files stay usable) and run prefetch again to "
            "write a new one"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise HarnessError(
            f"{path} is not an encoder-eval mirror manifest (schema {MANIFEST_SCHEMA!r}); "
            "choose another --out or move the file aside"
        )
    if data.get("version") != MANIFEST_VERSION:
        raise HarnessError(
            f"{path} has manifest version {data.get('version')!r}; this harness writes version "
            f"{MANIFEST_VERSION}. Use a fresh --out or the harness version that wrote it"
        )
    if not isinstance(data.get("tasks"), dict):
        data["tasks"] = {}
    return data


def merge_entry(old: dict | None, new: dict) -> dict:
    """A task's manifest entry after a prefetch: files merge when the revision is the same."""
    if (
        old
        and old.get("dataset") == new["dataset"]
        and old.get("revision") == new["revision"]
        and new["revision"] is not None
    ):
        return {**new, "files": {**old.get("files", {}), **new["files"]}}
    return new


def prefetch_task(task: str, out: Path, splits: Iterable[str] | None = None, log: Log = print):
    """Write one task's splits under `out` and return its manifest entry."""
    knobs = tasks.task_knobs(task)
    splits = tuple(splits) if splits is not None else default_splits(task)
    requested = revisions.dataset_revisions().get(knobs.hf_path)
    sha = resolve_revision(knobs.hf_path, requested)
    if sha is None:
        log(
            f"{task}: could not resolve {knobs.hf_path}@{requested or 'default branch'} to a "
            "commit; the manifest records the requested revision only"
        )
    offline = sources.hub_offline()
    files: dict[str, dict] = {}
    for split in splits:
        for lang in sources.file_languages(task):
            path = sources.mirror_file(out, task, split, lang)
            try:
                rows = sources.read_hub_rows(task, split, lang, revision=sha or requested)
            except HarnessError as exc:
                fix = (
                    "HF_HUB_OFFLINE is set: unset it, on a machine with internet access"
                    if offline
                    else "check the network, the dataset id and revision, and HF_TOKEN for "
                    "gated datasets"
                )
                raise HarnessError(
                    f"prefetch of {task} stopped before {path.name}: {exc} "
                    f"Prefetch reads the Hub: {fix}, then run it again (files and tasks "
                    f"already written are kept)."
                ) from None
            count, digest = write_jsonl_atomic(path, rows)
            files[path.name] = {"rows": count, "sha256": digest}
            log(f"{task}: wrote {path} ({count} rows, sha256 {digest[:12]})")
            if not count:
                log(f"{task}: warning: {path.name} is empty; loading it will fail")
            elif split in default_splits(task):
                _check_loadable(task, rows, path, log)
    return {
        "dataset": knobs.hf_path,
        "revision": sha,
        "revision_requested": requested,
        "files": files,
    }


def _check_loadable(task: str, rows: list[dict], path: Path, log: Log) -> None:
    """Warn now, where the Hub is at hand, when a split the loader reads will not load."""
    ranking = tasks.task_knobs(task).problem == RANKING
    convert = task_loading.ranking_rows_to_split if ranking else task_loading.rows_to_split
    try:
        convert(task, rows, str(path))
    except HarnessError as exc:
        log(f"{task}: warning: {path.name} will not load: {exc}")


def prefetch(
    task_names: Iterable[str],
    out: str | os.PathLike,
    splits: Iterable[str] | None = None,
    log: Log = print,
) -> dict:
    """Write a mirror of `task_names` under `out`; the manifest is rewritten after each task."""
    out = Path(out)
    names = list(task_names)
    for name in names:  # unknown names fail before anything is fetched
        knobs = tasks.task_knobs(name)
        if knobs.hf_path is None:
            source = (
                "generated locally" if knobs.bucket == "synthetic" else "read from a mirror only"
            )
            raise HarnessError(f"task {name!r} is {source}; there is nothing to prefetch")
    splits = _check_splits(splits)
    manifest = read_manifest(out)
    for name in names:
        entry = prefetch_task(name, out, splits, log)
        old = manifest["tasks"].get(name)
        merged = merge_entry(old, entry)
        stale = sorted(
            p.name for p in (out / name).glob("*.jsonl") if p.name not in merged["files"]
        )
        if stale:
            log(
                f"{name}: note: {', '.join(stale)} not written by this run (another revision or "
                "an earlier run) and not in the manifest; delete them or fetch their splits too"
            )
        manifest["tasks"][name] = merged
        write_json_atomic(out / MANIFEST_NAME, manifest)
        log(f"{name}: manifest updated ({out / MANIFEST_NAME})")
    return manifest


def _check_splits(splits: Iterable[str] | None) -> tuple[str, ...] | None:
    if splits is None:
        return None
    splits = tuple(splits)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown or not splits:
        raise HarnessError(
            f"--splits {','.join(splits)!r}: splits are a comma-separated subset of "
            f"{', '.join(SPLITS)}"
        )
    return splits


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval prefetch",
        description="Read tasks from the Hugging Face Hub and write them as an offline mirror "
        "for --data-dir / ENCODER_EVAL_DATA_DIR, with a MANIFEST.json of resolved revisions.",
    )
    p.add_argument(
        "--tasks",
        required=True,
        help="comma-separated task names or groups (all, multilingual, glue, superglue): "
        + ", ".join(name for name, k in tasks.TASK_KNOBS.items() if k.hf_path is not None),
    )
    p.add_argument(
        "--tasks-file",
        action="append",
        default=[],
        metavar="F",
        help="a task file whose Hub tasks may be named in --tasks (repeatable)",
    )
    p.add_argument("--out", required=True, help="the mirror directory (created if absent)")
    p.add_argument(
        "--splits",
        help="comma-separated splits to fetch (train, validation, test); default: those the "
        "task's loader reads (test only where the report split is the labelled test)",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    register_task_files(args.tasks_file)
    if not _csv(args.tasks):
        raise HarnessError("--tasks is empty; give task names separated by commas, or 'all'")
    names = tasks.resolve_task_names(_csv(args.tasks))
    splits = _csv(args.splits) if args.splits is not None else None
    manifest = prefetch(names, args.out, splits)
    pin = pin_line(manifest)
    if pin:
        print(f"to read exactly these commits from the Hub later: {pin}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
