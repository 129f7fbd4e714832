"""`encoder-eval run`: fine-tune one cell (or several in one process) and write JSON.

A cell is one (model, task, learning rate, seed). Several seeds or learning rates
(`--seed 42,43,44`, `--lr 1e-5,3.59e-5`) run one after another in this process, so the
imports, data loading and tokenisation are paid once; each cell still writes its own JSON.
The flags are declared once, as dataclass fields: the cell's identity and paths
(`cells/run_flags.py`, `RunFlags`) and the recipe (`core/protocol.py`, `Recipe`).

The module run with `--warm-worker` is the warm worker `run_all.sh --warm` starts:
one long-lived process that runs unit after unit (`serve`), paying the imports once.
Given several spec files (`--spec A --spec B ...`, a warm Slurm job of `sweep`), it runs
them one after another in one process by the same rules (`run_job`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import NoReturn

from encoder_eval.cells.run_flags import add_run_flags
from encoder_eval.cells.runner import plan_cells, resolve_model, run_configs
from encoder_eval.cells.unit_spec import FINETUNE, SPEC_FLAG, UnitSpec, spec_argv, spec_paths
from encoder_eval.core import process_state
from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    STOP_WORDS,
    STOPS,
    ArgumentParser,
    exit_code_for,
    raise_on_sigterm,
    report_errors,
)

WARM_FLAG = "--warm-worker"  # the only argument of a warm worker (`serve`)


def build_parser() -> argparse.ArgumentParser:
    """`run`'s parser: `RunFlags` and the recipe's flags, defaults shown in `--help`."""
    parser = ArgumentParser(
        prog="encoder-eval run",
        description="Fine-tune one (model, task, learning rate, seed) cell under the fixed "
        "protocol and write its result as one JSON file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_flags(parser)
    parser.add_argument(
        SPEC_FLAG,
        metavar="FILE",
        help="run the unit a spec file holds (what `sweep` writes beside its script, one per "
        "unit), given alone: its identity, recipe and paths; repeated (--spec A --spec B), "
        "the units one after another in one warm process (a Slurm job of a warm sweep)",
    )
    return parser


def unit_spec(argv: list[str] | None = None) -> UnitSpec:
    """The unit `run`'s arguments describe: the spec file of `--spec FILE`, or the flags
    parsed into the same object (`UnitSpec.from_args`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    path = spec_argv(argv)
    if path is not None:
        return UnitSpec.read_unit(path, FINETUNE)
    return UnitSpec.from_args(build_parser().parse_args(argv))


@report_errors
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    paths = spec_paths(argv)
    if paths is not None and (len(paths) > 1 or JOB_ENV in os.environ):  # a job's units left
        return run_job(paths)
    spec = unit_spec(argv)
    args = spec.namespace()
    cells = plan_cells(args)  # bad input ends here, before torch is imported
    return run_configs(cells, args.skip_existing, quiet=args.progress == "quiet")


class _Fields:
    """NUL-terminated fields read from a file descriptor (a warm worker's requests)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def take(self, n: int) -> list[str] | None:
        """The next `n` fields; None at the end of the input (a partial request included)."""
        fields: list[str] = []
        while len(fields) < n:
            end = self.buf.find(b"\0")
            if end < 0:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return None
                self.buf += chunk
                continue
            fields.append(os.fsdecode(self.buf[:end]))
            self.buf = self.buf[end + 1 :]
        return fields


def unit_identity(spec_path: str) -> tuple:
    """What a unit brings into its process that no reset takes back, read from its spec:
    the trusted remote code its model imports (none for most models) and its deterministic
    setting (cuBLAS reads its workspace once). A warm worker runs a unit in its process only
    if the units before it there had the same identity; otherwise in a fresh one. A unit
    whose spec does not read gets an identity of its own (it fails as it would in any
    process)."""
    try:
        spec = UnitSpec.read(spec_path)
        return (resolve_model(spec.namespace()).code_identity(), bool(spec.recipe.deterministic))
    except Exception:  # noqa: BLE001 - refused later, in the unit, with its line
        return ("unreadable", spec_path)


def _imported_remote_code() -> bool:
    """Whether this process has imported any Hub or local remote code (transformers puts it
    under `transformers_modules`)."""
    return any(name.split(".")[0] == "transformers_modules" for name in sys.modules)


@dataclass
class _Request:
    """One unit to run: the unit's stdout file, its stderr file or pipe (None: this
    process's own, as in a job of several units), its spec file, when it arrived
    (`time.time()`), and why a fresh worker runs it (after a restart)."""

    out: str | None
    err: str | None
    spec: str
    arrived: float
    restarted_because: str | None = None


# A worker that starts over (`_WarmWorker.restart`) hands its unit to the fresh process
# through this variable: JSON of a `_Request`.
PENDING_ENV = "ENCODER_EVAL_WARM_PENDING"


class _WarmWorker:
    """A warm worker's state: how many units this process ran, and their identity."""

    def __init__(self, replies) -> None:
        self.reply = replies
        self.units = 0
        self.identity: tuple | None = None  # of the units this process ran; None: none yet

    def why_fresh(self, request: _Request) -> str | None:
        """Why `request` must run in a fresh process (None: it may run here). Resets every
        registered piece of process state first (`core/process_state.py`)."""
        if self.units == 0:
            return None
        problems = process_state.reset_all()
        if problems:
            return "a reset did not take: " + "; ".join(problems)
        identity = unit_identity(request.spec)
        if identity != self.identity:
            return "its remote code or deterministic setting differs from the earlier units'"
        return None

    def restart(self, request: _Request, why: str) -> NoReturn:
        """Replace this process by a fresh warm worker (the same process id, pipes and
        arguments) that runs `request` first."""
        os.environ[PENDING_ENV] = json.dumps({**asdict(request), "restarted_because": why})
        sys.stdout.flush()
        sys.stderr.flush()
        self.reply.flush()
        os.dup2(self.reply.fileno(), 1)  # the replies on stdout again, as the script started us
        os.execv(sys.executable, [sys.executable, "-m", "encoder_eval.run", WARM_FLAG])

    def run(self, request: _Request) -> int:
        """Run one unit here, as a fresh `run` process given its arguments would."""
        identity = unit_identity(request.spec)
        self.units += 1
        code = _one_unit(request, self.units)
        if self.identity is None:
            self.identity = identity
        if identity[0] is None and _imported_remote_code():  # remote code nobody declared
            self.identity = ("remote code imported by", request.spec)
        return code


def _one_unit(request: _Request, unit: int) -> int:
    """Run `main(["--spec", SPEC])` with stdout appended to the request's `out` file and
    stderr to its `err` (the unit's log and its progress pipe; None: left as they are), as
    a fresh `run` process would; its exit code. `unit` is its number in this worker process
    (1: the first)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = None
    if request.out is not None and request.err is not None:
        opened: list[int] = []
        try:  # both before either replaces the worker's own output
            for path in (request.out, request.err):
                opened.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666))
        except OSError as exc:  # the run's folder is gone (a tmp purge): the unit fails, not us
            for fd in opened:
                os.close(fd)
            print(f"error: warm worker: cannot open the unit's output ({exc}); the unit did "
                  "not run", file=sys.stderr, flush=True)  # fmt: skip
            return EXIT_INCOMPLETE
        saved = os.dup(1), os.dup(2)
        for fd, opened_fd in zip((1, 2), opened, strict=True):
            os.dup2(opened_fd, fd)
            os.close(opened_fd)
    from encoder_eval.cells import devices  # torch: never on `run --help`'s path

    devices.mark_unit_start(unit, request.arrived)  # start-up counts from its arrival
    if request.restarted_because:
        print(
            f"note: warm worker: this unit runs in a fresh process ({request.restarted_because})",
            file=sys.stderr,
        )
    try:
        return main([SPEC_FLAG, request.spec])
    except SystemExit as exc:  # argparse's refusal (its line is printed): exit 2
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except STOPS as exc:  # a stop signal before or after the cells (inside them: run_configs)
        code = exit_code_for(exc)
        print(f"{STOP_WORDS[code]}: no cell was running; run again to go on", file=sys.stderr)
        return code
    except Exception:  # what would have ended a fresh process with a traceback
        traceback.print_exc()
        return EXIT_INCOMPLETE
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


# A job that starts over in a fresh process (`run_job`) hands on where it stands through
# this variable: JSON of {"first": unit number, "total": units, "code": exit code so far,
# "why": why the fresh process}.
JOB_ENV = "ENCODER_EVAL_JOB_STATE"


def run_job(paths: list[str]) -> int:
    """A job of several units (`run --spec A --spec B ...`: a Slurm job or array task of a
    warm sweep, `plans/emit.py`): run them one after another in this process, by the warm
    worker's rules (`serve`): every registered piece of process state is reset before each
    unit after the first, and a unit whose remote code or deterministic setting differs
    from the earlier units', or one after a reset that did not take, runs in a fresh
    process (this one replaces itself with the units left). Each unit's lines start with
    `== unit I of N: SPEC`. Exit code: a stop (Ctrl-C 130, SIGTERM 75) ends the job with
    its code at once (a requeued job skips the cells already done); otherwise 0 when every
    unit exited 0, else the first other unit's code, after all units ran."""
    state = json.loads(os.environ.pop(JOB_ENV, "") or "{}")
    first, total = int(state.get("first", 1)), int(state.get("total", len(paths)))
    code, why = int(state.get("code", 0)), state.get("why")
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    started = _process_start()
    from encoder_eval.cells import train  # noqa: F401  - the imports every unit needs, now

    process_state.snapshot_environment()  # what each unit starts from, after those imports
    worker = _WarmWorker(None)
    try:
        for i, path in enumerate(paths):
            arrived = started if worker.units == 0 else time.time()
            request = _Request(None, None, path, arrived, why if i == 0 else None)
            fresh = worker.why_fresh(request)
            if fresh is not None:
                _restart_job(paths[i:], first + i, total, code, fresh)
            print(f"== unit {first + i} of {total}: {path}", flush=True)
            unit_code = worker.run(request)
            if unit_code in STOP_WORDS:
                return unit_code
            code = code or unit_code
    except STOPS as exc:
        return exit_code_for(exc)
    return code


def _restart_job(paths: list[str], first: int, total: int, code: int, why: str) -> NoReturn:
    """Replace this process by a fresh `run` of the units `paths` (the same process id and
    output), the first of them number `first` of the job's `total`."""
    os.environ[JOB_ENV] = json.dumps({"first": first, "total": total, "code": code, "why": why})
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [word for path in paths for word in (SPEC_FLAG, path)]
    os.execv(sys.executable, [sys.executable, "-m", "encoder_eval.run", *argv])


def _process_start() -> float:
    """When this process started (`time.time()`), else now."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001
        return time.time()


def serve(requests: int = 0, replies: int = 1) -> int:
    """A warm worker: run units one after another in this process until `requests` ends.

    Each request is three NUL-terminated fields: the unit's stdout file, its stderr file
    (or pipe) and its spec file (`cells/unit_spec.py`); the reply is the exit code a fresh
    `run --spec FILE` process would have had, one line on `replies`.
    Every unit gets a fresh process's result: `train.run_cell` frees the previous cell's
    model, optimizer and device memory and seeds its RNGs, the task data is loaded per unit,
    and before each unit every piece of process state a unit may change is put back
    (`core/process_state.py`, the reset contract). A unit that brings remote code or a
    deterministic setting other than the earlier units', or one after a reset that did not
    take, runs in a fresh process: this one replaces itself (same process id and pipes),
    and the unit's log says so. Results record the unit's number in its process
    (`training.warm_unit`) and the process id.
    A unit stopped by Ctrl-C or SIGTERM (exit 130 or 75) ends the worker after its reply;
    between units either signal ends it with the same code.
    """
    # Started in the background by a shell, this process ignores Ctrl-C: take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    pending = os.environ.pop(PENDING_ENV, None)
    started = _process_start()
    from encoder_eval.cells import train  # noqa: F401  - the imports every unit needs, now

    process_state.snapshot_environment()  # what each unit starts from, after those imports
    reply = os.fdopen(os.dup(replies), "w", buffering=1)
    os.dup2(2, replies)  # stray output between units goes to stderr, never into the replies
    fields = _Fields(requests)
    worker = _WarmWorker(reply)
    try:
        while True:
            if pending is not None:
                request, pending = _Request(**json.loads(pending)), None
            else:
                head = fields.take(3)
                if head is None:
                    return 0
                # The first unit of a worker paid its start-up, as in a fresh process.
                arrived = started if worker.units == 0 else time.time()
                request = _Request(head[0], head[1], head[2], arrived)
            why = worker.why_fresh(request)
            if why is not None:
                worker.restart(request, why)
            code = worker.run(request)
            try:
                reply.write(f"{code}\n")
            except OSError:  # the script is gone (SIGTERM to the whole job): so is the unit
                return code
            if code in STOP_WORDS:
                return code
    except STOPS as exc:
        return exit_code_for(exc)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == [WARM_FLAG] else main())
