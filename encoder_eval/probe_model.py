"""Probing a model's frozen embeddings on the registered tasks: one probe cell per
(model, pooling, task).

Usage::

    python -m encoder_eval.probe --model minilm=/path/to/minilm [--model NAME[=PATH]] \\
        [--pooling mean,first] [--tasks glue_sst2,glue_mrpc | --tasks all] \\
        [--data-dir ../shared/data] [--results-dir probe_results] [--k-folds 10] [--seed 42] \\
        [--max-seq-len 256] [--precision bf16|fp32] [--batch-size N] [--device auto] \\
        [--no-cache] [--store-probes] [--force]

For each model the frozen encoder is loaded once (`loaders.load_encoder`), each task's
train and report splits are embedded once for every pooling asked (`encoder_eval.embed`,
cached on disk), and `probe.probe_task` runs the fold protocol on the vectors. Each cell
writes `<results-dir>/<model>_<pooling>_<task>.probe.json` (schema `encoder-eval-probe`,
with the per-fold scores `q_t`), and each (model, pooling) a run summary
`<model>_<pooling>.probe-summary.json`. Done cells are skipped (`--force` redoes them);
every input (models, tasks, their data) is checked, and the data provenance computed,
before the first model is loaded. `summarize` and `leaderboard` read the folder.

Exit status: 0 done; 2 bad input.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EXIT_OK, ArgumentParser, HarnessError, report_errors, unknown_name
from .fileio import safe_filename_part
from .probe import (
    DEFAULT_K_FOLDS,
    DEFAULT_SEED,
    PROBE_SCHEMA,
    PROBE_SCHEMA_VERSION,
    ProbeConfig,
    final_probe,
    probe_provenance,
    probe_task,
    result_record,
    run_summary,
    save_probe,
    task_from_registry,
    write_result,
)

RESULT_SUFFIX = ".probe.json"
SUMMARY_SUFFIX = ".probe-summary.json"
DEFAULT_POOLINGS = ("mean",)
DEFAULT_MAX_SEQ_LEN = 256  # the fine-tuning protocol's length limit


@dataclass(frozen=True)
class ProbeModel:
    """A model to probe: its name in the results, where it loads from, how."""

    name: str
    path: str
    trust_remote_code: bool = False
    revision: str | None = None


@dataclass
class ProbeRun:
    """Everything one probe run does, checked before any model work."""

    models: list[ProbeModel]
    tasks: list[str]
    poolings: tuple[str, ...] = DEFAULT_POOLINGS
    results_dir: Path = Path("probe_results")
    data_dir: str | None = None
    config: ProbeConfig = field(default_factory=ProbeConfig)
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    precision: str = "bf16"
    batch_size: int | None = None
    device: str = "auto"
    cache: bool = True
    store_probes: bool = False
    force: bool = False


def method_label(model: str, pooling: str) -> str:
    """How a (model, pooling) is named in tables: `minilm:mean`."""
    return f"{model}:{pooling}"


def cell_stem(model: str, pooling: str) -> str:
    return f"{safe_filename_part(model)}_{pooling}"


def result_path(results_dir: Path, model: str, pooling: str, task: str) -> Path:
    return Path(results_dir) / f"{cell_stem(model, pooling)}_{task}{RESULT_SUFFIX}"


def summary_path(results_dir: Path, model: str, pooling: str) -> Path:
    return Path(results_dir) / f"{cell_stem(model, pooling)}{SUMMARY_SUFFIX}"


def read_probe_result(path: Path) -> dict | None:
    """A probe result file's record, or None when it is missing, torn or of another schema."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(record, dict)
        and record.get("schema") == PROBE_SCHEMA
        and record.get("schema_version") == PROBE_SCHEMA_VERSION
    )
    return record if ok else None


def probe_cell_state(path: str | os.PathLike) -> tuple[str, dict | None, str | None]:
    """Whether a probe result file makes its cell done, in `results.cell_state`'s terms:
    ('ok', record, None) when `read_probe_result` reads it (the rule `run_probes` skips
    by), ('missing', None, None) without a file, else ('corrupt', None, why)."""
    from .results import CORRUPT, MISSING

    if not os.path.lexists(path):
        return MISSING, None, None
    record = read_probe_result(Path(path))
    if record is None:
        why = (f"not a readable {PROBE_SCHEMA} result of schema version "
               f"{PROBE_SCHEMA_VERSION}: torn, not JSON, or of another schema")  # fmt: skip
        return CORRUPT, None, why
    return "ok", record, None


def resolve_model(spec: str) -> ProbeModel:
    """`NAME=PATH_OR_HUB_ID` (the sweep's `--model` form; a mode suffix is ignored: probes
    use the encoder body) or a registry key."""
    from .models import check_model_path, model_entry, parse_model_spec

    if "=" in spec:
        name, entry = parse_model_spec(spec)
        return ProbeModel(name, check_model_path(spec, entry.path))
    entry = model_entry(spec)
    return ProbeModel(spec, entry.path, entry.trust_remote_code)


def _load_all_data(run: ProbeRun) -> dict[str, tuple[tuple, dict]]:
    """Every task's (load_task result, data provenance), or the first input problem."""
    from .tasks import data_provenance, load_task

    loaded = {}
    for task in run.tasks:
        data = load_task(task, run.data_dir)
        if not data[0].get("text"):
            raise HarnessError(f"task {task!r} has no train rows to fit probes on")
        loaded[task] = (data, data_provenance(task, run.data_dir))
    return loaded


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_probes(run: ProbeRun) -> list[Path]:
    """Run every (model, pooling, task) cell of `run` not already done; returns the result
    files written. Inputs are checked and data provenance computed before any model work."""
    from .embed import EmbedSetup, default_cache_dir, embed_split
    from .loaders import load_encoder
    from .tokencache import default_cache_dir as token_cache_dir
    from .train import resolve_device

    device = resolve_device(run.device)
    setup = EmbedSetup(max_seq_len=run.max_seq_len, precision=run.precision,
                       batch_size=run.batch_size)  # fmt: skip
    todo = {
        (m.name, task): [
            p for p in run.poolings
            if run.force or read_probe_result(result_path(run.results_dir, m.name, p, task)) is None
        ]
        for m in run.models
        for task in run.tasks
    }  # fmt: skip
    total = sum(len(v) for v in todo.values())
    cells = len(run.models) * len(run.tasks) * len(run.poolings)
    _log(f"probe: {cells} cell(s), {cells - total} already done, {total} to run "
         f"({len(run.models)} model(s) x {len(run.poolings)} pooling(s) x {len(run.tasks)} "
         f"task(s)); results in {run.results_dir}")  # fmt: skip
    data = _load_all_data(run) if total else {}
    run.results_dir.mkdir(parents=True, exist_ok=True)
    cache = default_cache_dir() if run.cache else None
    tokens = token_cache_dir() if run.cache else None
    written, number = [], 0
    base_provenance = probe_provenance()
    for model in run.models:
        if not any(todo[(model.name, t)] for t in run.tasks):
            continue
        started = time.perf_counter()
        loaded = load_encoder(model.path, revision=model.revision,
                              trust_remote_code=model.trust_remote_code,
                              max_seq_len=run.max_seq_len, model_label=model.name)  # fmt: skip
        _log(f"{model.name}: loaded {model.path} (revision {loaded.revision[:12]}) in "
             f"{time.perf_counter() - started:.1f} s on {device.type}, {run.precision}")  # fmt: skip
        for task in run.tasks:
            poolings = tuple(todo[(model.name, task)])
            if not poolings:
                continue
            (train, dev, test, n_labels, problem), data_prov = data[task]
            t0 = time.perf_counter()
            train_x, hits = embed_split(loaded, train, poolings, setup, device, cache, tokens)
            report_x = {}
            for lang, split in test.items():
                report_x[lang], h = embed_split(loaded, split, poolings, setup, device, cache,
                                                tokens)  # fmt: skip
                hits += h
            embed_s = time.perf_counter() - t0
            n_texts = len(train["text"]) + sum(len(s["text"]) for s in test.values())
            for pooling in poolings:
                number += 1
                t1 = time.perf_counter()
                ptask = task_from_registry(task, train_x[pooling],
                                           {lang: v[pooling] for lang, v in report_x.items()},
                                           data=(train, dev, test, n_labels, problem))  # fmt: skip
                outcome = probe_task(ptask, run.config)
                probe_s = time.perf_counter() - t1
                cell = {"model": model.name, "model_path": model.path, "pooling": pooling,
                        "method": method_label(model.name, pooling)}  # fmt: skip
                provenance = {
                    **base_provenance,
                    "model": {"path": model.path, "revision": loaded.revision,
                              "source": loaded.source, "class": type(loaded.model).__name__},
                    "data": data_prov,
                    "embedding": {"pooling": pooling, "max_seq_len": run.max_seq_len,
                                  "precision": run.precision, "device": device.type,
                                  "dim": int(train_x[pooling].shape[1]), "texts": n_texts,
                                  "cache_hits": hits},
                    "timing": {"embed_s": round(embed_s, 3), "probe_s": round(probe_s, 3)},
                }  # fmt: skip
                record = result_record(outcome, cell, run.config, fold_results=True,
                                       provenance=provenance)  # fmt: skip
                path = result_path(run.results_dir, model.name, pooling, task)
                if run.store_probes:
                    save_probe(path.with_name(path.name.removesuffix(RESULT_SUFFIX) + ".probe"),
                               final_probe(ptask, run.config, outcome))  # fmt: skip
                write_result(path, record)
                written.append(path)
                score = "undefined" if outcome.mean_score is None else (
                    f"{outcome.metric} {100 * outcome.mean_score:.2f} ± "
                    f"{100 * outcome.std_dev:.2f}, Q {outcome.q_stat:.2f}")  # fmt: skip
                _log(f"[{number}/{total}] {method_label(model.name, pooling)} {task}: {score} "
                     f"(embed {embed_s:.1f} s{', cached' if hits else ''}, probe {probe_s:.1f} s)")  # fmt: skip
        del loaded
    for model in run.models:
        for pooling in run.poolings:
            write_summary(run, model.name, pooling)
    return written


def write_summary(run: ProbeRun, model: str, pooling: str) -> Path | None:
    """The (model, pooling)'s run summary over every task result of it in the results
    directory, not only the run's tasks (a sweep runs each task in its own process); its
    `missing_tasks` are the run's tasks without a result."""
    found: dict[str, dict] = {}
    root, prefix = Path(run.results_dir), cell_stem(model, pooling) + "_"
    # Listed, not globbed: a model's name may hold * ? [
    names = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(RESULT_SUFFIX)):
            continue
        record = read_probe_result(root / name)
        cell = (record or {}).get("cell") or {}
        # the stem of another (model, pooling) can start with this one's: check the cell
        if cell.get("model") == model and cell.get("pooling") == pooling and "task" in cell:
            found.setdefault(cell["task"], record)
    if not found:
        return None
    tasks = [t for t in run.tasks if t in found] + sorted(set(found) - set(run.tasks))
    config = {"k_folds": run.config.k_folds, "seed": run.config.seed, "pooling": pooling,
              "max_seq_len": run.max_seq_len, "precision": run.precision, "tasks": tasks,
              "missing_tasks": [t for t in run.tasks if t not in found]}  # fmt: skip
    path = summary_path(run.results_dir, model, pooling)
    write_result(path, run_summary(method_label(model, pooling), [found[t] for t in tasks], config))
    return path


# ----------------------------------------------------------------------------- tables


def load_probe_results(results_dir: str | os.PathLike, warn=None) -> list[dict]:
    """Every readable probe result of a folder; unreadable ones are skipped with a warning."""
    records = []
    for path in sorted(Path(results_dir).glob(f"*{RESULT_SUFFIX}")):
        record = read_probe_result(path)
        if record is None:
            if warn is not None:
                warn(f"warning: skipping {path}: not a readable {PROBE_SCHEMA} result")
            continue
        records.append(record)
    return records


def has_probe_results(results_dir: str | os.PathLike) -> bool:
    return any(Path(results_dir).glob(f"*{RESULT_SUFFIX}"))


def probe_table(
    records: list[dict], models: list[str] | None = None, tasks: list[str] | None = None
):
    """The probe results as a `summarize.Table`: a row per (model, pooling) ("model:pooling"),
    a cell per task whose "seeds" are the folds (score per fold, `q_t`). Cells of another
    fold setup than the most common one, off protocol, or with a fold whose score is
    undefined (as `summarize` treats an undefined report score: never averaged, the table
    refused unless --allow-partial) are problems of the table."""
    from collections import Counter

    from .summarize import CellStats, Problem, Table

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
    setups = Counter((r["protocol"]["k_folds"], r["protocol"]["seed"]) for r in by_cell.values())
    (k, seed), _ = setups.most_common(1)[0] if setups else ((DEFAULT_K_FOLDS, DEFAULT_SEED), 0)
    cells, problems, off = {}, [], []
    other_setup, undefined_folds = [], []
    for (method, task), r in by_cell.items():
        if method not in names or task not in task_names:
            continue
        q_t = r.get("q_t") or []
        scores = {i: float(v) for i, v in enumerate(q_t) if v is not None}
        undefined = [i for i, v in enumerate(q_t) if v is None]
        if undefined or (r.get("mean_score") is None and not q_t):
            why = r.get("undefined") or "score undefined"
            folds = ", ".join(map(str, undefined)) or "all (no per-fold scores recorded)"
            undefined_folds.append(f"{method}/{task}: fold(s) {folds} of {len(q_t) or '?'} "
                                   f"undefined ({why})")  # fmt: skip
        if (r["protocol"]["k_folds"], r["protocol"]["seed"]) != (k, seed):
            other_setup.append(f"{method}/{task}")
        if not r["protocol"].get("on_protocol", False):
            off.append(f"{method}/{task}")
        cells[(method, task)] = CellStats(
            model=method, task=task, metric=r["metric"], lr_key=None, lr=None, scores=scores,
            diverged=[], missing=[], off_protocol=not r["protocol"].get("on_protocol", False),
            undefined=undefined,
        )  # fmt: skip
    if other_setup:
        problems.append(Problem("probe_setup", f"{len(other_setup)} cell(s) use another fold "
                                f"setup than k_folds {k}, seed {seed}", sorted(other_setup)))  # fmt: skip
    if off:
        problems.append(Problem("off_protocol", f"{len(off)} probe cell(s) ran under a NeuCo "
                                "rule", sorted(off)))  # fmt: skip
    if undefined_folds:
        problems.append(Problem("undefined_metric", f"{len(undefined_folds)} probe cell(s) have "
                                "a fold whose score is undefined (never averaged, never read "
                                "as 0)", sorted(undefined_folds)))  # fmt: skip
    return Table(names, task_names, cells, problems, list(range(k)), kind="probe")


# ----------------------------------------------------------------------------- CLI


def build_parser(prog: str | None = None) -> ArgumentParser:
    from .embed import POOLINGS, PRECISIONS

    p = ArgumentParser(
        prog=prog or "python -m encoder_eval.probe",
        description="Linear probes on a frozen encoder's embeddings, per registered task: "
        "repeated shuffle-split folds, the Q score. (NeuCo-Bench's files: pass "
        "--annotation-path and --submission-file instead.)",
    )
    p.add_argument("--model", action="append", required=True, metavar="NAME[=PATH]",
                   help="a registry key, or NAME=PATH_OR_HUB_ID (repeatable)")  # fmt: skip
    p.add_argument("--pooling", default=",".join(DEFAULT_POOLINGS),
                   help=f"comma-separated poolings: {', '.join(POOLINGS)} (default mean)")  # fmt: skip
    p.add_argument("--tasks", required=True, help="comma-separated tasks or groups, or all")
    p.add_argument("--tasks-file", action="append", help="user task file (repeatable)")
    p.add_argument("--data-dir", help="data mirror (default: $ENCODER_EVAL_DATA_DIR or the Hub)")
    p.add_argument("--results-dir", default="probe_results", help="where results go")
    p.add_argument("--k-folds", type=int, default=DEFAULT_K_FOLDS)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the folds' seed")
    p.add_argument("--max-seq-len", type=int, default=DEFAULT_MAX_SEQ_LEN)
    p.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="forward pass under bf16 autocast (weights and outputs fp32) or fp32")  # fmt: skip
    p.add_argument("--batch-size", type=int, help="examples per forward pass")
    p.add_argument("--device", default="auto", help="auto, cuda or cpu")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let NAME=PATH models run model-authored code")  # fmt: skip
    p.add_argument("--no-cache", action="store_true", help="do not read or write the "
                   "embedding cache")  # fmt: skip
    p.add_argument("--store-probes", action="store_true",
                   help="also store each cell's probe as JSON data (load_probe)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="redo cells that are done")
    return p


def run_from_args(args) -> ProbeRun:
    """Turn parsed flags into a checked `ProbeRun` (no model or data is loaded here)."""
    from dataclasses import replace

    from .embed import check_poolings
    from .tasks import register_task_files, resolve_task_names

    register_task_files(args.tasks_file)
    models = [resolve_model(spec) for spec in args.model]
    if args.trust_remote_code:
        models = [replace(m, trust_remote_code=True) for m in models]
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise HarnessError(f"--model names repeat ({', '.join(names)}); give each its own NAME")
    poolings = check_poolings(p.strip() for p in args.pooling.split(",") if p.strip())
    tasks = resolve_task_names([t.strip() for t in args.tasks.split(",") if t.strip()])
    for flag in ("max_seq_len", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise HarnessError(f"--{flag.replace('_', '-')} {value} must be 1 or more")
    return ProbeRun(
        models=models, tasks=tasks, poolings=poolings, results_dir=Path(args.results_dir),
        data_dir=args.data_dir, config=ProbeConfig(k_folds=args.k_folds, seed=args.seed),
        max_seq_len=args.max_seq_len, precision=args.precision, batch_size=args.batch_size,
        device=args.device, cache=not args.no_cache, store_probes=args.store_probes,
        force=args.force,
    )  # fmt: skip


@report_errors
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    run = run_from_args(args)
    started = time.perf_counter()
    written = run_probes(run)
    _log(f"probe: wrote {len(written)} result(s) in {time.perf_counter() - started:.1f} s; "
         f"table: python -m encoder_eval.summarize --results-dir {run.results_dir}")  # fmt: skip
    return EXIT_OK
