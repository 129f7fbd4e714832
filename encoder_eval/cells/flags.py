"""A cell's flags beside its recipe: its identity and paths, declared once as dataclass
fields (`core/flags.py`), for the fine-tune cell (`RunFlags`, `encoder-eval run`) and the
probe cell (`ProbeFlags`, `encoder-eval probe` on a model). The command modules build their
parsers from these (`add_run_flags`, `add_probe_flags`); a plan parses its cell commands'
extra arguments with the same flags and writes its unit lines back from instances
(`flags_argv`). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from encoder_eval.cells.probing import DEFAULT_K_FOLDS, DEFAULT_SEED
from encoder_eval.core.errors import ArgumentParser
from encoder_eval.core.flags import add_flags, flag_field
from encoder_eval.core.protocol import (
    DEVICES,
    PHASES,
    precision_arg,
    recipe_arguments,
    seed_arg,
)
from encoder_eval.core.protocol import PRECISIONS as PRECISION_WORDS
from encoder_eval.data.models import (
    ATTENTIONS,
    DECODER_DEFAULTS,
    FIXED_POOLINGS,
    HEAD_POOLINGS,
    MODEL_REGISTRY,
    all_modes,
)
from encoder_eval.data.tasks import TASK_KNOBS

# `run`'s argument groups, in the order `--help` lists them; the recipe's group starts with
# the Recipe's own flags (`protocol.recipe_arguments`).
CELL_GROUP = "the cell"
RECIPE_GROUP = "the recipe (defaults are the protocol's)"
IO_GROUP = "inputs and outputs"

# What a probe run writes and reads by default (`probe_cell.ProbeRun` holds the same).
DEFAULT_POOLINGS = ("mean",)
DEFAULT_MAX_SEQ_LEN = 256  # the fine-tuning protocol's length limit


@dataclass
class RunFlags:
    """`encoder-eval run`'s flags other than the recipe's: which cells (model, task, learning
    rates, seeds, phase), how the model loads, and where inputs and outputs go. `lr` and `seed`
    are comma-separated lists as given (`runner.plan_cells` reads and checks them)."""

    model_path: str | None = flag_field(
        None,
        "--model-path",
        group=CELL_GROUP,
        help="Hub id or local model directory (default: the registry's path for --model-key)",
    )
    model_key: str | None = flag_field(
        None,
        "--model-key",
        group=CELL_GROUP,
        help="the model's name in results and file names: a registry "
        f"key ({', '.join(MODEL_REGISTRY)}) or any name; derived from --model-path "
        "when omitted",
    )
    task: str | None = flag_field(
        None,
        "--task",
        group=CELL_GROUP,
        required=True,
        help=f"task name: {', '.join(TASK_KNOBS)}, or a task defined in a --tasks-file",
    )
    tasks_file: list[str] | None = flag_field(
        None,
        "--tasks-file",
        group=CELL_GROUP,
        action="append",
        metavar="FILE",
        help="a task file (TOML or "
        "YAML) defining tasks beyond the suite (repeatable; see docs/tasks.md, 'Adding "
        "a task')",
    )
    mode: str | None = flag_field(
        None,
        "--mode",
        group=CELL_GROUP,
        choices=all_modes(),
        help="auto: AutoModelForSequenceClassification; "
        "liquid-bidir: encoder body + mean-pool linear head; decoder-adapted: a "
        "decoder-only body (Llama, Qwen2, Gemma) + pooled linear head; or a loader "
        "plug-in's mode (`encoder-eval list modes`) (default: the registry's mode, "
        "else auto)",
    )
    attention: str | None = flag_field(
        None,
        "--attention",
        group=CELL_GROUP,
        choices=ATTENTIONS,
        help="decoder-adapted: bidirectional (a "
        "full padding-only mask) or causal (default: the registry's, else "
        f"{DECODER_DEFAULTS['attention']})",
    )
    pooling: str | None = flag_field(
        None,
        "--pooling",
        group=CELL_GROUP,
        choices=HEAD_POOLINGS,
        help="decoder-adapted: what the head "
        "reads: the mean, first or last real token's state, or a learned attention "
        f"pooling (default: the registry's, else {DECODER_DEFAULTS['pooling']})",
    )
    head_dropout: float | None = flag_field(
        None,
        "--head-dropout",
        group=CELL_GROUP,
        help="decoder-adapted: dropout before the "
        f"head (default: the registry's, else {DECODER_DEFAULTS['head_dropout']})",
    )
    body_dropout: float | None = flag_field(
        None,
        "--body-dropout",
        group=CELL_GROUP,
        help="decoder-adapted: the dropout of the body "
        "(its attention, residual and embedding dropouts; the seed's ablation axis; "
        "default: the registry's, else the checkpoint's own)",
    )
    lr: str | None = flag_field(
        None,
        "--lr",
        group=CELL_GROUP,
        required=True,
        help="learning rate(s), comma-separated; protocol "
        "values are the 10-point grid (encoder-eval sweep --show-grid)",
    )
    seed: str | None = flag_field(
        None,
        "--seed",
        group=CELL_GROUP,
        required=True,
        help="seed(s), comma-separated (select 42-44, report 45-49)",
    )
    phase: str = flag_field(
        "report",
        "--phase",
        group=CELL_GROUP,
        choices=PHASES,
        help="select: score dev only; report: also score the report split",
    )
    allow_off_protocol: bool = flag_field(
        False,
        "--allow-off-protocol",
        group=RECIPE_GROUP,
        action="store_true",
        help="accept a learning rate "
        "off the grid or a seed outside the phase's set (the result is marked "
        "off-protocol)",
    )
    out_json: str | None = flag_field(
        None, "--out-json", group=IO_GROUP, help="result file (one cell only)"
    )
    results_dir: str | None = flag_field(
        None,
        "--results-dir",
        group=IO_GROUP,
        help="directory for results named {model}_{task}_{lrkey}_s{seed}.json (several cells)",
    )
    skip_existing: bool = flag_field(
        False,
        "--skip-existing",
        group=IO_GROUP,
        action="store_true",
        help="skip cells whose valid result already exists",
    )
    data_dir: str | None = flag_field(
        None,
        "--data-dir",
        group=IO_GROUP,
        help="offline data mirror (<task>/<split>[.<lang>].jsonl); "
        "default: $ENCODER_EVAL_DATA_DIR, else the Hub",
    )
    device: str = flag_field(
        "auto",
        "--device",
        group=IO_GROUP,
        choices=DEVICES,
        help="auto picks a CUDA/ROCm GPU when one is visible",
    )
    model_revision: str | None = flag_field(
        None,
        "--model-revision",
        group=IO_GROUP,
        help="pin the model's Hub revision (commit sha; "
        "default: the registry row's pin, else the head)",
    )
    trust_remote_code: bool | None = flag_field(
        None,
        "--trust-remote-code",
        group=IO_GROUP,
        action=argparse.BooleanOptionalAction,
        help="run model-authored code (default: on only for a registry row that "
        "says so, loaded from that row's Hub id; else off)",
    )
    model_code_revision: str | None = flag_field(
        None,
        "--model-code-revision",
        group=IO_GROUP,
        help="remote code: the revision of the code "
        "repository the config's auto_map names (e.g. mGTE's Alibaba-NLP/new-impl); "
        "default: the registry row's pin, else that repository's head, resolved to "
        "a commit and recorded",
    )
    require_code_revision: bool = flag_field(
        False,
        "--require-code-revision",
        group=IO_GROUP,
        action="store_true",
        help="refuse remote code from another repository unless --model-code-revision pins it",
    )
    record_model_path: bool = flag_field(
        False,
        "--record-model-path",
        group=IO_GROUP,
        action="store_true",
        help="write the model path into the result (off: paths can be private)",
    )
    save_predictions: bool = flag_field(
        True,
        "--save-predictions",
        group=IO_GROUP,
        help="write per-example report predictions beside a report result, for "
        "`compare` (default: on; the file is X.predictions.json)",
    )
    cache_dir: str = flag_field(
        "default",
        "--cache-dir",
        group=IO_GROUP,
        help="tokenisation cache shared by the "
        "cells of a sweep (default: $ENCODER_EVAL_CACHE_DIR or "
        "~/.cache/encoder_eval/tokens)",
    )
    no_cache: bool = flag_field(
        False,
        "--no-cache",
        group=IO_GROUP,
        action="store_true",
        help="tokenise without the cache",
    )
    progress: str = flag_field(
        "bar",
        "--progress",
        group=IO_GROUP,
        choices=("bar", "quiet", "json"),
        help="progress display: a bar, nothing, or JSON lines on stderr",
    )
    report_to: str = flag_field(
        "none",
        "--report-to",
        group=IO_GROUP,
        metavar="LIST",
        help="send each cell's loss, LR and dev curves and its final scores to "
        "experiment trackers: tensorboard, mlflow, wandb (comma-separated; default: "
        "none; a failing tracker warns and never stops the cell)",
    )
    tracking_dir: str | None = flag_field(
        None,
        "--tracking-dir",
        group=IO_GROUP,
        metavar="DIR",
        help="where tensorboard and offline wandb write (default: tracking/ beside the results)",
    )


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """`run`'s flags: `RunFlags` in its groups, the recipe's flags first in theirs."""
    add_flags(parser, RunFlags, fill={RECIPE_GROUP: recipe_arguments})


@dataclass
class ProbeFlags:
    """`encoder-eval probe`'s flags on a model's own embeddings (NeuCo-Bench's files have
    theirs in `reports/neuco.py`): models, poolings, tasks, the folds, the forward pass and
    where results go. `probe_cell.run_from_args` checks them into a `ProbeRun`."""

    model: list[str] | None = flag_field(
        None,
        "--model",
        action="append",
        required=True,
        metavar="NAME[=PATH]",
        help="a registry key, or NAME=PATH_OR_HUB_ID (repeatable)",
    )
    pooling: str = flag_field(
        ",".join(DEFAULT_POOLINGS),
        "--pooling",
        help=f"comma-separated poolings: {', '.join(FIXED_POOLINGS)} (default mean)",
    )
    tasks: str | None = flag_field(
        None, "--tasks", required=True, help="comma-separated tasks or groups, or all"
    )
    tasks_file: list[str] | None = flag_field(
        None, "--tasks-file", action="append", help="user task file (repeatable)"
    )
    data_dir: str | None = flag_field(
        None, "--data-dir", help="data mirror (default: $ENCODER_EVAL_DATA_DIR or the Hub)"
    )
    results_dir: str = flag_field("probe_results", "--results-dir", help="where results go")
    k_folds: int = flag_field(DEFAULT_K_FOLDS, "--k-folds")
    seed: int = flag_field(DEFAULT_SEED, "--seed", type=seed_arg, help="the folds' seed")
    max_seq_len: int = flag_field(DEFAULT_MAX_SEQ_LEN, "--max-seq-len")
    precision: str = flag_field(
        "bf16",
        "--precision",
        type=precision_arg,
        metavar="{" + ",".join(PRECISION_WORDS) + "}",
        help="forward pass under bf16 autocast (weights and outputs fp32; alias "
        "bf16-autocast), fp32, or auto (fp32 on a CPU without native bf16, else bf16)",
    )
    batch_size: int | None = flag_field(None, "--batch-size", help="examples per forward pass")
    device: str = flag_field(
        "auto", "--device", choices=DEVICES, help="auto picks a GPU when one is visible"
    )
    trust_remote_code: bool = flag_field(
        False,
        "--trust-remote-code",
        action="store_true",
        help="let the --model models run model-authored code (default: on only "
        "for a registry row that says so, loaded from that row's Hub id)",
    )
    model_revision: str | None = flag_field(
        None,
        "--model-revision",
        help="pin the model's Hub revision (commit sha; one "
        "--model only; default: the registry row's pin, else the head)",
    )
    model_code_revision: str | None = flag_field(
        None,
        "--model-code-revision",
        help="remote code: the revision of the code "
        "repository the config's auto_map names (one --model only)",
    )
    require_code_revision: bool = flag_field(
        False,
        "--require-code-revision",
        action="store_true",
        help="refuse remote code from another repository unless --model-code-revision pins it",
    )
    no_cache: bool = flag_field(
        False,
        "--no-cache",
        action="store_true",
        help="do not read or write the embedding cache",
    )
    store_probes: bool = flag_field(
        False,
        "--store-probes",
        action="store_true",
        help="also store each cell's probe as JSON data (load_probe)",
    )
    force: bool = flag_field(False, "--force", action="store_true", help="redo cells that are done")
    record_model_path: bool = flag_field(
        False,
        "--record-model-path",
        action="store_true",
        help="write the model path "
        "into the results (off: local paths and private repository names can be "
        "sensitive)",
    )
    limit: int | None = flag_field(
        None,
        "--limit",
        metavar="N",
        help="a smoke run: cut every split to N "
        "examples (seeded, stratified; recorded; refused by summarize without "
        "--allow-partial)",
    )


def add_probe_flags(parser: argparse.ArgumentParser) -> None:
    """`probe`'s flags on a model (`ProbeFlags`)."""
    add_flags(parser, ProbeFlags)


def run_parser() -> ArgumentParser:
    """A parser of `run`'s flags, for a plan that checks or plans its cell commands (the
    command's own, with its description, is `encoder_eval.run.build_parser`)."""
    parser = ArgumentParser(prog="encoder-eval run")
    add_run_flags(parser)
    return parser


def probe_parser() -> ArgumentParser:
    """A parser of `probe`'s model-mode flags, for a plan (the command's own is
    `encoder_eval.probe.build_parser`)."""
    parser = ArgumentParser(prog="encoder-eval probe")
    add_probe_flags(parser)
    return parser
