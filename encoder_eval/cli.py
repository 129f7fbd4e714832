"""`encoder-eval`: one command for the whole harness, with a subcommand per step.

    encoder-eval run ...          # = python -m encoder_eval.run ...
    encoder-eval sweep ...        # = python -m encoder_eval.sweep ...
    encoder-eval list tasks       # the task registry (with --tasks-file: user tasks too)
    encoder-eval --version

Each subcommand is a module of the package with a `main(argv)`; this file only dispatches,
so `python -m encoder_eval.<cmd>` and `encoder-eval <cmd>` are the same code. Modules are
imported on demand, and no command imports torch, transformers, scipy, scikit-learn,
statsmodels, pandas or matplotlib before its flags are parsed: `--help`, `--version` and a
usage error answer in a fraction of a second (tests/test_import_cost.py).
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass

from encoder_eval import __version__
from encoder_eval.core import heap
from encoder_eval.core.errors import (
    EXIT_INPUT_ERROR,
    EXIT_OK,
    ArgumentParser,
    report_errors,
    unknown_name,
)


@dataclass(frozen=True)
class Command:
    """A subcommand: the module whose `main(argv)` runs it, and one line of help."""

    module: str
    help: str


# One row per subcommand; a later command (compare, probe, track...) is one more row.
COMMANDS: dict[str, Command] = {
    "run": Command("encoder_eval.run", "fine-tune one cell (or several LRs x seeds of one pair)"),
    "sweep": Command("encoder_eval.sweep", "write the launch script of a protocol phase"),
    "select": Command("encoder_eval.select", "pick each (model, task)'s learning rate on dev"),
    "summarize": Command("encoder_eval.summarize", "the avg@5 table from report results"),
    "leaderboard": Command(
        "encoder_eval.leaderboard",
        "rank models across tasks, with bootstrap intervals and a critical-difference test",
    ),
    "status": Command("encoder_eval.status", "what is done, missing, diverged or corrupt"),
    "prefetch": Command("encoder_eval.prefetch", "mirror task data for offline nodes"),
    "compare": Command("encoder_eval.compare", "is model A really better than B, per task"),
    "probe": Command(
        "encoder_eval.probe", "linear probes on frozen embeddings (NeuCo-Bench mode), the Q score"
    ),
    "track": Command(
        "encoder_eval.track", "per-checkpoint receipts; did a checkpoint regress (noise-aware)"
    ),
    "estimate": Command("encoder_eval.estimate", "device-hours of the full protocol, measured"),
    "done": Command("encoder_eval.done", "exit 0 iff the given result files are done cells"),
    "report": Command("encoder_eval.report", "one self-contained HTML page of a results folder"),
    "export": Command(
        "encoder_eval.export",
        "results in other tools' formats (EuroEval, one row per example, a model's Hub-page "
        "eval results)",
    ),
    "push": Command(
        "encoder_eval.push",
        "upload a results folder to a Hugging Face dataset, or a model's scores to its Hub "
        "page (--to-model, a pull request)",
    ),
    "demo": Command("encoder_eval.demo", "the whole protocol on MiniLM and synthetic tasks"),
    "list": Command(
        "encoder_eval.cli", "list tasks, task groups, models, loader modes or the grid"
    ),
}

LIST_WHAT = ("tasks", "groups", "models", "modes", "grid")


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: encoder-eval [--version] <command> [args...]",
        "",
        "Compare encoder models by fine-tuning them under one fixed protocol.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {cmd.help}" for name, cmd in COMMANDS.items()),
        "",
        "`encoder-eval <command> --help` lists a command's flags; `python -m "
        "encoder_eval.<command>` is the same command.",
    ]
    return "\n".join(lines)


def _task_rows() -> list[dict]:
    from encoder_eval.data.tasks import TASK_KNOBS

    return [
        {
            "task": key,
            "bucket": k.bucket,
            "problem": k.problem,
            "metric": k.metric,
            "report_split": k.report_split,
            "languages": list(k.languages),
            "euro_languages": list(k.euro_languages),
            "source": str(k.data_dir or k.hf_path or _no_source(k.bucket)),
        }
        for key, k in TASK_KNOBS.items()
    ]


def _no_source(bucket: str) -> str:
    """The source shown for a task with neither its own folder nor a Hub dataset."""
    return "generated" if bucket == "synthetic" else "mirror (--data-dir DIR/<task>/)"


def _model_rows() -> list[dict]:
    from encoder_eval.data.models import MODEL_REGISTRY, as_entry, installed_packaged_models

    rows = []
    for key, row in MODEL_REGISTRY.items():
        entry = as_entry(row)
        rows.append(
            {
                "model": key,
                "path": entry.path,
                "mode": entry.mode,
                "trust_remote_code": bool(entry.trust_remote_code),
                "source": "registry",
            }
        )
    for key, (entry, package) in installed_packaged_models().items():
        rows.append(
            {
                "model": key,
                "path": entry.path,
                "mode": entry.mode,
                "trust_remote_code": False,
                "source": f"installed package {package} (run only when named)",
            }
        )
    return rows


def _mode_rows() -> list[dict]:
    from encoder_eval.data.models import mode_sources

    return [{"mode": m, "from": src} for m, src in mode_sources().items()]


def _group_rows() -> list[dict]:
    from encoder_eval.data.tasks import TASK_GROUPS, group_tasks

    return [{"group": g, "tasks": group_tasks(g)} for g in TASK_GROUPS]


def _text_table(rows: list[dict]) -> str:
    """Rows as aligned columns; list values are shown comma-joined (long ones as a count)."""

    def show(value) -> str:
        if isinstance(value, list):
            return (
                ",".join(value) if len(value) <= 8 else f"{len(value)} ({','.join(value[:3])},...)"
            )
        return str(value)

    if not rows:
        return "(none)"
    cols = list(rows[0])
    cells = [[show(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    out += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(out)


def list_main(argv: list[str] | None = None) -> int:
    """`encoder-eval list tasks|groups|models|modes|grid`: what the registries hold (`models`
    also shows the loader modes and where each comes from)."""
    p = ArgumentParser(prog="encoder-eval list", description="List what the harness knows.")
    p.add_argument("what", choices=LIST_WHAT, help="which registry to list")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--tasks-file",
        action="append",
        default=[],
        metavar="F",
        help="also list the tasks defined in this file (repeatable)",
    )
    args = p.parse_args(argv)
    from encoder_eval.data.taskfile import register_task_files

    register_task_files(args.tasks_file)
    if args.what == "grid":
        from encoder_eval.plans.arguments import format_grid

        if args.format == "json":
            from encoder_eval.core.protocol import LR_GRID, PHASE_SEEDS, PROTOCOL_RECIPE

            print(
                json.dumps(
                    {"lr_grid": LR_GRID, "seeds": PHASE_SEEDS, "recipe": PROTOCOL_RECIPE.to_dict()},
                    indent=2,
                )
            )
        else:
            print(format_grid())
        return EXIT_OK
    rows = {"tasks": _task_rows, "groups": _group_rows, "models": _model_rows, "modes": _mode_rows}[
        args.what
    ]()
    print(json.dumps(rows, indent=2) if args.format == "json" else _text_table(rows))
    if args.what == "models" and args.format == "text":
        print(f"\nloader modes (list modes):\n{_text_table(_mode_rows())}")
    return EXIT_OK


@report_errors
def main(argv: list[str] | None = None) -> int:
    """Dispatch `encoder-eval <command> args...` to the command's module."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return EXIT_OK if argv else EXIT_INPUT_ERROR
    if argv[0] in ("-V", "--version"):
        print(f"encoder-eval {__version__}")
        return EXIT_OK
    name, rest = argv[0], argv[1:]
    heap.limit_primitive_cache()  # before any command creates its first CPU kernel
    if name not in COMMANDS:
        print(f"error: {unknown_name('command', name, COMMANDS)}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    if name == "list":
        return list_main(rest)
    return int(importlib.import_module(COMMANDS[name].module).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
