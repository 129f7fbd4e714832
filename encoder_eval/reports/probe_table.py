"""Probe results as a table: every probe cell of a folder read back, and the table that
`summarize` and `leaderboard` print from them (a row per model and pooling, the folds as
its "seeds")."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from encoder_eval.cells.probing import DEFAULT_K_FOLDS
from encoder_eval.core.comparability import cell_setup, setup_differences
from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.results import PROBE_RESULT_SUFFIX, read_result
from encoder_eval.reports.table import CellStats, Problem, Table


def load_probe_results(results_dir: str | os.PathLike, warn=None) -> list[dict]:
    """Every readable probe result of a folder; unreadable ones are skipped with a warning."""
    records = []
    for path in sorted(Path(results_dir).glob(f"*{PROBE_RESULT_SUFFIX}")):
        record, why = read_result(path)
        if record is None:
            if warn is not None:
                warn(f"warning: skipping {path}: {why}")
            continue
        records.append(record)
    return records


def has_probe_results(results_dir: str | os.PathLike) -> bool:
    return any(Path(results_dir).glob(f"*{PROBE_RESULT_SUFFIX}"))


def probe_folder(results_dirs: list[str]) -> str | None:
    """The folder of probe results a table command reads (None: the folders hold fine-tune
    report results). A probe table reads one folder: several, one of them of probes, are
    refused."""
    probes = [d for d in results_dirs if has_probe_results(d)]
    if probes and len(results_dirs) > 1:
        raise HarnessError(
            f"{probes[0]} holds probe results, which make a table of one --results-dir; "
            "several folders make one table of fine-tuned report results only"
        )
    return probes[0] if probes else None


def probe_table(
    records: list[dict], models: list[str] | None = None, tasks: list[str] | None = None
):
    """The probe results as a `summarize.Table`: a row per (model, pooling) ("model:pooling"),
    a cell per task whose "seeds" are the folds (score per fold, `q_t`). Cells of another
    fold setup than the most common one, off protocol, whose embeddings ran at another
    precision than the rest (bf16 beside fp32), or with a fold whose score is undefined (as
    `summarize` treats an undefined report score: never averaged, the table refused unless
    --allow-partial) are problems of the table."""
    by_cell: dict[tuple[str, str], dict] = {}
    for r in records:
        by_cell[(r["cell"]["method"], r["cell"]["task"])] = r
    names = sorted({m for m, _ in by_cell})
    task_names = sorted({t for _, t in by_cell})
    if models:
        for m in models:
            if m not in names:
                raise unknown_name("probe method", m, names)
        names = list(models)
    if tasks:
        for t in tasks:
            if t not in task_names:
                raise unknown_name("probed task", t, task_names)
        task_names = list(tasks)
    # The table's fold setup: the most common one (`comparability.cell_setup`).
    fold_setups = {id(r): cell_setup(r)["folds"] for r in by_cell.values()}
    setups = Counter(json.dumps(f, sort_keys=True) for f in fold_setups.values())
    common = json.loads(setups.most_common(1)[0][0]) if setups else {}
    k = common.get("k_folds", DEFAULT_K_FOLDS)
    cells, problems, off = {}, [], []
    other_setup, limited, undefined_folds = [], [], []
    by_precision: dict[str, list[str]] = {}
    for (method, task), r in by_cell.items():
        if method not in names or task not in task_names:
            continue
        precision = cell_setup(r)["precision"]
        if precision is not None:  # results of embeddings given as files record none
            by_precision.setdefault(str(precision), []).append(f"{method}/{task}")
        q_t = r.get("q_t") or []
        scores = {i: float(v) for i, v in enumerate(q_t) if v is not None}
        undefined = [i for i, v in enumerate(q_t) if v is None]
        if undefined or (r.get("mean_score") is None and not q_t):
            why = r.get("undefined") or "score undefined"
            folds = ", ".join(map(str, undefined)) or "all (no per-fold scores recorded)"
            undefined_folds.append(
                f"{method}/{task}: fold(s) {folds} of {len(q_t) or '?'} undefined ({why})"
            )
        differ = setup_differences(
            {"folds": fold_setups[id(r)]}, {"folds": common}, "the table has"
        )
        if differ:
            other_setup.append(f"{method}/{task}: {'; '.join(differ)}")
        if r["protocol"].get("limit") is not None:
            limited.append(f"{method}/{task} (limit {r['protocol']['limit']})")
        elif not r["protocol"].get("on_protocol", False):
            off.append(f"{method}/{task}")
        cells[(method, task)] = CellStats(
            model=method,
            task=task,
            metric=r["metric"],
            lr_key=None,
            lr=None,
            scores=scores,
            diverged=[],
            missing=[],
            off_protocol=not r["protocol"].get("on_protocol", False),
            undefined=undefined,
        )
    if other_setup:
        problems.append(
            Problem(
                "probe_setup",
                f"{len(other_setup)} cell(s) use another fold "
                f"setup than {', '.join(f'{key} {v}' for key, v in common.items())}",
                sorted(other_setup),
            )
        )
    if len(by_precision) > 1:  # bf16 and fp32 embeddings differ by more than rounding noise
        groups = sorted(by_precision.items(), key=lambda kv: -len(kv[1]))
        problems.append(
            Problem(
                "precision",
                "probe cells disagree on the embeddings' precision: "
                + "; ".join(f"{p} in {len(c)} cell(s)" for p, c in groups),
                sorted(f"{c} (precision {p})" for p, cs in groups for c in cs),
            )
        )
    if off:
        problems.append(
            Problem("off_protocol", f"{len(off)} probe cell(s) ran under a NeuCo rule", sorted(off))
        )
    if limited:
        problems.append(
            Problem(
                "off_protocol",
                f"{len(limited)} probe cell(s) are smoke runs "
                "on a few examples per split (--limit)",
                sorted(limited),
            )
        )
    if undefined_folds:
        problems.append(
            Problem(
                "undefined_metric",
                f"{len(undefined_folds)} probe cell(s) have "
                "a fold whose score is undefined (never averaged, never read "
                "as 0)",
                sorted(undefined_folds),
            )
        )
    return Table(names, task_names, cells, problems, list(range(k)), kind="probe")
