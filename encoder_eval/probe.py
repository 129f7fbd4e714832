"""`encoder-eval probe`: linear probes on frozen embeddings.

Two modes share one command: a model's own embeddings on registered tasks
(`encoder_eval.cells.probe_cell`, its flags declared in `cells/probe_flags.py`, `ProbeFlags`), or,
given NeuCo-Bench's `--annotation-path` / `--submission-file`, embeddings from its files
(`encoder_eval.reports.neuco`). The probing protocol itself is `encoder_eval.cells.probing`.
"""

from __future__ import annotations

import sys

from encoder_eval.cells.probe_cell import run_from_args, run_probe
from encoder_eval.cells.probe_flags import add_probe_flags
from encoder_eval.cells.unit_spec import PROBE, SPEC_FLAG, UnitSpec, spec_argv
from encoder_eval.core.errors import ArgumentParser, report_errors
from encoder_eval.reports.neuco import main as neuco_main

NEUCO_FLAGS = ("--annotation-path", "--annotation_path", "--submission-file", "--submission_file")


def build_parser(prog: str | None = None) -> ArgumentParser:
    """The model mode's parser (`ProbeFlags`); NeuCo-Bench mode has its own
    (`reports/neuco.py`)."""
    parser = ArgumentParser(
        prog=prog or "encoder-eval probe",
        description="Linear probes on a frozen encoder's embeddings, per registered task: "
        "repeated shuffle-split folds, the Q score. (NeuCo-Bench's files: pass "
        "--annotation-path and --submission-file instead.)",
    )
    add_probe_flags(parser)
    parser.add_argument(
        SPEC_FLAG,
        metavar="FILE",
        help="run the probe unit a spec file holds (what `sweep --phase probe` writes beside "
        "its script), given alone",
    )
    return parser


def unit_spec(argv: list[str], prog: str | None = None) -> UnitSpec:
    """The probe unit `argv` describes: the spec file of `--spec FILE`, or the flags parsed
    into the same object."""
    path = spec_argv(argv)
    if path is not None:
        return UnitSpec.read_unit(path, PROBE)
    return UnitSpec.from_args(build_parser(prog).parse_args(argv), PROBE)


@report_errors
def model_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The model mode: probe each model's own embeddings on registered tasks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_probe(run_from_args(unit_spec(argv, prog).namespace()))


def main(argv: list[str] | None = None) -> int:
    """`encoder-eval probe`: a model's own embeddings on registered tasks
    (`encoder_eval.cells.probe_cell`), or, given NeuCo-Bench's `--annotation-path` /
    `--submission-file`, embeddings from its files (`encoder_eval.reports.neuco`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    prog = "encoder-eval probe"
    if any(a.split("=", 1)[0] in NEUCO_FLAGS for a in args):
        return neuco_main(args, prog=prog)

    return model_main(args, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
