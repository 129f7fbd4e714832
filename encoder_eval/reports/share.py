"""Share a results folder on the Hugging Face Hub: stage it without local paths, then upload.

`stage_results` copies what a reader of the results needs into a staging folder:

    results/               every valid result of the folder (fine-tune report cells, or
                           probe cells), each with the predictions file and TREC run written
                           beside it; a file the readers skip (corrupt, other phase) is
                           left out with a warning
    selection.json         the selection the table was made from (fine-tune results)
    table.json, table.md, table.csv
                           the `summarize` table (`--format json`, `markdown`, `csv`)
    report.html            the `report` page (only when asked: it draws every figure)
    manifest.json          what was staged, skipped and redacted, by which harness version

Local paths are redacted on the way (`REDACTED_FIELDS`, `redact_paths`), and the table and
page are computed from the staged, redacted copies, so nothing derived from them carries
a path either. `upload_staged` is the one Hub call (`HfApi.upload_folder`, a dataset
repository; `create_repo` first when asked); `upload_eval_results` opens a pull request
on a model repository with its `.eval_results/` files (`HfApi.create_commit`,
`create_pr=True`). `huggingface_hub` is imported only there.
The command is `encoder_eval.push`.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoder_eval import __version__
from encoder_eval.cells.predictions import (
    CellPredictions,
    PredictionsError,
    predictions_path,
    trec_run_path,
)
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import (
    FileProblem,
    parse_json,
    read_bytes,
    read_json,
    write_atomic,
    write_json_atomic,
)
from encoder_eval.core.results import (
    PROBE_RESULT_SUFFIX,
    TREC_SUFFIX,
    load_results,
    read_result,
)
from encoder_eval.plans.experiment import (
    REDACTED,
    from_selection,
    redact_data,
    summarize_inputs,
)
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports.probe_table import has_probe_results, load_probe_results, probe_table
from encoder_eval.reports.table import Table, build_table
from encoder_eval.reports.table_loading import load_table
from encoder_eval.reports.table_render import render
from encoder_eval.reports.verdicts import add_statistics

MANIFEST_SCHEMA = "encoder-eval-push"
EVAL_RESULTS_DIR = ".eval_results"  # the model repository's folder the Hub reads results from
RESULTS_SUBDIR = "results"
TABLE_FORMATS = {"table.json": "json", "table.md": "markdown", "table.csv": "csv"}
# The fields of a result that hold a local path when one is recorded (`--record-model-path`);
# any other string value that is an absolute path (or starts with `~`) is redacted too.
REDACTED_FIELDS = ("provenance.model_path", "cell.model_path", "provenance.model.path")
# A Hub repository id as `push` takes it: `org/name` (the Hub's characters, at most 96 each).
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_OFF = ("1", "ON", "YES", "TRUE")  # how huggingface_hub reads HF_HUB_OFFLINE


class TableRefused(Exception):
    """The results folder's table has problems and `allow_partial` was not given."""

    def __init__(self, table: Table) -> None:
        super().__init__("table refused")
        self.table = table


@dataclass
class Staged:
    """A staged folder: its files (relative, sorted), the entries left out, the redactions."""

    folder: Path
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # warnings about entries left out
    redacted: dict[str, list[str]] = field(default_factory=dict)  # file -> fields
    table: Table | None = None


# ----------------------------------------------------------------------------- checks


def check_repo_id(repo_id: str, flag: str = "--repo") -> None:
    """Refuse anything but `org/name` (no bare name, no `--` or `..`, Hub characters);
    the error names `flag`."""
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        raise HarnessError(
            f"{flag} {repo_id!r} is not a Hub repository id; give it as org/name "
            "(letters, digits, '-', '_', '.'; no '--' or '..')"
        )


def check_path_in_repo(path_in_repo: str | None) -> None:
    """Refuse an absolute or escaping folder inside the repository."""
    if path_in_repo is None:
        return
    parts = path_in_repo.replace("\\", "/").split("/")
    if path_in_repo.startswith("/") or ".." in parts or not path_in_repo.strip("/"):
        raise HarnessError(
            f"--path-in-repo {path_in_repo!r} must be a relative folder inside the "
            "repository (no leading '/', no '..')"
        )


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE asks huggingface_hub to make no request."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _OFF


# ----------------------------------------------------------------------------- redaction


def redact_paths(data: Any, where: str = "") -> tuple[Any, list[str]]:
    """`data` (plain JSON) without local paths: the fields of `REDACTED_FIELDS` replaced
    by `REDACTED`, and in every other string each path or private link replaced
    (`experiment.redact_text`: `--flag=/x`, a path inside a message, file:// links,
    `./x`, `~/x`). Returns the copy and the dotted names of the fields changed."""
    return redact_data(data, REDACTED_FIELDS, where)


def local_roots(*paths: str | os.PathLike | None) -> list[str]:
    """The names that must not leave the machine: the folders given (absolute and
    resolved), the home directory, the working directory (the root `/` never), and this
    machine's host names (`local_hosts`)."""
    roots: set[str] = set(local_hosts())
    for p in [*paths, Path.home(), Path.cwd()]:
        if p is None:
            continue
        for form in (Path(p).absolute(), Path(p).resolve()):
            if len(form.parts) > 1:
                roots.add(str(form))
    return sorted(roots, key=len, reverse=True)  # the longest first: a folder before its parent


def local_hosts() -> list[str]:
    """This machine's host names (short and qualified), as they may appear in a message
    (a tracking server, a connection error); `localhost` and names under four characters
    (which would match ordinary words) are left out."""
    names = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        for form in (name, name.split(".", 1)[0]):
            if len(form) >= 4 and form.lower() not in ("localhost", "localhost.localdomain"):
                names.add(form)
    return sorted(names)


def scrub_text(text: str, roots: list[str]) -> str:
    """`text` with each occurrence of a folder of `roots` (as a whole path prefix) replaced
    by `REDACTED`."""
    for root in roots:
        text = re.sub(rf"(?<![\w.-]){re.escape(root)}(?![\w.-])", REDACTED, text)
    return text


# ----------------------------------------------------------------------------- staging


def _stage_result(
    src: Path, data: dict, dest_dir: Path, staged: Staged, note: Callable[[str], None]
) -> None:
    """Copy one result (redacted) and the files beside it into `dest_dir`."""
    clean, fields = redact_paths(data)
    dest = dest_dir / src.name
    raw = None if fields else read_bytes(src)
    if raw is not None and parse_json(raw, src) == data:  # unchanged: byte for byte
        write_atomic(dest, raw)
    else:
        write_json_atomic(dest, clean)
    if fields:
        staged.redacted[f"{RESULTS_SUBDIR}/{src.name}"] = fields
    for beside in (predictions_path(src), trec_run_path(src)):
        content, why = _beside_content(beside, src, data)
        if content is not None:
            write_atomic(dest_dir / beside.name, content)
        elif why is not None:
            note(f"not staging {beside}: {why}")


def _beside_content(path: Path, result: Path, data: dict) -> tuple[bytes | None, str | None]:
    """The bytes of a file beside a result to stage, or (None, why not): it must be a
    regular file in the result's folder (a symlink may point only inside it) and parse as
    what its name says (a predictions file, or a TREC run of this cell). (None, None):
    there is no such file."""
    if not os.path.lexists(path):
        return None, None
    folder = result.parent.resolve()
    if path.is_symlink() and path.resolve().parent != folder:
        return None, "a symlink out of the results folder"
    try:
        raw = read_bytes(path)
    except FileProblem as exc:
        return None, exc.reason
    if path.name.endswith(TREC_SUFFIX):
        why = _trec_problem(raw, data)
        return (raw, None) if why is None else (None, why)
    try:
        CellPredictions.from_dict(parse_json(raw, path))
    except (FileProblem, PredictionsError) as exc:
        return None, f"not a predictions file ({getattr(exc, 'reason', exc)})"
    return raw, None


def _trec_problem(raw: bytes, data: dict) -> str | None:
    """Why `raw` is not a TREC run of the cell `data` (None when it is): every line
    `qid Q0 docid rank score run`, the rank a positive integer, the score a number, the
    run this cell's name (as `predictions.trec_lines` writes it)."""
    cell = data.get("cell") or {}
    run = f"{cell.get('model')}_{cell.get('task')}_{cell.get('lr_key')}_s{cell.get('seed')}"
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return "not a TREC run (not UTF-8 text)"
    for number, line in enumerate(lines, start=1):
        parts = line.split()
        ok = len(parts) == 6 and parts[1] == "Q0" and parts[5] == run and parts[3].isdigit()
        try:
            ok = ok and int(parts[3]) > 0 and math.isfinite(float(parts[4]))
        except ValueError:
            ok = False
        if not ok:
            return f"not a TREC run of this cell (line {number})"
    return None if lines else "not a TREC run (empty)"


def _stage_selection(path: str | os.PathLike, dest: Path, staged: Staged) -> None:
    """The selection as `select --redact-paths` writes it (its experiment without local
    paths, no results directory), and any other local path redacted too."""
    data = read_json(path)
    load_selection(path)  # the table's reader accepts it: a valid selection
    exp = from_selection(data, str(path))
    fields = []
    if exp is not None:
        redacted = exp.redacted().to_dict()
        if redacted != data["experiment"]:
            fields.append("experiment")
        data["experiment"] = redacted
    if data.get("results_dir") not in (None, REDACTED):
        data["results_dir"] = REDACTED
        fields.append("results_dir")
    data, more = redact_paths(data)
    write_json_atomic(dest, data)
    load_selection(dest)  # still a selection the report sweep and summarize read
    if fields or more:
        staged.redacted[dest.name] = fields + more


def _table(
    staged_results: Path, selection: Path | None, probe: bool, models: list[str] | None
) -> tuple[Table, list]:
    """The `summarize` table of the staged results (the rows `models`: those `summarize`
    shows of the original folder), and the results it was built from."""
    quiet = lambda message: None  # noqa: E731  # the originals were warned about
    if probe:
        return probe_table(load_probe_results(staged_results, warn=quiet)), []
    results = load_results(staged_results, warn=quiet, phase="report")
    return build_table(results, load_selection(selection), models=models), results


def stage_results(
    results_dir: str | os.PathLike,
    folder: str | os.PathLike,
    *,
    selection: str | None = None,
    report: bool = False,
    allow_partial: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Staged:
    """Stage `results_dir` into the empty folder `folder` (see the module's docstring).

    Raises HarnessError for a folder without results or a bad selection, and TableRefused
    when the table has problems and not `allow_partial`."""
    warn = warn or (lambda message: None)
    root, out = Path(results_dir), Path(folder)
    probe = has_probe_results(root)
    if probe and selection:
        raise HarnessError("probe results have no selection; leave out --selection")
    selection_path = None if probe else summarize_inputs(root, selection)[0]
    staged = Staged(out)
    skipped: list[str] = []

    def note(message: str) -> None:
        skipped.append(message.removeprefix("warning: "))
        warn(message.removeprefix("warning: "))

    dest = out / RESULTS_SUBDIR
    dest.mkdir(parents=True)
    if probe:
        for path in sorted(root.glob(f"*{PROBE_RESULT_SUFFIX}")):
            data, why = read_result(path)
            if data is None:
                note(f"skipping {path}: {why}")
                continue
            _stage_result(path, data, dest, staged, note)
    else:
        for loaded in load_results(root, warn=note, phase="report"):
            _stage_result(loaded.path, loaded.data, dest, staged, note)
    if not any(dest.iterdir()):
        raise HarnessError(f"--results-dir {results_dir} holds no result to push")
    staged_selection = None
    if selection_path is not None:
        staged_selection = out / "selection.json"
        _stage_selection(selection_path, staged_selection, staged)

    # The rows summarize shows of the folder (its experiment file is not staged).
    quiet = lambda message: None  # noqa: E731  # warned about above
    models = None if probe else load_table(root, selection, warn=quiet).table.models
    table, results = _table(dest, staged_selection, probe, models)
    if table.problems and not allow_partial:
        raise TableRefused(table)
    if not probe:  # summarize's defaults: t intervals, marks corrected over the table
        add_statistics(table, results)
    staged.table = table
    for name, fmt in TABLE_FORMATS.items():
        write_atomic(out / name, render(table, fmt))
    if report:
        from encoder_eval.reports.html import build_report, render_html

        page = build_report(
            dest,
            selection=None if staged_selection is None else str(staged_selection),
            models=models,
            allow_partial=allow_partial,
            title=f"encoder-eval report: {root.absolute().name}",
        )
        write_atomic(out / "report.html", render_html(page))

    # Last, every staged file loses the names of local folders (the staging folder's too:
    # a footnote may name a staged file).
    roots = local_roots(root, selection_path and Path(selection_path).parent, out)
    staged.skipped = [scrub_text(s, roots) for s in skipped]
    write_json_atomic(
        out / "manifest.json",
        {
            "schema": MANIFEST_SCHEMA,
            "version": 1,
            "harness": __version__,
            "kind": "probe" if probe else "fine-tune",
            "skipped": staged.skipped,
            "redacted": staged.redacted,
            "redacted_fields": list(REDACTED_FIELDS),
        },
    )
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        clean = scrub_text(text, roots)
        if clean != text:
            write_atomic(path, clean)
        staged.files.append(path.relative_to(out).as_posix())
    return staged


# ----------------------------------------------------------------------------- upload


def _dataset_api(repo_id: str, create: bool, private: bool, token: str | None):
    """huggingface_hub's client for the dataset repository `repo_id`, made first with
    `create` (`private` its visibility); a clear error when the `push` extra is missing."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise HarnessError(
            "push needs huggingface_hub: pip install 'encoder-eval-harness[push]'"
        ) from None
    api = HfApi()
    if create:
        api.create_repo(repo_id, repo_type="dataset", exist_ok=True, private=private, token=token)
    return api


def upload_staged(
    staged: Staged,
    repo_id: str,
    *,
    path_in_repo: str | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create: bool = False,
    private: bool = False,
    token: str | None = None,
) -> str:
    """Upload the staged folder to the dataset repository `repo_id` in one commit (the
    repository's `results/` under `path_in_repo` is replaced: results no longer in the
    folder are deleted); with `create`, make the repository first if it does not exist.
    Returns the commit's URL. `token` None: huggingface_hub's own (HF_TOKEN, the login)."""
    api = _dataset_api(repo_id, create, private, token)
    info = api.upload_folder(
        repo_id=repo_id,
        repo_type="dataset",
        folder_path=str(staged.folder),
        path_in_repo=path_in_repo,
        commit_message=commit_message
        or f"encoder-eval push: {len(staged.files)} files (encoder-eval {__version__})",
        revision=revision,
        token=token,
        delete_patterns=[f"{RESULTS_SUBDIR}/*"],
    )
    return str(getattr(info, "commit_url", None) or info)


def upload_eval_results(
    files: dict[str, str],
    repo_id: str,
    *,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
) -> str:
    """Open a pull request on the model repository `repo_id` adding `files` (name -> YAML
    text, `hub_results.hub_files`) under `.eval_results/`: one `HfApi.create_commit` with
    `create_pr=True`, so nothing lands on the model's branch until its owner merges.
    Returns the pull request's URL. `token` None: huggingface_hub's own."""
    try:
        from huggingface_hub import CommitOperationAdd, HfApi
    except ImportError:
        raise HarnessError(
            "push needs huggingface_hub: pip install 'encoder-eval-harness[push]'"
        ) from None

    operations = [
        CommitOperationAdd(path_in_repo=f"{EVAL_RESULTS_DIR}/{name}", path_or_fileobj=text.encode())
        for name, text in files.items()
    ]
    info = HfApi().create_commit(
        repo_id,
        operations,
        commit_message=commit_message
        or f"Add evaluation results: {len(files)} task(s) (encoder-eval {__version__})",
        repo_type="model",
        revision=revision,
        create_pr=True,
        token=token,
    )
    return str(getattr(info, "pr_url", None) or getattr(info, "commit_url", None) or info)


def upload_benchmark(
    files: dict[str, str],
    repo_id: str,
    *,
    revision: str | None = None,
    commit_message: str | None = None,
    create: bool = False,
    private: bool = False,
    token: str | None = None,
) -> str:
    """Commit `files` (name -> text: the protocol's benchmark card and eval.yaml,
    `hub_results.benchmark_files`) to the root of the dataset repository `repo_id`, in one
    `HfApi.create_commit`; `create`: make the repository first (`private` its visibility).
    Returns the commit's URL. `token` None: huggingface_hub's own."""
    api = _dataset_api(repo_id, create, private, token)
    from huggingface_hub import CommitOperationAdd

    info = api.create_commit(
        repo_id,
        [
            CommitOperationAdd(path_in_repo=name, path_or_fileobj=text.encode())
            for name, text in files.items()
        ],  # fmt: skip
        commit_message=commit_message
        or f"Add the encoder-eval protocol's benchmark card and eval.yaml ({__version__})",
        repo_type="dataset",
        revision=revision,
        token=token,
    )
    return str(getattr(info, "commit_url", None) or info)
