"""Checkpoint tracking's cells (`encoder-eval track`): the checkpoint list, the evaluation
setup, the sweep `Plan` behind each receipt, running its cells and building the receipt.

A receipt (`core.receipt`) is built from ordinary harness cells in `<out-dir>/results`: probe
cells (`encoder_eval.probe`, one pooling, the folds as noise) or report-phase fine-tune cells
at one fixed learning rate (given, or read from a selection file) over N seeds. The cells are
planned by `plan.build_plan` / `build_probe_plan`, as `sweep`'s are, and run from the plan's
own configurations (`Plan.cell_configs`), so a receipt is idempotent: done cells are not run
again, and an existing receipt of the same checkpoint (same weights) and setup is kept. The
regression statistics over receipts are `reports.tracking`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from encoder_eval.cells.capability import AXES
from encoder_eval.cells.capability import evaluate_checkpoint as score_suite
from encoder_eval.cells.predictions import load_predictions, predictions_path
from encoder_eval.cells.probe_flags import DEFAULT_MAX_SEQ_LEN, DEFAULT_POOLINGS
from encoder_eval.cells.probing import DEFAULT_K_FOLDS, DEFAULT_SEED
from encoder_eval.core import aggregate, cpu
from encoder_eval.core.errors import EXIT_OK, HarnessError, report_errors, unknown_name
from encoder_eval.core.fileio import write_json_atomic
from encoder_eval.core.metrics import sign
from encoder_eval.core.protocol import LR_GRID, PHASE_SEEDS, lr_for_key, precision_word
from encoder_eval.core.provenance import directory_content_hash
from encoder_eval.core.receipt import (
    EVAL_KINDS,
    Receipt,
    TaskResult,
    TrackSetup,
    check_checkpoint_id,
    read_receipt,
    receipt_path,
)
from encoder_eval.core.results import DONE_STATES, cell_state, read_result
from encoder_eval.core.schema import CellResult
from encoder_eval.plans.plan import (
    CellSettings,
    PlanInputs,
    ProbeSettings,
    build_plan,
    build_probe_plan,
    resolve_tasks,
    split_csv,
)
from encoder_eval.plans.selection import load_selection

STEP_DIR = re.compile(r"checkpoint-(\d+)")


# ----------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of the sequence: its id (a file-name-safe label), where its weights
    live, its position, and metadata read from the listing (a folder's step)."""

    id: str
    path: str
    index: int
    metadata: dict = field(default_factory=dict)


def check_checkpoint_dir(cid: str, path: str) -> str:
    """A checkpoint's folder as an absolute path, refused (naming checkpoint `cid`) unless it
    is a directory, so a bad ladder line fails before any checkpoint is evaluated."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full):
        raise HarnessError(
            f"checkpoint {cid}: {path!r} is not a directory; give the folder "
            "holding its config.json"
        )
    return full


def read_checkpoints(source: str | os.PathLike) -> list[Checkpoint]:
    """The ordered checkpoints of `source`: a file of `id<TAB>path` lines (in file order;
    `#` comments and blank lines skipped; relative paths are relative to the file), or a
    folder of `checkpoint-<step>` directories, ordered by step (id = directory name)."""
    src = Path(source)
    if src.is_dir():
        steps = sorted(
            (int(m.group(1)), p)
            for p in src.iterdir()
            if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))
        )
        if not steps:
            raise HarnessError(f"--checkpoints {source}: no checkpoint-<step> folders in it")
        return [
            Checkpoint(p.name, str(p.resolve()), i, {"step": step})
            for i, (step, p) in enumerate(steps)
        ]
    if not src.is_file():
        raise HarnessError(f"--checkpoints {source}: no such file or folder")
    out: list[Checkpoint] = []
    for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise HarnessError(f"{source}:{n}: expected 'id<TAB>path', got {line!r}")
        cid, path = check_checkpoint_id(parts[0].strip()), parts[1].strip()
        if not os.path.isabs(os.path.expanduser(path)):
            path = str(src.parent / path)
        out.append(Checkpoint(cid, check_checkpoint_dir(cid, path), len(out)))
    if not out:
        raise HarnessError(f"--checkpoints {source}: no checkpoints listed")
    dupes = sorted({c.id for c in out if [d.id for d in out].count(c.id) > 1})
    if dupes:
        raise HarnessError(f"--checkpoints {source}: ids listed twice: {', '.join(dupes)}")
    return out


# ----------------------------------------------------------------------------- setup


def _lr_from_selection(path: str, model: str | None, tasks: list[str]) -> dict[str, tuple]:
    pairs = load_selection(path).get("pairs", {})
    if model is None:
        if len(pairs) != 1:
            raise HarnessError(
                f"--selection {path} holds {len(pairs)} models; name the one "
                f"whose LRs to use with --selection-model ({', '.join(pairs)})"
            )
        model = next(iter(pairs))
    if model not in pairs:
        raise unknown_name("selection model", model, pairs)
    out = {}
    for task in tasks:
        entry = pairs[model].get(task) or {}
        if not entry.get("lr_key"):
            raise HarnessError(f"--selection {path} has no selected LR for {model}/{task}")
        out[task] = (entry["lr_key"], float(entry["lr"]))
    keys = {k for k, _ in out.values()}
    if len(keys) > 1:
        raise HarnessError(
            f"--selection {path}: {model}'s tasks use several LRs ({', '.join(sorted(keys))}); "
            "tracking runs one fixed LR, give it with --lr-key"
        )
    return out


def _precision(word: str | None) -> str | None:
    """A receipt's precision for a `--precision` word: None for the protocol's bf16 (as
    receipts always recorded it), fp32, or what auto resolves to here (`cpu.resolve_precision`;
    `track` resolves it on the cells' device first)."""
    word = precision_word(word or "bf16")
    if word == "auto":
        word = cpu.resolve_precision(word, "auto")[0]
    return None if word == "bf16" else word


def build_setup(
    kind: str,
    tasks: list[str],
    *,
    max_seq_len: int | None = None,
    pooling: str | None = None,
    k_folds: int | None = None,
    seed: int | None = None,
    precision: str | None = None,
    lr_key: str | None = None,
    selection: str | None = None,
    selection_model: str | None = None,
    seeds: list[int] | None = None,
    max_steps: int | None = None,
    n_examples: int | None = None,
) -> TrackSetup:
    """Check and complete the evaluation setup, filling the defaults of its kind."""
    if kind not in EVAL_KINDS:
        raise unknown_name("evaluation kind", kind, EVAL_KINDS)
    if kind == "synthetic":
        given = [
            v is not None
            for v in (max_seq_len, pooling, k_folds, precision, lr_key, selection, seeds, max_steps)
        ]
        if tasks or any(given):
            raise HarnessError(
                "--kind synthetic scores the capability suite's four axes "
                "(perplexity, modular arithmetic, parity, induction): it takes "
                "only --seed and --n-examples"
            )
        n = 256 if n_examples is None else n_examples
        if n < 2:
            raise HarnessError(f"--n-examples {n} must be at least 2")
        return TrackSetup("synthetic", AXES, seed=0 if seed is None else seed, n_examples=n)
    if n_examples is not None:
        raise HarnessError("--n-examples is for --kind synthetic")
    if not tasks:
        raise HarnessError(f"--kind {kind} needs --tasks (task keys and groups)")
    task_list = tuple(resolve_tasks(tasks))
    if kind == "probe":
        from encoder_eval.cells.embed import check_poolings  # imports torch: on use only

        if any(v is not None for v in (lr_key, selection, seeds, max_steps)):
            raise HarnessError(
                "--lr-key, --selection, --seeds and --max-steps are for --kind "
                "finetune; a probe receipt takes --pooling, --k-folds, --seed"
            )
        pools = check_poolings(split_csv(pooling) if pooling else list(DEFAULT_POOLINGS))
        if len(pools) != 1:
            raise HarnessError("--pooling: a track runs one pooling")
        return TrackSetup(
            "probe",
            task_list,
            max_seq_len or DEFAULT_MAX_SEQ_LEN,
            pools[0],
            k_folds or DEFAULT_K_FOLDS,
            DEFAULT_SEED if seed is None else seed,
            _precision(precision) or "bf16",
        )

    if any(v is not None for v in (pooling, k_folds, seed)):
        raise HarnessError("--pooling, --k-folds and --seed are for --kind probe")
    # recorded only when it is not the protocol's bf16: earlier receipts stay comparable
    precision = _precision(precision)
    if (lr_key is None) == (selection is None):
        raise HarnessError(
            "--kind finetune needs its fixed LR: --lr-key KEY (one of "
            f"{', '.join(LR_GRID)}) or --selection selection.json"
        )
    if lr_key is not None:
        lr, source = lr_for_key(lr_key), "given (--lr-key)"
    else:
        chosen = _lr_from_selection(selection, selection_model, list(task_list))
        lr_key, lr = next(iter(chosen.values()))
        source = f"selection {os.path.abspath(selection)}" + (
            f" (model {selection_model})" if selection_model else ""
        )
    return TrackSetup(
        "finetune",
        task_list,
        max_seq_len,
        lr_key=lr_key,
        lr=lr,
        lr_source=source,
        seeds=tuple(seeds or PHASE_SEEDS["report"]),
        max_steps=max_steps,
        precision=precision,
    )


def results_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "results"


def build_track_plan(
    setup: TrackSetup,
    checkpoints: Sequence[Checkpoint],
    out_dir: str | os.PathLike,
    *,
    data_dir: str | None = None,
    device: str | None = None,
    no_cache: bool = False,
):
    """The sweep `Plan` of the cells behind the receipts of `checkpoints` (each checkpoint is
    a `--model ID=PATH` addition): the probe phase, or the report phase under a selection
    that gives every (checkpoint, task) the fixed LR."""
    inputs = PlanInputs(
        results_dir=results_dir(out_dir),
        models=tuple(c.id for c in checkpoints),
        extra_models=tuple(f"{c.id}={c.path}" for c in checkpoints),
        tasks=tuple(setup.tasks),
        data_dir=data_dir,
        device=device,
    )
    if no_cache and setup.kind != "probe":
        raise HarnessError("--no-cache is for --kind probe (fine-tune cells cache no embeddings)")
    if setup.kind == "probe":
        probe = ProbeSettings.asked(
            poolings=(setup.pooling,),
            k_folds=setup.k_folds,
            seed=setup.seed,
            precision=setup.precision,
        )
        settings = CellSettings(extra_run_args=("--no-cache",) if no_cache else ())
        return build_probe_plan(inputs, probe, settings.given(max_seq_len=setup.max_seq_len))
    selection = {
        "pairs": {
            c.id: {t: {"lr_key": setup.lr_key, "lr": setup.lr} for t in setup.tasks}
            for c in checkpoints
        }
    }
    settings = CellSettings().given(
        max_seq_len=setup.max_seq_len, max_steps=setup.max_steps, precision=setup.precision
    )
    return build_plan("report", inputs, settings, selection=selection, seeds=list(setup.seeds))


def _run_missing(plan, log: Callable[[str], None]) -> None:
    """Run every unit of `plan` that has a cell not done, in this process, from the plan's
    own configurations (`Plan.cell_configs`: what the unit's launch-script line runs)."""
    for unit in plan.units():
        if all(plan.cell_state(c) in DONE_STATES for c in unit):
            continue
        log(f"track: running {len(unit)} cell(s) of {unit[0].model}/{unit[0].task}")
        rc = int(report_errors(_run_unit)(plan, unit) or 0)
        if rc != EXIT_OK:
            raise HarnessError(
                f"cells of {unit[0].model}/{unit[0].task} failed (exit {rc}); see the log "
                "above, fix, and run the receipt again (done cells are kept)"
            )


def _run_unit(plan, unit: list) -> int:
    """Run one unit of a track plan as its launch script's command would, and return that
    command's exit code. Imports torch."""
    from encoder_eval.cells import probe_cell, runner

    configs = plan.cell_configs(unit)
    if plan.probe is not None:
        return probe_cell.run_probe(configs[0])
    return runner.run_configs(configs, skip_existing=True)


def _mean_by_language(rows: list[dict]) -> dict[str, float]:
    langs = sorted({lang for r in rows for lang in r})
    return {
        lang: math.fsum(r[lang] for r in rows if r.get(lang) is not None)
        / max(1, sum(r.get(lang) is not None for r in rows))
        for lang in langs
    }


def _probe_task_result(plan, cell, revision: str) -> TaskResult:
    path = Path(plan.out_json(cell))
    r = read_result(path)[0]
    if r is None:
        raise HarnessError(f"{path}: missing or unreadable after its run")
    found = (r["provenance"].get("model") or {}).get("revision")
    _check_revision(path, found, revision, cell.model)
    if r.get("mean_score") is None:
        raise HarnessError(
            f"{path}: the probe score is undefined ({r.get('undefined')}); a "
            "receipt needs a score on every task"
        )
    folds = [v for v in r.get("q_t") or [] if v is not None]
    return TaskResult(
        cell.task,
        float(r["mean_score"]),
        sign(r["metric"]) > 0,
        sum((r.get("n") or {}).get("report", {}).values()) or None,
        {
            "metric": r["metric"],
            "std": r.get("std_dev"),
            "n": len(folds),
            "noise_from": "probe folds",
            "folds": folds,
            "q_stat": r.get("q_stat"),
            "per_language": _mean_by_language([f.get("languages") or {} for f in r["folds"]]),
            "model_revision": found,
            "result": str(path),
        },
    )


def _finetune_task_result(plan, cells, revision: str) -> TaskResult:
    scores, per_lang, diverged, undefined, n_examples, off = {}, [], [], [], None, False
    metric = None
    for cell in cells:
        path = Path(plan.out_json(cell))
        state, data, reason = cell_state(path, "report", model=cell.model, task=cell.task)
        if data is None:
            raise HarnessError(f"{path}: {reason or state} after its run")
        _check_revision(path, data["provenance"].get("model_revision"), revision, cell.model)
        metric = data["metric"]
        off = off or not data["protocol"]["on_protocol"]
        outcome, score = aggregate.seed_outcome(CellResult.from_dict(data), "report")
        if outcome == aggregate.FINISHED:
            scores[cell.seed] = score
            per_lang.append(data["report"]["per_language"])
        elif outcome == aggregate.UNDEFINED:
            undefined.append(cell.seed)
        else:
            diverged.append(cell.seed)
        if n_examples is None and predictions_path(path).exists():
            try:
                preds = load_predictions(predictions_path(path))
                n_examples = sum(len(p) for p in preds.languages.values())
            except HarnessError:
                pass
    task = cells[0].task
    if not scores:
        raise HarnessError(
            f"{cells[0].model}/{task}: no seed finished with a defined score "
            f"(diverged {diverged}, undefined {undefined})"
        )
    return TaskResult(
        task,
        aggregate.seed_mean(scores.values()),
        sign(metric) > 0,
        n_examples,
        {
            "metric": metric,
            "std": aggregate.seed_std(scores.values()),
            "n": len(scores),
            "noise_from": "report seeds",
            "seeds": sorted(scores),
            "per_seed": {str(s): v for s, v in sorted(scores.items())},
            "diverged_seeds": diverged,
            "undefined_seeds": undefined,
            "per_language": _mean_by_language(per_lang),
            "lr_key": plan.cells[0].lr_key,
            "model_revision": revision,
            "off_protocol": off,
        },
    )


def _check_revision(path: Path, found: str | None, expected: str, cid: str) -> None:
    if found != expected:
        raise HarnessError(
            f"{path} was made from other weights than checkpoint {cid} holds now "
            f"({found} vs {expected}); give the new weights a new id, or another --out-dir"
        )


def evaluate_checkpoint(
    setup: TrackSetup,
    checkpoint: Checkpoint,
    out_dir: str | os.PathLike,
    *,
    metadata: dict | None = None,
    data_dir: str | None = None,
    device: str | None = None,
    no_cache: bool = False,
    log: Callable[[str], None] = print,
) -> Receipt:
    """The receipt of one checkpoint: run its cells that are not done, then write
    `receipts/<id>.receipt.json` atomically. An existing receipt of the same weights and
    setup is returned as it is; one of other weights or another setup is refused."""
    check_checkpoint_id(checkpoint.id)
    revision = directory_content_hash(checkpoint.path)
    meta = {**checkpoint.metadata, **(metadata or {})}
    path = receipt_path(out_dir, checkpoint.id)
    if path.exists():
        old = read_receipt(path)
        if old.model_revision != revision:
            raise HarnessError(
                f"{path} is the receipt of other weights ({old.model_revision}); "
                f"{checkpoint.id} now holds {revision}: give it a new id"
            )
        if TrackSetup.from_dict(old.setup).comparable() != setup.comparable():
            raise HarnessError(
                f"{path} was made with another setup ({old.setup}); use "
                "another --out-dir for another setup"
            )
        if old.checkpoint_index == checkpoint.index and (not metadata or old.metadata == meta):
            log(f"track: {checkpoint.id}: receipt exists, kept ({path})")
            return old
    if setup.kind == "synthetic":
        tasks = _synthetic_task_results(setup, checkpoint, device, log)
    else:
        tasks = _cell_task_results(
            setup, checkpoint, out_dir, revision, data_dir, device, no_cache, log
        )
    receipt = Receipt(
        checkpoint.id,
        checkpoint.index,
        tasks,
        list(setup.seeds) if setup.kind == "finetune" else [setup.seed],
        meta,
        setup.to_dict(),
        checkpoint.path,
        revision,
        datetime.now(UTC).isoformat(timespec="seconds"),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, receipt.to_dict())
    log(f"track: {checkpoint.id}: wrote {path}")
    return receipt


def _cell_task_results(
    setup: TrackSetup,
    checkpoint: Checkpoint,
    out_dir,
    revision: str,
    data_dir,
    device,
    no_cache: bool,
    log,
) -> list[TaskResult]:
    """Probe or fine-tune: run the checkpoint's cells that are not done, then read them."""
    plan = build_track_plan(
        setup, [checkpoint], out_dir, data_dir=data_dir, device=device, no_cache=no_cache
    )
    _run_missing(plan, log)
    tasks = []
    for task in setup.tasks:
        cells = [c for c in plan.cells if c.task == task]
        if setup.kind == "probe":
            tasks.append(_probe_task_result(plan, cells[0], revision))
        else:
            tasks.append(_finetune_task_result(plan, cells, revision))
    return tasks


def _synthetic_task_results(
    setup: TrackSetup, checkpoint: Checkpoint, device: str | None, log
) -> list[TaskResult]:
    """The capability suite on the checkpoint loaded as a causal LM (fp32, local files only),
    scored over its tokenizer's vocabulary when it has one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from encoder_eval.cells.devices import resolve_device  # imports torch: on use only

    log(
        f"track: {checkpoint.id}: synthetic capability suite ({setup.n_examples} examples per axis)"
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint.path, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise HarnessError(
            f"{checkpoint.id}: {checkpoint.path} does not load as a causal "
            f"language model ({str(exc).splitlines()[0][:200]}); --kind "
            "synthetic is for decoder checkpoints"
        ) from None
    vocab = None  # the tokenizer's size, when the checkpoint has one (the embedding may be padded)
    if any(Path(checkpoint.path, f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        try:
            tokenizer = AutoTokenizer.from_pretrained(checkpoint.path, local_files_only=True)
            vocab = min(len(tokenizer), model.config.vocab_size)
        except (OSError, ValueError):
            vocab = None
    model.to(resolve_device(device or "auto"))
    report = score_suite(
        model,
        checkpoint_id=checkpoint.id,
        seed=setup.seed,
        n_examples=setup.n_examples,
        vocab=vocab,
    )
    return report.tasks
