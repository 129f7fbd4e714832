"""NeuCo-Bench compatibility mode: probe embeddings you already have, from NeuCo-Bench's files.

Usage::

    encoder-eval probe --annotation-path labels/ --submission-file embeddings.csv \\
        [--output-dir results] [--config config.yaml] [--method-name NAME] [--phase dev] \\
        [--exclude-file bad_ids.txt] [--neuco-rule RULE ...]
    neuco-bench --annotation_path labels/ --submission_file embeddings.csv ...  # the same

Inputs are NeuCo-Bench's: a folder of label files `<task>__<type>.csv` (columns `id`,
`label`; type `classification`/`cls` or `regression`/`regr`), an embeddings CSV (column
`id`, embedding columns named by their index, or every other column), an exclude file
(one id per line), a YAML config (`CONFIG_KEYS`; default `config.yaml`). Outputs follow
its layout: `<output_dir>/<phase>/<method>_<timestamp>/<task>/<task>_result.json` (+
`probe/` with `store_probes`, `regression_scatter/` or `confusion_matrices/` with
`enable_plots`), `results_summary.json` beside the task folders, and with
`update_leaderboard` `<output_dir>/leaderboards/<phase>/leaderboard_<timestamp>.csv`.

The probing itself is `encoder_eval.cells.probing` (EVALUATION_METHODOLOGY.md, "12.
Probing"), with `probe_type: svm` its SVM probe (`encoder_eval.cells.svm_probe`): the
sound rules by default, NeuCo-Bench's own with `--neuco-rule` (results then say so).

Exit status: 0 done; 1 leaderboard refused (a run misses a task; each listed); 2 bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import stat
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from encoder_eval.cells.probing import (
    CLASSIFICATION,
    NEUCO_RULES,
    R2,
    REGRESSION,
    ProbeConfig,
    ProbeOutcome,
    ProbeTask,
    final_probe,
    held_out_predictions,
    probe_task,
    result_record,
    run_summary,
    save_probe,
    write_result,
)
from encoder_eval.cells.svm_probe import SvmSearch, require_search_library
from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    report_errors,
    unknown_name,
)
from encoder_eval.core.fileio import (
    FileProblem,
    MissingFile,
    parse_yaml,
    read_bytes,
    read_json,
    safe_filename_part,
    write_atomic,
)
from encoder_eval.reports.plots import plot_confusion_matrix, plot_regression_scatter
from encoder_eval.reports.ranking import neuco_weights

# Label-file types as NeuCo-Bench spells them -> ours.
TASK_TYPE_NAMES = {
    "classification": CLASSIFICATION,
    "cls": CLASSIFICATION,
    "regression": REGRESSION,
    "regr": REGRESSION,
}
REQUIRED_KEYS = ("k_folds", "probe_type", "probe_params", "update_leaderboard")
OPTIONAL_KEYS = {
    "embedding_dim": None,
    "standardize_embeddings": True,
    "normalize_labels": True,
    "enable_plots": True,
    "task_filter": None,
    "output_fold_results": False,
    "store_probes": False,
    "seed": 42,
}
CONFIG_KEYS = (*REQUIRED_KEYS, *OPTIONAL_KEYS)
# What runs of one leaderboard must share (config keys): the folds, their seed, the
# standardisation and the probe; and, from each summary, the rules and embedding dimension.
SETUP_KEYS = ("k_folds", "seed", "standardize_embeddings", "probe_type")
PROBE_TYPES = ("linear", "svm")
PROBE_PARAMS_REQUIRED = ("batch_size", "epochs", "learning_rate")  # probe_type linear
PROBE_PARAMS = (*PROBE_PARAMS_REQUIRED, "device")
DEVICES = ("auto", "cpu", "gpu")
SUMMARY_FILE = "results_summary.json"
TIMESTAMP_FORMAT = "%Y%m%d_%H%M%S"
ZARR_SUFFIXES = (".zarr.zip", ".zarr")  # stripped from ids, as NeuCo-Bench does


class LeaderboardRefused(HarnessError):
    """The leaderboard would rank runs that did not all probe the same tasks."""


@dataclass(frozen=True)
class NeucoConfig:
    """A validated NeuCo-Bench config: the YAML's values, defaults filled in."""

    values: dict

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def svm_search(self) -> SvmSearch | None:
        """The SVM probe's search (`probe_type: svm`), None for the linear probe."""
        if self.values["probe_type"] != "svm":
            return None
        return SvmSearch.from_params(self.values["probe_params"], "config")


def _bool(config: dict, key: str, where: str) -> bool:
    value = config[key]
    if not isinstance(value, bool):
        raise HarnessError(f"{where}: {key} must be true or false, not {value!r}")
    return value


def _positive_int(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HarnessError(f"{where}: {key} must be a positive integer, not {value!r}")
    return value


def read_config(path: str | Path | None) -> NeucoConfig:
    """Read and check a NeuCo-Bench YAML config: every required key present, no unknown key,
    `probe_params` of the `probe_type` (linear or svm); defaults filled in for the optional
    keys. An svm probe is refused here when its search library is not installed."""
    if path is None:
        raise HarnessError(
            "give --config config.yaml (k_folds, probe_type, probe_params, "
            "update_leaderboard are required)"
        )
    where = str(path)
    try:
        raw = parse_yaml(read_bytes(path), path)
    except MissingFile:
        raise HarnessError(f"config file {where} does not exist; check --config") from None
    except FileProblem as exc:
        raise HarnessError(f"{exc}; fix the file") from None
    if not isinstance(raw, dict):
        raise HarnessError(f"{where}: the config must be a mapping of keys to values")
    for key in raw:
        if key not in CONFIG_KEYS:
            raise unknown_name("config key", key, CONFIG_KEYS, f"remove it from {where}")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise HarnessError(f"{where}: required key(s) missing: {', '.join(missing)}; add them")
    config = {**OPTIONAL_KEYS, **raw}
    _positive_int(config["k_folds"], "k_folds", where)
    if config["probe_type"] not in PROBE_TYPES:
        raise unknown_name("probe_type", str(config["probe_type"]), PROBE_TYPES)
    params = config["probe_params"]
    if not isinstance(params, dict):
        raise HarnessError(f"{where}: probe_params must be a mapping")
    if config["probe_type"] == "svm":
        SvmSearch.from_params(params, where)
        require_search_library()
    else:
        for key in params:
            if key not in PROBE_PARAMS:
                raise unknown_name("probe_params key", key, PROBE_PARAMS)
        missing = [k for k in PROBE_PARAMS_REQUIRED if k not in params]
        if missing:
            raise HarnessError(f"{where}: probe_params lacks {', '.join(missing)}; add them")
        if params.get("device", "auto") not in DEVICES:
            raise unknown_name("probe_params device", str(params["device"]), DEVICES)
    for key in (
        "update_leaderboard",
        "standardize_embeddings",
        "normalize_labels",
        "enable_plots",
        "output_fold_results",
        "store_probes",
    ):
        _bool(config, key, where)
    if config["embedding_dim"] is not None:
        _positive_int(config["embedding_dim"], "embedding_dim", where)
    tf = config["task_filter"]
    if tf is not None and not (isinstance(tf, list) and all(isinstance(t, str) for t in tf)):
        raise HarnessError(f"{where}: task_filter must be a list of task names")
    if not isinstance(config["seed"], int) or isinstance(config["seed"], bool):
        raise HarnessError(f"{where}: seed must be an integer")
    return NeucoConfig(config)


# ----------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Annotations:
    """One label file: task name, type, and labels by id (rows with an empty label skipped)."""

    task: str
    task_type: str
    labels: dict[str, float]
    skipped: int


# A NeuCo task name (the part of a label file's name before `__`): it names the task's
# folder of results, so it may not be `..`, start with '.' or '-', or hold a separator.
TASK_NAME = re.compile(r"[^\W_][\w.-]*|_[\w.-]*")


def read_annotations(folder: str | Path) -> dict[str, Annotations]:
    """Every `<task>__<type>.csv` of `folder`, by task name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HarnessError(f"--annotation-path {folder} is not a directory of label files")
    out: dict[str, Annotations] = {}
    for path in sorted(folder.glob("*.csv")):
        task, sep, kind = path.stem.partition("__")
        if not sep or not task:
            raise HarnessError(
                f"label file {path.name} is not named <task>__<type>.csv; rename it, e.g. "
                f"{path.stem}__classification.csv"
            )
        if not TASK_NAME.fullmatch(task):
            raise HarnessError(
                f"label file {path.name}: task name {task!r} is not valid (it names the "
                "task's result folder): use letters, digits, '_', '.' and '-', not "
                "starting with '.' or '-'; rename the file"
            )
        if kind not in TASK_TYPE_NAMES:
            raise unknown_name("task type", kind, TASK_TYPE_NAMES, f"rename {path.name}")
        labels: dict[str, float] = {}
        skipped = 0
        _check_regular(path, "label file")
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames or not {"id", "label"} <= set(reader.fieldnames):
                raise HarnessError(f"{path}: needs columns 'id' and 'label'")
            for number, row in enumerate(reader, start=2):
                value = (row["label"] or "").strip()
                if not value:
                    skipped += 1
                    continue
                try:
                    label = float(value)
                except ValueError:
                    raise HarnessError(
                        f"{path}: line {number}: label {value!r} is not a number"
                    ) from None
                if not math.isfinite(label):
                    raise HarnessError(f"{path}: line {number}: label {value!r} is not finite")
                if row["id"] in labels:
                    raise HarnessError(f"{path}: line {number}: id {row['id']!r} appears twice")
                labels[row["id"]] = label
        if task in out:
            raise HarnessError(f"task {task!r} has two label files in {folder}; keep one")
        out[task] = Annotations(task, TASK_TYPE_NAMES[kind], labels, skipped)
    if not out:
        raise HarnessError(f"{folder} holds no <task>__<type>.csv label file")
    return out


def _clean_id(raw: str) -> str:
    for suffix in ZARR_SUFFIXES:
        if raw.endswith(suffix):
            return raw[: -len(suffix)]
    return raw


def read_submission(
    path: str | Path, embedding_dim: int | None = None, exclude: set[str] | None = None
) -> tuple[list[str], np.ndarray]:
    """The ids and the (n, dim) embeddings of a submission CSV, excluded ids dropped. A
    vector shorter than `embedding_dim` is zero-padded, a longer one refused; an empty or
    non-numeric value is refused (NeuCo-Bench would silently read it as 0)."""
    path = Path(path)
    try:
        _check_regular(path, "--submission-file")
        handle = path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise HarnessError(f"--submission-file {path} does not exist") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header or "id" not in header:
            raise HarnessError(f"{path}: the submission needs a column 'id'")
        id_col = header.index("id")
        digits = [i for i, name in enumerate(header) if name.strip().isdigit()]
        cols = (
            sorted(digits, key=lambda i: int(header[i]))
            if digits
            else [i for i in range(len(header)) if i != id_col]
        )
        ids, rows = [], []
        for number, row in enumerate(reader, start=2):
            if not row:
                continue
            ident = _clean_id(row[id_col])
            if exclude and ident in exclude:
                continue
            try:
                rows.append([float(row[i]) for i in cols])
            except (ValueError, IndexError):
                raise HarnessError(
                    f"{path}: line {number} (id {ident!r}): an embedding value is missing or "
                    "not a number; write every dimension as a number"
                ) from None
            ids.append(ident)
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise HarnessError(f"{path}: id {dup!r} appears more than once")
    found = len(cols)
    matrix = np.asarray(rows, dtype=np.float64).reshape(len(rows), found)
    if not np.all(np.isfinite(matrix)):
        raise HarnessError(f"{path}: the embeddings hold NaN or infinity")
    if embedding_dim is not None and found > embedding_dim:
        raise HarnessError(
            f"{path}: embeddings have {found} dimensions, more than embedding_dim "
            f"{embedding_dim}; set embedding_dim to {found} or more, or drop columns"
        )
    if embedding_dim is not None and found < embedding_dim:
        matrix = np.pad(matrix, ((0, 0), (0, embedding_dim - found)))
    return ids, matrix


def _check_regular(path: Path, what: str) -> None:
    """Refuse an input that is not a regular file (a FIFO would hang the reader, a link to
    /dev/zero never end); FileNotFoundError when there is none."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise HarnessError(f"{what} {path} is not a regular file; give the file itself")


def read_exclude(path: str | Path | None) -> set[str]:
    """The ids of an exclude file (one per line, blank lines ignored)."""
    if path is None:
        return set()
    try:
        _check_regular(Path(path), "--exclude-file")
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HarnessError(f"--exclude-file {path} does not exist") from None
    return {line.strip() for line in text.splitlines() if line.strip()}


def neuco_task(
    annotations: Annotations, ids: list[str], matrix: np.ndarray, labelled: np.ndarray
) -> ProbeTask:
    """The `ProbeTask` of one label file: rows of ids in both files, in submission order;
    metric F1 for 0/1 classes, macro F1 for more, R² for regression (NeuCo-Bench's).
    `labelled` (rows with a label in any file) is what global statistics cover."""
    index = [i for i, ident in enumerate(ids) if ident in annotations.labels]
    labels = np.asarray([annotations.labels[ids[i]] for i in index])
    if annotations.task_type == CLASSIFICATION:
        if not np.all(labels == np.round(labels)):
            raise HarnessError(
                f"task {annotations.task!r}: classification labels must be whole numbers"
            )
        labels = labels.astype(np.int64)
        metric = "f1" if set(labels.tolist()) <= {0, 1} else "macro_f1"
    else:
        metric = R2
    if len(index) < 20:
        raise HarnessError(
            f"task {annotations.task!r}: {len(index)} ids are in both the label file and the "
            "submission; give 20 or more (check that the ids match)"
        )
    return ProbeTask(
        annotations.task, annotations.task_type, metric, matrix[index], labels, global_rows=labelled
    )


# ----------------------------------------------------------------------------- leaderboard


def summarize_runs(
    output_dir: str | Path, phase: str, drop_incomplete: bool = False, now: datetime | None = None
) -> Path:
    """Rank every run under `<output_dir>/<phase>/` by NeuCo-Bench's std-weighted rank of
    per-task Q, as NeuCo-Bench's `compute_leaderboard` does (per task, rank by Q with ties
    at the lowest rank, scipy rankdata method "min"; weight each task by the std of its Q
    across runs over the sum of those stds; rank the weighted sums, method "min") and write
    `<output_dir>/leaderboards/<phase>/leaderboard_<timestamp>.csv`. Runs that differ in
    NeuCo rules, k_folds, fold seed, standardisation, probe type or embedding dimension are
    refused in one error naming what differs and each run's value (their Q do not
    compare), and so is a run missing a task (or with an undefined Q), each listed, unless
    `drop_incomplete` (NeuCo rule drop_incomplete_runs: it is dropped, and the CSV says so)."""
    from scipy import stats as sps

    runs = []
    for path in sorted(Path(output_dir, phase).glob(f"*/{SUMMARY_FILE}")):
        try:
            summary = read_json(path)
        except FileProblem as exc:
            raise HarnessError(f"{exc}; run that probe again") from None
        if not isinstance(summary, dict) or not isinstance(summary.get("neuco_rules"), list):
            raise HarnessError(f"{path}: not a probe run summary; run that probe again")
        runs.append((path.parent.name, summary))
    if not runs:
        raise HarnessError(f"no {SUMMARY_FILE} under {Path(output_dir, phase)}; run a probe first")
    _refuse_different_setups(runs)
    tasks = sorted({t for _, s in runs for t in s["task_q_scores"]})
    missing = {name: [t for t in tasks if s["task_q_scores"].get(t) is None] for name, s in runs}
    missing = {name: ts for name, ts in missing.items() if ts}
    if missing and not drop_incomplete:
        raise LeaderboardRefused(
            "runs missing a task (or with an undefined Q) would be ranked on fewer tasks: "
            + "; ".join(f"{name} lacks {', '.join(ts)}" for name, ts in missing.items())
            + "; probe them on every task (same task_filter), or pass --neuco-rule "
            "drop_incomplete_runs to drop them"
        )
    kept = [(name, s) for name, s in runs if name not in missing]
    if not kept:
        raise LeaderboardRefused("every run misses a task; nothing to rank")
    q = np.asarray([[s["task_q_scores"][t] for t in tasks] for _, s in kept], dtype=np.float64)
    weights, _ = neuco_weights(q)
    weighted = sps.rankdata(-q, method="min", axis=0) @ weights
    order = sps.rankdata(weighted, method="min")
    buffer = []
    header = [
        "method",
        "run",
        "aggregated_rank",
        "weighted_score",
        "overall_q_score",
        "overall_acc_score",
        *(f"{t}_q" for t in tasks),
    ]
    for i in np.argsort(order, kind="stable"):
        name, s = kept[i]
        buffer.append(
            [
                s["method"],
                name,
                f"{order[i]:g}",
                f"{weighted[i]:.6g}",
                f"{s['overall_q_score']:.6g}",
                f"{s['overall_acc_score']:.6g}",
                *(f"{v:.6g}" for v in q[i]),
            ]
        )
    for name in missing:
        buffer.append(
            [
                dict(runs)[name]["method"],
                name,
                "dropped (drop_incomplete_runs)",
                "",
                "",
                "",
                *("" for _ in tasks),
            ]
        )
    stamp = (now or datetime.now(UTC)).strftime(TIMESTAMP_FORMAT)
    out = Path(output_dir, "leaderboards", phase, f"leaderboard_{stamp}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([spreadsheet_safe(v) for v in header])
    writer.writerows([spreadsheet_safe(v) for v in row] for row in buffer)
    write_atomic(out, text.getvalue())
    return out


def run_setup(summary: dict) -> dict[str, str]:
    """What a run's Q depends on besides the embeddings, from its summary: the NeuCo rules,
    the `SETUP_KEYS` of its config (probe_type linear when absent) and the embedding
    dimension probed (from the config's embedding_dim in summaries that predate it)."""
    config = summary.get("config") or {}
    setup = {"neuco_rules": ", ".join(summary["neuco_rules"]) or "none"}
    for key in SETUP_KEYS:
        setup[key] = str(config.get(key, "linear" if key == "probe_type" else None))
    dim = summary.get("embedding_dim", config.get("embedding_dim"))
    setup["embedding_dim"] = "unknown" if dim is None else str(dim)
    return setup


def _refuse_different_setups(runs: list[tuple[str, dict]]) -> None:
    setups = {name: run_setup(s) for name, s in runs}
    keys = list(next(iter(setups.values())))
    differ = [k for k in keys if len({setup[k] for setup in setups.values()}) > 1]
    if not differ:
        return
    groups: dict[str, list[str]] = {}
    for name, setup in setups.items():
        groups.setdefault(", ".join(f"{k}={setup[k]}" for k in differ), []).append(name)
    raise LeaderboardRefused(
        f"runs that differ in {', '.join(differ)} cannot share a leaderboard (their Q do not "
        "compare): "
        + "; ".join(f"{key}: {', '.join(names)}" for key, names in groups.items())
        + "; rerun them alike, or use one --phase per setup"
    )


def spreadsheet_safe(value: str) -> str:
    """`value` as a CSV cell a spreadsheet shows as text: one that starts like a formula
    (`=`, `+`, `-`, `@`, a tab or a carriage return) and is not a number gets a leading `'`
    (OWASP's advice against CSV injection); numbers such as -0.5 stay numbers."""
    if value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


# ----------------------------------------------------------------------------- the run


def run_neuco(
    annotation_path: str | Path,
    submission_file: str | Path,
    config: NeucoConfig,
    output_dir: str | Path = "results",
    method_name: str | None = None,
    phase: str = "results",
    exclude_file: str | Path | None = None,
    neuco_rules: tuple[str, ...] = (),
    now: datetime | None = None,
    progress=None,
) -> Path:
    """Probe every task of the annotation folder (or `task_filter`) on the submission's
    embeddings; write the per-task results, the run summary and (with
    `update_leaderboard`) the phase's leaderboard. Returns the run folder."""
    probe_config = ProbeConfig(
        k_folds=config["k_folds"],
        seed=config["seed"],
        standardize=config["standardize_embeddings"],
        normalize_labels=config["normalize_labels"],
        neuco_rules=tuple(sorted(set(neuco_rules))),
        std_ddof=0,  # NeuCo-Bench's Q: np.nanstd, ddof 0
    )
    search = config.svm_search
    annotations = read_annotations(annotation_path)
    tasks = sorted(annotations)
    if config["task_filter"] is not None:
        for name in config["task_filter"]:
            if name not in annotations:
                raise unknown_name(
                    "task",
                    name,
                    annotations,
                    "task_filter takes the part of a label file name before __",
                )
        tasks = [t for t in tasks if t in config["task_filter"]]
    ids, matrix = read_submission(
        submission_file, config["embedding_dim"], read_exclude(exclude_file)
    )
    method = method_name or Path(submission_file).stem
    known = set().union(*(a.labels for a in annotations.values()))
    labelled = matrix[[i for i, ident in enumerate(ids) if ident in known]]
    problem_tasks = [neuco_task(annotations[t], ids, matrix, labelled) for t in tasks]
    stamp = (now or datetime.now(UTC)).strftime(TIMESTAMP_FORMAT)
    base = Path(output_dir, phase, f"{safe_filename_part(method)}_{stamp}")
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = Path(f"{base}-{n}"), n + 1
    run_dir.mkdir(parents=True)
    cell = {"method": method, "pooling": None, "phase": phase}
    records = []
    for number, task in enumerate(problem_tasks, start=1):
        outcome = probe_task(task, probe_config, search)
        record = result_record(outcome, cell, probe_config, config["output_fold_results"])
        if search is None:
            record["probe_params_unused"] = dict(config["probe_params"])
        write_result(run_dir / task.name / f"{task.name}_result.json", record)
        if config["enable_plots"]:
            write_task_plots(run_dir / task.name, task, probe_config, outcome)
        if config["store_probes"]:
            save_probe(
                run_dir / task.name / "probe", final_probe(task, probe_config, outcome, search)
            )
        records.append(record)
        if progress is not None:
            q = "undefined" if outcome.q_stat is None else f"{outcome.q_stat:.3f}"
            print(f"[{number}/{len(problem_tasks)}] {task.name}: Q {q}", file=progress)
    snapshot = {
        **config.values,
        "neuco_rules": list(probe_config.neuco_rules),
        "annotation_path": str(annotation_path),
        "submission_file": str(submission_file),
        "exclude_file": None if exclude_file is None else str(exclude_file),
    }
    summary = run_summary(method, records, snapshot, experiment=run_dir.name)
    summary["embedding_dim"] = int(matrix.shape[1])  # as probed (padded); the leaderboard checks it
    write_result(run_dir / SUMMARY_FILE, summary)
    if config["update_leaderboard"]:
        drop = "drop_incomplete_runs" in probe_config.neuco_rules
        path = summarize_runs(output_dir, phase, drop_incomplete=drop, now=now)
        if progress is not None:
            print(f"leaderboard: {path}", file=progress)
    return run_dir


def write_task_plots(
    folder: Path, task: ProbeTask, config: ProbeConfig, outcome: ProbeOutcome
) -> list[Path]:
    """NeuCo-Bench's task plots (`enable_plots`), drawn from each fold's probe on the rows
    it held out (never the rows it was fitted on): `regression_scatter/<task>_regression_
    scatter.png` for a regression task, `confusion_matrices/<task>_confusion_matrix.png`
    (counts summed over folds) for a classification task."""
    folds = held_out_predictions(task, config, outcome)
    title = f"{task.name}: held-out rows of {len(folds)} folds"
    if task.task_type == REGRESSION:
        path = folder / "regression_scatter" / f"{task.name}_regression_scatter.png"
        return [plot_regression_scatter(folds, title, path)]
    classes = sorted(set(np.asarray(task.train_y).tolist()))
    path = folder / "confusion_matrices" / f"{task.name}_confusion_matrix.png"
    return [plot_confusion_matrix(folds, classes, title, path)]


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description="Probe embeddings given in NeuCo-Bench's files.")

    def add(flag: str, **kw) -> None:  # NeuCo-Bench spells its flags with underscores
        parser.add_argument(flag, flag.replace("-", "_").replace("__", "--"), **kw)

    add("--annotation-path", required=True, help="folder of <task>__<type>.csv label files")
    add("--submission-file", required=True, help="embeddings CSV (column id + dimensions)")
    add("--output-dir", default="results", help="where runs and leaderboards go")
    add("--config", default="config.yaml", help="NeuCo-Bench YAML config (default: config.yaml)")
    add("--method-name", default=None, help="run name (default: the submission file's stem)")
    add("--phase", default="results", help="group of runs ranked together")
    add("--exclude-file", default=None, help="ids to drop, one per line")
    add(
        "--neuco-rule",
        action="append",
        default=[],
        choices=sorted(NEUCO_RULES),
        help="apply one of NeuCo-Bench's unsound rules (marks the results off protocol)",
    )
    return parser


@report_errors
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    config = read_config(args.config)
    try:
        run_dir = run_neuco(
            args.annotation_path,
            args.submission_file,
            config,
            output_dir=args.output_dir,
            method_name=args.method_name,
            phase=args.phase,
            exclude_file=args.exclude_file,
            neuco_rules=tuple(args.neuco_rule),
            progress=sys.stderr,
        )
    except LeaderboardRefused as exc:
        print(f"error: leaderboard refused: {exc}", file=sys.stderr)
        return EXIT_INCOMPLETE
    print(run_dir)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
