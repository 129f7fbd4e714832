"""Preemption: the training loop's state (`LoopState`), stop signals turned into a flag
the loop checks (`stop_requests`), and the resumable state saved on SIGTERM or Ctrl-C and
restored when the same cell runs again (`save_resume`, `restore_resume`)."""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from encoder_eval.cells.cell_config import CellConfig
from encoder_eval.core.errors import Interrupted, Preempted
from encoder_eval.core.fileio import atomic_open
from encoder_eval.core.progress import stop_line


@dataclass
class LoopState:
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


class StopFlag:
    """The stop signal `stop_requests` caught, checked by the loop between steps."""

    signal: int | None = None  # the first stop signal received


@contextlib.contextmanager
def stop_requests():
    """Turn SIGTERM and SIGINT into a flag the loop checks between steps (main thread only),
    so a preempted or interrupted cell saves its state instead of losing its progress."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag.signal is None:
            flag.signal = signum
            # Said at once: the running step (or evaluation) may take minutes to end. A raw
            # write: a handler may run while the main thread is inside a print to stderr.
            # run_all.sh shows this line of a cell's stderr (`progress.stop_line`).
            os.write(2, (stop_line(stop_reason(signum)[1]) + "\n").encode())

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_reason(signum: int) -> tuple[type, str]:
    """The exception a stop signal ends the cell with (its exit code) and its words in messages."""
    if signum == signal.SIGINT:
        return Interrupted, "Ctrl-C (SIGINT)"
    return Preempted, "SIGTERM"


def resume_signature(cfg: CellConfig, revision: str) -> dict:
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


def save_resume(path: Path, signature, st, model, optimizer, scheduler, data_rng) -> None:
    """Save the loop's state as tensors and plain values only, so that `restore_resume` loads it
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


def restore_resume(
    path: Path, signature, model, optimizer, scheduler, data_rng, st, label: str
) -> LoopState:
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
    restored = LoopState(**state["loop"])
    print(f"{label}: resuming at step {restored.step} from {path}", file=sys.stderr, flush=True)
    return restored
