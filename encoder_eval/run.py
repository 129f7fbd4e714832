"""`encoder-eval run`: fine-tune one cell (or several in one process) and write JSON.

A cell is one (model, task, learning rate, seed). Several seeds or learning rates
(`--seed 42,43,44`, `--lr 1e-5,3.59e-5`) run one after another in this process, so the
imports, data loading and tokenisation are paid once; each cell still writes its own JSON.
"""

from __future__ import annotations

import sys

from encoder_eval.cells.runner import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
