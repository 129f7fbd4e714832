"""The probe cell's flags (`ProbeFlags`: `encoder-eval probe` on a model's own embeddings;
NeuCo-Bench's files have theirs in `reports/neuco.py`), declared once as dataclass fields
(`core/flags.py`). `encoder_eval.probe` builds its parser from them (`add_probe_flags`); a
probe plan parses extra arguments with them (`probe_parser`) and writes its unit lines back
from `ProbeFlags` instances (`flags_argv`). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from encoder_eval.cells.probing import DEFAULT_K_FOLDS, DEFAULT_SEED
from encoder_eval.core.errors import ArgumentParser
from encoder_eval.core.flags import add_flags, flag_field
from encoder_eval.core.protocol import (
    DEVICES,
    PROTOCOL_RECIPE,
    Precision,
    precision_flag,
    seed_arg,
)
from encoder_eval.data.models import FIXED_POOLINGS

# What a probe run writes and reads by default (`probe_cell.ProbeRun` holds the same).
DEFAULT_POOLINGS = ("mean",)
# The probe's default length: the fine-tuning protocol's (a probe plan's recipe holds it).
DEFAULT_MAX_SEQ_LEN = PROTOCOL_RECIPE.max_seq_len


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
    precision: str = field(
        default=Precision.BF16.value,
        metadata=precision_flag(
            "forward pass under bf16 autocast (weights and outputs fp32; alias "
            "bf16-autocast), fp32, or auto (fp32 on a CPU without native bf16, else bf16)"
        ),
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


def probe_parser() -> ArgumentParser:
    """A parser of `probe`'s model-mode flags, for a plan (the command's own is
    `encoder_eval.probe.build_parser`)."""
    parser = ArgumentParser(prog="encoder-eval probe")
    add_probe_flags(parser)
    return parser
