"""Where a task's rows come from, and reading them: a data mirror laid out as
`<task>/<split>[.<lang>].jsonl` (or a user task's own folder of `<split>[.<lang>].jsonl`),
the Hugging Face Hub at the revision in effect (`encoder_eval.data.revisions`), or the
synthetic generator; and `data_provenance`, which source a cell reads, recorded.

Rows keep the dataset's own (Hugging Face) field names whichever source they come from, so
that `encoder_eval.data.task_loading` turns a mirror's rows and the Hub's into the same inputs.
`read_hub_rows` is the one place rows come from the Hub (the loaders and `prefetch` both
call it); `datasets` is imported only there.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import DamagedFile, FileProblem, parse_json, read_json
from encoder_eval.data import synthetic
from encoder_eval.data.formatters import HUB_READERS
from encoder_eval.data.revisions import dataset_revisions, resolved_revision
from encoder_eval.data.tasks import TaskKnobs, task_knobs


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE says this machine must not reach the Hub (then no message
    suggests a command that reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The mirror directory in effect: the argument, else ENCODER_EVAL_DATA_DIR, else None (Hub)."""
    chosen = data_dir if data_dir is not None else os.environ.get("ENCODER_EVAL_DATA_DIR")
    return Path(chosen) if chosen else None


def mirror_not_a_folder(mirror: Path, task: str) -> HarnessError:
    """The error for a mirror (`--data-dir` or ENCODER_EVAL_DATA_DIR) that is not a folder."""
    return HarnessError(
        f"the data mirror {mirror} (--data-dir, or ENCODER_EVAL_DATA_DIR) is not a folder; "
        f"check the path: a mirror holds a folder per task, such as {mirror / task}{os.sep}"
    )


def check_mirror(data_dir: str | os.PathLike | None, task: str) -> None:
    """Refuse a mirror that is not a folder when `task` would read it (not a synthetic task,
    not one with its own `data_dir`): before any heavy import, so `run --data-dir TYPO`
    answers in under a second (`tests/test_fast_refusal.py`)."""
    mirror = resolve_data_dir(data_dir)
    knobs = task_knobs(task)
    if mirror is None or knobs.bucket == "synthetic" or knobs.data_dir is not None:
        return
    if not mirror.is_dir():
        raise mirror_not_a_folder(mirror, task)


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
        revision = resolved_revision(knobs, task)
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
                raise mirror_not_a_folder(mirror, task)
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
        sha = resolved_revision(knobs, task)
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
