"""One cell, top to bottom: load, tokenise, fine-tune with early stopping, score, write.

The loop is written out rather than delegated to `transformers.Trainer` so that the
protocol is visible in one file: fp32 master weights, bf16 autocast for the forward
pass, AdamW with the shared recipe, linear warmup and decay, evaluation on dev at a
fixed cadence, early stopping, best weights restored in memory, then the report split.
`run_cell` runs four parts in turn: `_setup` (task, device, data, model, tokenisation and
provenance, all before the first step), `_train` (the loop), `_score` (dev and report
sections) and `_result` (the result dict). What differs between kinds of cell (batching,
loss, predictions, scoring, what the predictions file and the files beside the result
hold) comes from the cell's `kinds.Kind`; the loop has no branch per kind.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch import nn

from encoder_eval.cells import trackers
from encoder_eval.cells.encoding import Encoded, autocast, encode_cached
from encoder_eval.cells.kinds import Autocast, Kind, beside_result, kind_for
from encoder_eval.cells.predictions import (
    PredictionsError,
    predictions_path,
    write_predictions,
)
from encoder_eval.cells.predictions import from_cell as predictions_from_cell
from encoder_eval.core import cpu, heap, metrics, provenance
from encoder_eval.core import device as gpu
from encoder_eval.core.errors import (
    EXIT_INTERRUPTED as EXIT_INTERRUPTED,  # re-exported for older imports
)
from encoder_eval.core.errors import EXIT_PREEMPTED as EXIT_PREEMPTED
from encoder_eval.core.errors import HarnessError, Interrupted, Preempted, unknown_name
from encoder_eval.core.fileio import atomic_open, check_output_file, temporary_name
from encoder_eval.core.progress import progress_line, stop_line
from encoder_eval.core.protocol import (
    PROTOCOL_RECIPE,
    Recipe,
    off_protocol_reasons,
    signature,
    step_budget,
)
from encoder_eval.core.results import (
    EXCL_SUFFIX,
    LOCK_PREFIX,
    RESUME_PREFIX,
    RESUME_SUFFIX,
    lr_key,
    write_json_atomic,
)
from encoder_eval.core.schema import CellId, CellResult, Protocol, ScoreSection, Training
from encoder_eval.data import tokencache
from encoder_eval.data.limit import limit_data
from encoder_eval.data.loaders import LoadedModel, load_model
from encoder_eval.data.sources import data_provenance
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.tasks import TaskKnobs, task_knobs

# Which dev languages each evaluation during training scores: "deciding", those whose mean
# decides early stopping and the best checkpoint (the rest are scored once, at the end, on
# the kept weights); "all", every language at every evaluation (the same numbers, slower).
DEV_LANGUAGES = ("deciding", "all")


@dataclass
class CellConfig:
    """Everything that defines one cell; the CLI in `run.py` fills it from flags. What makes
    cells comparable (loader mode, batching, micro-batch, evaluation batch) is the recipe's."""

    model_path: str
    task: str
    lr: float
    seed: int
    model_key: str
    phase: str = "report"
    recipe: Recipe = field(default_factory=Recipe)
    data_dir: str | None = None
    device: str = "auto"
    out_json: str | None = None
    model_revision: str | None = None
    model_code_revision: str | None = None  # remote code held by another repository
    require_code_revision: bool = False  # refuse such code unless model_code_revision pins it
    trust_remote_code: bool = False
    record_model_path: bool = False
    save_predictions: bool = True  # report cells only: `encoder_eval.cells.predictions`
    progress: str = "bar"  # bar | quiet | json
    cache_dir: str | None = "default"  # tokenisation cache; None disables it
    dev_languages: str = "deciding"  # or "all" (DEV_LANGUAGES; benchmarks only)
    report_to: tuple[str, ...] = ()  # experiment trackers (`trackers.TRACKERS`); none by default
    tracking_dir: str | None = None  # their files; default: `tracking/` beside out_json


def resolve_device(device: str) -> torch.device:
    """The device a cell runs on, with its index (`cuda:0`), as the result records it.
    `auto` picks CUDA/ROCm when present, else the CPU, saying so on stderr when a GPU should
    be here (`device.expected_gpu`); `cuda` without a GPU is an error."""
    if device not in ("auto", "cuda", "cpu"):
        raise HarnessError(f"unknown device {device!r}; valid: auto, cuda, cpu")
    if device == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if device == "auto":
        gpu.warn_cpu_fallback(gpu.expected_gpu())
        return torch.device("cpu")
    why = gpu.expected_gpu()
    raise HarnessError(
        "--device cuda but no CUDA or ROCm GPU is visible to torch "
        f"{torch.__version__}{f' (although {why})' if why else ''}; check the driver against "
        "this torch build (ROCm: docs/install.md), or use --device cpu"
    )


def check_bf16(device: torch.device, precision: str) -> None:
    """Refuse bf16 autocast on a GPU torch says cannot run it, where torch would turn
    autocast off with a warning and train in fp32 while the recipe says bf16; warn on one
    that only emulates it (V100, T4 on recent torch: slow, recorded as
    `hardware.gpu_native_bf16` false)."""
    if device.type != "cuda" or not cpu.is_bf16(precision):
        return
    name = torch.cuda.get_device_name(device)
    if not torch.cuda.is_bf16_supported():
        raise HarnessError(
            f"{name} cannot run bf16 autocast (the protocol's precision), and torch would "
            "silently train in fp32; use a GPU with bf16 (Ampere or newer, MI200 or newer), "
            "or --precision fp32 (off-protocol)"
        )
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the argument: no emulation to tell apart
        native = True
    if not native and name not in _WARNED_BF16:
        _WARNED_BF16.add(name)
        print(
            f"warning: {name} has no native bf16: torch emulates bf16 autocast on it, slowly "
            "(recorded as provenance.hardware.gpu_native_bf16 false); --precision fp32 is "
            "faster there, but off-protocol",
            file=sys.stderr,
            flush=True,
        )


_WARNED_BF16: set[str] = set()  # the GPUs this process has warned for (one line each)


def attn_implementation(model: nn.Module) -> str | None:
    """The attention implementation the model's transformers body runs
    (`config._attn_implementation`: sdpa, eager, flash_attention_2, ...); None for a model
    without a transformers config (a loader plug-in's own module)."""
    for part in (model, getattr(model, "body", None)):
        config = getattr(part, "config", None)
        value = getattr(config, "_attn_implementation", None)
        if isinstance(value, str):
            return value
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


# ----------------------------------------------------------------------------- data


def _collate(
    enc: Encoded, idx: list[int], pad_id: int, device, kind: Kind, shapes: Shapes | None = None
) -> dict:
    """The batch of examples `idx` for `kind` (the one call `predict` batches through, so a
    benchmark can count the tokens of every batch), its width bucketed by `shapes`."""
    batch = kind.collate(enc, idx, pad_id, device)
    return batch if shapes is None else shapes.pad(batch, enc, pad_id)


def bucket_width(width: int, multiple: int | None, cap: int) -> int:
    """The width a batch whose longest row has `width` tokens is padded to: rounded up to a
    multiple of `multiple` (`Recipe.pad_multiple`; None or 1 leaves it), at most `cap` (the
    recipe's max_seq_len, which truncation already bounds every row by), never below `width`."""
    if not multiple or multiple <= 1:
        return width
    return max(width, min(cap, -(-width // multiple) * multiple))


@dataclass(frozen=True)
class Shapes:
    """How a cell shapes its batches for speed (issue 38, item 7): widths padded up to a
    multiple of `pad_multiple` tokens, at most `cap`, so a compiled model meets a few shapes
    instead of one per width; and whether the compiled model replays CUDA graphs (`graphs`),
    where each forward starts a new graph step. Padding is invisible to the model: the
    attention mask hides it, as it hides the padding to a batch's longest row."""

    pad_multiple: int | None = None
    cap: int = 0
    graphs: bool = False

    def pad(self, batch: dict, enc: Encoded, pad_id: int) -> dict:
        """`batch` (a `Kind.collate` batch of `enc`) with its model inputs right-padded to
        `bucket_width`: input ids with the pad id, every other input with 0, as
        `kinds.pad_features` pads; labels untouched."""
        width = batch["input_ids"].shape[-1]
        extra = bucket_width(width, self.pad_multiple, self.cap) - width
        if extra <= 0:
            return batch
        for name in enc.features:
            if name in batch:
                fill = pad_id if name == "input_ids" else 0
                batch[name] = nn.functional.pad(batch[name], (0, extra), value=fill)
        return batch

    def step_begin(self) -> None:
        """Before each forward: with CUDA graphs, mark a new step, so a replay never
        overwrites outputs a step before it still reads."""
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()


# torch.compile's mode by device type (`Recipe.compile`): CUDA graphs on a GPU, where a
# step's few thousand kernel launches are the host's work, replayed in one call; on the CPU
# inductor's default mode (fused C++ kernels; CUDA graphs do not exist there).
COMPILE_MODES = {"cuda": "reduce-overhead", "cpu": "default"}


def compile_model(model: nn.Module, device: torch.device) -> str:
    """torch.compile `model` in place (`nn.Module.compile`: its state dict keeps its keys,
    so best weights, resume state and predictions are untouched) and return the mode. Dynamic
    shapes are left to torch (a second width makes the graph dynamic; CUDA graphs record one
    graph per shape, which `Recipe.pad_multiple` keeps few). `fallback_random`: dropout
    draws from torch's generator as the eager model does, so the random state (seeded, put
    back by an out-of-memory retry, saved for resume) means what it means without compiling.
    What compiling needs is checked now, before any step (a clear error, not a crash later)."""
    mode = COMPILE_MODES.get(device.type, COMPILE_MODES["cuda"])
    _check_compiler(device)
    import torch._inductor

    options = {**torch._inductor.list_mode_options(mode), "fallback_random": True}
    model.compile(options=options)
    return mode


def _check_compiler(device: torch.device) -> None:
    """Refuse --compile where inductor cannot build kernels: on the CPU without a C++
    compiler, on a GPU without triton."""
    if device.type == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as exc:
            raise HarnessError(
                "--compile on the CPU needs a C++ compiler for torch's inductor, and none was "
                f"found ({type(exc).__name__}; it looks for $CXX, else g++): install one, or "
                "run without --compile (the same scores within float noise)"
            ) from exc
        return
    from torch.utils._triton import has_triton

    if not has_triton():
        raise HarnessError(
            f"--compile on {device} needs triton (installed with CUDA and ROCm torch "
            "wheels), which this environment lacks: install it, or run without --compile"
        )


def forget_compiled() -> None:
    """Drop every compiled graph of this process (and their CUDA graphs' memory): a cell
    that compiled leaves nothing to the next, whose compile reads inductor's disk cache."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


@contextlib.contextmanager
def _compile_failures(cfg: CellConfig):
    """Turn a failure of torch.compile (tracing or building kernels, at the first step or at
    a new shape) into a one-line error that names the way out; never a silent fall back to
    the uncompiled model."""
    if not cfg.recipe.compile:
        yield
        return
    from torch._dynamo.exc import TorchDynamoException

    try:
        yield
    except TorchDynamoException as exc:
        if gpu.is_out_of_memory(exc):
            raise
        text = " ".join(str(exc).split())[:300] or "no message"
        raise HarnessError(
            f"{_label(cfg)}: torch.compile failed ({type(exc).__name__}: {text}); the cell "
            "stopped and wrote no result: run it without --compile (the same scores within "
            "float noise)"
        ) from exc


def train_batches(lengths: list[int], batch_size: int, rng: random.Random, grouped: bool):
    """One epoch of training batches (lists of example indices), deterministic given `rng`.

    Length-grouped: shuffle, cut into mega-batches of 50 batches, sort each by length,
    cut into batches and shuffle the batch order; padding then wastes little compute while
    every epoch still sees a fresh random grouping.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if not grouped:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    mega = batch_size * 50
    batches = []
    for start in range(0, len(order), mega):
        chunk = sorted(order[start : start + mega], key=lambda i: -lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


# ----------------------------------------------------------------------------- model step


@torch.no_grad()
def predict(
    model,
    enc: Encoded,
    pad_id: int,
    device,
    precision: str,
    batch_size: int,
    kind: Kind,
    shapes: Shapes | None = None,
):
    """Predictions for every example, in the split's original order. Batches are
    length-sorted, longest first, so an evaluation that runs out of memory does so at its
    first batch, not its last; `shapes` buckets their widths."""
    model.eval()
    order = sorted(range(len(enc.labels)), key=lambda i: -enc.lengths[i])
    preds: list = [None] * len(order)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = _collate(enc, idx, pad_id, device, kind, shapes)
        batch.pop("labels")
        if shapes is not None:
            shapes.step_begin()
        with autocast(device, precision):
            logits = model(**batch).logits
        for i, value in zip(idx, kind.predictions(logits), strict=True):
            preds[i] = value
    model.train()
    return preds


# Evaluation batch by device type. Batches are length-sorted, so padding is small either
# way; a GPU is fastest with large batches, while on the CPU (bf16 autocast, MiniLM, RTE
# dev) batches of 8-32 scored the split in 1.7-1.9 s against 3.0 s with 128. Predictions
# do not depend on it beyond bf16 rounding (max |logit difference| 6e-4, same argmax).
EVAL_BATCH_SIZE = {"cuda": 128, "cpu": 16}


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


def eval_interval(steps_per_epoch: int, max_steps: int, recipe: Recipe = PROTOCOL_RECIPE) -> int:
    """Dev evaluation cadence: once an epoch, but at least every `recipe.eval_every_max` steps
    on large tasks, and at least `recipe.min_evals_when_capped` times when max_steps ends
    training early."""
    cap_every = math.ceil(max_steps / recipe.min_evals_when_capped)
    return max(1, min(steps_per_epoch, recipe.eval_every_max, cap_every))


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


def _score_section(scores: dict, undefined: dict, euro: tuple[str, ...]) -> dict:
    mean, langs = metrics.language_mean(scores, euro)
    return {
        "per_language": scores,
        "mean": mean,
        "languages_in_mean": langs,
        "undefined": undefined,
    }


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


def release_memory() -> None:
    """Free what no cell holds any more: reference cycles (a model stays in one after its
    cell, through transformers' lazy import frames, until the cyclic collector runs), the
    CUDA caching allocator's free blocks and the CPU heap's free pages."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    heap.release_free_heap()


def _run_cell_stoppable(
    cfg: CellConfig, loaded: LoadedModel | None, data, data_prov: dict | None
) -> dict:
    """`run_cell` under `_stop_requests`: a stop signal becomes Preempted or Interrupted."""
    with _stop_requests() as stop:
        try:
            result = _run_cell(cfg, loaded, data, data_prov, stop)
        except Preempted:
            raise
        except Exception as exc:
            if stop.signal is None:
                raise
            kind, how = _stop_kind(stop.signal)
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise kind(
                f"{_label(cfg)}: stopped by {how}, but the cell could not be saved "
                f"({why}); nothing new was saved for it; run the same command again "
                "once that is fixed"
            ) from exc
        if stop.signal is not None:
            kind, how = _stop_kind(stop.signal)
            raise kind(
                f"{_label(cfg)}: {how} arrived after training; the result is written "
                f"to {cfg.out_json}; run the same command again for any remaining "
                "cells"
            )
    return result


def _label(cfg: CellConfig) -> str:
    return f"{cfg.model_key}/{cfg.task}/{lr_key(cfg.lr)}/s{cfg.seed}"


def _stop_kind(signum: int) -> tuple[type, str]:
    if signum == signal.SIGINT:
        return Interrupted, "Ctrl-C (SIGINT)"
    return Preempted, "SIGTERM"


def _run_cell(
    cfg: CellConfig, loaded: LoadedModel | None, data, data_prov: dict | None, stop: _StopFlag
) -> dict:
    cell = _setup(cfg, loaded, data, data_prov)
    cell.reporter = _reporter(cfg)
    try:
        with _compile_failures(cfg):
            trained = _train(cell, stop)
            scored = _score(cell, trained)
        result = _result(cell, trained, scored)
        _write(cfg, cell.kind, result, scored.predictions)
    except BaseException:
        if cell.reporter is not None:
            cell.reporter.finish({}, status="failed")
        raise
    if cell.reporter is not None:
        cell.reporter.finish(_final_metrics(result), status=result["status"])
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
        model=cfg.model_key,
        task=cfg.task,
        lr=cfg.lr,
        lr_key=lr_key(cfg.lr),
        seed=cfg.seed,
        phase=cfg.phase,
        recipe=recipe,
        signature=signature(recipe),
        tracking_dir=tracking_dir(cfg),
    )


def _final_metrics(result: dict) -> dict[str, float | None]:
    """The scores a tracker shows as the cell's outcome: dev and report means, per language."""
    out: dict[str, float | None] = {}
    for name in ("dev", "report"):
        section = result.get(name) or {}
        out[f"{name}/mean"] = section.get("mean")
        for lang, score in (section.get("per_language") or {}).items():
            out[f"{name}/{lang}"] = score
    out["best_step"] = result["training"]["best_step"]
    out["steps"] = result["training"]["steps"]
    return out


@dataclass
class _Cell:
    """Everything a cell resolves before its first step (`_setup`), and the dev scorer."""

    cfg: CellConfig
    knobs: TaskKnobs
    kind: Kind
    device: torch.device
    eval_batch: int
    loaded: LoadedModel
    model: nn.Module
    pad_id: int
    prov: dict
    tokenise: Callable[[dict], Encoded]
    enc_train: Encoded
    enc_val: dict[str, Encoded]
    test_splits: dict[str, dict]
    loop_languages: list[str]  # the dev languages each evaluation during training scores
    micro: int
    accum: int
    steps_per_epoch: int
    max_steps: int
    warmup: int
    every: int
    t0: float
    shapes: Shapes = field(default_factory=Shapes)  # bucketed widths, CUDA graphs
    compile_mode: str | None = None  # torch.compile's mode (`Recipe.compile`), else None
    dev_eval_seconds: float = 0.0  # time spent scoring dev, in the loop and at the end
    reporter: trackers.Reporter | None = None  # --report-to: the cell's tracker runs

    last_dev_predictions: dict = field(default_factory=dict)  # of the last `dev_scores`
    # The evaluation batch in use: `eval_batch` until out of memory halves it (for the rest of
    # the cell), and how many times it did (`training.eval_batch_used`, `eval_oom_retries`).
    eval_batch_used: int = 0
    eval_oom_retries: int = 0

    def predict(self, enc: Encoded) -> list:
        """Predictions for every example of `enc`. Out of memory, the split is scored again
        from its start with the evaluation batch halved, so each split's predictions come
        from one batch size; out of memory at a batch of 1 re-raises, saying so."""
        while True:
            size = self.eval_batch_used or self.eval_batch
            try:
                return predict(
                    self.model,
                    enc,
                    self.pad_id,
                    self.device,
                    self.cfg.recipe.precision,
                    size,
                    self.kind,
                    self.shapes,
                )
            except Exception as exc:
                if not gpu.is_out_of_memory(exc):
                    raise
                if min(size, len(enc.labels)) <= 1:
                    exc.add_note(
                        f"{_label(self.cfg)}: out of memory in evaluation with a batch "
                        "of 1: this model does not fit this device at this sequence "
                        "length; use a device with more memory"
                    )
                    raise
            _release_cached_memory(self.device)  # outside the except block: the graph is freed
            self.eval_batch_used = max(1, min(size, len(enc.labels)) // 2)
            self.eval_oom_retries += 1
            print(
                f"warning: {_label(self.cfg)}: out of memory in evaluation with a batch of "
                f"{size}; scoring the split again with {self.eval_batch_used} (recorded in "
                "training.eval_oom_retries)",
                file=sys.stderr,
                flush=True,
            )

    def dev_scores(self, langs: list[str]) -> tuple[dict[str, float | None], dict[str, str]]:
        """Score the current weights on the dev split of each language in `langs` (the
        predictions are kept in `last_dev_predictions`)."""
        t = time.perf_counter()
        preds = {lang: self.predict(self.enc_val[lang]) for lang in langs}
        out = self.kind.score(self.knobs.metric, preds, {k: self.enc_val[k] for k in langs})
        self.last_dev_predictions = preds
        self.dev_eval_seconds += time.perf_counter() - t
        return out


def _setup(cfg: CellConfig, loaded: LoadedModel | None, data, data_prov: dict | None) -> _Cell:
    """Resolve the task, device, data, model, tokenisation, schedule and provenance."""
    if cfg.dev_languages not in DEV_LANGUAGES:
        raise unknown_name("dev_languages setting", cfg.dev_languages, DEV_LANGUAGES)
    if cfg.out_json:
        validate_out_path(cfg.out_json)  # (also checked by `run` before any cell starts)
    knobs = task_knobs(cfg.task)
    device = resolve_device(cfg.device)
    recipe = cfg.recipe
    check_bf16(device, recipe.precision)
    note = _Progress(cfg.progress, None, _label(cfg)).note  # what happens before step 1
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
    return _Cell(
        cfg=cfg,
        knobs=knobs,
        kind=kind,
        device=device,
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
    )


@dataclass
class _Trained:
    """What the training loop hands to scoring and the result."""

    st: _LoopState
    diverged_at: int | None
    train_time: float
    first_step_s: float | None
    process_first_step_s: float | None


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


def _train(cell: _Cell, stop: _StopFlag) -> _Trained:
    """Fine-tune with dev evaluations on the deciding languages and early stopping; on a
    stop signal, save a resumable state (with --out-json) and raise Preempted/Interrupted."""
    cfg, recipe, model, kind = cell.cfg, cell.cfg.recipe, cell.model, cell.kind
    enc_train, max_steps = cell.enc_train, cell.max_steps
    optimizer = build_optimizer(model, recipe, cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cell.warmup, max_steps))
    data_rng = random.Random(cfg.seed)
    label = _label(cfg)
    progress = _Progress(cfg.progress, max_steps, label)

    if cell.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(cell.device)
    model.train()
    st = _LoopState()
    resume_path = _resume_path(cfg.out_json)
    signature = _signature(cfg, cell.loaded.revision)
    if resume_path is not None and resume_path.exists():
        st = _restore(resume_path, signature, model, optimizer, scheduler, data_rng, st, label)
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
            stop_kind, how = _stop_kind(stop.signal)
            if resume_path is None:
                raise stop_kind(
                    f"{label}: stopped by {how} at step {st.step}; no --out-json, "
                    "so no state was saved"
                )
            st.train_time_before += time.perf_counter() - t_train
            _save_resume(resume_path, signature, st, model, optimizer, scheduler, data_rng)
            raise stop_kind(
                f"{label}: stopped by {how} at step {st.step}; state saved to "
                f"{resume_path}; run the cell again to resume (the same command)"
            )
        if not st.batches:
            st.batches = _epoch_batches(enc_train, kind, recipe, data_rng)
            st.epoch += 1
        idx = st.batches.pop(0)
        lr = scheduler.get_last_lr()[0]
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
            process_first_step_s = _seconds_since_process_start()
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
    return _Trained(st, diverged_at, train_time, first_step_s, process_first_step_s)


def _read_losses(
    cell: _Cell, st: _LoopState, pending: list[_Pending], progress: _Progress
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


def _accumulate(
    cell: _Cell, idx: list, micro: int, in_precision: Autocast
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
        loss = kind.train_step(cell.model, batch, len(sub) / len(idx), in_precision)
        step_loss = loss if step_loss is None else step_loss + loss
        tokens += sum(enc.lengths[i] for u in sub for i in kind.members(u))
    return step_loss, tokens


def _step_fitting_memory(
    cell: _Cell, st: _LoopState, idx: list, optimizer, in_precision: Autocast, label: str
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
    rng = _rng_state(cell.device)
    while True:
        micro = st.micro or cell.micro
        optimizer.zero_grad(set_to_none=True)
        in_optimizer = False
        try:
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
        # already freed; its gradients go now.
        optimizer.zero_grad(set_to_none=True)
        _release_cached_memory(cell.device)
        _set_rng_state(cell.device, rng)
        st.micro = _smaller_divisor(cell.cfg.recipe.batch_size, min(micro, len(idx)) // 2)
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


def _smaller_divisor(batch_size: int, most: int) -> int:
    """The largest divisor of `batch_size` that is at most `most` (at least 1): a micro-batch
    that still cuts every full batch evenly."""
    return next(d for d in range(max(1, most), 0, -1) if batch_size % d == 0)


def _rng_state(device: torch.device) -> tuple:
    """The random state a step draws from (dropout): the CPU generator's, and the device's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _release_cached_memory(device: torch.device) -> None:
    """Hand the caching allocator's free blocks back after an out-of-memory error, so a
    retry at a smaller batch starts from unfragmented memory."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _epoch_batches(enc: Encoded, kind: Kind, recipe: Recipe, rng: random.Random) -> list[list]:
    """One epoch of training batches of the kind's units (examples, or query groups), each
    batch `recipe.batch_size` units, length-grouped by a unit's tokens unless the recipe
    says random; deterministic given `rng`."""
    units = kind.units(enc, rng, recipe)
    lengths = [sum(enc.lengths[i] for i in kind.members(u)) for u in units]
    order = train_batches(lengths, recipe.batch_size, rng, recipe.batching == "length-grouped")
    return [[units[i] for i in batch] for batch in order]


def _evaluate(cell: _Cell, st: _LoopState) -> float | None:
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


def keep_best_weights(st: _LoopState, state: dict[str, torch.Tensor]) -> None:
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


@dataclass
class _Scores:
    status: str  # ok | diverged
    dev: dict | None
    report: dict | None
    predictions: dict[str, dict]  # report split, per language: predictions and labels


def _score(cell: _Cell, trained: _Trained) -> _Scores:
    """Restore the best weights, complete the dev scores and score the report split."""
    if trained.diverged_at is not None:
        return _Scores("diverged", None, None, {})
    knobs, euro, kind = cell.knobs, cell.knobs.euro_languages, cell.kind
    *dev_scores, dev_preds = _final_dev_scores(cell, trained.st)
    dev = {
        **_score_section(*dev_scores, euro),
        **kind.section_extra(knobs, cell.enc_val, dev_preds),
    }
    report, predictions = None, {}
    if cell.cfg.phase == "report":
        encs = {lang: cell.tokenise(split) for lang, split in cell.test_splits.items()}
        preds = {lang: cell.predict(enc) for lang, enc in encs.items()}
        for lang, enc in encs.items():
            predictions[lang] = {
                "predictions": preds[lang],
                "labels": enc.labels,
                **kind.prediction_fields(enc),
            }
        scores, undefined = kind.score(knobs.metric, preds, encs)
        report = {
            "split": knobs.report_split,
            **_score_section(scores, undefined, euro),
            **kind.section_extra(knobs, encs, preds),
        }
    for name, section in (("dev", dev), ("report", report)):
        for lang, why in (section or {}).get("undefined", {}).items():
            print(
                f"warning: {_label(cell.cfg)}: {knobs.metric} is undefined on the {name} "
                f"split ({lang}: {why}); recorded as undefined, not as 0",
                file=sys.stderr,
            )
    return _Scores("ok", dev, report, predictions)


def _final_dev_scores(
    cell: _Cell, st: _LoopState
) -> tuple[dict[str, float | None], dict[str, str], dict[str, list]]:
    """Every dev language's score (and predictions) on the weights the cell keeps: the best
    evaluation's (restored here), else the last one's. The languages that evaluation scored
    keep its numbers; the others are scored once, now, on the same weights."""
    if st.best_state is not None:
        cell.model.load_state_dict(st.best_state)
        scores, undefined, preds = st.best_per_language, st.best_undefined, st.best_predictions
    else:  # no evaluation had a defined score: the last one says why
        scores, undefined, preds = st.last_per_language, st.last_undefined, st.last_predictions
    rest = [lang for lang in cell.enc_val if lang not in scores]
    more, more_undefined = cell.dev_scores(rest) if rest else ({}, {})
    more_preds = cell.last_dev_predictions if rest else {}
    scores, undefined = {**scores, **more}, {**undefined, **more_undefined}
    preds = {**preds, **more_preds}
    order = list(cell.enc_val)
    return (
        {lang: scores[lang] for lang in order},
        {lang: undefined[lang] for lang in order if lang in undefined},
        {lang: preds[lang] for lang in order if lang in preds},
    )


def _result(cell: _Cell, trained: _Trained, scored: _Scores) -> dict:
    """The cell's result dict (schema v2, `results.validate_result`)."""
    cfg, recipe, st = cell.cfg, cell.cfg.recipe, trained.st
    device, train_time = cell.device, trained.train_time
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _cpu_peak_rss()
    kind_record, kind_reasons = cell.kind.record(cell.knobs, recipe, cell.enc_train, cell.enc_val)
    off = off_protocol_reasons(recipe, cfg.lr, cfg.seed, cfg.phase) + kind_reasons
    stopped_by = _stopped_by(trained.diverged_at, st.early_stopped, cell.max_steps, recipe)
    first_step_s = trained.first_step_s
    micro_used = st.micro or cell.micro  # the recipe's, unless out of memory halved it
    training = Training(
        steps=st.step,
        max_steps=cell.max_steps,
        best_step=st.best_step,
        epochs=round(st.step / cell.steps_per_epoch, 3),
        epochs_started=st.epoch,
        steps_per_epoch=cell.steps_per_epoch,
        eval_every=cell.every,
        early_stopped=st.early_stopped,
        stopped_by=stopped_by,
        diverged_at_step=trained.diverged_at,
        final_loss=st.last_loss if math.isfinite(st.last_loss) else None,
        train_examples=len(cell.enc_train.labels),
        dev_history=st.history,
        wall_time_s=round(time.perf_counter() - cell.t0, 3),
        train_time_s=round(train_time, 3),
        dev_eval_time_s=round(cell.dev_eval_seconds, 3),
        time_to_first_step_s=None if first_step_s is None else round(first_step_s, 3),
        process_start_to_first_step_s=trained.process_first_step_s,
        train_tokens_per_s=round(st.real_tokens / train_time, 1) if train_time > 0 else None,
        peak_memory_bytes=int(peak) if peak else None,
        oom_retries=st.oom_retries,
        micro_batch_used=micro_used,
        grad_accumulation_used=recipe.batch_size // micro_used,
        eval_oom_retries=cell.eval_oom_retries,
        eval_batch_used=cell.eval_batch_used or cell.eval_batch,
    )
    recorded_recipe = {
        **recipe.to_dict(),
        # What the run derived from the recipe on this device and task (the micro-batch and
        # evaluation batch it started with; `training` says what out of memory left):
        "effective_batch": recipe.batch_size,
        "micro_batch": cell.micro,
        "grad_accumulation": cell.accum,
        "eval_batch": cell.eval_batch,
        "warmup_steps": cell.warmup,
        "optimizer": "AdamW",
        "schedule": "linear warmup, linear decay",
        "pair_format": cell.knobs.pair_format,
        # Which attention kernels ran (sdpa, eager, flash_attention_2): a table never mixes
        # them within one model silently (`comparability.cell_setup`).
        "attn_implementation": attn_implementation(cell.model),
        # torch.compile's mode when `compile` is on (reduce-overhead: CUDA graphs), else None.
        "compile_mode": cell.compile_mode,
        **cell.loaded.recorded,  # what the loader derived (decoder-adapted: pair separator, ...)
    }
    return CellResult(
        cell=CellId(
            model=cfg.model_key,
            task=cfg.task,
            lr=cfg.lr,
            lr_key=lr_key(cfg.lr),
            seed=cfg.seed,
            phase=cfg.phase,
        ),
        status=scored.status,
        metric=cell.knobs.metric,
        dev=ScoreSection.from_dict(scored.dev),
        report=ScoreSection.from_dict(scored.report),
        training=training,
        recipe=recorded_recipe,
        protocol=Protocol(on_protocol=not off, off_protocol_reasons=off),
        provenance=cell.prov,
        ranking=kind_record,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    ).to_dict()


def _write(cfg: CellConfig, kind: Kind, result: dict, predictions: dict) -> None:
    """Write the report predictions (unless turned off), then the result, and only then
    remove what the result supersedes: a predictions or TREC file of an earlier run that
    was not rewritten (so no file beside the result describes another run), and the resume
    state. A write that fails (a full disk) raises with the resume state still in place and
    the files this run wrote beside the result removed, so the cell left nothing behind."""
    if not cfg.out_json:
        return
    pred_path = predictions_path(cfg.out_json)
    rewritten = set()
    if cfg.save_predictions and predictions:
        try:
            preds = predictions_from_cell(result, predictions)
            write_predictions(pred_path, preds)
            rewritten.add(pred_path)
            rewritten.update(kind.write_files(cfg.out_json, preds))
        except PredictionsError as exc:  # e.g. a non-finite regression output: keep the result
            print(f"warning: {_label(cfg)}: predictions not written: {exc}", file=sys.stderr)
    try:
        write_json_atomic(cfg.out_json, result)
    except BaseException:  # no result: nothing of this run stays beside it ("nothing written")
        for written in rewritten:
            written.unlink(missing_ok=True)
        raise
    for stale in (pred_path, *beside_result(cfg.out_json).values()):
        if stale not in rewritten:
            stale.unlink(missing_ok=True)
    resume_path = _resume_path(cfg.out_json)
    if resume_path is not None:
        resume_path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- preemption


@dataclass
class _LoopState:
    """Everything the training loop carries from one step to the next (saved on SIGTERM)."""

    step: int = 0
    epoch: int = 0
    bad_evals: int = 0
    best_mean: float = -math.inf
    best_step: int = 0
    best_per_language: dict = field(default_factory=dict)
    best_undefined: dict = field(default_factory=dict)
    best_state: dict | None = None
    history: list = field(default_factory=list)
    early_stopped: bool = False
    real_tokens: int = 0
    batches: list = field(default_factory=list)
    last_loss: float = math.nan
    train_time_before: float = 0.0
    last_per_language: dict = field(default_factory=dict)
    last_undefined: dict = field(default_factory=dict)
    best_predictions: dict = field(default_factory=dict)  # dev, of the best evaluation
    last_predictions: dict = field(default_factory=dict)  # dev, of the last evaluation
    micro: int = 0  # the micro-batch steps run with, once out of memory halved it (0: the cell's)
    oom_retries: int = 0  # training steps retried with a smaller micro-batch (out of memory)


class _StopFlag:
    signal: int | None = None  # the first stop signal received


@contextlib.contextmanager
def _stop_requests():
    """Turn SIGTERM and SIGINT into a flag the loop checks between steps (main thread only),
    so a preempted or interrupted cell saves its state instead of losing its progress."""
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag.signal is None:
            flag.signal = signum
            # Said at once: the running step (or evaluation) may take minutes to end. A raw
            # write: a handler may run while the main thread is inside a print to stderr.
            # run_all.sh shows this line of a cell's stderr (`progress.stop_line`).
            os.write(2, (stop_line(_stop_kind(signum)[1]) + "\n").encode())

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _resume_path(out_json: str | None) -> Path | None:
    if not out_json:
        return None
    path = Path(out_json)
    return path.parent / f"{RESUME_PREFIX}{path.name}{RESUME_SUFFIX}"


def _signature(cfg: CellConfig, revision: str) -> dict:
    """What must match for a saved state to be resumed: the cell, recipe and model revision."""
    return {
        "model": cfg.model_key,
        "task": cfg.task,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "phase": cfg.phase,
        "recipe": cfg.recipe.to_dict(),
        "revision": revision,
        "micro": cfg.recipe.micro_batch,
    }


def _save_resume(path: Path, signature, st, model, optimizer, scheduler, data_rng) -> None:
    """Save the loop's state as tensors and plain values only, so that `_restore` loads it
    with `weights_only=True` (no pickled objects, no code): numpy's generator state becomes
    a list."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "signature": signature,
        "loop": st.__dict__,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data_rng": data_rng.getstate(),
        "py_rng": random.getstate(),
        "np_rng": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    with atomic_open(path, "wb") as handle:
        torch.save(state, handle)


def _restore(
    path: Path, signature, model, optimizer, scheduler, data_rng, st, label: str
) -> _LoopState:
    """Load a saved state into the live objects (`weights_only`: tensors and plain values,
    never code); a state of another cell, or an unreadable or older-format one, is ignored."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise ValueError(f"a {type(state).__name__}, not a saved cell state")
    except Exception as exc:  # a torn, foreign or older file: start over rather than crash
        warnings.warn(f"ignoring unreadable resume state {path}: {exc}", stacklevel=2)
        return st
    if state.get("signature") != signature:
        warnings.warn(f"ignoring resume state {path}: it belongs to another setup", stacklevel=2)
        return st
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    data_rng.setstate(state["data_rng"])
    random.setstate(state["py_rng"])
    name, keys, *rest = state["np_rng"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    restored = _LoopState(**state["loop"])
    print(f"{label}: resuming at step {restored.step} from {path}", file=sys.stderr, flush=True)
    return restored


def _stopped_by(diverged_at: int | None, early_stopped: bool, max_steps: int, recipe) -> str:
    """What ended training: divergence, early stopping, or the step or epoch cap."""
    if diverged_at is not None:
        return "diverged"
    if early_stopped:
        return "early_stop"
    return "step_cap" if max_steps == recipe.max_steps else "epoch_cap"


def _seconds_since_process_start() -> float | None:
    """Wall time since this process started (imports included), for start-up measurements."""
    try:
        import psutil

        return round(time.time() - psutil.Process().create_time(), 3)
    except Exception:
        return None


def _cpu_peak_rss() -> int | None:
    try:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(kb) * 1024 if sys.platform != "darwin" else int(kb)
    except Exception:
        return None


def validate_out_path(path: str | os.PathLike, flag: str = "--out-json") -> None:
    """Refuse, before any training, an output path whose directory cannot be created or
    written (`fileio.check_output_file`; the error names `flag`, the flag that gave it), or
    whose longest derived file name the file system would refuse; a missing directory is
    fine (`run` creates it when the cell starts)."""
    check_output_file(path, flag, create_dirs=True)
    existing = Path(path).resolve().parent
    while not existing.exists():
        existing = existing.parent
    _check_name_lengths(Path(path), existing)


# mkstemp's random part of a temporary's name (`fileio.temporary_name` is the rest).
_TMP_RANDOM_CHARS = 8


def derived_names(out_json: str | os.PathLike) -> dict[str, str]:
    """Every file name a cell writes beside its result, by what it is: the result, its
    predictions, its kind's files (`kinds.beside_result`), resume state and lock, and the writers' temporaries of each."""
    path = Path(out_json)
    files = {
        "result": path,
        "predictions": predictions_path(path),
        **beside_result(path),  # a ranking cell's TREC run
        "resume state": _resume_path(path),
    }
    names = {what: p.name for what, p in files.items()}
    names["lock"] = f"{LOCK_PREFIX}{path.name}"
    names["lock without flock"] = f"{LOCK_PREFIX}{path.name}{EXCL_SUFFIX}"
    for what, p in files.items():
        names[f"temporary of the {what}"] = temporary_name(p) + "x" * _TMP_RANDOM_CHARS
    return names


def _name_bytes(name: str) -> int:
    try:
        return len(os.fsencode(name))
    except UnicodeError:
        return len(name.encode("utf-8", "surrogatepass"))


def _check_name_lengths(out_json: Path, existing: Path) -> None:
    """Refuse a result name whose longest derived name exceeds the file system's NAME_MAX,
    which would otherwise fail only when the trained cell is written."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if not name_max or name_max < 0:
        return
    what, name = max(derived_names(out_json).items(), key=lambda item: _name_bytes(item[1]))
    if _name_bytes(name) > name_max:
        raise HarnessError(
            f"the result name {out_json.name!r} is too long for its directory: "
            f"the {what} beside it would be named with {_name_bytes(name)} bytes, "
            f"and this file system allows {name_max}; use a shorter --model-key "
            "or --out-json name"
        )
