"""One cell, top to bottom: load, tokenise, fine-tune with early stopping, score, write.

The loop is written out rather than delegated to `transformers.Trainer` so that the
protocol is visible in one place: fp32 master weights, bf16 autocast for the forward
pass, AdamW with the shared recipe, linear warmup and decay, evaluation on dev at a
fixed cadence, early stopping, best weights restored in memory, then the report split.
`run_cell` runs four parts in turn: `_setup` (task, device, data, model, tokenisation and
provenance, all before the first step: a `ResolvedCell`), `_train` (the loop, here: a
`Trained`), `score_trained` (dev and report sections) and `build_result` (the result dict;
both in `cell_result.py`). Beside it, each through its public names: the cell's
configuration and file names (`cell_config.py`), what it resolved before its first step and
the evaluation forward pass (`cell_state.py`), device, precision and compile helpers
(`devices.py`), batches and their shapes (`batching.py`), and the loop's state (`LoopState`)
with what a stop signal saves and a rerun resumes (`resume.py`). What differs between kinds of cell (batching,
loss, predictions, scoring, what the predictions file and the files beside the result
hold) comes from the cell's `kinds.Kind`; the loop has no branch per kind.
"""

from __future__ import annotations

import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from encoder_eval.cells import graph_step, trackers
from encoder_eval.cells.attention import apply_sdpa_environment, observe_backend
from encoder_eval.cells.batching import (
    EVAL_BATCH_SIZE,
    Shapes,
    epoch_batches,
    smaller_divisor,
)
from encoder_eval.cells.cell_config import (
    DEV_LANGUAGES,
    CellConfig,
    cell_label,
    resume_state_path,
    validate_out_path,
)
from encoder_eval.cells.cell_result import (
    build_result,
    final_metrics,
    score_trained,
    write_cell_result,
)
from encoder_eval.cells.cell_state import ResolvedCell, Trained
from encoder_eval.cells.devices import (
    apply_deterministic,
    check_bf16,
    compile_failures,
    compile_model,
    count_cell,
    device_rng_state,
    forget_compiled,
    release_cached_memory,
    release_memory,
    reset_peak_memory,
    resolve_device,
    seconds_since_process_start,
    seed_everything,
    set_device_rng_state,
)
from encoder_eval.cells.encoding import Encoded, autocast, encode_cached
from encoder_eval.cells.kinds import Autocast, kind_for
from encoder_eval.cells.resume import (
    LoopState,
    StopFlag,
    restore_resume,
    resume_signature,
    save_resume,
    stop_reason,
    stop_requests,
)
from encoder_eval.core import cpu, heap, metrics, provenance
from encoder_eval.core import device as gpu
from encoder_eval.core.errors import (
    EXIT_INTERRUPTED as EXIT_INTERRUPTED,  # re-exported for older imports
)
from encoder_eval.core.errors import EXIT_PREEMPTED as EXIT_PREEMPTED
from encoder_eval.core.errors import HarnessError, Preempted, unknown_name
from encoder_eval.core.errors import Interrupted as Interrupted  # re-exported for older imports
from encoder_eval.core.progress import progress_line
from encoder_eval.core.protocol import (
    Recipe,
    eval_interval,
    signature,
    step_budget,
)
from encoder_eval.data import tokencache
from encoder_eval.data.limit import limit_data
from encoder_eval.data.loaders import LoadedModel, load_model
from encoder_eval.data.sources import data_provenance
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.tasks import task_knobs

# ----------------------------------------------------------------------------- model step


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices only; biases and normalisation weights are not decayed."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, recipe: Recipe, lr: float) -> torch.optim.AdamW:
    """AdamW with the shared recipe; its state lives beside the fp32 parameters, so it is fp32."""
    groups = _param_groups(model, recipe.weight_decay)
    kw = {"lr": lr, "betas": (recipe.adam_beta1, recipe.adam_beta2), "eps": recipe.adam_eps}
    try:
        # The fused kernel does the same arithmetic in one pass (10x faster steps measured
        # on the CPU for MiniLM); older torch builds without it fall back to foreach.
        return torch.optim.AdamW(groups, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw)


def _lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


# ----------------------------------------------------------------------------- the cell


class _Progress:
    """Step, loss, dev score and ETA, as a tqdm bar, JSON lines, or nothing; and the short
    lines (`note`) that say what a cell is doing before its first step."""

    def __init__(self, style: str, total: int | None, label: str):
        self.style, self.total, self.label = style, total, label
        self.bar = None
        self.start = time.perf_counter()
        if style == "bar" and total is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr, leave=False)

    def advance(self) -> None:
        """One step done (the bar redraws at its own pace; the loss is not read for it)."""
        if self.bar is not None:
            self.bar.update(1)

    def show(self, loss: float, dev: float | None) -> None:
        """The last loss read, and the dev score when an evaluation just gave one."""
        if self.bar is not None:
            postfix = {"loss": f"{loss:.4f}"}
            if dev is not None:
                postfix["dev"] = f"{dev:.4f}"
            self.bar.set_postfix(postfix, refresh=False)

    def note(self, text: str, **fields) -> None:
        """A line saying what the cell does now (loading, tokenising, the first step): plain
        text with the bar, a progress JSON line (`stage`) with json, nothing when quiet."""
        if self.style == "bar":
            line = f"{self.label}: {text}"
            if self.bar is not None:
                self.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
        elif self.style == "json":
            self.event(stage=text, **fields)

    def event(self, **fields) -> None:
        if self.style == "json":
            elapsed = time.perf_counter() - self.start
            step = fields.get("step", 0)
            eta = elapsed / step * (self.total - step) if step and self.total else None
            line = progress_line(
                self.label,
                self.total,
                round(elapsed, 2),
                None if eta is None else round(eta, 1),
                **fields,
            )
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_cell(
    cfg: CellConfig, loaded: LoadedModel | None = None, data=None, data_prov: dict | None = None
) -> dict:
    """Fine-tune one cell and return its result dict (also written to `cfg.out_json`).

    `loaded`, `data` and `data_prov` (its `sources.data_provenance`) let a multi-cell process
    pass in what it already has; a fresh model is still loaded for every cell, since weights
    change during training.
    SIGTERM or Ctrl-C during training saves a resumable state and raises Preempted or
    Interrupted; one that arrives after training lets the cell finish and write first. The
    signal wins over any failure after it (saving the state or the result): that failure
    is named in the Preempted or Interrupted raised, never reported as a crash.
    Everything the cell held (model, gradients, optimizer state, best weights) is freed
    when it returns (`release_memory`), so the next cell of the process starts from the
    same memory as the first.
    """
    heap.limit_primitive_cache()  # for callers other than the command line
    release_memory()  # what an earlier cell of this process left (a crash's traceback)
    try:
        return _run_cell_stoppable(cfg, loaded, data, data_prov)
    finally:
        if cfg.recipe.compile:
            forget_compiled()
        release_memory()


def _run_cell_stoppable(
    cfg: CellConfig, loaded: LoadedModel | None, data, data_prov: dict | None
) -> dict:
    """`run_cell` under `stop_requests`: a stop signal becomes Preempted or Interrupted."""
    with stop_requests() as stop:
        try:
            result = _run_cell(cfg, loaded, data, data_prov, stop)
        except Preempted:
            raise
        except Exception as exc:
            if stop.signal is None:
                raise
            kind, how = stop_reason(stop.signal)
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise kind(
                f"{cell_label(cfg)}: stopped by {how}, but the cell could not be saved "
                f"({why}); nothing new was saved for it; run the same command again "
                "once that is fixed"
            ) from exc
        if stop.signal is not None:
            kind, how = stop_reason(stop.signal)
            raise kind(
                f"{cell_label(cfg)}: {how} arrived after training; the result is written "
                f"to {cfg.out_json}; run the same command again for any remaining "
                "cells"
            )
    return result


def _run_cell(
    cfg: CellConfig, loaded: LoadedModel | None, data, data_prov: dict | None, stop: StopFlag
) -> dict:
    cell = _setup(cfg, loaded, data, data_prov)
    cell.reporter = _reporter(cfg)
    try:
        with compile_failures(cfg):
            trained = _train(cell, stop)
            scored = score_trained(cell, trained)
        result = build_result(cell, trained, scored)
        write_cell_result(cfg, cell.kind, result, scored.predictions)
    except BaseException:
        if cell.reporter is not None:
            cell.reporter.finish({}, status="failed")
        raise
    if cell.reporter is not None:
        cell.reporter.finish(final_metrics(result), status=result["status"])
    return result


def tracking_dir(cfg: CellConfig) -> Path:
    """Where file-based trackers write: `--tracking-dir`, else `tracking/` beside the result."""
    if cfg.tracking_dir:
        return Path(cfg.tracking_dir)
    return (Path(cfg.out_json).parent if cfg.out_json else Path.cwd()) / "tracking"


def _reporter(cfg: CellConfig) -> trackers.Reporter | None:
    recipe = cfg.recipe.to_dict()
    return trackers.reporter_for_cell(
        cfg.report_to,
        **cfg.cell_id().to_dict(),
        recipe=recipe,
        signature=signature(recipe),
        tracking_dir=tracking_dir(cfg),
    )


def _setup(
    cfg: CellConfig, loaded: LoadedModel | None, data, data_prov: dict | None
) -> ResolvedCell:
    """Resolve the task, device, data, model, tokenisation, schedule and provenance."""
    if cfg.dev_languages not in DEV_LANGUAGES:
        raise unknown_name("dev_languages setting", cfg.dev_languages, DEV_LANGUAGES)
    if cfg.out_json:
        validate_out_path(cfg.out_json)  # (also checked by `run` before any cell starts)
    knobs = task_knobs(cfg.task)
    device = resolve_device(cfg.device)
    recipe = cfg.recipe
    check_bf16(device, recipe.precision)
    apply_deterministic(recipe.deterministic)
    attn_environment = apply_sdpa_environment(device)  # before the first CUDA attention
    peak_scope = reset_peak_memory(device)  # the cell's own peak, from its data and model on
    process_cell = count_cell()
    note = _Progress(cfg.progress, None, cell_label(cfg)).note  # what happens before step 1
    eval_batch = recipe.eval_batch_size or EVAL_BATCH_SIZE.get(device.type, EVAL_BATCH_SIZE["cuda"])
    t0 = time.perf_counter()
    # Where the data comes from is resolved before it is read (for the Hub, the commit that
    # is then loaded), and before any training: a cell never trains and then fails on
    # bookkeeping.
    if data_prov is None:
        data_prov = data_provenance(cfg.task, cfg.data_dir)
    if data is None:
        data = load_task(
            cfg.task,
            cfg.data_dir,
            with_test=cfg.phase == "report",
            selection_split=recipe.selection_split,
        )
    train_split, val_splits, test_splits, num_labels, problem = limit_data(data, recipe.limit)
    kind = kind_for(problem, recipe)

    seed_everything(cfg.seed)  # before the model load: the fresh head's init is seeded
    if loaded is None:
        note(f"loading model {cfg.model_path} ({recipe.mode}) onto {device}")
        loaded = load_model(
            cfg.model_path,
            recipe.mode,
            num_labels,
            kind.problem,
            revision=cfg.model_revision,
            trust_remote_code=cfg.trust_remote_code,
            max_seq_len=recipe.max_seq_len,
            model_label=cfg.model_key,
            attention=recipe.attention,
            pooling=recipe.pooling,
            head_dropout=recipe.head_dropout,
            body_dropout=recipe.body_dropout,
            code_revision=cfg.model_code_revision,
            require_code_revision=cfg.require_code_revision,
        )
    model, tok = loaded.model.to(device), loaded.tokenizer
    if recipe.pad_multiple is not None:
        if recipe.pad_multiple < 1:
            raise HarnessError("--pad-multiple must be at least 1")
        if "attention_mask" not in loaded.input_names:
            raise HarnessError(
                f"--pad-multiple needs an attention mask to hide the padding, and {cfg.model_key}"
                f"'s inputs are {', '.join(loaded.input_names)}: run it without --pad-multiple"
            )
    if recipe.graph_step and recipe.compile:
        raise HarnessError(
            "--graph-step and --compile are two ways to replay CUDA graphs: use one of them"
        )
    compile_mode = compile_model(model, device) if recipe.compile else None
    cpu.warn_slow_bf16(device.type, recipe.precision)  # before the first step
    prov = {
        "software": provenance.software_versions(),
        "hardware": provenance.device_info(str(device), requested=cfg.device),
        "model_revision": loaded.revision,
        "model_revision_requested": cfg.model_revision,
        "model_source": loaded.source,
        "model_path": cfg.model_path if cfg.record_model_path else None,
        "trust_remote_code": cfg.trust_remote_code,
        "model_code": loaded.code,
        "data": data_prov,
        "dataset_revisions": {knobs.hf_path: data_prov.get("revision")} if knobs.hf_path else {},
    }
    max_len = recipe.max_seq_len
    cache_dir = None
    if cfg.cache_dir is not None:
        cache_dir = (
            tokencache.default_cache_dir() if cfg.cache_dir == "default" else Path(cfg.cache_dir)
        )
    tok_fp = tokencache.tokenizer_fingerprint(tok) if cache_dir is not None else None

    def tokenise(split: dict) -> Encoded:
        enc = encode_cached(tok, split, max_len, loaded.input_names, cache_dir, tok_fp)
        return kind.columns(enc, split)

    n_dev = sum(len(s["label"]) for s in val_splits.values())
    note(f"tokenising {len(train_split['label'])} training and {n_dev} dev examples")
    enc_train = tokenise(train_split)
    enc_val = {lang: tokenise(s) for lang, s in val_splits.items()}

    micro = recipe.micro_batch or recipe.batch_size
    if recipe.batch_size % micro:
        raise HarnessError(f"--micro-batch {micro} must divide the batch size {recipe.batch_size}")
    steps_per_epoch, max_steps = step_budget(kind.count_units(enc_train), recipe)
    deciding = metrics.deciding_languages(list(enc_val), knobs.euro_languages)
    return ResolvedCell(
        cfg=cfg,
        knobs=knobs,
        kind=kind,
        device=device,
        peak_scope=peak_scope,
        process_cell=process_cell,
        eval_batch=eval_batch,
        loaded=loaded,
        model=model,
        pad_id=tok.pad_token_id,
        prov=prov,
        tokenise=tokenise,
        enc_train=enc_train,
        enc_val=enc_val,
        test_splits=test_splits,
        loop_languages=deciding if cfg.dev_languages == "deciding" else list(enc_val),
        micro=micro,
        accum=recipe.batch_size // micro,
        steps_per_epoch=steps_per_epoch,
        max_steps=max_steps,
        warmup=int(recipe.warmup_ratio * max_steps),
        every=eval_interval(steps_per_epoch, max_steps, recipe),
        t0=t0,
        shapes=Shapes(recipe.pad_multiple, max_len, graphs=compile_mode == "reduce-overhead"),
        compile_mode=compile_mode,
        attn_environment=attn_environment,
    )


# How many training steps may pass between two reads of the loss on the host. Reading it
# waits for the device to finish every step queued before (a GPU step whose host work is
# most of its time then idles the GPU while the next batch is prepared), so it is read at
# the first step, at each evaluation, at least this often, and at the end. A loss that is
# not finite is found at the next read: the cell is recorded diverged at the step that
# produced it, as though it had stopped there (what ran after it is discarded).
LOSS_READ_EVERY = 32


@dataclass
class _Pending:
    """A training step whose loss is still on the device: its number, the epoch it was drawn
    in, the loss and the learning rate it ran with."""

    step: int
    epoch: int
    loss: torch.Tensor
    lr: float


def _train(cell: ResolvedCell, stop: StopFlag) -> Trained:
    """Fine-tune with dev evaluations on the deciding languages and early stopping; on a
    stop signal, save a resumable state (with --out-json) and raise Preempted/Interrupted."""
    cfg, recipe, model, kind = cell.cfg, cell.cfg.recipe, cell.model, cell.kind
    enc_train, max_steps = cell.enc_train, cell.max_steps
    optimizer = _graph_setup(cell) if recipe.graph_step else None
    optimizer = optimizer or build_optimizer(model, recipe, cfg.lr)
    schedule = _lr_lambda(cell.warmup, max_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    data_rng = random.Random(cfg.seed)
    label = cell_label(cfg)
    progress = _Progress(cfg.progress, max_steps, label)

    model.train()
    st = LoopState()
    resume_path = resume_state_path(cfg.out_json)
    signature = resume_signature(cfg, cell.loaded.revision)
    if resume_path is not None and resume_path.exists():
        st = restore_resume(
            resume_path, signature, model, optimizer, scheduler, data_rng, st, label
        )
        if cell.graph is not None:
            cell.graph.hold_lr()
    diverged_at = None
    pending: list[_Pending] = []
    in_precision = lambda: autocast(cell.device, recipe.precision)  # noqa: E731
    progress.note(
        f"training: {max_steps} steps of {recipe.batch_size}, dev every {cell.every} steps",
        step=st.step,
    )
    t_train = time.perf_counter()
    first_step_s = process_first_step_s = None
    while st.step < max_steps and not st.early_stopped:
        if stop.signal is not None:
            diverged_at = _read_losses(cell, st, pending, progress)
            if diverged_at is not None:
                break
            progress.close()
            stop_kind, how = stop_reason(stop.signal)
            if resume_path is None:
                raise stop_kind(
                    f"{label}: stopped by {how} at step {st.step}; no --out-json, "
                    "so no state was saved"
                )
            st.train_time_before += time.perf_counter() - t_train
            save_resume(resume_path, signature, st, model, optimizer, scheduler, data_rng)
            raise stop_kind(
                f"{label}: stopped by {how} at step {st.step}; state saved to "
                f"{resume_path}; run the cell again to resume (the same command)"
            )
        if not st.batches:
            st.batches = epoch_batches(enc_train, kind, recipe, data_rng)
            st.epoch += 1
        idx = st.batches.pop(0)
        lr = scheduler.get_last_lr()[0]
        if isinstance(lr, torch.Tensor):  # the graph step's device tensor: not read back
            lr = cfg.lr * schedule(st.step)
        step_loss = _step_fitting_memory(cell, st, idx, optimizer, in_precision, label)
        scheduler.step()
        st.step += 1
        pending.append(_Pending(st.step, st.epoch, step_loss, lr))
        evaluated = st.step % cell.every == 0 or st.step == max_steps
        progress.advance()
        if first_step_s is None or evaluated or len(pending) >= LOSS_READ_EVERY:
            diverged_at = _read_losses(cell, st, pending, progress)
            if diverged_at is not None:
                break
        if first_step_s is None:
            first_step_s = time.perf_counter() - cell.t0
            process_first_step_s = seconds_since_process_start()
            progress.note(f"step 1 done, loss {st.last_loss:.4f}", step=st.step)
        if evaluated:
            dev_mean = _evaluate(cell, st)
            progress.event(step=st.step, loss=st.last_loss, dev=dev_mean)
            progress.show(st.last_loss, dev_mean)
            if cell.reporter is not None:
                curves = {"dev/mean": dev_mean}
                curves.update({f"dev/{k}": v for k, v in st.last_per_language.items()})
                cell.reporter.log(st.step, curves)
    if diverged_at is None:
        diverged_at = _read_losses(cell, st, pending, progress)
    progress.close()
    # The gradients go now, not with the optimizer: scoring needs none of them.
    optimizer.zero_grad(set_to_none=True)
    train_time = st.train_time_before + time.perf_counter() - t_train
    return Trained(st, diverged_at, train_time, first_step_s, process_first_step_s)


def _read_losses(
    cell: ResolvedCell, st: LoopState, pending: list[_Pending], progress: _Progress
) -> int | None:
    """Read the losses of the `pending` steps on the host (one wait for the device), send
    them to the trackers, and empty the list. A loss that is not finite ends training at
    its step: the loop state is put back to the step before it (its number and epoch; what
    ran after it is discarded with the cell) and that step is returned, else None."""
    if not pending:
        return None
    values = torch.stack([p.loss.float() for p in pending]).tolist()
    diverged_at = None
    for p, value in zip(pending, values, strict=True):
        if not math.isfinite(value):
            diverged_at = p.step
            st.step, st.epoch = p.step - 1, p.epoch
            break
        st.last_loss = value
        if cell.reporter is not None:
            cell.reporter.log(p.step, {"train/loss": value, "train/lr": p.lr})
    pending.clear()
    if diverged_at is None:
        progress.show(st.last_loss, None)
    return diverged_at


def _graph_setup(cell: ResolvedCell) -> torch.optim.Optimizer | None:
    """--graph-step: the cell's `GraphStep` and its optimizer (capturable fused AdamW, the
    learning rate a device tensor); None where it cannot run (`graph_step.unavailable`: the
    cell runs eagerly, bit for bit as without the setting, saying so in one line)."""
    cfg, recipe = cell.cfg, cell.cfg.recipe
    why = graph_step.unavailable(cell.device, cell.kind, cell.model)
    if why is not None:
        cell.graph_run = {"graphs": 0, "shapes": 0, "fallback": why}
        print(
            f"warning: {cell_label(cfg)}: --graph-step: {why}; eager steps (recorded in "
            "recipe.graph_step_run)",
            file=sys.stderr,
            flush=True,
        )
        return None
    groups = _param_groups(cell.model, recipe.weight_decay)
    optimizer = graph_step.graph_optimizer(groups, recipe, cfg.lr, cell.device)
    in_precision = lambda: autocast(cell.device, recipe.precision, cache=False)  # noqa: E731
    cell.graph = graph_step.GraphStep(
        cell.kind, cell.model, optimizer, in_precision, cell.device, cell_label(cfg)
    )
    return optimizer


def _graph_attempt(cell: ResolvedCell, idx: list, micro: int) -> tuple[torch.Tensor, int] | None:
    """The step of the batch `idx` through the cell's graph step (`GraphStep.run`), with its
    real tokens; None where it does not run (off, fallen back, accumulation): the eager step
    then runs."""
    graph = cell.graph
    if graph is None or not graph.active(len(idx), micro):
        return None
    kind, enc = cell.kind, cell.enc_train
    batch = cell.shapes.pad(
        kind.collate_units(enc, idx, cell.pad_id, cell.device), enc, cell.pad_id
    )
    watch = not cell.attn_backend  # the first step: a shape's first meeting runs eagerly
    with observe_backend(cell.model, cell.attn_backend) if watch else nullcontext():
        loss = graph.run(batch)
    if loss is None:
        return None
    return loss, sum(enc.lengths[i] for u in idx for i in kind.members(u))


def _accumulate(
    cell: ResolvedCell, idx: list, micro: int, in_precision: Autocast
) -> tuple[torch.Tensor, int]:
    """Forward, loss and backward of the batch of units `idx` in micro-batches of `micro`
    units, each backed by its share of the batch loss so the gradients add up to the batch's;
    returns the batch loss (on the device: not read here) and its real tokens."""
    kind, enc = cell.kind, cell.enc_train
    step_loss, tokens = None, 0
    for m in range(0, len(idx), micro):
        sub = idx[m : m + micro]
        batch = cell.shapes.pad(
            kind.collate_units(enc, sub, cell.pad_id, cell.device), enc, cell.pad_id
        )
        cell.shapes.step_begin()
        watch = not cell.attn_backend and cell.compile_mode is None  # the first forward
        with observe_backend(cell.model, cell.attn_backend) if watch else nullcontext():
            loss = kind.train_step(cell.model, batch, len(sub) / len(idx), in_precision)
        step_loss = loss if step_loss is None else step_loss + loss
        tokens += sum(enc.lengths[i] for u in sub for i in kind.members(u))
    return step_loss, tokens


def _step_fitting_memory(
    cell: ResolvedCell, st: LoopState, idx: list, optimizer, in_precision: Autocast, label: str
) -> torch.Tensor:
    """One step: accumulated gradients (`_accumulate`) and the optimizer's update; returns
    the loss, on the device. Out of memory (`device.is_out_of_memory`), in the forward, the
    backward or the optimizer step (AdamW allocates its state at the first one), the step is
    retried from a clean slate with the micro-batch halved (gradient accumulation doubled:
    the same effective batch, so the same update): the failed attempt's gradients are zeroed
    and the random state is put back, so the retried step computes what a cell started at
    that micro-batch computes. The smaller micro-batch holds for the rest of the cell; it is
    recorded (`training.oom_retries`, `training.micro_batch_used`). Out of memory at a
    micro-batch of 1, or in an optimizer step that had already updated some weights,
    re-raises, saying so."""
    rng = device_rng_state(cell.device)
    while True:
        micro = st.micro or cell.micro
        # The graph step keeps the gradients at their addresses (`graph_step`): zeroed there.
        optimizer.zero_grad(set_to_none=cell.graph is None)
        in_optimizer = False
        try:
            graphed = _graph_attempt(cell, idx, micro)
            if graphed is not None:
                st.real_tokens += graphed[1]
                return graphed[0]
            step_loss, tokens = _accumulate(cell, idx, micro, in_precision)
            in_optimizer = True
            optimizer.step()
            st.real_tokens += tokens
            return step_loss
        except Exception as exc:
            if not gpu.is_out_of_memory(exc):
                raise
            where = "in the optimizer step " if in_optimizer else ""
            if in_optimizer and _optimizer_advanced(optimizer, st.step):
                exc.add_note(
                    f"{label}: out of memory {where}at step {st.step + 1} after it had "
                    "updated some of the weights, so the step cannot be retried; use a "
                    "device with more memory"
                )
                raise
            if min(micro, len(idx)) <= 1:
                exc.add_note(
                    f"{label}: out of memory {where}at step {st.step + 1} with a micro-batch "
                    f"of 1 (after {st.oom_retries} retries with smaller micro-batches): "
                    "this model does not fit this device at this sequence length; use "
                    "a device with more memory"
                )
                raise
        # Outside the except block, so the failed attempt's graph (held by the traceback) is
        # already freed; its gradients go now (and with them the addresses a graph step's
        # graphs write to: it runs eagerly from here on).
        optimizer.zero_grad(set_to_none=True)
        if cell.graph is not None and cell.graph.fallback is None:
            cell.graph.give_up("out of memory: micro-batches from here on")
        release_cached_memory(cell.device)
        set_device_rng_state(cell.device, rng)
        st.micro = smaller_divisor(cell.cfg.recipe.batch_size, min(micro, len(idx)) // 2)
        st.oom_retries += 1
        print(
            f"warning: {label}: out of memory {where}at step {st.step + 1} with a micro-batch "
            f"of {micro}; retrying the step with {st.micro} (gradient accumulation "
            f"{cell.cfg.recipe.batch_size // st.micro}: the same effective batch of "
            f"{cell.cfg.recipe.batch_size}, recorded in training.oom_retries)",
            file=sys.stderr,
            flush=True,
        )


def _optimizer_advanced(optimizer: torch.optim.Optimizer, steps_done: int) -> bool:
    """Whether a failed optimizer step had already updated some parameters: their AdamW
    step count went past the `steps_done` steps the loop completed (state allocated but
    not yet used still counts `steps_done`). Read only after an out-of-memory error."""
    return any(
        float(state["step"]) > steps_done for state in optimizer.state.values() if "step" in state
    )


def _evaluate(cell: ResolvedCell, st: LoopState) -> float | None:
    """One dev evaluation during training: score the deciding languages, record it, keep the
    weights when it is a new best, and count patience; returns the dev mean."""
    per_lang, undefined = cell.dev_scores(cell.loop_languages)
    dev_mean, _ = metrics.language_mean(per_lang, cell.knobs.euro_languages)
    st.history.append({"step": st.step, "dev": dev_mean, "loss": st.last_loss})
    st.last_per_language, st.last_undefined = per_lang, undefined
    st.last_predictions = cell.last_dev_predictions
    # An undefined dev score (constant predictions) never counts as a best.
    if metrics.improves(dev_mean, st.best_mean, cell.knobs.metric):
        st.best_mean, st.best_step = dev_mean, st.step
        st.best_per_language, st.best_undefined = per_lang, undefined
        st.best_predictions = cell.last_dev_predictions
        keep_best_weights(st, cell.model.state_dict())
        st.bad_evals = 0
    else:
        st.bad_evals += 1
        # Patience running out at the last allowed step is the cap ending training, not an
        # early stop.
        recipe = cell.cfg.recipe
        if recipe.early_stop and st.bad_evals >= recipe.patience and st.step < cell.max_steps:
            st.early_stopped = True
    return dev_mean


def keep_best_weights(st: LoopState, state: dict[str, torch.Tensor]) -> None:
    """Keep a host-memory copy of the weights `state` as `st.best_state`: written into the
    tensors of the earlier copy when it has the same entries, else made after the earlier
    copy is let go, so host memory never holds two copies of the model (28 GB for XLM-R XL,
    per worker)."""
    kept, st.best_state = st.best_state, None
    if (
        kept is not None
        and kept.keys() == state.keys()
        and all(kept[k].shape == v.shape and kept[k].dtype == v.dtype for k, v in state.items())
    ):
        for k, v in state.items():
            kept[k].copy_(v.detach())
        st.best_state = kept
        return
    del kept
    st.best_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
