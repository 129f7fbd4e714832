"""Issue 49's stages of bench/gpu_check.py (item 4), in order of importance: `widths`,
`cells_per_hour`, `warm_fresh`, `graph`. Each is `stage(h, args, out, cuda, device, left)`,
`h` being gpu_check's module (its `run`, `tail`, `env`, `figures`, `cell_args`), and returns
the stage's record with its `status`. The per-process probes are bench/gpu_probe.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PROBE = BENCH / "gpu_probe.py"
AVOID = "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"


def _limit(h, name: str, left: float) -> float:
    """A stage's seconds: its limit, within what the budget has left."""
    return max(10.0, min(h.STAGE_LIMIT_S[name], left - 10))


def _fp32(args) -> list[str]:
    """The dry run's precision (bf16 is emulated, slowly, on many CPUs); none on a GPU."""
    return ["--precision", "fp32"] if args.dry_run else []


# ----------------------------------------------------------------------------- widths


def widths_variants(cuda: bool) -> dict[str, dict]:
    """The processes of the `widths` stage and their environment: cuDNN's plan reuse across
    lengths (first: it also warms the machine, so no figure is its first process), cuDNN's
    per-width plans (torch's own default), cuDNN attention off. The CPU has one."""
    if not cuda:
        return {"defaults": {}}
    return {"avoid_recompile": {AVOID: "1"}, "defaults": {AVOID: "0"},
            "cudnn_off": {AVOID: "0", "EE_SDP": "off"}}  # fmt: skip


def stage_widths(h, args, out: Path, cuda: bool, device: str, left: float) -> dict:
    folder = out / "widths"
    folder.mkdir(parents=True, exist_ok=True)
    rec: dict = {"variants": {}}
    deadline = time.perf_counter() + _limit(h, "widths", left)
    extra = ["--widths", "21,37", "--rows", "8", "--light"] if args.dry_run else []
    for name, environ in widths_variants(cuda).items():
        remaining = deadline - time.perf_counter()
        if remaining < 20:
            rec["variants"][name] = {"status": "skipped: out of time"}
            continue
        path = folder / f"{name}.json"
        cmd = [sys.executable, str(PROBE), "widths", args.model_path, str(path),
               "--device", device, *extra, *_fp32(args)]  # fmt: skip
        rc = h.run(cmd, folder / f"{name}.log", remaining, environ)
        if rc != 0 or not path.exists():
            rec["variants"][name] = {"status": f"failed: exit {rc}",
                                     "log_tail": h.tail(folder / f"{name}.log")}  # fmt: skip
            continue
        probe = json.loads(path.read_text())
        keys = ("env", "cudnn_sdp_enabled", "first_step_w29_s", "median_cold_s",
                "median_warm_s", "first_meeting_s_per_width", "sdpa_backend_by_width")  # fmt: skip
        rec["variants"][name] = {"status": "ok", **{k: probe.get(k) for k in keys},
                                 "probe": str(path)}  # fmt: skip
    failed = [n for n, v in rec["variants"].items() if v["status"].startswith("failed")]
    rec["status"] = f"failed: {', '.join(failed)}" if failed else "ok"
    return rec


# ----------------------------------------------------------------------------- cells per hour


def cph_variants(cuda: bool) -> list[tuple[str, list[str], list[str], dict, str]]:
    """(name, run_all.sh flags, extra run arguments, environment, lr keys) of the
    `cells_per_hour` stage, by importance; the first is the reference of every ratio: the
    seed's default, one fresh process per cell, one at a time, cuDNN attention building its
    plans per width (AVOID_RECOMPILE=0: torch's own default)."""
    pad, graph = ["--pad-multiple", "32"], ["--pad-multiple", "32", "--graph-step"]
    if not cuda:  # the dry run: two variants of the same two cells
        return [("seed_default", ["--workers", "1"], [], {AVOID: "0"}, "lr06,lr08"),
                ("k2_warm_pad_graph", ["--workers", "2", "--warm"], graph, {}, "lr06,lr08")]  # fmt: skip
    k = "lr03,lr06,lr08,lr10"
    gpu = ["--gpus", "0"]
    return [
        ("seed_default", gpu, [], {AVOID: "0"}, "lr06,lr08"),
        ("k4_warm_pad_graph", [*gpu, "--workers-per-gpu", "4", "--warm"], graph, {}, k),
        ("k4_warm_pad", [*gpu, "--workers-per-gpu", "4", "--warm"], pad, {}, k),
        ("plain", gpu, [], {}, "lr06,lr08"),  # today's default: AVOID_RECOMPILE=1
        ("k2_warm", [*gpu, "--workers-per-gpu", "2", "--warm"], [], {}, k),
        ("k8_warm_pad_graph", [*gpu, "--workers-per-gpu", "8", "--warm"], graph, {},
         "lr01,lr02,lr03,lr04,lr06,lr08,lr09,lr10"),
    ]  # fmt: skip


def _sweep(h, args, device: str, root: Path, name: str, lr_keys: str, seeds: str,
           extra: list[str]) -> list[str]:  # fmt: skip
    """The `sweep` command of a select plan of MiniLM RTE cells into ROOT/NAME_runs."""
    cmd = [sys.executable, "-m", "encoder_eval.sweep", "--phase", "select", "--model",
           f"minilm={args.model_path}", "--tasks", h.TASK, "--lr-keys", lr_keys, "--seeds",
           seeds, "--max-steps", str(args.steps), "--data-dir", args.data_dir, "--device",
           device, "--mode", "shell", "--group", "cell", "--out-dir", str(root / f"{name}_runs"),
           "--results-dir", str(root / name), *h.shared_flags(args), *_fp32(args)]  # fmt: skip
    if extra:
        cmd.append("--extra-run-args=" + " ".join(extra))
    return cmd


def _cells(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if "training" in data:
            t = data["training"]
            out[path.stem] = {"dev": data["dev"]["mean"] if data.get("dev") else None,
                              "final_loss": t.get("final_loss"), "steps": t.get("steps"),
                              "s_per_step": t["train_time_s"] / max(1, t["steps"]),
                              "start_to_first_step_s": t.get("process_start_to_first_step_s"),
                              "warm_unit": t.get("warm_unit"),
                              "attn_backend": data["recipe"].get("attn_backend"),
                              "graph_step_run": data["recipe"].get("graph_step_run")}  # fmt: skip
    return out


def stage_cells_per_hour(h, args, out: Path, cuda: bool, device: str, left: float) -> dict:
    root = out / "cells_per_hour"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    seeds = "42" if args.dry_run else "42,43"
    deadline = time.perf_counter() + _limit(h, "cells_per_hour", left)
    rec: dict = {"steps": args.steps, "variants": {}}
    base = None
    for name, flags, extra, environ, lr_keys in cph_variants(cuda):
        remaining = deadline - time.perf_counter()
        if remaining < (60 if cuda else 30):
            rec["variants"][name] = {"status": "skipped: out of time"}
            continue
        v: dict = {"run_all_flags": flags, "run_args": extra, "env": environ}
        rec["variants"][name] = v
        sweep = _sweep(h, args, device, root, name, lr_keys, seeds, extra)
        if subprocess.run(sweep, cwd=h.REPO, env=h.env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.STDOUT, check=False).returncode:  # fmt: skip
            v["status"] = "failed: sweep"
            continue
        t = time.perf_counter()
        rc = h.run(["bash", str(root / f"{name}_runs" / "run_all.sh"), *flags],
                   root / f"{name}.log", remaining, environ)  # fmt: skip
        wall = time.perf_counter() - t
        cells = _cells(root / name)
        n = len(lr_keys.split(",")) * len(seeds.split(","))
        v.update(exit_status=rc, wall_s=round(wall, 2), cells=cells,
                 cells_per_hour=round(3600 * len(cells) / wall, 1))  # fmt: skip
        if rc == 124:  # the stage's time ran out in this variant: not a failure of it
            v["status"] = f"cut: out of time after {len(cells)} of {n} results"
            continue
        if rc != 0 or len(cells) != n:
            v["status"] = f"failed: exit {rc}, {len(cells)} of {n} results"
            v["log_tail"] = h.tail(root / f"{name}.log")
            continue
        v["status"] = "ok"
        if name == "seed_default":
            base = v["cells_per_hour"]
        v["vs_seed_default"] = round(v["cells_per_hour"] / base, 2) if base else None
    # The same cells (learning rate, seed) under two settings: their dev scores side by side.
    ok = {n: v["cells"] for n, v in rec["variants"].items() if v.get("status") == "ok"}
    rec["dev_by_cell"] = {
        cell: {n: cells[cell]["dev"] for n, cells in ok.items() if cell in cells}
        for cell in sorted({c for cells in ok.values() for c in cells})
    }
    # One model's cells must record one attention kernel, or a table refuses to mix them
    # (`comparability`): more than one here means the kernel changes with the batch width.
    rec["attn_backends"] = sorted({str(c["attn_backend"]) for cells in ok.values()
                                   for c in cells.values()})  # fmt: skip
    failed = [n for n, v in rec["variants"].items() if v["status"].startswith("failed")]
    rec["status"] = f"failed: {', '.join(failed)}" if failed else "ok"
    if rec["variants"]["seed_default"].get("status") != "ok" and not failed:
        rec["status"] = "failed: the reference (seed_default) did not finish"
    return rec


# ----------------------------------------------------------------------------- warm and fresh


def stage_warm_fresh(h, args, out: Path, cuda: bool, device: str, left: float) -> dict:
    """Six runs at once: fresh A and B (seed 42), a warm worker (`run_all.sh --warm`, seeds
    43 then 42: the seed-42 cell is its second unit), a warm process whose freed device
    memory is NaN before its seed-42 cell (bench/gpu_probe.py warm, EE_POISON=1; CUDA only),
    fresh and warm under --deterministic. Compares the seed-42 cells to the last bit."""
    root = out / "warm_fresh"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    limit = _limit(h, "warm_fresh", left)
    cell = h.cell_args(args, device)
    cell = [a for i, a in enumerate(cell) if a != "--seed" and (i == 0 or cell[i - 1] != "--seed")]
    cell += _fp32(args)
    fresh = [sys.executable, "-m", "encoder_eval.run", *cell, "--seed", "42", "--results-dir"]
    det = ["--deterministic"]
    jobs: dict[str, list[str]] = {
        "fresh_a": [*fresh, str(root / "fresh_a")],
        "fresh_b": [*fresh, str(root / "fresh_b")],
        "fresh_deterministic": [*fresh, str(root / "fresh_deterministic"), *det],
    }
    if cuda:
        jobs["warm_poisoned"] = [sys.executable, str(PROBE), "warm", str(root / "warm_poisoned"),
                                 *cell]  # fmt: skip
    for name, extra in (("warm", []), ("warm_deterministic", det)):
        sweep = _sweep(h, args, device, root, name, "lr08", "43,42", extra)
        if subprocess.run(sweep, cwd=h.REPO, env=h.env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.STDOUT, check=False).returncode == 0:  # fmt: skip
            flags = ["--gpus", "0"] if cuda else ["--workers", "1"]
            jobs[name] = ["bash", str(root / f"{name}_runs" / "run_all.sh"), *flags, "--warm"]
    procs = {}
    for name, cmd in jobs.items():
        extra = {"EE_POISON": "1"} if name == "warm_poisoned" else {}
        with open(root / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen(cmd, cwd=h.REPO, stdout=log, stderr=subprocess.STDOUT,
                                           env={**h.env(), **extra},
                                           start_new_session=True)  # fmt: skip
    t = time.perf_counter()
    codes = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=max(1.0, limit - (time.perf_counter() - t)))
        except subprocess.TimeoutExpired:
            h.kill_group(proc)
            codes[name] = 124
    where = {"fresh_a": "fresh_a", "fresh_b": "fresh_b", "warm": "warm",
             "warm_poisoned": "warm_poisoned/b", "fresh_deterministic": "fresh_deterministic",
             "warm_deterministic": "warm_deterministic"}  # fmt: skip
    runs: dict = {}
    for name, folder in where.items():
        found = sorted((root / folder).glob("*_s42.json")) if (root / folder).is_dir() else []
        if name not in jobs:
            runs[name] = {"status": "skipped: no cuda" if name == "warm_poisoned" else "skipped"}
        elif not found:
            runs[name] = {"status": f"failed: exit {codes.get(name)}",
                          "log_tail": h.tail(root / f"{name}.log")}  # fmt: skip
        else:
            data = json.loads(found[0].read_text())
            t_ = data["training"]
            runs[name] = {"status": "ok", "final_loss": repr(t_.get("final_loss")),
                          "dev": data["dev"]["mean"] if data.get("dev") else None,
                          "history": [[e["step"], repr(e["dev"]), repr(e["loss"])]
                                      for e in t_.get("dev_history", [])],
                          "warm_unit": t_.get("warm_unit"),
                          "process_id": t_.get("process_id")}  # fmt: skip

    def same(a: str, b: str):
        ra, rb = runs.get(a, {}), runs.get(b, {})
        if ra.get("status") != "ok" or rb.get("status") != "ok":
            return None
        return ra["final_loss"] == rb["final_loss"] and ra["history"] == rb["history"]

    rec = {"runs": runs, "exit_codes": codes,
           "fresh_processes_agree": same("fresh_a", "fresh_b"),
           "warm_agrees_with_fresh": same("warm", "fresh_a"),
           "poisoned_agrees_with_warm": same("warm_poisoned", "warm"),
           "deterministic_warm_agrees_with_fresh": same("warm_deterministic",
                                                        "fresh_deterministic")}  # fmt: skip
    if rec["fresh_processes_agree"] is False:
        rec["reading"] = (
            "fresh processes differ among themselves: a warm/fresh difference is rerun noise"
        )
    elif rec["warm_agrees_with_fresh"] is False:
        rec["reading"] = (
            "fresh processes agree and the warm one differs: the warm process carries state"
        )
    if runs["warm"].get("status") == "ok" and runs["warm"]["warm_unit"] != 2:
        rec["status"] = f"failed: the warm seed-42 cell was unit {runs['warm']['warm_unit']}, not 2"
        return rec
    failed = [n for n, r in runs.items() if r["status"].startswith("failed")]
    rec["status"] = f"failed: {', '.join(failed)}" if failed else "ok"
    return rec


# ----------------------------------------------------------------------------- graph


def stage_graph(h, args, out: Path, cuda: bool, device: str, left: float) -> dict:
    path = out / "graph_probe.json"
    cmd = [sys.executable, str(PROBE), "graph", args.model_path, str(path), "--device", device,
           *(["--width", "40", "--rows", "8", "--reps", "2"] if args.dry_run else []),
           *_fp32(args)]  # fmt: skip
    rc = h.run(cmd, out / "graph.log", _limit(h, "graph", left))
    if rc != 0 or not path.exists():
        return {"status": f"failed: exit {rc}", "log_tail": h.tail(out / "graph.log")}
    probe = json.loads(path.read_text())
    rec = {"command": cmd, "model": probe["model"], "xlm_r_base": probe["xlm_r_base"]}
    bad = [k for k in ("model", "xlm_r_base") if not isinstance(probe[k], dict)]
    if bad:
        return {**rec, "status": f"failed: {', '.join(bad)}"}
    if cuda and any("graph_ms" not in probe[k] for k in ("model", "xlm_r_base")):
        return {**rec, "status": "ok: a capture fell back (see fallback)"}
    return {**rec, "status": "ok"}


ISSUE49_STAGES = {
    "widths": stage_widths,
    "cells_per_hour": stage_cells_per_hour,
    "warm_fresh": stage_warm_fresh,
    "graph": stage_graph,
}
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
