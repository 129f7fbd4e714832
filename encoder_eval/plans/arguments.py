"""The command-line arguments shared by every command that plans cells (`sweep`, `status`,
`track sweep`): what to run (`add_plan_arguments`, `add_probe_arguments`), how to launch it
(`add_emit_arguments`), and the `Plan` they describe (`plan_from_args`; `plan_and_config`
also returns the flags merged with their experiment files, a `sweep_config.SweepConfig`).
"""

from __future__ import annotations

import argparse
import os
import shlex

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import check_utf8
from encoder_eval.core.protocol import (
    DEVICES,
    LR_GRID,
    PHASE_SEEDS,
    PHASES,
    PROBE_PHASE,
    PROTOCOL_RECIPE,
    SELECTION_SPLITS,
    add_precision_argument,
    check_seed,
    recipe_argv,
)
from encoder_eval.data.models import MODES
from encoder_eval.data.tasks import MULTILINGUAL_TASKS, TASK_GROUPS
from encoder_eval.plans.emit import (
    DEFAULT_UNITS_PER_JOB,
    EMIT_MODES,
)
from encoder_eval.plans.plan import (
    GROUPS,
    PROBE,
    CellSettings,
    Plan,
    PlanInputs,
    ProbeSettings,
    build_plan,
    build_probe_plan,
    split_csv,
)
from encoder_eval.plans.selection import load_selection
from encoder_eval.plans.sweep_config import SweepConfig, resolve

# ----------------------------------------------------------------------------- CLI


def add_plan_arguments(p: argparse.ArgumentParser, phases: tuple[str, ...] = PHASES) -> None:
    """Flags that define which cells a phase has (shared by sweep and status; `phases`: the
    phases the command takes)."""
    g = p.add_argument_group("what runs")
    g.add_argument(
        "--experiment",
        metavar="FILE",
        help="an experiment file (TOML; see "
        "examples/experiment.toml) that fills the flags not given",
    )
    probe = "; probe: linear probes on frozen embeddings, one unit per (model, task)"
    g.add_argument(
        "--phase",
        choices=phases,
        help="select: LR grid x select seeds, dev only; "
        "report: report seeds at each pair's selected LR"
        + (probe if PROBE_PHASE in phases else ""),
    )
    g.add_argument("--selection", help="selection.json from encoder-eval select (report phase)")
    g.add_argument(
        "--models",
        help="comma-separated model names (default: every registry "
        "model, or only the --model additions when any are given)",
    )
    g.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH[:MODE]",
        help=f"add a model for this sweep (repeatable); MODE: {' | '.join(MODES)} or a "
        "loader plug-in's mode, default auto",
    )
    g.add_argument(
        "--trust-remote-code",
        metavar="MODEL[,MODEL]",
        help="let these models "
        "run code from their repositories (registry rows that need it and load "
        "from their own Hub id need no flag); an experiment or selection file "
        "never turns remote code on",
    )
    g.add_argument(
        "--tasks",
        help="comma-separated task keys and groups (default: "
        f"multilingual = {','.join(MULTILINGUAL_TASKS)}); groups: "
        f"{', '.join(TASK_GROUPS)} (all: the whole suite)",
    )
    g.add_argument(
        "--tasks-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a file of user task definitions (TOML or YAML; repeatable): its "
        "tasks can be named in --tasks, and every cell reads it",
    )
    g = p.add_argument_group("shrinking for smoke runs (results are marked off-protocol)")
    g.add_argument("--lr-keys", help="a subset of the grid, e.g. lr03,lr06 (select phase)")
    g.add_argument("--seeds", help="seeds instead of the phase's (select 42-44, report 45-49)")
    g.add_argument(
        "--max-steps", type=int, help=f"step cap (protocol: {PROTOCOL_RECIPE.max_steps})"
    )
    g.add_argument(
        "--max-seq-len",
        type=int,
        help=f"truncation length (protocol: {PROTOCOL_RECIPE.max_seq_len})",
    )
    g.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="a smoke run: every split of every "
        "cell cut to N examples (seeded, stratified; `run --limit`)",
    )
    g = p.add_argument_group("what each cell records")
    g.add_argument(
        "--report-to",
        metavar="LIST",
        help="send every cell's curves to "
        "tensorboard, mlflow and/or wandb (`run --report-to`; default none)",
    )
    g = p.add_argument_group("protocol variant")
    g.add_argument(
        "--selection-split",
        choices=SELECTION_SPLITS,
        help="what picks the LR "
        "and the early-stopping checkpoint: dev (default, the specification's) or "
        "holdout (strict: a fixed slice of train; see EVALUATION_METHODOLOGY.md); "
        "a report phase follows its selection",
    )
    g = p.add_argument_group("where")
    g.add_argument("--results-dir", help="result JSON directory (default: results/<phase>)")
    add_cell_place_arguments(g)
    g.add_argument(
        "--extra-run-args",
        default="",
        help="more encoder-eval run flags for every "
        "cell, as one shell-quoted string, e.g. '--micro-batch 8'",
    )


def add_cell_place_arguments(
    g: argparse._ArgumentGroup | argparse.ArgumentParser,
    data_dir: str = "offline data mirror passed to every cell",
    device: str = "passed to every cell (default: auto)",
) -> None:
    """`--data-dir` and `--device` of a command that passes them on to the cells it plans
    (`sweep`, `track`), declared once: not given, None (the cell's own default, or what
    the experiment file says); `data_dir` and `device` are their help."""
    g.add_argument("--data-dir", help=data_dir)
    g.add_argument("--device", choices=DEVICES, help=device)


# The probe phase's own flags (dest, flag), and the fine-tune flags it refuses.
_PROBE_FLAGS = (("pooling", "--pooling"), ("k_folds", "--k-folds"))
_FINETUNE_FLAGS = (
    ("experiment", "--experiment"),
    ("selection", "--selection"),
    ("lr_keys", "--lr-keys"),
    ("seeds", "--seeds"),
    ("max_steps", "--max-steps"),
    ("selection_split", "--selection-split"),
)


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `--phase probe` (defaults: encoder_eval.probe's)."""
    g = p.add_argument_group(
        "probe phase (--phase probe; also --max-seq-len, default 256, and --precision)"
    )
    g.add_argument(
        "--pooling",
        help="comma-separated poolings: mean, first, last (default "
        "mean); every pooling of a (model, task) runs in its one unit",
    )
    g.add_argument("--k-folds", type=int, help="shuffle-split folds per task (default 10)")
    # --seed was, and for select/report stays, argparse's abbreviation of --seeds
    g.add_argument(
        "--seed", help="the folds' seed (default 42); for select/report the same as --seeds"
    )
    add_precision_argument(
        g,
        None,
        help="every cell's precision: bf16 (default; autocast, the protocol's; alias "
        "bf16-autocast), fp32 (faster on a CPU without native bf16; a fine-tuning cell in "
        "fp32 is off-protocol) or auto (each cell picks fp32 on a CPU without native bf16)",
    )


def add_emit_arguments(p: argparse.ArgumentParser, out_flag: str = "--out-dir") -> None:
    g = p.add_argument_group("the launch script")
    g.add_argument(
        "--mode",
        choices=EMIT_MODES,
        default="shell",
        help="shell: run_all.sh; slurm: launch.sh with one sbatch per job; "
        "slurm-array: launch.sh submitting array jobs over a manifest (the mode for a "
        "whole phase)",
    )
    g.add_argument(
        "--slurm-template",
        help="your sbatch script (contract: the emit_slurm "
        "docstring in encoder_eval/plans/emit.py; example: examples/slurm_template.sh)",
    )
    g.add_argument(
        "--group",
        choices=GROUPS,
        help="cells run by one process: pair = every "
        "cell of a (model, task), lr = the seeds of one (model, task, LR), cell = "
        "one (default: pair for shell, lr for slurm/slurm-array: start-up paid "
        "once per 3-5 cells, jobs short enough for time limits)",
    )
    g.add_argument(
        "--units-per-job",
        type=int,
        metavar="N",
        help="slurm/slurm-array: units (see --group) one job or array task runs one after "
        f"another in one warm process, consecutive units of one model (default "
        f"{DEFAULT_UNITS_PER_JOB}; a probe sweep 1): a GPU process's start-up and first "
        "steps are paid once per job",
    )
    g.add_argument(
        "--no-warm",
        action="store_true",
        help="slurm/slurm-array: one unit a job, in its own process (--units-per-job 1); "
        "run_all.sh takes --no-warm when it runs instead",
    )
    g.add_argument("--requeue", action="store_true", help="pass --requeue to sbatch")
    g.add_argument(
        "--python",
        help="interpreter run_all.sh runs cells with, and every "
        "script checks which cells are done with (default: this one; $PYTHON "
        "overrides at run time)",
    )


def emit_options(args: argparse.Namespace) -> dict:
    """The keywords of `emit.emit` that `add_emit_arguments`'s flags set (one reading for
    `sweep`, `status --emit` and `track sweep`); `--no-warm` with `--units-per-job` above 1
    is refused."""
    per_job = args.units_per_job
    if args.no_warm:
        if per_job is not None and per_job != 1:
            raise HarnessError(f"give --no-warm or --units-per-job {per_job}, not both")
        per_job = 1
    return {
        "template": args.slurm_template,
        "requeue": args.requeue,
        "python": args.python,
        "group": args.group,
        "units_per_job": per_job,
    }


def _flags_given(args: argparse.Namespace, flags: tuple) -> list[str]:
    return [flag for dest, flag in flags if getattr(args, dest, None) not in (None, "", [])]


def _extra_args(args: argparse.Namespace) -> list[str]:
    """--extra-run-args shell-split into a list (`CellSettings.from_argv` reads it once)."""
    try:
        return shlex.split(args.extra_run_args or "")
    except ValueError as exc:
        raise HarnessError(f"--extra-run-args is not valid shell quoting ({exc})") from None


def probe_plan_from_args(args: argparse.Namespace) -> Plan:
    """The probe phase's Plan (`plan.build_probe_plan`) from the parsed flags."""
    wrong = _flags_given(args, _FINETUNE_FLAGS)
    if wrong:
        raise HarnessError(
            f"{wrong[0]} is for --phase select/report; drop it for --phase "
            "probe (its flags: --pooling, --k-folds, --seed, --precision)"
        )
    seed = None
    if args.seed is not None:
        try:
            seed = check_seed(int(args.seed))
        except ValueError:
            raise HarnessError(f"--seed {args.seed!r} must be one integer, e.g. 42") from None
    probe = ProbeSettings.asked(
        poolings=None if args.pooling is None else tuple(split_csv(args.pooling)),
        k_folds=args.k_folds,
        seed=seed,
        precision=args.precision,
    )
    inputs = PlanInputs(
        results_dir=args.results_dir or os.path.join("results", PROBE_PHASE),
        models=tuple(split_csv(args.models)),
        extra_models=tuple(args.model),
        tasks=tuple(split_csv(args.tasks)),
        tasks_files=tuple(args.tasks_file),
        trust_remote_code=tuple(split_csv(args.trust_remote_code)),
        data_dir=args.data_dir,
        device=args.device,
    )
    settings = CellSettings.from_argv(_extra_args(args), PROBE).given(
        max_seq_len=args.max_seq_len, limit=args.limit, report_to=args.report_to or None
    )
    return build_probe_plan(inputs, probe, settings)


def plan_from_args(args: argparse.Namespace, cfg: SweepConfig | None = None) -> Plan:
    """Build the Plan the parsed plan flags describe (`plan_and_config`)."""
    return plan_and_config(args, cfg)[0]


def plan_and_config(
    args: argparse.Namespace, cfg: SweepConfig | None = None
) -> tuple[Plan, SweepConfig | None]:
    """The Plan the parsed plan flags describe, and for a fine-tuning phase the flags
    merged with their experiment files (`cfg`, else `sweep_config.resolve(args)`; None for
    the probe phase, which reads no experiment file). The plan's settings are the
    experiment's or `--extra-run-args`' (`cfg.cell_settings`, typed) with the recipe
    entries the sweep's own flags give."""
    if (args.phase if cfg is None else cfg.phase) == PROBE_PHASE:
        return probe_plan_from_args(args), None
    wrong = _flags_given(args, _PROBE_FLAGS)
    if wrong:
        raise HarnessError(
            f"{wrong[0]} is for --phase probe; drop it for --phase {args.phase or 'select'}"
        )
    if cfg is None:
        cfg = resolve(args)
    if cfg.phase is None:
        raise HarnessError("give --phase select or --phase report")
    selection = None
    if cfg.selection is not None:
        selection = load_selection(cfg.selection)
    inputs = PlanInputs(
        results_dir=cfg.results_dir or os.path.join("results", cfg.phase),
        models=cfg.models,
        extra_models=cfg.model,
        tasks=cfg.tasks,
        tasks_files=cfg.tasks_files,
        trust_remote_code=cfg.trust_remote_code,
        pins=cfg.model_pins,
        data_dir=cfg.data_dir,
        device=cfg.device,
    )
    settings = cfg.cell_settings.given(
        max_steps=cfg.max_steps,
        max_seq_len=cfg.max_seq_len,
        selection_split=cfg.selection_split,
        limit=getattr(args, "limit", None),
        precision=getattr(args, "precision", None),
        report_to=getattr(args, "report_to", None) or None,
    )
    plan = build_plan(
        cfg.phase,
        inputs,
        settings,
        lr_keys=None if cfg.lr_keys is None else list(cfg.lr_keys),
        seeds=None if cfg.seeds is None else list(cfg.seeds),
        selection=selection,
    )
    return plan, cfg


def check_utf8_args(args: argparse.Namespace) -> None:
    """Refuse, naming the flag, any text flag that is not valid UTF-8 (a path's raw bytes):
    the launch scripts and records that hold it are UTF-8 text."""
    for dest, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                check_utf8(item, f"--{dest.replace('_', '-')}")


def check_utf8_plan(plan: Plan, out_dir: str | os.PathLike) -> None:
    """The same for the paths a plan took from files (an experiment's folder, a model's)."""
    check_utf8(out_dir, "--out-dir")
    check_utf8(plan.results_dir, "--results-dir")
    for path in [*([plan.data_dir] if plan.data_dir else []), *plan.tasks_files]:
        check_utf8(path, "the path")
    for cell in plan.cells:
        check_utf8(cell.model_path, f"model {cell.model!r}: its path")


def format_grid() -> str:
    lines = ["key    learning rate"]
    lines += [f"{key}   {lr:g}" for key, lr in LR_GRID.items()]
    lines.append(f"select seeds: {','.join(map(str, PHASE_SEEDS['select']))}")
    lines.append(f"report seeds: {','.join(map(str, PHASE_SEEDS['report']))}")
    lines.append("recipe flags on every cell: " + shlex.join(recipe_argv(PROTOCOL_RECIPE)))
    return "\n".join(lines)
