"""`encoder-eval status`: how far a phase is, and a launch script for what is left.

Usage::

    encoder-eval status --results-dir results/select
    encoder-eval status --results-dir results/report
    # re-emit a script for just the missing cells (with the sweep's max steps, data, device)
    encoder-eval status --results-dir results/select \\
        --emit runs/select-rest --mode slurm --slurm-template my.sbatch

The expected cells are those the sweep planned: the experiment file it wrote into the
results directory (`experiment.toml`, see `encoder_eval.plans.experiment`) gives the phase,
models, tasks, LR keys, seeds, recipe overrides, data directory, device and (report) the
selection; flags may narrow `--models`/`--tasks` but not contradict the file. Without the
file (results of an older sweep) they are those `encoder_eval.sweep` would plan from the
same flags (`--phase`, `--models`, `--model`, `--tasks`, `--lr-keys`, `--seeds`,
`--max-steps`, ...: pass the ones the sweep got). Each is counted, by `results.cell_state`
(the definition every script and command shares), as one of:

* done: a result that parses, validates and names this cell (phase included), status ok;
* diverged: such a result whose training diverged (a finished outcome, not re-run);
* corrupt: a result file that reads but does not parse, validate or name this cell (listed
  with why; the scripts and `run --skip-existing` move it aside into `.corrupt/` and re-run
  the cell);
* kept: a file to leave alone: one that cannot be read (permissions, I/O errors), one a
  newer harness wrote, or another model's result under this cell's name (listed with why;
  nothing moves it or runs the cell over it until you fix or move it);
* missing: no result file yet.

Results in the directory that the plan does not cover are counted as "other", and the
files moved aside into `.corrupt/` as "moved aside". Every entry of the directory that is
not a valid result of this phase gets one warning on stderr naming it and why, as in
`select` and `summarize`. Status only reads: it moves nothing.
`--emit DIR` writes a script (`--mode shell|slurm|slurm-array`, with the sweep's options)
covering only the missing and corrupt cells; nothing is written when there are none.

Resume states (`.resume-<result name>.pt`, a stopped cell's saved state, hundreds of MB
for a base-size model) in the results directory are listed with their size and whether
their cell is done. `--clean-resume` removes those whose cell is done (left over: the next
run would never read them); `--clean-resume all` removes every one, so an unfinished cell
starts over. A state whose cell another runner holds is never removed. Nothing else is
ever written or removed by status without `--emit`.

Exit status: 0 when every cell is done or diverged; 1 when some are missing, corrupt or
kept; 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    report_errors,
    warn_once,
)
from encoder_eval.core.results import (
    CORRUPT,
    DONE_STATES,
    KEPT,
    MISSING,
    QUARANTINE_DIR,
    RESUME_PREFIX,
    RESUME_SUFFIX,
    cell_lock,
    cell_state,
    count_quarantined,
    load_results,
)
from encoder_eval.plans import experiment
from encoder_eval.plans.arguments import (
    add_emit_arguments,
    add_plan_arguments,
    check_utf8_args,
    check_utf8_plan,
    plan_from_args,
)
from encoder_eval.plans.emit import emit
from encoder_eval.plans.plan import Cell, Plan

STATES = ("done", "diverged", "corrupt", "kept", "missing")


@dataclass(frozen=True)
class ResumeState:
    """A resume state in the results directory: its file and size, the result file of its
    cell, whether that cell is done, and the cell's label when the plan holds it."""

    path: Path
    size: int
    result: Path
    done: bool
    label: str | None


@dataclass
class Status:
    plan: Plan
    cells: dict[str, list[Cell]]  # state -> cells
    reasons: dict[str, str] = field(default_factory=dict)  # corrupt or kept file -> why
    other: list[str] = field(default_factory=list)  # result files the plan does not cover
    moved_aside: int = 0  # corrupt results moved into the results directory's .corrupt/
    resume: list[ResumeState] = field(default_factory=list)  # resume states left in the dir

    def count(self, state: str) -> int:
        return len(self.cells[state])

    @property
    def to_run(self) -> list[Cell]:
        """The cells a script still has to run (missing or corrupt), in plan order."""
        todo = {id(c) for c in self.cells["missing"] + self.cells["corrupt"]}
        return [c for c in self.plan.cells if id(c) in todo]

    @property
    def complete(self) -> bool:
        return not self.to_run and not self.cells["kept"]


def phase_status(plan: Plan) -> Status:
    """Classify every cell of the plan by its result file (`results.cell_state`)."""
    cells: dict[str, list[Cell]] = {s: [] for s in STATES}
    reasons = {}
    for cell in plan.cells:
        path = plan.out_json(cell)
        state, _, why = plan.cell_status(cell)
        if state in (CORRUPT, KEPT):
            reasons[path] = why
        cells[{MISSING: "missing", CORRUPT: "corrupt", "ok": "done"}.get(state, state)].append(cell)
    planned = {os.path.basename(plan.out_json(c)) for c in plan.cells}
    root = Path(plan.results_dir)
    other = []
    if root.is_dir():
        other = sorted(
            str(p)
            for p in root.glob("*.json")
            if not p.name.startswith(".")
            and p.name not in planned
            and not p.name.endswith(".predictions.json")
        )
    return Status(
        plan, cells, reasons, other, count_quarantined(plan.results_dir), resume_states(plan)
    )


def resume_states(plan: Plan) -> list[ResumeState]:
    """The resume states in the plan's results directory, each with whether its cell (the
    result file it is named after) is done (`results.cell_state`)."""
    root = Path(plan.results_dir)
    if not root.is_dir():
        return []
    labels = {os.path.basename(plan.out_json(c)): c.label for c in plan.cells}
    out = []
    for path in sorted(root.glob(f"{RESUME_PREFIX}*{RESUME_SUFFIX}")):
        name = path.name[len(RESUME_PREFIX) : -len(RESUME_SUFFIX)]
        try:
            size = path.stat().st_size
        except OSError:
            continue
        done = cell_state(root / name, plan.phase)[0] in DONE_STATES
        out.append(ResumeState(path, size, root / name, done, labels.get(name)))
    return out


def clean_resume(states: list[ResumeState], which: str) -> tuple[list[ResumeState], list[str]]:
    """Remove the resume states of done cells (`which` "done"), or all of them ("all");
    returns (removed, lines saying what was left and why). A state whose cell another
    runner holds (its cell lock) is left: that runner is reading or writing it."""
    removed, left = [], []
    for state in states:
        if which != "all" and not state.done:
            continue
        with cell_lock(state.result) as mine:
            if not mine:
                left.append(f"left {state.path}: another runner is running its cell")
                continue
            try:
                state.path.unlink()
            except FileNotFoundError:
                continue  # its cell finished and removed it meanwhile
            except OSError as exc:
                left.append(f"left {state.path}: {exc.strerror or exc}")
                continue
        removed.append(state)
    return removed, left


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def format_status(status: Status, limit: int | None = 50) -> str:
    plan = status.plan
    total = len(plan.cells)
    lines = [f"{plan.phase} phase, {plan.results_dir}: {total} cells planned"]
    if plan.shrunk:
        lines.append("  (shrunken plan: " + "; ".join(plan.shrunk) + ")")
    for state in STATES:
        lines.append(f"  {state:<9}{status.count(state):>6}")
    if status.other:
        lines.append(f"  {'other':<9}{len(status.other):>6}  (results outside this plan)")
    if status.moved_aside:
        where = os.path.join(plan.results_dir, QUARANTINE_DIR)
        lines.append(
            f"  {'moved aside':<9}{status.moved_aside:>4}  (corrupt results kept in "
            f"{where}; never read)"
        )
    for state in ("diverged", "corrupt", "kept", "missing"):
        cells = status.cells[state]
        if not cells:
            continue
        lines.append(f"{state}:")
        shown = cells if limit is None else cells[:limit]
        for c in shown:
            path = plan.out_json(c)
            why = f"  ({status.reasons[path]})" if path in status.reasons else ""
            lines.append(f"  {c.label}  {path}{why}")
        if len(shown) < len(cells):
            lines.append(f"  ... and {len(cells) - len(shown)} more (--list-all shows them)")
    if status.resume:
        total = sum(r.size for r in status.resume)
        lines.append(
            f"resume states: {len(status.resume)} ({_mb(total)}), saved when a signal "
            "stopped a cell:"
        )
        for r in status.resume:
            what = (
                "its cell is done: left over, never read again"
                if r.done
                else "its cell is not done: its next run resumes from it"
            )
            lines.append(f"  {r.label or '(not in this plan)'}  {r.path}  {_mb(r.size)}  ({what})")
        lines.append(
            "--clean-resume removes those of done cells; --clean-resume all removes "
            "every one (an unfinished cell then starts over)"
        )
    if status.cells["corrupt"]:
        lines.append(
            "corrupt files do not count as done: the phase's script (or --emit) moves "
            "them aside into .corrupt/ and re-runs their cells"
        )
    if status.cells["kept"]:
        lines.append(
            "kept files do not count as done, and nothing moves them or runs their "
            "cells over them: fix or move each (see why above), then run again"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval status",
        description="Count done / diverged / corrupt / missing cells of a phase and optionally "
        "write a launch script for the missing and corrupt ones.",
    )
    add_plan_arguments(p)
    add_emit_arguments(p)
    p.add_argument(
        "--emit",
        metavar="DIR",
        help="write a launch script for the missing and "
        "corrupt cells into DIR (--mode picks its kind)",
    )
    p.add_argument("--list-all", action="store_true", help="list every cell, not the first 50")
    p.add_argument(
        "--clean-resume",
        nargs="?",
        const="done",
        choices=("done", "all"),
        help="remove the resume states of done cells (left over); 'all': every "
        "resume state, so unfinished cells start over",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.results_dir is None:
        raise HarnessError("give --results-dir (the phase's result directory)")
    check_utf8_args(args)
    cfg = experiment.resolve(args, results_manifest=True)
    plan = plan_from_args(args, cfg)
    if args.emit:
        check_utf8_plan(plan, args.emit)
        experiment.check_consent(cfg)
    status = phase_status(plan)
    load_results(plan.results_dir, phase=plan.phase)  # one warning per entry it skips
    if args.clean_resume:
        removed, left = clean_resume(status.resume, args.clean_resume)
        warn = warn_once()
        for line in left:
            warn(line)
        print(f"removed {len(removed)} resume state(s), {_mb(sum(r.size for r in removed))}")
        status.resume = resume_states(plan)
    emitted = None
    if args.emit and status.to_run:
        emitted = emit(
            plan,
            args.emit,
            args.mode,
            cells=status.to_run,
            template=args.slurm_template,
            requeue=args.requeue,
            python=args.python,
            group=args.group,
        )
    print(format_status(status, limit=None if args.list_all else 50))
    if args.emit:
        print(emitted.describe() if emitted else "nothing to run: no script written")
    return EXIT_OK if status.complete else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
