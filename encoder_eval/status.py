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
* queued, running: no result yet (missing, or corrupt: its run moves the file aside), and a
  Slurm job of this results directory that will run it is pending or running. Read from
  `squeue` (your jobs) when it is installed: each job a launch script submits names its
  cells in its comment (`encoder_eval.plans.queue`), so this holds for every grouping and
  mode, and for the jobs of a `status --emit` script too. Without squeue these rows are not
  shown (and those cells count as missing);
* missing: no result file yet.

Results in the directory that the plan does not cover are counted as "other", and the
files moved aside into `.corrupt/` as "moved aside". Every entry of the directory that is
not a valid result of this phase gets one warning on stderr naming it and why, as in
`select` and `summarize`. Status only reads: it moves nothing.
`--emit DIR` writes a script (`--mode shell|slurm|slurm-array`, with the sweep's options)
covering only the missing and corrupt cells, never a queued or running one (a squeue that
is installed but fails is then an error); nothing is written when there are none. Every
result file is read once.

Resume states (`.resume-<result name>.pt`, a stopped cell's saved state, hundreds of MB
for a base-size model) in the results directory are listed with their size and whether
their cell is done. `--clean-resume` removes those whose cell is done (left over: the next
run would never read them); `--clean-resume all` removes every one, so an unfinished cell
starts over. A state whose cell another runner holds is never removed. Nothing else is
ever written or removed by status without `--emit`.

Exit status: 0 when every cell is done or diverged; 1 when some are missing, corrupt,
kept, queued or running; 2 on bad input.
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
    planned_cell_state,
)
from encoder_eval.plans import sweep_config
from encoder_eval.plans.arguments import (
    add_emit_arguments,
    add_plan_arguments,
    check_utf8_args,
    check_utf8_plan,
    emit_options,
    plan_from_args,
)
from encoder_eval.plans.emit import emit
from encoder_eval.plans.plan import Cell, Plan
from encoder_eval.plans.queue import QUEUED, RUNNING, held_cells, squeue_lines

STATES = ("done", "diverged", "corrupt", "kept", QUEUED, RUNNING, "missing")
# A verdict of `results.cell_state` by result file: what status read, each file once.
Verdicts = dict[Path, tuple[str, dict | None, str | None]]


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
    queue_read: bool = False  # whether squeue said which cells are queued or running
    states: dict[str, str] = field(default_factory=dict)  # result file -> cell_state's state

    def count(self, state: str) -> int:
        return len(self.cells[state])

    @property
    def to_run(self) -> list[Cell]:
        """The cells a script still has to run (missing or corrupt), in plan order."""
        todo = {id(c) for c in self.cells["missing"] + self.cells["corrupt"]}
        return [c for c in self.plan.cells if id(c) in todo]

    @property
    def complete(self) -> bool:
        return not any(self.cells[s] for s in ("missing", "corrupt", "kept", QUEUED, RUNNING))


def phase_status(
    plan: Plan, verdicts: Verdicts | None = None, held: dict[str, str] | None = None
) -> Status:
    """Classify every cell of the plan by its result file (`results.cell_state`; from
    `verdicts`, the files already read, when there) and, when `held` (`queue.held_cells`)
    is given, a cell without a result that a Slurm job holds as queued or running."""
    verdicts = verdicts or {}
    cells: dict[str, list[Cell]] = {s: [] for s in STATES}
    reasons, states = {}, {}
    for cell in plan.cells:
        path = plan.out_json(cell)
        known = verdicts.get(Path(path))
        if known is None:
            state, _, why = plan.cell_status(cell)
        else:
            state, _, why = planned_cell_state(known, cell.model, cell.task)
        states[path] = state
        if state in (CORRUPT, KEPT):
            reasons[path] = why
        if state in (MISSING, CORRUPT) and held and path in held:
            cells[held[path]].append(cell)
            continue
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
    resume = resume_states(plan, verdicts)
    return Status(
        plan, cells, reasons, other, count_quarantined(plan.results_dir), resume,
        held is not None, states,
    )  # fmt: skip


def resume_states(plan: Plan, verdicts: Verdicts | None = None) -> list[ResumeState]:
    """The resume states in the plan's results directory, each with whether its cell (the
    result file it is named after) is done (`results.cell_state`; from `verdicts` when
    that file was read already)."""
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
        known = (verdicts or {}).get(root / name)
        done = (known or cell_state(root / name, plan.phase))[0] in DONE_STATES
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
        if state in (QUEUED, RUNNING) and not status.queue_read:
            continue  # no squeue here: nothing is known of the jobs
        lines.append(f"  {state:<9}{status.count(state):>6}")
    if status.other:
        lines.append(f"  {'other':<9}{len(status.other):>6}  (results outside this plan)")
    if status.moved_aside:
        where = os.path.join(plan.results_dir, QUARANTINE_DIR)
        lines.append(
            f"  {'moved aside':<9}{status.moved_aside:>4}  (corrupt results kept in "
            f"{where}; never read)"
        )
    for state in ("diverged", "corrupt", "kept", RUNNING, QUEUED, "missing"):
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


def _held_cells(plan: Plan, must: bool) -> dict[str, str] | None:
    """The plan's cells that Slurm jobs hold (`queue.held_cells`), None without squeue. A
    squeue that fails is an error when `must` (--emit would submit queued cells again), else
    a warning, and the cells count as missing."""
    warn = warn_once()
    try:
        lines = squeue_lines()
    except HarnessError as exc:
        if must:
            raise HarnessError(f"{exc}; --emit would submit them again") from None
        warn(f"{exc}: queued and running cells count as missing")
        return None
    if lines is None:
        return None
    held, problems = held_cells(plan, lines)
    for line in problems:
        warn(line)
    return held


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.results_dir is None:
        raise HarnessError("give --results-dir (the phase's result directory)")
    check_utf8_args(args)
    cfg = sweep_config.resolve(args, results_manifest=True)
    plan = plan_from_args(args, cfg)
    if args.emit:
        check_utf8_plan(plan, args.emit)
        sweep_config.check_consent(cfg)
    verdicts: Verdicts = {}
    # One warning per entry it skips; every file's verdict kept, so each is read once.
    load_results(plan.results_dir, phase=plan.phase, states=verdicts)
    held = _held_cells(plan, must=bool(args.emit))
    status = phase_status(plan, verdicts, held)
    if args.clean_resume:
        removed, left = clean_resume(status.resume, args.clean_resume)
        warn = warn_once()
        for line in left:
            warn(line)
        print(f"removed {len(removed)} resume state(s), {_mb(sum(r.size for r in removed))}")
        status.resume = resume_states(plan, verdicts)
    emitted = None
    if args.emit and status.to_run:
        emitted = emit(
            plan,
            args.emit,
            args.mode,
            cells=status.to_run,
            known=status.states,
            **emit_options(args),
        )
    print(format_status(status, limit=None if args.list_all else 50))
    if args.emit:
        print(emitted.describe() if emitted else "nothing to run: no script written")
    return EXIT_OK if status.complete else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
