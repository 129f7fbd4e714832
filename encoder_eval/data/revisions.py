"""Which Hub commit of a dataset a task reads: the revisions the task rows pin, the
environment's override (ENCODER_EVAL_DATASET_REVISIONS), and a revision resolved to the
commit that is then both read and recorded.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from encoder_eval.core import process_state
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import DamagedFile, parse_json
from encoder_eval.data.tasks import TASK_KNOBS, TaskKnobs


def default_revisions() -> dict[str, str | None]:
    """The Hub revision each dataset is read at, from the task rows (None: the head); when
    several tasks read one dataset, the one a row names (a run reads one revision of it)."""
    revisions: dict[str, str | None] = {}
    for knobs in TASK_KNOBS.values():
        repo = knobs.hf_path
        if repo and (knobs.revision is not None or repo not in revisions):
            revisions[repo] = knobs.revision
    return revisions


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


# A fresh process asks again: a branch may have moved between two units of a warm worker.
process_state.register(
    "resolved dataset revisions (data/revisions.py)", resolve_dataset_revision.cache_clear
)


def resolved_revision(knobs: TaskKnobs, task: str) -> str:
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
