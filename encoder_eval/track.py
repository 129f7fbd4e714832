"""Did a checkpoint regress? One receipt per checkpoint, then a noise-aware regression report
over the ordered sequence (the rule and the receipts: `encoder_eval.reports.tracking`).

    encoder-eval track receipt --checkpoint step2000=ckpt/2000 --index 1 --kind probe \\
        --tasks glue_sst2,glue_mrpc --out-dir runs/track            # one checkpoint
    encoder-eval track run --checkpoints ladder.tsv --kind probe --tasks ... --out-dir D
    encoder-eval track sweep --checkpoints ladder.tsv ... --mode slurm   # cells as jobs
    encoder-eval track report --out-dir D                      # exit 1 when anything regressed
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from encoder_eval.core import cpu
from encoder_eval.core.errors import (
    EXIT_OK,
    EXIT_REGRESSED,
    ArgumentParser,
    HarnessError,
    report_errors,
    unknown_name,
)
from encoder_eval.core.fileio import FileProblem, parse_json
from encoder_eval.core.protocol import add_precision_argument, precision_word, seed_arg
from encoder_eval.core.receipt import (
    EVAL_KINDS,
    Receipt,
    TaskResult,
    TrackSetup,
    check_checkpoint_id,
    load_receipts,
    read_receipt,
    receipt_path,
)
from encoder_eval.plans.arguments import (
    add_cell_place_arguments,
    add_emit_arguments,
    emit_options,
)
from encoder_eval.plans.emit import emit
from encoder_eval.plans.plan import parse_seeds, split_csv
from encoder_eval.plans.tracking import (
    Checkpoint,
    build_setup,
    build_track_plan,
    evaluate_checkpoint,
    read_checkpoints,
)
from encoder_eval.plans.tracking import check_checkpoint_dir as check_checkpoint_dir
from encoder_eval.reports.tracking import (
    DEFAULT_HORIZON,
    DEFAULT_NOISE_ALPHA,
    DEFAULT_THRESHOLD,
    DEFAULT_ZERO_FLOOR,
    REFERENCES,
    Check,
    track_regression,
    write_report,
)

# the library names tests and readers take from this command module
__all__ = ["Check", "Receipt", "TaskResult", "main", "read_checkpoints", "track_regression"]


# ----------------------------------------------------------------------------- CLI


def _add_setup_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("how each checkpoint is evaluated (the same for all)")
    g.add_argument(
        "--kind",
        choices=EVAL_KINDS,
        default="probe",
        help="probe: linear probes on frozen embeddings (cheap); finetune: "
        "report-phase cells at one fixed LR; synthetic: the capability suite of "
        "decoder checkpoints (perplexity, modular arithmetic, parity, induction)",
    )
    g.add_argument("--n-examples", type=int, help="synthetic: examples per axis (default 256)")
    g.add_argument("--tasks", help="comma-separated task keys and groups (probe, finetune)")
    g.add_argument("--max-seq-len", type=int, help="truncation length")
    g.add_argument("--pooling", help="probe: mean | first | last (default mean)")
    g.add_argument("--k-folds", type=int, help="probe: folds (default 10)")
    g.add_argument(
        "--seed",
        type=seed_arg,
        help="probe: the folds' seed (default 42); "
        "synthetic: the seed of the suite's samples (default 0)",
    )
    add_precision_argument(
        g,
        None,
        help="probe, finetune: bf16 (default; autocast; alias bf16-autocast), fp32 "
        "(faster on a CPU without native bf16; a fine-tuned cell in fp32 is "
        "off-protocol) or auto (fp32 on a CPU without native bf16, else bf16)",
    )
    g.add_argument("--lr-key", help="finetune: the fixed LR, a grid key such as lr06")
    g.add_argument("--selection", help="finetune: take the LR from this selection.json")
    g.add_argument("--selection-model", help="finetune: whose LRs in --selection to use")
    g.add_argument("--seeds", help="finetune: report seeds (default 45-49)")
    g.add_argument("--max-steps", type=int, help="finetune: step cap (shrunken: off-protocol)")
    add_cell_place_arguments(
        g, data_dir="task data mirror (default: the harness's)", device="device for the cells"
    )
    g.add_argument(
        "--no-cache",
        action="store_true",
        help="probe: embed afresh instead of reading the embedding cache (which is "
        "keyed by the weights' content hash, so identical weights share entries)",
    )
    p.add_argument(
        "--out-dir",
        default=os.path.join("runs", "track"),
        help="results/, receipts/, the report and plots go here (default runs/track)",
    )


def _add_report_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the regression rule")
    g.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="relative drop that counts (default 0.05)",
    )
    g.add_argument(
        "--reference",
        choices=REFERENCES,
        default="best",
        help="best: best earlier score (slow drift); prior: previous checkpoint",
    )
    g.add_argument(
        "--noise-alpha",
        type=float,
        default=DEFAULT_NOISE_ALPHA,
        help="a flag also needs the drop beyond a one-sided Welch t bound; per "
        "task, the chance of any false flag over the horizon is at most this "
        "(default 0.05; 0 = the plain threshold rule)",
    )
    g.add_argument(
        "--horizon",
        type=int,
        default=DEFAULT_HORIZON,
        help="checkpoints the noise level is spread over (default 10; the number "
        "of checkpoints when there are more)",
    )
    g.add_argument(
        "--zero-floor",
        type=float,
        default=DEFAULT_ZERO_FLOOR,
        help="references closer to 0 than this are measured against it "
        "(absolute threshold; default 0.1)",
    )
    g.add_argument("--no-plots", action="store_true", help="skip the per-task plots")


def setup_from_args(args: argparse.Namespace) -> TrackSetup:
    """The checked setup the flags describe; `--precision auto` is resolved here, on the
    cells' device (`cpu.resolve_precision`), since a receipt records what ran."""
    precision = args.precision
    if precision is not None and precision_word(precision) == "auto":
        precision, note = cpu.resolve_precision(precision, args.device or "auto")
        if note:
            print(note, file=sys.stderr)
    return build_setup(
        args.kind,
        split_csv(args.tasks) if args.tasks else [],
        max_seq_len=args.max_seq_len,
        pooling=args.pooling,
        k_folds=args.k_folds,
        seed=args.seed,
        precision=precision,
        lr_key=args.lr_key,
        selection=args.selection,
        selection_model=args.selection_model,
        seeds=parse_seeds(args.seeds),
        max_steps=args.max_steps,
        n_examples=args.n_examples,
    )


def _parse_meta(items: list[str]) -> dict:
    meta = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HarnessError(f"--meta {item!r} must look like KEY=VALUE")
        try:
            meta[key] = parse_json(value, f"--meta {key}")
        except FileProblem:
            meta[key] = value
    return meta


def _receipt_target(args: argparse.Namespace) -> Checkpoint:
    """The checkpoint a `track receipt` names: `--checkpoint ID=PATH [--index N]` (default
    index: its receipt's, else one past the last receipt's), or `--checkpoints F --id ID`."""
    if (args.checkpoint is None) == (args.checkpoints is None):
        raise HarnessError("give --checkpoint ID=PATH, or --checkpoints FILE --id ID")
    if args.checkpoints is not None:
        listed = read_checkpoints(args.checkpoints)
        if args.id is None:
            raise HarnessError("--checkpoints FILE: name the checkpoint with --id")
        match = [c for c in listed if c.id == args.id]
        if not match:
            raise unknown_name("checkpoint", args.id, [c.id for c in listed])
        return match[0]
    cid, sep, path = args.checkpoint.partition("=")
    if not sep:
        raise HarnessError(f"--checkpoint {args.checkpoint!r} must look like ID=PATH")
    cid = check_checkpoint_id(cid)
    index = args.index
    if index is None:
        existing = receipt_path(args.out_dir, cid)
        if existing.exists():
            index = read_receipt(existing).checkpoint_index
        else:
            others = load_receipts(args.out_dir)
            index = others[-1].checkpoint_index + 1 if others else 0
    return Checkpoint(cid, check_checkpoint_dir(cid, path), index)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval track",
        description="Per-checkpoint receipts and "
        "noise-aware regression tracking across a checkpoint sequence.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    r = sub.add_parser("receipt", help="evaluate one checkpoint and write its receipt")
    r.add_argument("--checkpoint", metavar="ID=PATH", help="the checkpoint")
    r.add_argument("--index", type=int, help="its position in the sequence")
    r.add_argument("--checkpoints", help="or: a list file / checkpoint-<step> folder ...")
    r.add_argument("--id", help="... and the id of the one to evaluate")
    r.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="free-form metadata for the receipt (repeatable)",
    )
    _add_setup_arguments(r)
    run = sub.add_parser("run", help="receipts for every checkpoint, then the report")
    run.add_argument(
        "--checkpoints",
        required=True,
        help="a file of id<TAB>path lines, or a folder of checkpoint-<step>",
    )
    _add_setup_arguments(run)
    _add_report_arguments(run)
    sw = sub.add_parser(
        "sweep",
        help="a launch script (shell or Slurm) for every checkpoint's "
        "cells; then `track run` only assembles",
    )
    sw.add_argument("--checkpoints", required=True, help="as for run")
    _add_setup_arguments(sw)

    add_emit_arguments(sw)
    rep = sub.add_parser("report", help="the regression report of the receipts in --out-dir")
    rep.add_argument("--out-dir", default=os.path.join("runs", "track"))
    _add_report_arguments(rep)
    return p


def _report(args: argparse.Namespace, receipts: list[Receipt]) -> int:
    report, text = write_report(
        receipts,
        args.out_dir,
        threshold=args.threshold,
        reference=args.reference,
        noise_alpha=args.noise_alpha,
        horizon=args.horizon,
        zero_floor=args.zero_floor,
        plots=not args.no_plots,
    )
    print(text)
    print(
        f"wrote {Path(args.out_dir) / 'regression.json'} and regression.md"
        + ("" if args.no_plots else f", plots in {Path(args.out_dir) / 'plots'}")
    )
    return EXIT_REGRESSED if report.flags else EXIT_OK


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        return _report(args, load_receipts(args.out_dir))
    setup = setup_from_args(args)
    if args.command == "receipt":
        ckpt = _receipt_target(args)
        evaluate_checkpoint(
            setup,
            ckpt,
            args.out_dir,
            metadata=_parse_meta(args.meta),
            data_dir=args.data_dir,
            device=args.device,
            no_cache=args.no_cache,
        )
        return EXIT_OK
    checkpoints = read_checkpoints(args.checkpoints)
    if args.command == "sweep":
        if setup.kind == "synthetic":
            raise HarnessError(
                "--kind synthetic runs in process in seconds per checkpoint; "
                "use `track run` (there are no cells to launch)"
            )
        plan = build_track_plan(
            setup,
            checkpoints,
            args.out_dir,
            data_dir=args.data_dir,
            device=args.device,
            no_cache=args.no_cache,
        )
        emitted = emit(
            plan,
            Path(args.out_dir) / "launch",
            args.mode,
            **emit_options(args),
        )
        print(emitted.describe())
        print(
            f"then: encoder-eval track run --checkpoints {args.checkpoints} ... "
            f"--out-dir {args.out_dir} (assembles the receipts from the done cells)"
        )
        return EXIT_OK
    receipts = [
        evaluate_checkpoint(
            setup,
            c,
            args.out_dir,
            data_dir=args.data_dir,
            device=args.device,
            no_cache=args.no_cache,
        )
        for c in checkpoints
    ]
    return _report(args, receipts)


if __name__ == "__main__":
    sys.exit(main())
