"""A pytest plugin that runs every cell a test starts on cuda (issue 38, item 12).

`bench/gpu_check.py` loads it (`-p cuda_cells`, with bench/ on PYTHONPATH) to run
tests/test_oom.py on a GPU: those tests build their cells with `device="cpu"`, and this moves
each to cuda at `encoder_eval.cells.train.run_cell`, the one entry they call, so the retry
path meets CUDA's allocator (`empty_cache`) and CUDA's random state. Each moved cell appends
a line to the file named by $CUDA_CELLS_LOG, so the check can tell that cells did run there.
"""

from __future__ import annotations

import dataclasses
import os

import pytest


@pytest.fixture(autouse=True)
def _cells_on_cuda(monkeypatch):
    from encoder_eval.cells import train

    real = train.run_cell

    def on_cuda(cfg, *args, **kwargs):
        log = os.environ.get("CUDA_CELLS_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{cfg.model_key}/{cfg.task}/s{cfg.seed}\n")
        return real(dataclasses.replace(cfg, device="cuda"), *args, **kwargs)

    monkeypatch.setattr(train, "run_cell", on_cuda)
