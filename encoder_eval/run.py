"""`encoder-eval run`: fine-tune one cell (or several in one process) and write JSON.

A cell is one (model, task, learning rate, seed). Several seeds or learning rates
(`--seed 42,43,44`, `--lr 1e-5,3.59e-5`) run one after another in this process, so the
imports, data loading and tokenisation are paid once; each cell still writes its own JSON.
The flags are declared once, as dataclass fields: the cell's identity and paths
(`cells/run_flags.py`, `RunFlags`) and the recipe (`core/protocol.py`, `Recipe`).

The module run with `--warm-worker` is the warm worker `run_all.sh --warm` starts:
one long-lived process that runs unit after unit (`serve`), paying the imports once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback

from encoder_eval.cells.run_flags import add_run_flags
from encoder_eval.cells.runner import plan_cells, run_configs
from encoder_eval.core import cpu
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
    return parser


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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


def _one_unit(out_path: str, err_path: str, argv: list[str]) -> int:
    """Run `main(argv)` with stdout appended to `out_path` and stderr to `err_path` (the
    unit's log and its progress pipe), as a fresh `run` process would; its exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    for fd, path in ((1, out_path), (2, err_path)):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.dup2(opened, fd)
        os.close(opened)
    cpu._WARNED.clear()  # each unit's log gets the warnings a fresh process prints
    from encoder_eval.cells import devices  # torch: never on `run --help`'s path

    devices.mark_unit_start()  # its start-up figure counts from here, not the worker's start
    try:
        return main(argv)
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
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def serve(requests: int = 0, replies: int = 1) -> int:
    """A warm worker: run units one after another in this process until `requests` ends.

    Each request is NUL-terminated fields: the unit's stdout file, its stderr file (or
    pipe), the number of arguments, then `run`'s arguments; the reply is the exit code a
    fresh run process given ARGS would have had, one line on `replies`. Every
    cell is as in a fresh process: `train.run_cell` frees the previous cell's model,
    optimizer and device memory and seeds its RNGs, and the task data is loaded per unit.
    A unit stopped by Ctrl-C or SIGTERM (exit 130 or 75) ends the worker after its reply;
    between units either signal ends it with the same code.
    """
    # Started in the background by a shell, this process ignores Ctrl-C: take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    reply = os.fdopen(os.dup(replies), "w", buffering=1)
    os.dup2(2, replies)  # stray output between units goes to stderr, never into the replies
    fields = _Fields(requests)
    try:
        while True:
            head = fields.take(3)
            argv = fields.take(int(head[2])) if head is not None else None
            if argv is None:
                return 0
            code = _one_unit(head[0], head[1], argv)
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
