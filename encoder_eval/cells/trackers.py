"""Training curves in the user's experiment tracker (`--report-to tensorboard,mlflow,wandb`).

Per cell, each chosen tracker gets one run named `model/task/lr_key/sSEED/phase`: the
training loss and learning rate at every step, every dev evaluation (the deciding mean and
each language), and at the end the cell's final dev and report scores. The run's
parameters and tags carry the cell's identity (model, task, LR and its grid key, seed,
phase, the recipe's comparability signature and each recipe entry), so a sweep can be
filtered in the tracker's own interface.

Recording is off unless asked for. A tracker never fails a cell: before the first cell of
a process trains, each tracker is prepared without a time limit (MLflow's store created
and migrated under a lock: interrupting that would break the store for good); then
everything is sent from a background thread, a tracker's first error is warned about
once and that tracker is dropped for the rest of the process, and at the end the cell
waits at most `FINISH_TIMEOUT_S` for the trackers to flush (one still busy is dropped
too). Each tracker is configured as its own documentation says:
- `tensorboard`: event files under `<tracking dir>/tensorboard/<run>/`;
- `mlflow`: `MLFLOW_TRACKING_URI` (e.g. `sqlite:///mlflow.db`) and `MLFLOW_EXPERIMENT_NAME`
  (default `encoder-eval`);
- `wandb`: `WANDB_PROJECT` (default `encoder-eval`), `WANDB_MODE` (`offline` writes the run
  under `<tracking dir>/wandb/` for a later `wandb sync`), and the user's own login.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoder_eval.core import process_state
from encoder_eval.core.errors import HarnessError, unknown_name

TRACKERS = ("tensorboard", "mlflow", "wandb")
DEFAULT_PROJECT = "encoder-eval"  # MLflow experiment and W&B project when the user names none
FINISH_TIMEOUT_S = 30.0
_INSTALL = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def parse_report_to(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """The trackers named by `--report-to` (comma-separated; `none` or empty: none), checked
    against TRACKERS, in the order given, without repeats."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [v.strip().lower() for v in items if v.strip()]
    if names == ["none"]:
        return ()
    for name in names:
        if name not in TRACKERS:
            raise unknown_name(
                "tracker", name, (*TRACKERS, "none"), "--report-to takes a comma-separated list"
            )
    return tuple(dict.fromkeys(names))


def recipe_signature_hash(signature: dict) -> str:
    """A short, stable name for a comparability signature, so a tracker can group by it."""
    text = json.dumps(signature, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RunInfo:
    """What a tracker run is called and tagged with: one cell's identity."""

    name: str
    params: dict[str, Any]
    tags: dict[str, str]
    tracking_dir: str
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- backends


class _TensorBoard:
    def __init__(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(info.tracking_dir, "tensorboard", info.name.replace("/", "_"))
        self.writer = SummaryWriter(log_dir=str(self.dir))
        self.params = {
            k: v if isinstance(v, int | float | str | bool) else str(v)
            for k, v in info.params.items()
            if v is not None
        }
        self.writer.add_text("identity", json.dumps({**info.params, **info.tags}, indent=1))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, summary: dict[str, float], status: str) -> None:
        final = {f"final/{k}": v for k, v in summary.items()}
        self.writer.add_hparams(self.params, final or {"final/none": 0.0}, run_name=".")
        self.writer.close()


def _mlflow_experiment(client: Any) -> str:
    """The id of the MLflow experiment runs go to (`MLFLOW_EXPERIMENT_NAME`), created when
    missing; the first call of a process also creates the tracking store if it is new."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another cell created it first
        return client.get_experiment_by_name(name).experiment_id


@contextlib.contextmanager
def _store_lock() -> Iterator[None]:
    """Hold an exclusive lock beside a SQLite tracking store (`sqlite:///PATH`) while it
    is opened: the cells of parallel workers would otherwise run its schema migrations at
    once (one fails with "table ... already exists"). Other stores need none."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith("sqlite:///"):
        yield
        return
    lock = Path(uri.removeprefix("sqlite:///") + ".encoder-eval-lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare_mlflow(info: RunInfo) -> None:
    """Create (or migrate) the tracking store and the experiment before training, with
    no time limit: interrupting a new SQLite store's migrations leaves it broken for good."""
    import mlflow

    for name in ("alembic", "mlflow"):  # their INFO lines, one per migration step
        logging.getLogger(name).setLevel(logging.WARNING)
    with _store_lock():
        _mlflow_experiment(mlflow.MlflowClient())


def _prepare_import(module: str) -> Callable[[RunInfo], None]:
    def prepare(info: RunInfo) -> None:
        importlib.import_module(module)  # the slow part, and an ImportError now, not later

    return prepare


class _MLflow:
    def __init__(self, info: RunInfo) -> None:
        import mlflow
        from mlflow.entities import Param

        self.client = mlflow.MlflowClient()
        exp_id = _mlflow_experiment(self.client)
        self.run_id = self.client.create_run(exp_id, run_name=info.name, tags=info.tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in info.params.items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id,
            metrics=[Metric(k.replace("@", "_at_"), v, now, step) for k, v in metrics.items()],
        )

    def finish(self, summary: dict[str, float], status: str) -> None:
        if summary:
            self.log(0, {f"final/{k}": v for k, v in summary.items()})
        self.client.set_terminated(self.run_id, "FINISHED" if status == "ok" else "FAILED")


class _Wandb:
    def __init__(self, info: RunInfo) -> None:
        import wandb

        Path(info.tracking_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=info.name,
            config={**info.params},
            tags=[f"{k}={v}"[:64] for k, v in info.tags.items()],
            group=info.tags.get("recipe_signature"),
            dir=info.tracking_dir,
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, float], status: str) -> None:
        self.run.summary.update({f"final/{k}": v for k, v in summary.items()})
        self.run.finish(exit_code=0 if status == "ok" else 1)


_BACKENDS: dict[str, Callable[[RunInfo], Any]] = {
    "tensorboard": _TensorBoard,
    "mlflow": _MLflow,
    "wandb": _Wandb,
}
# What each tracker does once per process before the first cell trains, outside any time
# limit (`prepare`): what may not be interrupted, and what is slow the first time.
_PREPARE: dict[str, Callable[[RunInfo], None]] = {
    "tensorboard": _prepare_import("torch.utils.tensorboard"),
    "mlflow": _prepare_mlflow,
    "wandb": _prepare_import("wandb"),
}
# Trackers this process has prepared, and those that failed (name -> why): a tracker that
# fails once is off for the rest of the process, so no later cell waits on it again.
_PREPARED: set[tuple[str, str | None, str | None]] = set()
DROPPED: dict[str, str] = {}
# A warm worker's next unit prepares its trackers again and retries one that failed, with
# its warning in that unit's log, as a fresh process would.
process_state.set_clearer("prepared trackers (cells/trackers.py)", _PREPARED)
process_state.set_clearer("dropped trackers (cells/trackers.py)", DROPPED)


# ----------------------------------------------------------------------------- the reporter


class Reporter:
    """Sends one cell's curves to the chosen trackers from a background thread; `log` and
    `finish` never raise and never wait on a tracker (but `finish`, for at most `timeout`).

    With the real trackers (`backends` None), each is first prepared in the calling thread
    (once per process, before training, without a time limit: `_PREPARE`), and one that
    fails, here or later, is dropped for the rest of the process (`DROPPED`) with one
    warning. `dropped` replaces that registry (fake `backends` get a fresh one)."""

    def __init__(
        self,
        names: Iterable[str],
        info: RunInfo,
        warn: Callable[[str], None] | None = None,
        backends: dict[str, Callable[[RunInfo], Any]] | None = None,
        dropped: dict[str, str] | None = None,
    ) -> None:
        self.info = info
        self.failed: dict[str, str] = {}
        self._warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr, flush=True))
        if dropped is None:  # the process's registry is the real trackers'
            dropped = DROPPED if backends is None else {}
        self._dropped = dropped
        self._makers = backends or _BACKENDS
        self.names = tuple(n for n in names if n not in self._dropped)
        self._pending: set[str] = set()
        if backends is None:
            self._prepare()
        self._pending = set(self.names)  # trackers that have not finished (nor failed) yet
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(
            target=self._work, name="encoder-eval-trackers", daemon=True
        )
        self._finished = False
        self._thread.start()

    def _prepare(self) -> None:
        for name in self.names:
            # MLflow's store and experiment come from the environment, which may change
            key = (
                name,
                os.environ.get("MLFLOW_TRACKING_URI"),
                os.environ.get("MLFLOW_EXPERIMENT_NAME"),
            )
            if key in _PREPARED:
                continue
            try:
                _PREPARE[name](self.info)
                _PREPARED.add(key)
            except BaseException as exc:  # noqa: BLE001 - a tracker must never stop the cell
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self._fail(name, exc)
        self.names = tuple(n for n in self.names if n not in self._dropped)

    def log(self, step: int, metrics: dict[str, float | None]) -> None:
        """Record `metrics` at optimizer step `step` (None values are skipped)."""
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        if clean and not self._finished and self.names:
            self._queue.put(("log", step, clean))

    def finish(
        self,
        summary: dict[str, float | None],
        status: str = "ok",
        timeout: float = FINISH_TIMEOUT_S,
    ) -> None:
        """Record the final scores, close every run, and wait at most `timeout` seconds; a
        tracker still busy then is dropped for the rest of the process."""
        if self._finished:
            return
        self._finished = True
        clean = {k: float(v) for k, v in summary.items() if v is not None}
        self._queue.put(("finish", clean, status))
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            late = sorted(self._pending)
            for name in late:
                self._dropped.setdefault(name, f"did not finish within {timeout:.0f} s")
            self._warn(
                f"{self.info.name}: the trackers did not finish within {timeout:.0f} s; "
                "the cell's result is written, its tracker runs may be incomplete"
                + (f"; {', '.join(late)} off for the rest of this process" if late else "")
            )

    def _fail(self, name: str, exc: BaseException) -> None:
        self._pending.discard(name)
        if name in self.failed:
            return
        self.failed[name] = f"{type(exc).__name__}: {exc}"
        if name in self._dropped:  # another cell of this process said so already
            return
        self._dropped[name] = self.failed[name]
        hint = ""
        if isinstance(exc, ImportError):
            hint = f" (pip install {_INSTALL[name]})"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        self._warn(
            f"{self.info.name}: --report-to {name} failed and is off for the rest of this "
            f"process: {type(exc).__name__}: {first}{hint}"
        )

    def _work(self) -> None:
        live: dict[str, Any] = {}
        for name in self.names:
            try:
                live[name] = self._makers[name](self.info)
            except BaseException as exc:  # noqa: BLE001 - a tracker must never stop the cell
                self._fail(name, exc)
        while True:
            item = self._queue.get()
            if item is None:
                return
            for name, backend in list(live.items()):
                try:
                    if item[0] == "log":
                        backend.log(item[1], item[2])
                    else:
                        backend.finish(item[1], item[2])
                        self._pending.discard(name)
                except BaseException as exc:  # noqa: BLE001
                    self._fail(name, exc)
                    live.pop(name)


def reporter_for_cell(
    names: Iterable[str],
    *,
    model: str,
    task: str,
    lr: float,
    lr_key: str,
    seed: int,
    phase: str,
    recipe: dict[str, Any],
    signature: dict[str, Any],
    tracking_dir: str | os.PathLike,
    warn: Callable[[str], None] | None = None,
) -> Reporter | None:
    """The reporter of one fine-tuning cell, or None when no tracker is asked for."""
    names = tuple(names)
    if not names:
        return None
    sig = recipe_signature_hash(signature)
    identity = {
        "model": model,
        "task": task,
        "lr": lr,
        "lr_key": lr_key,
        "seed": seed,
        "phase": phase,
        "recipe_signature": sig,
    }
    params = {**identity, **{f"recipe.{k}": v for k, v in recipe.items()}}
    tags = {k: str(v) for k, v in identity.items() if k != "lr"}
    info = RunInfo(f"{model}/{task}/{lr_key}/s{seed}/{phase}", params, tags, str(tracking_dir))
    return Reporter(names, info, warn)


def check_tracking_dir(path: str | os.PathLike) -> None:
    """Refuse a tracking directory that cannot be created or written, before any training."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(
            f"--tracking-dir {str(p)!r} cannot be created ({exc.strerror}); choose another"
        ) from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise HarnessError(f"--tracking-dir {str(p)!r} is not writable; choose another")
