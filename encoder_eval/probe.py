"""`encoder-eval probe`: linear probes on frozen embeddings.

Two modes share one command: a model's own embeddings on registered tasks
(`encoder_eval.cells.probe_cell`), or, given NeuCo-Bench's `--annotation-path` /
`--submission-file`, embeddings from its files (`encoder_eval.reports.neuco`). The probing
protocol itself is `encoder_eval.cells.probing`.
"""

from __future__ import annotations

import sys

from encoder_eval.cells.probe_cell import main as model_main
from encoder_eval.reports.neuco import main as neuco_main

NEUCO_FLAGS = ("--annotation-path", "--annotation_path", "--submission-file", "--submission_file")


def main(argv: list[str] | None = None) -> int:
    """`encoder-eval probe`: a model's own embeddings on registered tasks
    (`encoder_eval.cells.probe_cell`), or, given NeuCo-Bench's `--annotation-path` /
    `--submission-file`, embeddings from its files (`encoder_eval.reports.neuco`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    prog = "encoder-eval probe"
    # Imported on use: the model mode pulls in torch, NeuCo mode does not.
    if any(a.split("=", 1)[0] in NEUCO_FLAGS for a in args):
        return neuco_main(args, prog=prog)

    return model_main(args, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
