"""Probing a model's frozen embeddings on the registered tasks: one probe cell per
(model, pooling, task).

Usage::

    encoder-eval probe --model minilm=/path/to/minilm [--model NAME[=PATH]] \\
        [--pooling mean,first] [--tasks glue_sst2,glue_mrpc | --tasks all] \\
        [--data-dir ../shared/data] [--results-dir probe_results] [--k-folds 10] [--seed 42] \\
        [--max-seq-len 256] [--precision bf16|fp32] [--batch-size N] [--device auto] \\
        [--no-cache] [--store-probes] [--force]

For each model the frozen encoder is loaded once (`loaders.load_encoder`), each task's
train and report splits are embedded once for every pooling asked (`encoder_eval.cells.embed`,
cached on disk), and `probe.probe_task` runs the fold protocol on the vectors. Each cell
writes `<results-dir>/<model>_<pooling>_<task>.probe.json` (schema `encoder-eval-probe`,
with the per-fold scores `q_t`), and each (model, pooling) a run summary
`<model>_<pooling>.probe-summary.json`. Done cells are skipped (`--force` redoes them), as
are cells whose result file must be left alone (one that cannot be read, or a newer
harness's: said on stderr, exit 1); every input (models, tasks, their data) is checked, and the data provenance computed,
before the first model is loaded. `summarize` and `leaderboard` read the folder.

Exit status: 0 done; 1 some cells left alone (their files kept); 2 bad input.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.cells.probe_flags import DEFAULT_MAX_SEQ_LEN, DEFAULT_POOLINGS
from encoder_eval.cells.probing import (
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
from encoder_eval.core import cpu
from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    HarnessError,
)
from encoder_eval.core.fileio import (
    check_output_dir,
    safe_filename_part,
)
from encoder_eval.core.progress import probe_line
from encoder_eval.core.results import (
    PROBE_RESULT_SUFFIX,
    cell_state,
    probe_result_filename,
    read_result,
)
from encoder_eval.data.limit import check_limit, limit_data
from encoder_eval.data.models import (
    check_model_path,
    model_entry,
    parse_model_spec,
    registry_trusts,
)
from encoder_eval.data.sources import data_provenance
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.taskfile import register_task_files
from encoder_eval.data.tasks import resolve_task_names
from encoder_eval.data.tokencache import default_cache_dir as token_cache_dir

SUMMARY_SUFFIX = ".probe-summary.json"


@dataclass(frozen=True)
class ProbeModel:
    """A model to probe: its name in the results, where it loads from, how."""

    name: str
    path: str
    trust_remote_code: bool = False
    revision: str | None = None
    code_revision: str | None = None  # remote code another repository holds (auto_map)


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
    require_code_revision: bool = False
    limit: int | None = None  # a smoke run: every split cut to this many examples
    record_model_path: bool = False  # paths can be private: recorded only when asked
    kept: list[Path] = field(default_factory=list)  # result files left alone (`run_probes`)


def method_label(model: str, pooling: str) -> str:
    """How a (model, pooling) is named in tables: `minilm:mean`."""
    return f"{model}:{pooling}"


def cell_stem(model: str, pooling: str) -> str:
    return f"{safe_filename_part(model)}_{pooling}"


def result_path(results_dir: Path, model: str, pooling: str, task: str) -> Path:
    return Path(results_dir) / probe_result_filename(model, pooling, task)


def summary_path(results_dir: Path, model: str, pooling: str) -> Path:
    return Path(results_dir) / f"{cell_stem(model, pooling)}{SUMMARY_SUFFIX}"


def resolve_model(spec: str) -> ProbeModel:
    """`NAME=PATH_OR_HUB_ID` (the sweep's `--model` form; a mode suffix is ignored: probes
    use the encoder body) or a registry key."""
    if "=" in spec:
        name, entry = parse_model_spec(spec)
        path = check_model_path(spec, entry.path)
        # NAME=PATH with a registry name and its own Hub id is that row, pins included
        row = model_entry(name) if registry_trusts(name, path) else None
        pins = (row.revision, row.code_revision) if row else (None, None)
        return ProbeModel(name, path, row is not None, *pins)
    entry = model_entry(spec)
    return ProbeModel(
        spec, entry.path, registry_trusts(spec, entry.path), entry.revision, entry.code_revision
    )


def _load_all_data(run: ProbeRun) -> dict[str, tuple[tuple, dict]]:
    """Every task's (load_task result, data provenance), or the first input problem."""
    loaded = {}
    for task in run.tasks:
        data = limit_data(load_task(task, run.data_dir), run.limit)
        if not data[0].get("text"):
            raise HarnessError(f"task {task!r} has no train rows to fit probes on")
        loaded[task] = (data, data_provenance(task, run.data_dir))
    return loaded


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_probes(run: ProbeRun) -> list[Path]:
    """Run every (model, pooling, task) cell of `run` not already done; returns the result
    files written. Inputs are checked and data provenance computed before any model work."""
    from encoder_eval.cells.devices import resolve_device  # imports torch: on use only
    from encoder_eval.cells.embed import (  # imports torch: on use only
        EmbedSetup,
        default_cache_dir,
        embed_split,
    )
    from encoder_eval.data.loaders import load_encoder  # imports torch: on use only

    device = resolve_device(run.device)
    setup = EmbedSetup(
        max_seq_len=run.max_seq_len, precision=run.precision, batch_size=run.batch_size
    )
    kept = []  # result files to leave alone (unreadable, a newer harness's): not run over
    todo: dict[tuple[str, str], list[str]] = {}
    for m in run.models:
        for task in run.tasks:
            todo[(m.name, task)] = []
            for p in run.poolings:
                path = result_path(run.results_dir, m.name, p, task)
                state, _, why = cell_state(path, model=m.name, task=task)
                if state == "kept" and not run.force:
                    _log(
                        f"left {path} in place ({why}); its cell is not done, and is not run "
                        "over it: fix or move the file (or pass --force), then run again"
                    )
                    kept.append(path)
                elif run.force or state != "ok":
                    todo[(m.name, task)].append(p)
    run.kept = kept
    total = sum(len(v) for v in todo.values())
    cells = len(run.models) * len(run.tasks) * len(run.poolings)
    _log(
        f"probe: {cells} cell(s), {cells - total} already done, {total} to run "
        f"({len(run.models)} model(s) x {len(run.poolings)} pooling(s) x {len(run.tasks)} "
        f"task(s)); results in {run.results_dir}"
    )
    data = _load_all_data(run) if total else {}
    if total:
        cpu.warn_slow_bf16(device.type, run.precision)
    run.results_dir.mkdir(parents=True, exist_ok=True)
    cache = default_cache_dir() if run.cache else None
    tokens = token_cache_dir() if run.cache else None
    written, number = [], 0
    base_provenance = probe_provenance()
    for model in run.models:
        if not any(todo[(model.name, t)] for t in run.tasks):
            continue
        started = time.perf_counter()
        loaded = load_encoder(
            model.path,
            revision=model.revision,
            trust_remote_code=model.trust_remote_code,
            max_seq_len=run.max_seq_len,
            model_label=model.name,
            code_revision=model.code_revision,
            require_code_revision=run.require_code_revision,
        )
        _log(
            f"{model.name}: loaded {model.path} (revision {loaded.revision[:12]}) in "
            f"{time.perf_counter() - started:.1f} s on {device.type}, {run.precision}"
        )
        for task in run.tasks:
            poolings = tuple(todo[(model.name, task)])
            if not poolings:
                continue
            (train, dev, test, n_labels, problem), data_prov = data[task]
            t0 = time.perf_counter()
            train_x, hits = embed_split(loaded, train, poolings, setup, device, cache, tokens)
            report_x = {}
            for lang, split in test.items():
                report_x[lang], h = embed_split(
                    loaded, split, poolings, setup, device, cache, tokens
                )
                hits += h
            embed_s = time.perf_counter() - t0
            n_texts = len(train["text"]) + sum(len(s["text"]) for s in test.values())
            for pooling in poolings:
                number += 1
                t1 = time.perf_counter()
                ptask = task_from_registry(
                    task,
                    train_x[pooling],
                    {lang: v[pooling] for lang, v in report_x.items()},
                    data=(train, dev, test, n_labels, problem),
                )
                outcome = probe_task(ptask, run.config)
                probe_s = time.perf_counter() - t1
                shown_path = model.path if run.record_model_path else None
                cell = {
                    "model": model.name,
                    "model_path": shown_path,
                    "pooling": pooling,
                    "method": method_label(model.name, pooling),
                }
                provenance = {
                    **base_provenance,
                    "model": {
                        "path": shown_path,
                        "revision": loaded.revision,
                        "revision_requested": model.revision,
                        "trust_remote_code": model.trust_remote_code,
                        "code": loaded.code,
                        "source": loaded.source,
                        "class": type(loaded.model).__name__,
                    },
                    "data": data_prov,
                    "embedding": {
                        "pooling": pooling,
                        "max_seq_len": run.max_seq_len,
                        "precision": run.precision,
                        "device": device.type,
                        "dim": int(train_x[pooling].shape[1]),
                        "texts": n_texts,
                        "cache_hits": hits,
                        "limit": run.limit,
                    },
                    "timing": {"embed_s": round(embed_s, 3), "probe_s": round(probe_s, 3)},
                }
                record = result_record(
                    outcome, cell, run.config, fold_results=True, provenance=provenance
                )
                if run.limit is not None:  # a smoke run is never a protocol number
                    record["protocol"].update(on_protocol=False, limit=run.limit)
                path = result_path(run.results_dir, model.name, pooling, task)
                if run.store_probes:
                    save_probe(
                        path.with_name(path.name.removesuffix(PROBE_RESULT_SUFFIX) + ".probe"),
                        final_probe(ptask, run.config, outcome),
                    )
                write_result(path, record)
                written.append(path)
                score = (
                    "undefined"
                    if outcome.mean_score is None
                    else (
                        f"{outcome.metric} {100 * outcome.mean_score:.2f} ± "
                        f"{100 * outcome.std_dev:.2f}, Q {outcome.q_stat:.2f}"
                    )
                )
                _log(
                    probe_line(
                        number,
                        total,
                        method_label(model.name, pooling),
                        task,
                        f"{score} (embed {embed_s:.1f} s{', cached' if hits else ''}, "
                        f"probe {probe_s:.1f} s)",
                    )
                )
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
        if not (name.startswith(prefix) and name.endswith(PROBE_RESULT_SUFFIX)):
            continue
        record = read_result(root / name)[0]
        cell = (record or {}).get("cell") or {}
        # the stem of another (model, pooling) can start with this one's: check the cell
        if cell.get("model") == model and cell.get("pooling") == pooling and "task" in cell:
            found.setdefault(cell["task"], record)
    if not found:
        return None
    tasks = [t for t in run.tasks if t in found] + sorted(set(found) - set(run.tasks))
    config = {
        "k_folds": run.config.k_folds,
        "seed": run.config.seed,
        "pooling": pooling,
        "max_seq_len": run.max_seq_len,
        "precision": run.precision,
        "tasks": tasks,
        "missing_tasks": [t for t in run.tasks if t not in found],
    }
    path = summary_path(run.results_dir, model, pooling)
    write_result(path, run_summary(method_label(model, pooling), [found[t] for t in tasks], config))
    return path


def run_from_args(args) -> ProbeRun:
    """Turn parsed flags (`probe_flags.ProbeFlags`, parsed by `encoder_eval.probe`) into a checked
    `ProbeRun` (no model or data is loaded here)."""
    from dataclasses import replace

    from encoder_eval.cells.embed import check_poolings  # imports torch: on use only

    register_task_files(args.tasks_file)
    models = [resolve_model(spec) for spec in args.model]
    if args.trust_remote_code:
        models = [replace(m, trust_remote_code=True) for m in models]
    pins = {
        k: v
        for k in ("revision", "code_revision")
        if (v := getattr(args, f"model_{k}")) is not None
    }
    if pins and len(models) != 1:
        raise HarnessError(
            "--model-revision and --model-code-revision pin one model; give "
            "one --model per probe run"
        )
    models = [replace(m, **pins) for m in models]
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise HarnessError(f"--model names repeat ({', '.join(names)}); give each its own NAME")
    poolings = check_poolings(p.strip() for p in args.pooling.split(",") if p.strip())
    tasks = resolve_task_names([t.strip() for t in args.tasks.split(",") if t.strip()])
    check_limit(args.limit)
    for flag in ("max_seq_len", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise HarnessError(f"--{flag.replace('_', '-')} {value} must be 1 or more")
    check_output_dir(args.results_dir, "--results-dir")
    return ProbeRun(
        models=models,
        tasks=tasks,
        poolings=poolings,
        results_dir=Path(args.results_dir),
        data_dir=args.data_dir,
        config=ProbeConfig(k_folds=args.k_folds, seed=args.seed),
        max_seq_len=args.max_seq_len,
        precision=resolved_precision(args.precision, args.device),
        batch_size=args.batch_size,
        device=args.device,
        cache=not args.no_cache,
        store_probes=args.store_probes,
        force=args.force,
        require_code_revision=args.require_code_revision,
        limit=args.limit,
        record_model_path=args.record_model_path,
    )


def resolved_precision(word: str, device: str) -> str:
    """The precision a probe runs for a `--precision` word on `device` (`cpu.resolve_precision`;
    its note, when auto chose fp32, goes to stderr)."""
    precision, note = cpu.resolve_precision(word, device)
    if note:
        _log(note)
    return precision


def run_probe(run: ProbeRun) -> int:
    """Run a checked `ProbeRun` as the `probe` command does and return its exit code (OK, or
    INCOMPLETE when result files were left alone): the typed entry `track` calls."""
    started = time.perf_counter()
    written = run_probes(run)
    _log(
        f"probe: wrote {len(written)} result(s) in {time.perf_counter() - started:.1f} s; "
        f"table: encoder-eval summarize --results-dir {run.results_dir}"
    )
    if run.kept:
        _log(
            f"probe: {len(run.kept)} cell(s) not run, to keep the file in their place "
            "(see the lines above)"
        )
        return EXIT_INCOMPLETE
    return EXIT_OK
