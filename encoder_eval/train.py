"""One cell, top to bottom: load, tokenise, fine-tune with early stopping, score, write.

The loop is written out rather than delegated to `transformers.Trainer` so that the
protocol is visible in one file: fp32 master weights, bf16 autocast for the forward
pass, AdamW with the shared recipe, linear warmup and decay, evaluation on dev at a
fixed cadence, early stopping, best weights restored in memory, then the report split.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import metrics, provenance, tokencache
from .errors import HarnessError
from .loaders import LoadedModel, load_model
from .protocol import Recipe, off_protocol_reasons
from .results import PREDICTIONS_SUFFIX, SCHEMA_NAME, SCHEMA_VERSION, lr_key, write_json_atomic
from .tasks import REGRESSION, data_provenance, load_task, task_knobs

EVAL_EVERY_MAX = 500  # evaluate at least every 500 optimizer steps (large tasks)
MIN_EVALS_WHEN_CAPPED = 4  # a shortened run still evaluates at least this many times


@dataclass
class CellConfig:
    """Everything that defines one cell; the CLI in `run.py` fills it from flags."""

    model_path: str
    task: str
    lr: float
    seed: int
    model_key: str
    mode: str = "auto"
    phase: str = "report"
    recipe: Recipe = field(default_factory=Recipe)
    data_dir: str | None = None
    device: str = "auto"
    out_json: str | None = None
    model_revision: str | None = None
    trust_remote_code: bool = False
    record_model_path: bool = False
    save_predictions: bool = False
    micro_batch_size: int | None = None  # gradient accumulation when smaller than batch_size
    eval_batch_size: int | None = None  # None: EVAL_BATCH_SIZE for the device
    batching: str = "length-grouped"  # or "random"
    progress: str = "bar"  # bar | quiet | json
    cache_dir: str | None = "default"  # tokenisation cache; None disables it
    extra_off_protocol: list[str] = field(default_factory=list)


def resolve_device(device: str) -> torch.device:
    """`auto` picks CUDA/ROCm when present, else the CPU; `cuda` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise HarnessError("--device cuda but no CUDA or ROCm GPU is visible; use --device cpu")
    if device not in ("cuda", "cpu"):
        raise HarnessError(f"unknown device {device!r}; valid: auto, cuda, cpu")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


# ----------------------------------------------------------------------------- data


@dataclass
class Encoded:
    """A tokenised split: one list of token ids per example (no padding), plus labels."""

    features: dict[str, list[list[int]]]
    labels: list
    lengths: list[int]


def encode(tokenizer, split: dict, max_len: int, input_names: tuple[str, ...]) -> Encoded:
    """Tokenise a split without padding; truncation keeps both texts of a pair where it can."""
    args = (split["text"], split["text_pair"]) if "text_pair" in split else (split["text"],)
    enc = tokenizer(*args, truncation=True, max_length=max_len, padding=False)
    features = {name: enc[name] for name in input_names if name in enc}
    lengths = [len(ids) for ids in features["input_ids"]]
    return Encoded(features=features, labels=list(split["label"]), lengths=lengths)


def encode_cached(
    tokenizer,
    split: dict,
    max_len: int,
    input_names: tuple[str, ...],
    cache_dir: Path | None,
    tokenizer_fp: str | None = None,
) -> Encoded:
    """`encode` through the tokenisation cache (no cache when `cache_dir` is None)."""
    if cache_dir is None:
        return encode(tokenizer, split, max_len, input_names)
    fp = tokenizer_fp or tokencache.tokenizer_fingerprint(tokenizer)
    key = tokencache.cache_key(fp, split, max_len, input_names)
    hit = tokencache.load(cache_dir, key)
    if isinstance(hit, Encoded):
        return hit
    enc = encode(tokenizer, split, max_len, input_names)
    tokencache.store(cache_dir, key, enc)
    return enc


def _collate(enc: Encoded, idx: list[int], pad_id: int, device, regression: bool) -> dict:
    width = max(enc.lengths[i] for i in idx)
    batch = {}
    for name, seqs in enc.features.items():
        fill = pad_id if name == "input_ids" else 0
        rows = [seqs[i] + [fill] * (width - len(seqs[i])) for i in idx]
        batch[name] = torch.tensor(rows, dtype=torch.long)
    labels = [enc.labels[i] for i in idx]
    batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


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


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    logits = logits.float()
    if regression:
        return nn.functional.mse_loss(logits.squeeze(-1), labels)
    return nn.functional.cross_entropy(logits, labels)


@torch.no_grad()
def predict(model, enc: Encoded, pad_id: int, device, precision: str, batch_size: int, regression):
    """Predictions for every example, in the split's original order (length-sorted batches)."""
    model.eval()
    order = sorted(range(len(enc.labels)), key=lambda i: enc.lengths[i])
    preds: list = [None] * len(order)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = _collate(enc, idx, pad_id, device, regression)
        batch.pop("labels")
        with _autocast(device, precision):
            logits = model(**batch).logits.float()
        out = logits.squeeze(-1) if regression else logits.argmax(-1)
        for i, value in zip(idx, out.cpu().tolist(), strict=True):
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


def eval_interval(steps_per_epoch: int, max_steps: int) -> int:
    """Dev evaluation cadence: once an epoch, but at least every 500 steps on large tasks, and
    at least MIN_EVALS_WHEN_CAPPED times when max_steps ends training early."""
    return max(
        1, min(steps_per_epoch, EVAL_EVERY_MAX, math.ceil(max_steps / MIN_EVALS_WHEN_CAPPED))
    )


# ----------------------------------------------------------------------------- the cell


class _Progress:
    """Step, loss, dev score and ETA, as a tqdm bar, JSON lines, or nothing."""

    def __init__(self, style: str, total: int, label: str):
        self.style, self.total, self.label = style, total, label
        self.bar = None
        self.start = time.perf_counter()
        if style == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr, leave=False)

    def step(self, loss: float, dev: float | None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", dev="-" if dev is None else f"{dev:.4f}")

    def event(self, **fields) -> None:
        if self.style == "json":
            import json

            elapsed = time.perf_counter() - self.start
            step = fields.get("step", 0)
            eta = elapsed / step * (self.total - step) if step else None
            print(json.dumps({"cell": self.label, "total_steps": self.total, "elapsed_s": round(
                elapsed, 2), "eta_s": None if eta is None else round(eta, 1), **fields}),
                file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _language_means(
    scores: dict[str, float | None], euro: tuple[str, ...]
) -> tuple[float | None, list[str]]:
    """The headline mean over the Euro languages scored (all of them when none is Euro);
    None when any of those is undefined: an undefined score is never averaged as 0."""
    langs = [lang for lang in scores if lang in euro] or list(scores)
    values = [scores[lang] for lang in langs]
    if not values or any(v is None for v in values):
        return None, langs
    return float(np.mean(values)), langs


def score_splits(
    metric: str, predictions: dict[str, list], labels: dict[str, list]
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Score each language; returns (scores, undefined) where undefined maps a language
    whose metric is undefined on its predictions to the reason (its score is None)."""
    scores, undefined = {}, {}
    for lang, preds in predictions.items():
        scores[lang] = metrics.compute_metric(metric, preds, labels[lang])
        if scores[lang] is None:
            undefined[lang] = metrics.undefined_reason(metric, preds, labels[lang])
    return scores, undefined


def _score_section(scores: dict, undefined: dict, euro: tuple[str, ...]) -> dict:
    mean, langs = _language_means(scores, euro)
    return {"per_language": scores, "mean": mean, "languages_in_mean": langs,
            "undefined": undefined}  # fmt: skip


def run_cell(
    cfg: CellConfig, loaded: LoadedModel | None = None, data=None, data_prov: dict | None = None
) -> dict:
    """Fine-tune one cell and return its result dict (also written to `cfg.out_json`).

    `loaded`, `data` and `data_prov` (its `tasks.data_provenance`) let a multi-cell process
    pass in what it already has; a fresh model is still loaded for every cell, since weights
    change during training.
    SIGTERM or Ctrl-C during training saves a resumable state and raises Preempted or
    Interrupted; one that arrives after training lets the cell finish and write first.
    """
    with _stop_requests() as stop:
        result = _run_cell(cfg, loaded, data, data_prov, stop)
        if stop.signal is not None:
            kind, how = _stop_kind(stop.signal)
            raise kind(f"{_label(cfg)}: {how} arrived after training; the result is written "
                       f"to {cfg.out_json}; run the same command again for any remaining "
                       "cells")  # fmt: skip
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
    knobs = task_knobs(cfg.task)
    regression = knobs.problem == REGRESSION
    device = resolve_device(cfg.device)
    eval_batch = cfg.eval_batch_size or EVAL_BATCH_SIZE.get(device.type, EVAL_BATCH_SIZE["cuda"])
    recipe = cfg.recipe
    t0 = time.perf_counter()
    # Where the data comes from is resolved before it is read (for the Hub, the commit that
    # is then loaded), and before any training: a cell never trains and then fails on
    # bookkeeping.
    if data_prov is None:
        data_prov = data_provenance(cfg.task, cfg.data_dir)
    if data is None:
        data = load_task(cfg.task, cfg.data_dir, with_test=cfg.phase == "report",
                         selection_split=recipe.selection_split)  # fmt: skip
    train_split, val_splits, test_splits, num_labels, problem = data

    seed_everything(cfg.seed)  # before the model load: the fresh head's init is seeded
    if loaded is None:
        loaded = load_model(
            cfg.model_path, cfg.mode, num_labels, problem, revision=cfg.model_revision,
            trust_remote_code=cfg.trust_remote_code, max_seq_len=recipe.max_seq_len,
            model_label=cfg.model_key,
        )  # fmt: skip
    model, tok = loaded.model.to(device), loaded.tokenizer
    prov = {
        "software": provenance.software_versions(),
        "hardware": provenance.device_info(str(device)),
        "model_revision": loaded.revision,
        "model_revision_requested": cfg.model_revision,
        "model_source": loaded.source,
        "model_path": cfg.model_path if cfg.record_model_path else None,
        "trust_remote_code": cfg.trust_remote_code,
        "data": data_prov,
        "dataset_revisions": {knobs.hf_path: data_prov.get("revision")} if knobs.hf_path else {},
    }
    pad_id = tok.pad_token_id
    max_len = recipe.max_seq_len
    cache_dir = None
    if cfg.cache_dir is not None:
        cache_dir = tokencache.default_cache_dir() if cfg.cache_dir == "default" else Path(
            cfg.cache_dir
        )  # fmt: skip
    tok_fp = tokencache.tokenizer_fingerprint(tok) if cache_dir is not None else None

    def tokenise(split: dict) -> Encoded:
        return encode_cached(tok, split, max_len, loaded.input_names, cache_dir, tok_fp)

    enc_train = tokenise(train_split)
    enc_val = {lang: tokenise(s) for lang, s in val_splits.items()}

    micro = cfg.micro_batch_size or recipe.batch_size
    if recipe.batch_size % micro:
        raise HarnessError(f"--micro-batch {micro} must divide the batch size {recipe.batch_size}")
    accum = recipe.batch_size // micro
    n_train = len(enc_train.labels)
    steps_per_epoch = math.ceil(n_train / recipe.batch_size)
    max_steps = min(recipe.max_steps, recipe.epoch_cap * steps_per_epoch)
    warmup = int(recipe.warmup_ratio * max_steps)
    every = eval_interval(steps_per_epoch, max_steps)

    optimizer = build_optimizer(model, recipe, cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(warmup, max_steps))
    data_rng = random.Random(cfg.seed)
    label = _label(cfg)
    progress = _Progress(cfg.progress, max_steps, label)

    eval_seconds = [0.0]  # time spent scoring dev inside the training loop

    def dev_scores() -> tuple[dict[str, float | None], dict[str, str]]:
        t = time.perf_counter()
        preds = {lang: predict(model, enc, pad_id, device, recipe.precision, eval_batch,
                               regression) for lang, enc in enc_val.items()}  # fmt: skip
        out = score_splits(knobs.metric, preds, {k: e.labels for k, e in enc_val.items()})
        eval_seconds[0] += time.perf_counter() - t
        return out

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    st = _LoopState()
    resume_path = _resume_path(cfg.out_json)
    signature = _signature(cfg, loaded.revision)
    if resume_path is not None and resume_path.exists():
        st = _restore(resume_path, signature, model, optimizer, scheduler, data_rng, st)
    diverged_at = None
    t_train = time.perf_counter()
    first_step_s = process_first_step_s = None
    while st.step < max_steps and diverged_at is None and not st.early_stopped:
        if stop.signal is not None:
            progress.close()
            kind, how = _stop_kind(stop.signal)
            if resume_path is None:
                raise kind(f"{label}: stopped by {how} at step {st.step}; no --out-json, so "
                           "no state was saved")  # fmt: skip
            st.train_time_before += time.perf_counter() - t_train
            _save_resume(resume_path, signature, st, model, optimizer, scheduler, data_rng)
            raise kind(f"{label}: stopped by {how} at step {st.step}; state saved to "
                       f"{resume_path}; run the cell again to resume (the same command)")  # fmt: skip
        if not st.batches:
            st.batches = train_batches(enc_train.lengths, recipe.batch_size, data_rng,
                                       cfg.batching == "length-grouped")  # fmt: skip
            st.epoch += 1
        idx = st.batches.pop(0)
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for m in range(0, len(idx), micro):
            sub = idx[m : m + micro]
            batch = _collate(enc_train, sub, pad_id, device, regression)
            labels = batch.pop("labels")
            with _autocast(device, recipe.precision):
                logits = model(**batch).logits
            loss = _loss(logits, labels, regression) * (len(sub) / len(idx))
            loss.backward()
            step_loss += loss.detach()
            st.real_tokens += sum(enc_train.lengths[i] for i in sub)
        step_loss = float(step_loss)
        if not math.isfinite(step_loss):
            diverged_at = st.step + 1
            break
        optimizer.step()
        scheduler.step()
        st.step += 1
        st.last_loss = step_loss
        if first_step_s is None:
            first_step_s = time.perf_counter() - t0
            process_first_step_s = _seconds_since_process_start()
        dev_mean = None
        if st.step % every == 0 or st.step == max_steps:
            per_lang, undefined = dev_scores()
            dev_mean, _ = _language_means(per_lang, knobs.euro_languages)
            st.history.append({"step": st.step, "dev": dev_mean, "loss": step_loss})
            st.last_per_language, st.last_undefined = per_lang, undefined
            progress.event(step=st.step, loss=step_loss, dev=dev_mean)
            # An undefined dev score (constant predictions) never counts as a best.
            if dev_mean is not None and dev_mean > st.best_mean:
                st.best_mean, st.best_step, st.best_per_language = dev_mean, st.step, per_lang
                st.best_state = {k: v.detach().to("cpu", copy=True)
                                 for k, v in model.state_dict().items()}  # fmt: skip
                st.bad_evals = 0
            else:
                st.bad_evals += 1
                # Patience running out at the last allowed step is the cap ending training,
                # not an early stop.
                if (recipe.early_stop and st.bad_evals >= recipe.patience
                        and st.step < max_steps):  # fmt: skip
                    st.early_stopped = True
        progress.step(step_loss, dev_mean)
    progress.close()
    train_time = st.train_time_before + time.perf_counter() - t_train
    step, epoch, history, real_tokens = st.step, st.epoch, st.history, st.real_tokens
    early_stopped, last_loss = st.early_stopped, st.last_loss
    best = {"mean": st.best_mean, "step": st.best_step, "per_language": st.best_per_language,
            "state": st.best_state}  # fmt: skip

    status = "diverged" if diverged_at is not None else "ok"
    report = dev = None
    predictions = {}
    if status == "ok":
        if best["state"] is not None:
            model.load_state_dict(best["state"])
            dev = _score_section(best["per_language"], {}, knobs.euro_languages)
        else:  # no evaluation had a defined score: the last one says why
            dev = _score_section(st.last_per_language, st.last_undefined, knobs.euro_languages)
        if cfg.phase == "report":
            labels = {}
            for lang, split in test_splits.items():
                enc = tokenise(split)
                preds = predict(model, enc, pad_id, device, recipe.precision,
                                eval_batch, regression)  # fmt: skip
                predictions[lang] = {"predictions": preds, "labels": enc.labels}
                labels[lang] = enc.labels
            scores, undefined = score_splits(
                knobs.metric, {k: v["predictions"] for k, v in predictions.items()}, labels
            )
            report = {"split": knobs.report_split,
                      **_score_section(scores, undefined, knobs.euro_languages)}  # fmt: skip
        for name, section in (("dev", dev), ("report", report)):
            for lang, why in (section or {}).get("undefined", {}).items():
                print(f"warning: {label}: {knobs.metric} is undefined on the {name} split "
                      f"({lang}: {why}); recorded as undefined, not as 0", file=sys.stderr)  # fmt: skip

    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _cpu_peak_rss()
    off = off_protocol_reasons(recipe, cfg.lr, cfg.seed, cfg.phase) + list(cfg.extra_off_protocol)
    result = {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "cell": {
            "model": cfg.model_key,
            "task": cfg.task,
            "lr": cfg.lr,
            "lr_key": lr_key(cfg.lr),
            "seed": cfg.seed,
            "phase": cfg.phase,
        },  # fmt: skip
        "status": status,
        "metric": knobs.metric,
        "dev": dev,
        "report": report,
        "training": {
            "steps": step,
            "max_steps": max_steps,
            "best_step": best["step"],
            "epochs": round(step / steps_per_epoch, 3),
            "epochs_started": epoch,
            "steps_per_epoch": steps_per_epoch,
            "eval_every": every,
            "early_stopped": early_stopped,
            "stopped_by": _stopped_by(diverged_at, early_stopped, max_steps, recipe),
            "diverged_at_step": diverged_at,
            "final_loss": last_loss if math.isfinite(last_loss) else None,
            "train_examples": n_train,
            "dev_history": history,
            "wall_time_s": round(time.perf_counter() - t0, 3),
            "train_time_s": round(train_time, 3),
            "dev_eval_time_s": round(eval_seconds[0], 3),
            "time_to_first_step_s": None if first_step_s is None else round(first_step_s, 3),
            "process_start_to_first_step_s": process_first_step_s,
            "train_tokens_per_s": round(real_tokens / train_time, 1) if train_time > 0 else None,
            "peak_memory_bytes": int(peak) if peak else None,
        },  # fmt: skip
        "recipe": {
            **recipe.to_dict(),
            "effective_batch": recipe.batch_size,
            "micro_batch": micro,
            "grad_accumulation": accum,
            "eval_batch": eval_batch,
            "warmup_steps": warmup,
            "optimizer": "AdamW",
            "schedule": "linear warmup, linear decay",
            "pair_format": knobs.pair_format,
            "batching": cfg.batching,
            "mode": cfg.mode,
        },  # fmt: skip
        "protocol": {"on_protocol": not off, "off_protocol_reasons": off},
        "provenance": prov,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if cfg.out_json:
        if resume_path is not None:
            resume_path.unlink(missing_ok=True)
        if cfg.save_predictions and predictions:
            pred_path = Path(str(cfg.out_json).removesuffix(".json") + PREDICTIONS_SUFFIX)
            write_json_atomic(pred_path, {"cell": result["cell"], "splits": predictions})
        write_json_atomic(cfg.out_json, result)
    return result


# ----------------------------------------------------------------------------- preemption

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the cell saved its state and should be run again


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class Preempted(Exception):
    """Raised when SIGTERM stopped a cell after it saved a resumable state."""


class Interrupted(Preempted):
    """Raised when Ctrl-C (SIGINT) stopped a cell after it saved a resumable state."""


@dataclass
class _LoopState:
    """Everything the training loop carries from one step to the next (saved on SIGTERM)."""

    step: int = 0
    epoch: int = 0
    bad_evals: int = 0
    best_mean: float = -math.inf
    best_step: int = 0
    best_per_language: dict = field(default_factory=dict)
    best_state: dict | None = None
    history: list = field(default_factory=list)
    early_stopped: bool = False
    real_tokens: int = 0
    batches: list = field(default_factory=list)
    last_loss: float = math.nan
    train_time_before: float = 0.0
    last_per_language: dict = field(default_factory=dict)
    last_undefined: dict = field(default_factory=dict)


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
    return path.parent / f".resume-{path.name}.pt"


def _signature(cfg: CellConfig, revision: str) -> dict:
    """What must match for a saved state to be resumed: the cell, recipe and model revision."""
    return {"model": cfg.model_key, "task": cfg.task, "lr": cfg.lr, "seed": cfg.seed,
            "phase": cfg.phase, "recipe": cfg.recipe.to_dict(), "revision": revision,
            "batching": cfg.batching, "micro": cfg.micro_batch_size}  # fmt: skip


def _save_resume(path: Path, signature, st, model, optimizer, scheduler, data_rng) -> None:
    state = {
        "signature": signature, "loop": st.__dict__, "model": model.state_dict(),
        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "data_rng": data_rng.getstate(), "py_rng": random.getstate(),
        "np_rng": np.random.get_state(), "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }  # fmt: skip
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _restore(path: Path, signature, model, optimizer, scheduler, data_rng, st) -> _LoopState:
    """Load a saved state into the live objects; a state of another cell is ignored."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a torn or foreign file: start over rather than crash
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
    np.random.set_state(state["np_rng"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return _LoopState(**state["loop"])


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


def validate_out_path(path: str | os.PathLike) -> None:
    """Refuse an output path whose directory is missing or not writable, before any training."""
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise HarnessError(f"output directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise HarnessError(f"output directory {parent} is not writable; choose another --out-json")
