#!/usr/bin/env python
"""The probes of bench/gpu_check.py's issue-49 stages, each one process (issue 49, item 4;
absorbed from ../shared/tools/gpu/gpu_probe.py, the reference probe of the last session):

  widths MODEL OUT.json [--widths W,..] [--rows N] [--light] [--device D]
      What a fresh process pays the first time it meets each batch width: one step at width
      29 (one-time costs), then a cold pass over new widths, a warm pass over the same ones,
      each step timed alone (synchronised); the allocator's new segments per cold step; the
      SDPA kernel torch picks at each width (an untimed pass: `cells/attention.observe_backend`);
      a profile of one cold and one warm step (not with --light). The process's attention
      settings come from the environment: TORCH_CUDNN_SDPA_AVOID_RECOMPILE as given (a cell
      sets it to 1 by default on CUDA), EE_SDP=off turns cuDNN attention off.
  graph MODEL OUT.json [--width W] [--reps N] [--device D]
      The harness's `--graph-step` (`cells/graph_step.GraphStep`) against its eager step, for
      MODEL and for a random-weight XLM-R base (bench_gpu.build_model; tiny on the CPU), at
      one bucket width: ms a step of each (the eager loop timed with one sync at its end),
      the capture's seconds and any fallback. On the CPU only the eager step is timed.
  warm OUTDIR RUN_ARGS...
      Two cells in one process (seeds 43 then 42, `encoder_eval.run.main`), OUTDIR/a and
      OUTDIR/b; EE_POISON=1 (CUDA) fills the freed device memory with NaN between them and
      keeps it cached, so a cell that read memory it did not write would show it.

Each prints what it measured and writes it as JSON; gpu_check.py reads the files.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _p in (str(REPO), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

ENV = ("EE_SDP", "TORCH_CUDNN_SDPA_AVOID_RECOMPILE", "PYTORCH_CUDA_ALLOC_CONF")
WIDTHS = "37,53,69,85,101,117,133,149,165,181,197,213"


def _try(rec: dict, key: str, fn):
    """rec[key] = fn(), or what failed: one failing part must not hide the others."""
    try:
        rec[key] = fn()
    except Exception as exc:
        rec[key] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    print(key, json.dumps(rec[key], default=str), flush=True)


def _device(name: str):
    import torch

    if os.environ.get("EE_SDP") == "off":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def _batch(gen, device, width: int, rows: int, vocab: int = 30000) -> dict:
    """`rows` rows of RTE-like lengths (the widest `width`), random ids below `vocab`, pad
    id 0, labels."""
    import torch

    lengths = torch.randint(max(2, width // 2), width + 1, (rows,), generator=gen)
    lengths[0] = width
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    ids = torch.randint(min(1000, vocab // 2), vocab - 1, (rows, width), generator=gen) * mask
    labels = torch.randint(0, 2, (rows,), generator=gen)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "labels": labels.to(device)}  # fmt: skip


PRECISION = ["auto"]  # --precision: auto (bf16 unless a CPU lacks it), bf16 or fp32


def _precision(device) -> str:
    from encoder_eval.core import cpu

    word = cpu.resolve_precision(PRECISION[0], device.type)[0]
    return "fp32" if word == "fp32" else "bf16-autocast"


def widths(args) -> dict:
    import torch

    from encoder_eval.cells import attention
    from encoder_eval.cells.encoding import autocast
    from encoder_eval.cells.kinds import KINDS
    from encoder_eval.cells.train import build_optimizer
    from encoder_eval.core.protocol import Recipe
    from encoder_eval.data.loaders import load_model

    device = _device(args.device)
    cuda = device.type == "cuda"
    rec: dict = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version() if cuda else None,
                 "env": {k: os.environ.get(k) for k in ENV},
                 "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled()}  # fmt: skip
    precision = _precision(device)
    rec["precision"] = precision
    kind = KINDS["classification"]
    model = load_model(args.model, "auto", 2, kind.problem).model.to(device).train()
    optimizer = build_optimizer(model, Recipe(), 5.99e-5)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        kind.train_step(model, dict(batch), 1.0, lambda: autocast(device, precision))
        optimizer.step()

    def timed(width):
        batch = _batch(gen, device, width, args.rows, vocab)
        sync()
        t = time.perf_counter()
        step(batch)
        sync()
        return round(time.perf_counter() - t, 4)

    def segments():
        return torch.cuda.memory_stats().get("segment.all.allocated", 0) if cuda else 0

    ws = [int(w) for w in args.widths.split(",")]
    _try(rec, "first_step_w29_s", lambda: timed(29))

    def cold_pass():
        rows = []
        for w in ws:
            s0 = segments()
            rows.append([w, timed(w), segments() - s0])
        return rows

    _try(rec, "cold_w_s_newsegments", cold_pass)
    _try(rec, "warm_w_s", lambda: [[w, timed(w)] for w in ws])
    if isinstance(rec["cold_w_s_newsegments"], list) and isinstance(rec["warm_w_s"], list):
        cold = [t for _, t, _ in rec["cold_w_s_newsegments"]]
        warm = [t for _, t in rec["warm_w_s"]]
        rec["median_cold_s"], rec["median_warm_s"] = (
            statistics.median(cold),
            statistics.median(warm),
        )
        rec["first_meeting_s_per_width"] = round(
            statistics.median(c - w for c, w in zip(cold, warm, strict=True)), 4
        )
        print(f"SUMMARY cold {rec['median_cold_s']:.4f} warm {rec['median_warm_s']:.4f} "
              f"first-meeting {rec['first_meeting_s_per_width']:.4f} s/width", flush=True)  # fmt: skip

    def backends():
        out = {}
        for w in ws:
            seen: list = []
            with attention.observe_backend(model, seen):
                step(_batch(gen, device, w, args.rows, vocab))
            out[str(w)] = seen[0]
        return out

    _try(rec, "sdpa_backend_by_width", backends)

    def profiled(w):
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        batch = _batch(gen, device, w, args.rows, vocab)
        sync()
        with profile(activities=acts) as prof:
            step(batch)
            sync()
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]
        return [[e.key[:56], round(e.self_cpu_time_total / 1e3, 2), e.count] for e in top]

    if not args.light:
        _try(rec, "profile_warmup", lambda: len(profiled(ws[0])))  # the profiler's start-up
        _try(rec, "profile_cold_w229_top_self_cpu_ms", lambda: profiled(229))
        _try(rec, "profile_warm_w229_top_self_cpu_ms", lambda: profiled(229))
    if cuda:
        rec["peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return rec


def _graph_gain(model, device, width: int, rows: int, reps: int) -> dict:
    """ms a step: the eager step (the harness's optimizer, one sync after `reps` steps)
    against `GraphStep` (first meeting eager, second captured, then `reps` replays)."""
    import torch

    from encoder_eval.cells import graph_step
    from encoder_eval.cells.encoding import autocast
    from encoder_eval.cells.kinds import KINDS
    from encoder_eval.cells.train import _param_groups, build_optimizer
    from encoder_eval.core.protocol import Recipe

    kind, recipe, precision = KINDS["classification"], Recipe(), _precision(device)
    cuda = device.type == "cuda"
    batch = _batch(torch.Generator().manual_seed(1), device, width, rows, model.config.vocab_size)
    model.train()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    optimizer = build_optimizer(model, recipe, 5e-5)
    for _ in range(3):  # warm-up: kernels chosen, AdamW's state made
        optimizer.zero_grad(set_to_none=True)
        kind.train_step(model, dict(batch), 1.0, lambda: autocast(device, precision))
        optimizer.step()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        optimizer.zero_grad(set_to_none=True)
        kind.train_step(model, dict(batch), 1.0, lambda: autocast(device, precision))
        optimizer.step()
    host = time.perf_counter() - t
    sync()
    eager = time.perf_counter() - t
    out = {"width": width, "rows": rows, "eager_ms": round(1e3 * eager / reps, 2),
           "eager_host_dispatch_ms": round(1e3 * host / reps, 2)}  # fmt: skip
    why = graph_step.unavailable(device, kind, model)
    if why is not None:
        return {**out, "graph": f"skipped: {why}"}
    del optimizer
    opt = graph_step.graph_optimizer(
        _param_groups(model, recipe.weight_decay), recipe, 5e-5, device
    )
    step = graph_step.GraphStep(kind, model, opt, lambda: autocast(device, precision, cache=False),
                                device, "probe")  # fmt: skip
    step.run(dict(batch))  # the first meeting: eager, on a side stream
    sync()
    t = time.perf_counter()
    step.run(dict(batch))  # captured, then replayed
    sync()
    capture = time.perf_counter() - t
    if step.fallback:
        return {**out, "graph": "fell back", "fallback": step.fallback}
    t = time.perf_counter()
    for _ in range(reps):
        step.run(dict(batch))
    sync()
    graphed = time.perf_counter() - t
    return {**out, "graph_ms": round(1e3 * graphed / reps, 2), "capture_s": round(capture, 3),
            "speedup": round(eager / graphed, 2), "graphs": step.captured}  # fmt: skip


def graph(args) -> dict:
    import torch

    from encoder_eval.cells.kinds import KINDS
    from encoder_eval.data.loaders import load_model

    device = _device(args.device)
    rec: dict = {"device": str(device), "torch": torch.__version__}

    def minilm():
        model = load_model(args.model, "auto", 2, KINDS["classification"].problem).model
        return _graph_gain(model.to(device), device, args.width, args.rows, args.reps)

    def xlmr():
        import bench_gpu

        model, _ = bench_gpu.build_model("xlm-r-base", device.type != "cuda", device, "sdpa", 0)
        return _graph_gain(model, device, args.width, args.rows, args.reps)

    _try(rec, "model", minilm)
    _try(rec, "xlm_r_base", xlmr)
    return rec


def warm(out: str, run_args: list[str]) -> dict:
    from encoder_eval.run import main

    codes = [main([*run_args, "--seed", "43", "--results-dir", out + "/a"])]
    poisoned = False
    if os.environ.get("EE_POISON"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache = lambda: None  # keep the poisoned blocks in the cache
            free = torch.cuda.mem_get_info()[0]
            big = torch.full((int(free * 0.3) // 4,), float("nan"), device="cuda")
            small = [torch.full((65536,), float("nan"), device="cuda") for _ in range(6000)]
            del big, small
            poisoned = True
    codes.append(main([*run_args, "--seed", "42", "--results-dir", out + "/b"]))
    print("warm exit codes", codes, flush=True)
    return {"exit_codes": codes, "poisoned": poisoned}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu_probe.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("widths")
    w.add_argument("model")
    w.add_argument("out")
    w.add_argument("--widths", default=WIDTHS)
    w.add_argument("--rows", type=int, default=32)
    w.add_argument("--light", action="store_true", help="no profile")
    w.add_argument("--device", default="auto")
    w.add_argument("--precision", default="auto")
    g = sub.add_parser("graph")
    g.add_argument("model")
    g.add_argument("out")
    g.add_argument("--width", type=int, default=96)
    g.add_argument("--rows", type=int, default=32)
    g.add_argument("--reps", type=int, default=20)
    g.add_argument("--device", default="auto")
    g.add_argument("--precision", default="auto")
    k = sub.add_parser("warm")
    k.add_argument("out")
    args, rest = p.parse_known_args(argv)
    if args.command == "warm":
        rec = warm(args.out, rest)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "warm.json").write_text(json.dumps(rec))
        return 0 if rec["exit_codes"] == [0, 0] else 1
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    PRECISION[0] = args.precision
    rec = widths(args) if args.command == "widths" else graph(args)
    Path(args.out).write_text(json.dumps(rec, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
