"""How many workers share one GPU: the choice of `run_all.sh --gpus` without `--workers-per-gpu`.

Each worker is its own process holding its own model, gradients, AdamW state, activations
and CUDA context, so K workers fit a card when K times one worker's memory does.
`workers_per_gpu` makes that choice from a worker's memory (`need_bytes`: the largest unit
of the plan, `data/model_memory.training_memory_bytes`, which `sweep` writes into the
script) and the card's memory (`card_memory_bytes`, read at run time from `nvidia-smi`, or
`ENCODER_EVAL_GPU_MEMORY_GIB`). `python -m encoder_eval.core.gpu_share --need-bytes N --gpu G`
prints K; `run_all.sh` calls it. `MEASURED_GAIN` is what K workers were measured to give
(bench/README.md), read by `encoder-eval estimate`.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys

GIB = 1024**3
# A process's CUDA context, the caching allocator's slack and the evaluation batch beside a
# worker's training memory.
PROCESS_OVERHEAD_BYTES = 1 * GIB
# The share of the card K workers may fill (the rest: fragmentation, other processes).
USABLE_SHARE = 0.9
# K beyond 4 has not been tried; two workers are the most measured (bench/README.md).
MAX_WORKERS_PER_GPU = 4
# Cells per hour of K workers on one GPU over one worker's, as measured: bench/README.md,
# "On one H200 (2026-12-04)", stage two_workers (4 MiniLM glue_rte select cells, 80 steps,
# one process per cell: 164 against 282 cells an hour). K > 2 was not measured: the
# estimate assumes no more than K = 2 gave.
MEASURED_GAIN: dict[int, float] = {1: 1.0, 2: 1.72}
MEMORY_VARIABLE = "ENCODER_EVAL_GPU_MEMORY_GIB"


def workers_per_gpu(
    need_bytes: int, card_bytes: int, max_workers: int = MAX_WORKERS_PER_GPU
) -> int:
    """K workers for one card: as many as fit `USABLE_SHARE` of `card_bytes`, each needing
    `need_bytes` plus `PROCESS_OVERHEAD_BYTES`, at least 1 and at most `max_workers`."""
    if need_bytes <= 0 or card_bytes <= 0:
        return 1
    fit = math.floor(card_bytes * USABLE_SHARE / (need_bytes + PROCESS_OVERHEAD_BYTES))
    return max(1, min(max_workers, fit))


def measured_gain(k: int) -> float:
    """Throughput of K workers on one GPU over one worker's, from `MEASURED_GAIN` (for K above
    the largest measured, that one's gain: no extrapolation)."""
    known = max(m for m in MEASURED_GAIN if m <= max(1, k))
    return MEASURED_GAIN[known]


def card_memory_bytes(gpu: str, env: dict[str, str] | None = None) -> int | None:
    """The memory of GPU `gpu` (an index or UUID, as `run_all.sh --gpus` takes it): the
    variable ENCODER_EVAL_GPU_MEMORY_GIB when set, else `nvidia-smi`'s total; None when
    neither answers."""
    env = os.environ if env is None else env
    given = env.get(MEMORY_VARIABLE, "").strip()
    if given:
        try:
            gib = float(given)
        except ValueError:
            gib = -1.0
        if not gib > 0:
            raise ValueError(f"{MEMORY_VARIABLE}={given!r} must be a positive number of GiB")
        return int(gib * GIB)
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run(
            [tool, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", gpu],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return int(float(out.split()[0]) * 1024**2)  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Print K for `run_all.sh`; one line on stderr says how it was chosen."""
    p = argparse.ArgumentParser(prog="python -m encoder_eval.core.gpu_share")
    p.add_argument("--need-bytes", type=int, required=True, help="one worker's memory")
    p.add_argument("--gpu", required=True, help="the GPU whose memory decides")
    args = p.parse_args(argv)
    try:
        card = card_memory_bytes(args.gpu)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if card is None or args.need_bytes <= 0:
        why = "its memory is unknown" if card is None else "the plan's memory need is unknown"
        print(
            f"1 worker per GPU: {why} ({MEMORY_VARIABLE}=GIB or nvidia-smi tell the card's; "
            "--workers-per-gpu K sets it)",
            file=sys.stderr,
        )
        print(1)
        return 0
    k = workers_per_gpu(args.need_bytes, card)
    print(
        f"{k} worker(s) per GPU: {args.need_bytes / GIB:.1f} GiB a worker (+ "
        f"{PROCESS_OVERHEAD_BYTES / GIB:.0f} GiB a process) on a {card / GIB:.0f} GiB card "
        f"(GPU {args.gpu}), at most {MAX_WORKERS_PER_GPU}; --workers-per-gpu K overrides",
        file=sys.stderr,
    )
    print(k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
