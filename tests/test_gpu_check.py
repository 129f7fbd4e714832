"""`make gpu-check`'s script, bench/gpu_check.py, in its CPU form (issue 38, item 12): every
stage runs or says why not, and every figure lands as JSON in one folder, so the check a GPU
machine runs cannot rot while no GPU runs it. A tiny real model on the small mirror keeps it
to seconds of CPU; the cuda stages must be recorded as skipped, never as passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"
ISSUE38 = "environment,cell,oom,oom_tests,two_workers,bench_gpu,speed"  # `--only all` adds 49's


def _env() -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def test_gpu_check_dry_run_runs_every_stage_on_the_cpu_and_writes_json(
    tiny_models, small_mirror, tmp_path
):
    out = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--data-dir",
         str(small_mirror), "--model-path", str(tiny_models["bert"]), "--max-seq-len", "128",
         "--only", ISSUE38],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == summary
    assert summary["device"] == "cpu" and summary["dry_run"] is True
    status = {name: s["status"] for name, s in summary["stages"].items()}
    assert status == {"environment": "ok", "cell": "ok", "oom": "skipped: no cuda",
                      "oom_tests": "skipped: no cuda", "two_workers": "ok", "bench_gpu": "ok",
                      "speed": "ok"}  # fmt: skip
    for name in status:
        assert json.loads((out / f"{name}.json").read_text())["status"] == status[name]

    env = json.loads((out / "environment.json").read_text())
    assert env["device"] == "cpu" and env["torch"]
    cell = json.loads((out / "cell.json").read_text())
    assert cell["hardware"]["device"] == "cpu" and cell["steps"] == 2
    assert cell["micro_batch_used"] * cell["grad_accumulation_used"] == 32
    assert cell["train_tokens_per_s"] > 0 and cell["peak_memory_bytes"] > 0
    assert Path(cell["result"]).is_file()
    workers = json.loads((out / "two_workers.json").read_text())
    assert workers["flags"] == ["--workers", "2"] and workers["devices"] == ["cpu"]
    assert len(workers["per_cell"]) == workers["cells"] == 2
    assert workers["one_worker_seconds"] > 0 and workers["speedup"] > 0
    assert all(c["status"] == "ok" and c["steps"] == 2 for c in workers["per_cell"].values())
    bench = json.loads((out / "bench_gpu.json").read_text())
    assert bench["skipped_for_time"] == [] and bench["wall_s"] <= bench["time_budget_s"] + 120
    ratios = bench["ours_vs_trainer"]["xlm-r-base"]
    assert ratios["train_tokens_per_s"] > 0 and ratios["peak_memory_bytes"] > 0
    assert json.loads((out / "bench_gpu_report.json").read_text())["device_type"] == "cpu"
    speed = json.loads((out / "speed.json").read_text())
    assert set(speed["variants"]) == {"plain", "buckets"}  # no --compile on the CPU
    for v in speed["variants"].values():
        assert [c["steps"] for c in v["cells"]] == [2, 2]
        assert v["second_over_first"] == v["second_cell_s_per_step"] / v["first_cell_s_per_step"]
    assert speed["first_cell_s_per_step_vs_plain"]["plain"] == 1.0


def test_gpu_check_without_a_gpu_and_without_dry_run_refuses_in_one_line(small_mirror, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "check"), "--data-dir",
         str(small_mirror), "--model-path", str(tmp_path)],
        capture_output=True, text=True, env={**_env(), "CUDA_VISIBLE_DEVICES": ""}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "gpu_check.py: error: no CUDA or ROCm GPU is visible; --dry-run runs the CPU form"
    )
    assert not (tmp_path / "check").exists()


def test_gpu_check_dry_run_runs_issue_49s_stages_in_order_of_importance(
    tiny_models, small_mirror, tmp_path
):
    """The default stages (issue 49, item 4) in their CPU form: the per-width probe, cells per
    hour of the seed's default against warm workers with --pad-multiple 32 --graph-step, the
    warm/fresh comparison to the last bit (fresh, warm worker, --deterministic), and the
    graph step against eager; what needs a GPU is recorded as skipped or fallen back."""
    out = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--data-dir",
         str(small_mirror), "--model-path", str(tiny_models["bert"]), "--max-seq-len", "128",
         "--only", "environment,widths,cells_per_hour,warm_fresh,graph"],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["stages"]) == ["environment", "widths", "cells_per_hour", "warm_fresh",
                                       "graph"]  # fmt: skip
    assert {s["status"] for s in summary["stages"].values()} == {"ok"}, summary

    widths = json.loads((out / "widths.json").read_text())["variants"]["defaults"]
    assert widths["status"] == "ok" and widths["median_cold_s"] > 0
    assert set(widths["sdpa_backend_by_width"]) == {"21", "37"}
    assert set(widths["sdpa_backend_by_width"].values()) <= {"flash", "math"}

    cph = json.loads((out / "cells_per_hour.json").read_text())
    base, graph = cph["variants"]["seed_default"], cph["variants"]["k2_warm_pad_graph"]
    assert base["vs_seed_default"] == 1.0 and graph["vs_seed_default"] > 0
    assert base["env"] == {"TORCH_CUDNN_SDPA_AVOID_RECOMPILE": "0"}
    assert graph["run_all_flags"] == ["--workers", "2", "--warm"]
    for cell in graph["cells"].values():  # on the CPU the graph step falls back, recorded
        assert cell["graph_step_run"]["fallback"] == "no CUDA graphs on cpu"
        assert cell["warm_unit"] == 1 and cell["steps"] == 2
    assert all(c["graph_step_run"] is None for c in base["cells"].values())
    assert set(cph["dev_by_cell"]) == set(base["cells"]) and len(base["cells"]) == 2
    assert len(cph["attn_backends"]) == 1  # one kernel for every cell of the model

    warm = json.loads((out / "warm_fresh.json").read_text())
    runs = warm["runs"]
    assert runs["warm_poisoned"]["status"] == "skipped: no cuda"
    assert {n: r["status"] for n, r in runs.items() if n != "warm_poisoned"} == {
        "fresh_a": "ok", "fresh_b": "ok", "warm": "ok", "fresh_deterministic": "ok",
        "warm_deterministic": "ok"}  # fmt: skip
    assert runs["warm"]["warm_unit"] == 2 and runs["fresh_a"]["warm_unit"] is None
    # The CPU repeats itself: fresh, warm and deterministic runs agree to the last bit.
    assert warm["fresh_processes_agree"] is True and warm["warm_agrees_with_fresh"] is True
    assert warm["deterministic_warm_agrees_with_fresh"] is True
    assert warm["poisoned_agrees_with_warm"] is None

    graph_rec = json.loads((out / "graph.json").read_text())
    for name in ("model", "xlm_r_base"):
        assert graph_rec[name]["eager_ms"] > 0
        assert graph_rec[name]["graph"] == "skipped: no CUDA graphs on cpu"


def test_gpu_check_refuses_an_unknown_stage(small_mirror, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--only", "widths,nope", "--out",
         str(tmp_path / "check"), "--data-dir", str(small_mirror), "--model-path", str(tmp_path)],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown stage nope" in proc.stderr
