"""One or several cells run from the `run` command's flags (declared in `cells/run_flags.py`,
parsed by `encoder_eval.run`): the cells they describe (`plan_cells`: every name and path
checked before any training), and running them (`run_cells`: one process, data and
tokenisation paid once, a JSON per cell). The typed API, for callers that are not a
command line (`track`): `unit_configs` makes the cells of one unit from a
`cell_config.CellConfig`, `run_configs` runs them and returns `run`'s exit code.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from encoder_eval.cells.trackers import check_tracking_dir, parse_report_to
from encoder_eval.core import cpu
from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    STOP_WORDS,
    STOPS,
    HarnessError,
    Preempted,
    exit_code_for,
    raise_on_sigterm,
)
from encoder_eval.core.fileio import check_output_dir, check_output_file
from encoder_eval.core.protocol import (
    PHASE_SEEDS,
    Precision,
    check_seed,
    lr_key_for,
    nearest_grid_lr,
    recipe_flag,
    recipe_from_args,
)
from encoder_eval.core.results import (
    DONE_STATES,
    KEPT,
    cell_lock,
    clean_stale_temporaries,
    result_filename,
    settle_cell,
)
from encoder_eval.data.limit import check_limit
from encoder_eval.data.models import (
    MODEL_REGISTRY,
    ModelEntry,
    check_local_model,
    key_from_path,
    loader_settings,
    model_entry,
    packaged_model,
    registry_trusts,
)
from encoder_eval.data.revisions import dataset_revisions
from encoder_eval.data.sources import check_mirror, data_provenance
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.taskfile import register_task_files
from encoder_eval.data.tasks import task_knobs


class CellsFailed(Exception):
    """Some cells of a multi-cell process crashed; the others ran and wrote their results."""


def _parse_list(text: str, kind, flag: str) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise HarnessError(f"{flag} {text!r} is not a comma-separated list of numbers") from None
    if not values:
        raise HarnessError(f"{flag} is empty")
    return values


@dataclass(frozen=True)
class ResolvedModel:
    """The model a cell's flags name: its registry row (None for a path of one's own), path,
    key, whether its remote code is trusted, and the revisions of its weights and code."""

    entry: ModelEntry | None
    path: str
    key: str
    trust: bool
    revision: str | None
    code_revision: str | None

    def code_identity(self) -> tuple | None:
        """The remote code a cell of this model imports into its process (None: none):
        what a warm worker must not carry into a unit of another model
        (`encoder_eval.run.unit_identity`)."""
        return (self.path, self.revision, self.code_revision) if self.trust else None


def resolve_model(args: argparse.Namespace) -> ResolvedModel:
    """The model `run`'s parsed flags name, from the registry or a path (no torch)."""
    if args.model_path is None and args.model_key is None:
        raise HarnessError("give --model-path or a registry --model-key")
    entry = None
    if args.model_key in MODEL_REGISTRY:
        entry = model_entry(args.model_key)
    elif args.model_path is None:  # a model an installed package ships, else unknown
        entry = packaged_model(args.model_key) or model_entry(args.model_key)
    model_path = args.model_path or entry.path
    check_local_model(model_path)
    model_key = args.model_key or key_from_path(model_path)
    if entry is None and model_key in MODEL_REGISTRY:  # --model-path alone names a registry model
        entry = model_entry(model_key)
    trust = args.trust_remote_code
    if trust is None:  # the registry's word holds for its own Hub id only, never a name
        trust = registry_trusts(model_key, model_path)
    pinned = entry if entry is not None and entry.path == model_path else None
    return ResolvedModel(
        entry=entry,
        path=model_path,
        key=model_key,
        trust=bool(trust),
        revision=args.model_revision or (pinned.revision if pinned else None),
        code_revision=args.model_code_revision or (pinned.code_revision if pinned else None),
    )


def plan_cells(args: argparse.Namespace) -> list:
    """Turn parsed flags into CellConfigs, checking every input before anything runs: names,
    learning rates, seeds and output paths before torch is imported, so a typo is refused in
    under a second (`tests/test_fast_refusal.py`)."""
    register_task_files(args.tasks_file)  # first: the task names below may be defined there
    task_knobs(args.task)
    check_mirror(args.data_dir, args.task)
    dataset_revisions()  # a malformed ENCODER_EVAL_DATASET_REVISIONS fails now, not after training
    report_to = parse_report_to(args.report_to)
    check_limit(args.limit)
    if report_to and args.tracking_dir:
        check_tracking_dir(args.tracking_dir)
    model = resolve_model(args)
    entry, model_path, model_key = model.entry, model.path, model.key
    mode = args.mode or (entry.mode if entry else "auto")
    row = entry if entry and entry.mode == mode else None  # a row's settings go with its mode
    settings = loader_settings(
        mode,
        *(
            getattr(args, k) if getattr(args, k) is not None else getattr(row, k, None)
            for k in ("attention", "pooling", "head_dropout")
        ),
        body_dropout=args.body_dropout
        if args.body_dropout is not None
        else getattr(row, "body_dropout", None),
    )
    trust, revision, code_revision = model.trust, model.revision, model.code_revision
    lrs = _parse_list(args.lr, float, "--lr")
    seeds = _parse_list(args.seed, int, "--seed")
    check_cell_values(lrs, seeds, args.phase, args.allow_off_protocol)
    for name in ("batch_size", "max_steps", "epoch_cap", "max_seq_len", "patience"):
        if getattr(args, name) < 1:
            raise HarnessError(f"{recipe_flag(name)} must be at least 1")
    if args.rank_group_size < 2:
        raise HarnessError(
            "--rank-group-size must be at least 2 (one relevant candidate and one negative)"
        )
    if args.eval_batch_size is not None and args.eval_batch_size < 1:
        raise HarnessError("--eval-batch must be at least 1")
    if args.pad_multiple is not None and args.pad_multiple < 1:
        raise HarnessError("--pad-multiple must be at least 1")
    if args.micro_batch is not None and (
        args.micro_batch < 1 or args.batch_size % args.micro_batch
    ):
        raise HarnessError(f"--micro-batch {args.micro_batch} must divide --bsz {args.batch_size}")
    n_cells = len(lrs) * len(seeds)
    if args.out_json and n_cells > 1:
        raise HarnessError("--out-json names one file; use --results-dir for several cells")
    if not args.out_json and not args.results_dir:
        raise HarnessError("give --out-json FILE (one cell) or --results-dir DIR")
    if args.out_json:
        check_output_file(args.out_json, "--out-json", create_dirs=True)
    else:
        check_output_dir(args.results_dir, "--results-dir")
    recipe = recipe_from_args(args, mode=mode, **settings)
    # Imports torch and transformers (seconds): only once every check above has passed.
    from encoder_eval.cells.cell_config import CellConfig

    base = CellConfig(
        model_path=model_path,
        task=args.task,
        lr=lrs[0],
        seed=seeds[0],
        model_key=model_key,
        phase=args.phase,
        recipe=recipe,
        data_dir=args.data_dir,
        device=args.device,
        out_json=args.out_json,
        model_revision=revision,
        model_code_revision=code_revision,
        require_code_revision=args.require_code_revision,
        trust_remote_code=trust,
        record_model_path=args.record_model_path,
        save_predictions=args.save_predictions,
        progress=args.progress,
        cache_dir=None if args.no_cache else args.cache_dir,
        report_to=report_to,
        tracking_dir=args.tracking_dir,
    )
    return unit_configs(base, lrs, seeds, None if args.out_json else args.results_dir)


def check_cell_values(
    lrs: list[float], seeds: list[int], phase: str, allow_off_protocol: bool = False
) -> None:
    """Refuse an unusable learning rate, and one off the grid or a seed outside `phase`'s set
    unless `allow_off_protocol` (the result is then marked off-protocol)."""
    for lr in lrs:
        if not math.isfinite(lr) or lr <= 0 or lr >= 1:
            raise HarnessError(f"--lr {lr} is not a usable learning rate (0 < lr < 1)")
        if lr_key_for(lr) is None and not allow_off_protocol:
            key, nearest = nearest_grid_lr(lr)
            raise HarnessError(
                f"--lr {lr:g} is not on the protocol grid (the nearest grid value is "
                f"{nearest:g}, {key}); use a grid value or pass --allow-off-protocol (the "
                "result is then marked off-protocol)"
            )
    for seed in seeds:
        check_seed(seed)
        if seed not in PHASE_SEEDS[phase] and not allow_off_protocol:
            raise HarnessError(
                f"--seed {seed} is not a {phase} seed {list(PHASE_SEEDS[phase])}; "
                "use one of those or pass --allow-off-protocol"
            )


def unit_configs(base, lrs: list[float], seeds: list[int], results_dir: str | None = None) -> list:
    """The CellConfigs of one unit: `base` (a `cell_config.CellConfig`) at every learning rate of
    `lrs` and each of its `seeds`, LR by LR, each writing
    `results_dir/{model}_{task}_{lrkey}_s{seed}.json` (None: `base.out_json`, one cell).
    The typed entry of the cell API: `plan_cells` ends here, and `track` builds `base`
    itself; `run_configs` runs the list."""
    import dataclasses

    from encoder_eval.cells.cell_config import validate_out_path  # imports torch: on use only

    if base.recipe.precision is Precision.AUTO:  # a plan's request: resolved on this device
        word, note = cpu.resolve_precision(Precision.AUTO, base.device)
        if note:
            print(note, file=sys.stderr, flush=True)
        recipe = dataclasses.replace(base.recipe, precision=Precision.of(word))
        base = dataclasses.replace(base, recipe=recipe)
    path_flag = "--results-dir" if results_dir else "--out-json"
    cells = []
    for lr in lrs:
        for seed in seeds:
            out = base.out_json
            if results_dir:
                out = os.path.join(
                    results_dir, result_filename(base.model_key, base.task, lr, seed)
                )
            validate_out_path(out, path_flag)
            cells.append(dataclasses.replace(base, lr=lr, seed=seed, out_json=out))
    return cells


def run_cells(cells: list, skip_existing: bool = False, log=print) -> list[dict]:
    """Run cells in order in this process, sharing the task data; returns their results.

    With `skip_existing`, a cell that is done (`results.cell_state`) is skipped, and a
    corrupt result file in its place is moved aside into `.corrupt/` and the cell run again;
    a file to leave alone (unreadable, a newer harness's, another model's result under this
    cell's name) is left, its cell not run, and CellsFailed names it at the end.
    A cell another runner holds is skipped and come back to at the end: this process then
    waits for that runner's lock and skips the cell if the other runner finished it (or runs
    it, if that runner died first), so a unit's process ends only when its cells are done.
    A cell that crashes (an exception other than bad input or preemption, e.g. running out
    of memory) writes nothing; its traceback is printed and the next cell runs. CellsFailed
    is raised at the end, naming the crashed cells. A stop signal is never a crash: once
    SIGTERM or Ctrl-C arrives, Preempted or Interrupted ends the loop, even when saving
    failed after it, and no further cell starts.
    """
    import traceback

    from encoder_eval.cells.train import run_cell  # imports torch: on use only

    results = []
    data = data_prov = None

    kept = []  # cells whose result file must be left alone (`results.KEPT`): not run over it

    def skip(cfg, done_by: str) -> bool:
        """Whether to skip the cell (called with its lock held): it is done, or its file is
        one to leave alone; a corrupt result is moved aside, and the cell runs."""
        state = settle_cell(
            cfg.out_json, cfg.phase, locked=True, model=cfg.model_key, task=cfg.task
        )[0]
        if state == KEPT:
            kept.append(cfg)
        elif state in DONE_STATES:
            log(f"skip {cfg.out_json} ({done_by})")
        return state == KEPT or state in DONE_STATES

    def run_one(cfg) -> None:
        nonlocal data, data_prov
        if data is None:  # once per process: where the data comes from, then the data itself
            data_prov = data_provenance(cfg.task, cfg.data_dir)
            data = load_task(
                cfg.task,
                cfg.data_dir,
                with_test=cfg.phase == "report",
                selection_split=cfg.recipe.selection_split,
            )
        result = run_cell(cfg, data=data, data_prov=data_prov)
        results.append(result)
        score = result["report"]["mean"] if result["report"] else (result["dev"] or {}).get("mean")
        log(
            f"{result['status']}: {cfg.model_key} {cfg.task} lr={cfg.lr:g} seed={cfg.seed} "
            f"{result['metric']}={'-' if score is None else f'{score:.4f}'} "
            f"steps={result['training']['steps']} -> {cfg.out_json}"
        )

    crashed = []

    def guarded(cfg) -> None:
        try:
            run_one(cfg)
        except (HarnessError, Preempted):
            raise
        except Exception:
            crashed.append(cfg)
            print(
                f"FAILED {cfg.model_key} {cfg.task} lr={cfg.lr:g} seed={cfg.seed} "
                f"(nothing written):\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )

    held_elsewhere = []
    for cfg in cells:
        Path(cfg.out_json).parent.mkdir(parents=True, exist_ok=True)  # checked by plan_cells
        clean_stale_temporaries(Path(cfg.out_json).parent)
        with cell_lock(cfg.out_json) as mine:
            if not mine:
                log(f"skip {cfg.out_json} (another runner is running this cell; back to it later)")
                held_elsewhere.append(cfg)
                continue
            if skip_existing and skip(cfg, "done"):
                continue
            guarded(cfg)
    for cfg in held_elsewhere:
        with cell_lock(cfg.out_json, wait=True):
            if skip(cfg, "done by another runner"):
                continue
            guarded(cfg)
    problems = []
    if crashed:
        problems.append(
            f"{len(crashed)} of {len(cells)} cell(s) crashed and wrote nothing: "
            + ", ".join(f"lr={c.lr:g} seed={c.seed}" for c in crashed)
            + "; see the tracebacks above, then run again to retry them"
        )
    if kept:
        problems.append(
            f"{len(kept)} cell(s) not run, to keep the file in their place (see the lines "
            "above: unreadable, written by a newer harness, or another model's result): "
            + ", ".join(str(c.out_json) for c in kept)
        )
    if problems:
        raise CellsFailed("; and ".join(problems))
    return results


def _note_unreadable_name(cells: list) -> None:
    """Say so, once the result is written, when --out-json named a file that select,
    summarize and status will not read (before that, an error stays one line)."""
    for cfg in cells:
        expected = result_filename(cfg.model_key, cfg.task, cfg.lr, cfg.seed)
        if Path(cfg.out_json).name != expected:
            print(
                f"note: select, summarize and status read this cell's result only under the "
                f"name {expected}; they will skip {cfg.out_json} (use --results-dir DIR to "
                "get the name right)",
                file=sys.stderr,
            )


# What a stop signal that came outside a training loop says after its word (`STOP_WORDS`).
_STOPPED_OUTSIDE_A_CELL = {
    EXIT_PREEMPTED: "SIGTERM before a cell's training started or after its result was "
    "written; run the same command again to continue",
    EXIT_INTERRUPTED: "Ctrl-C before training started or after a result was written; "
    "run the same command again to continue",
}


def run_configs(cells: list, skip_existing: bool = False, quiet: bool = False) -> int:
    """Run typed cells (`cell_config.CellConfig`s, from `plan_cells` or `unit_configs`) as the `run`
    command does, and return its exit code: OK, INCOMPLETE when some crashed or were kept,
    PREEMPTED or INTERRUPTED after a stop signal (SIGTERM is turned into one for the run).
    `quiet` drops the per-cell lines."""
    # SIGTERM between cells (loading data, waiting for another runner's lock) raises, as
    # Ctrl-C does; inside a cell `train.run_cell` turns both into a saved state.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_on_sigterm) if main_thread else None
    try:
        run_cells(cells, skip_existing, log=(lambda m: None) if quiet else print)
        _note_unreadable_name(cells)
    except STOPS as exc:  # the exit code by `errors.exit_code_for`, never a crash
        code = exit_code_for(exc)
        # Preempted and Interrupted say what was saved; Terminated and KeyboardInterrupt
        # (no message) came outside a training loop, where nothing was lost.
        print(f"{STOP_WORDS[code]}: {str(exc) or _STOPPED_OUTSIDE_A_CELL[code]}", file=sys.stderr)
        return code
    except CellsFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INCOMPLETE
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_OK
