"""`encoder-eval run`: fine-tune one cell (or several in one process) and write JSON.

A cell is one (model, task, learning rate, seed). Several seeds or learning rates
(`--seed 42,43,44`, `--lr 1e-5,3.59e-5`) run one after another in this process, so the
imports, data loading and tokenisation are paid once; each cell still writes its own JSON.
The flags are declared once, as dataclass fields: the cell's identity and paths
(`cells/run_flags.py`, `RunFlags`) and the recipe (`core/protocol.py`, `Recipe`).
"""

from __future__ import annotations

import argparse
import sys

from encoder_eval.cells.run_flags import add_run_flags
from encoder_eval.cells.runner import plan_cells, run_configs
from encoder_eval.core.errors import ArgumentParser, report_errors


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


if __name__ == "__main__":
    sys.exit(main())
