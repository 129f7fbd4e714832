"""The fine-tune cell's flags beside its recipe (`RunFlags`: its identity and paths),
declared once as dataclass fields (`core/flags.py`). `encoder_eval.run` builds its parser from
them (`add_run_flags`); a plan parses its cell commands' extra arguments with the same flags
(`run_parser`) and writes its unit lines back from `RunFlags` instances (`flags_argv`). The
probe cell's are `probe_flags.py`. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from encoder_eval.core.errors import ArgumentParser
from encoder_eval.core.flags import add_flags, flag_field
from encoder_eval.core.protocol import (
    DEVICES,
    PHASES,
    recipe_arguments,
)
from encoder_eval.data.models import (
    ATTENTIONS,
    DECODER_DEFAULTS,
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


def run_parser() -> ArgumentParser:
    """A parser of `run`'s flags, for a plan that checks or plans its cell commands (the
    command's own, with its description, is `encoder_eval.run.build_parser`)."""
    parser = ArgumentParser(prog="encoder-eval run")
    add_run_flags(parser)
    return parser
