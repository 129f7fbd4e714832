"""`encoder-eval done`: whether result files are done, for the generated scripts.

Usage::

    encoder-eval done --phase select results/select/m_xnli_lr06_s42.json ...
    printf '%s\\0' FILE... | encoder-eval done --phase select --states --files0-from -

Done is `results.cell_state`, for fine-tune and probe cells alike: a file that parses,
validates against its schema and names its cell (and phase, and with `--model` that model).
A file named like a cell result that reads and fails to parse or validate is moved aside
into `<results dir>/.corrupt/` (never deleted), with one line on stderr, so its cell runs
again. Nothing else is ever moved: a file that cannot be read (permissions, I/O), one a
newer harness wrote, another model's result under this cell's name, and any file not named
like a cell result (experiment.toml, predictions) are left in place with one line on
stderr, and are not done. `--states` prints one word per file, in order: ok or diverged
(done), missing, moved (was corrupt, moved aside now), corrupt (another runner holds its
cell, so it stays), kept (left in place, as above: `run --skip-existing` does not run its
cell over it). It imports no torch, so it is fast on a login node.

Exit status: 0 when every file is done; 1 when some are not; 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_INPUT_ERROR,
    EXIT_OK,
    ArgumentParser,
    exit_code_for,
)
from encoder_eval.core.protocol import PROBE_PHASE, SWEEP_PHASES
from encoder_eval.core.results import (
    DONE_STATES,
    cell_state,
    is_probe_result_name,
    settle_cell,
)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval done",
        description="Exit 0 iff every result file is done (parses, validates, names its cell); "
        "a corrupt cell result is moved aside into .corrupt/ so its cell runs again; files "
        "that cannot be read, of a newer harness, or not named like a cell result are left.",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="result files to check")
    p.add_argument(
        "--phase",
        choices=SWEEP_PHASES,
        help="the phase the files must be of (probe: probe result files)",
    )
    p.add_argument(
        "--files0-from",
        metavar="F",
        help="also read NUL-separated file names "
        "from F ('-': stdin), for lists longer than a command line",
    )
    p.add_argument(
        "--states", action="store_true", help="print one state word per file, in order, on stdout"
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help="the model every file must be of (another "
        "model's result under one of its names is left in place, not done)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    files = list(args.files)
    if args.files0_from:
        try:
            if args.files0_from == "-":
                raw = sys.stdin.buffer.read()
            else:
                with open(args.files0_from, "rb") as handle:
                    raw = handle.read()
        except OSError as exc:
            print(
                f"error: cannot read --files0-from {args.files0_from} ({exc.strerror}); "
                "give a readable file, or - for stdin",
                file=sys.stderr,
            )
            return EXIT_INPUT_ERROR
        files += [os.fsdecode(f) for f in raw.split(b"\0") if f]
    state_of = names_result = None
    if args.phase == PROBE_PHASE:
        state_of = lambda path, _phase: cell_state(path, model=args.model)  # noqa: E731
        names_result = is_probe_result_name
    try:
        states = [
            settle_cell(
                f, args.phase, state_of=state_of, names_result=names_result, model=args.model
            )[0]
            for f in files
        ]
    except KeyboardInterrupt as exc:  # Ctrl-C in a script: the script itself says how to resume
        return exit_code_for(exc)
    if args.states:
        sys.stdout.write("".join(s + "\n" for s in states))
    return EXIT_OK if all(s in DONE_STATES for s in states) else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
