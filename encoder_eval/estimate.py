"""`encoder-eval estimate`: the protocol's device-hours, from measured cells.

A protocol cell's cost is built from measured parts and the protocol's own counts:

- **steps**: the task's step cap (`protocol.step_budget` on its full training split) times
  the share of it that measured on-protocol cells of the task (else of the model) ran before
  early stopping; the whole cap when none did;
- **seconds per step**: the cells' own training steps, `training.train_time_s` less the dev
  evaluations inside it (`training.dev_eval_time_s`), over `training.steps`, from cells of
  the task where there are some, else of the model; wall time with dev evaluations is not a
  step's cost (a 4-step smoke cell evaluates dev after every step). The step comes from the
  cells that ran after another in their process (`later_in_process`: `training.process_cell`,
  or for older results their timings), whose batch widths
  were mostly met before; all cells when none did;
- **first meetings**: what a process's first cell paid per step beyond that
  (`first_meeting_s`), a fresh process's cost of meeting a batch width, charged for at most
  `max_seq_len` steps of each fresh cell (a warm worker's cells are not charged);
- **dev evaluations**: the protocol's cadence on the task (`protocol.eval_interval`) times the
  measured seconds of one evaluation of that task (`dev_eval_time_s` over the evaluations in
  `dev_history`); a task no cell measured is counted without them, and the output says so;
- **start-up**: one fresh process per cell (the bound above every plan; GPU plans are warm
  by default: `run_all.sh --gpus`, warm Slurm jobs) pays `process_start_to_first_step_s`
  per cell (per task the smallest, a process's first cell; the median over tasks); a warm
  worker pays it once and each cell only `time_to_first_step_s` (its model load,
  tokenisation, first step), and K warm workers per GPU (`core/gpu_share.workers_per_gpu`
  for the model's memory on a `--gpu-memory-gib` card) run `gpu_share.measured_gain(K)` as
  many cells an hour as one (bench/README.md's H200 figure; not measured above K = 2).

A model runs at the speed its measured cells show on *their* device; the output says when
they are unlike the protocol's cells (off-protocol recipe, --limit, a CPU, short cells).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    report_errors,
)
from encoder_eval.core.gpu_share import GIB, measured_gain, workers_per_gpu
from encoder_eval.core.protocol import (
    LR_GRID,
    PROTOCOL_RECIPE,
    REPORT_SEEDS,
    SELECT_SEEDS,
    eval_interval,
    name_reasons,
    step_budget,
)
from encoder_eval.core.results import load_results
from encoder_eval.data.model_memory import model_size, training_memory_bytes
from encoder_eval.data.tasks import TASK_KNOBS, resolve_task_names, task_knobs

CELLS_PER_PAIR = len(LR_GRID) * len(SELECT_SEEDS) + len(REPORT_SEEDS)  # 30 select + 5 report
DEFAULT_CARD_GIB = 80.0  # an H100's 80 GB; an H200 has 141
# Cells shorter than this on average meet each batch width for the first time in a larger
# share of their steps than a protocol cell (hundreds to thousands of steps) does.
SHORT_CELL_STEPS = 200


def cell_step_cap(task: str) -> int:
    """The most optimizer steps one protocol cell of `task` can run on the full data."""
    return _budget(task)[1]


def _budget(task: str) -> tuple[int, int]:
    """(steps per epoch, step cap) of a protocol cell of `task` on its full training split."""
    rows = task_knobs(task).train_rows  # from the dataset card: the task row's `train_rows`
    if rows is None:
        known = [k for k, v in TASK_KNOBS.items() if v.train_rows is not None]
        raise HarnessError(
            f"no full-data size is known for task {task!r}; estimate covers {', '.join(known)}"
        )
    if math.isinf(rows):
        return PROTOCOL_RECIPE.max_steps, PROTOCOL_RECIPE.max_steps
    return step_budget(int(rows))


def protocol_evaluations(task: str, steps: float) -> int:
    """Dev evaluations a protocol cell of `task` makes in `steps` steps (the cadence)."""
    per_epoch, cap = _budget(task)
    return max(1, math.ceil(steps / eval_interval(per_epoch, cap)))


@dataclass(frozen=True)
class TaskCost:
    """One protocol cell of a task, as a model's measured cells price it."""

    steps: float
    step_s: float
    step_s_measured_on_task: bool
    evaluations: int
    eval_s: float | None  # None: no measured cell of the task, evaluations not counted
    startup_s: float
    setup_s: float
    first_meetings: int = 0  # batch widths a fresh process meets for the first time
    first_meeting_s: float = 0.0  # what each costs beyond a warm step

    def seconds(self, fresh: bool) -> float:
        """One cell: in a fresh process (start-up, every width met cold) or in a warm worker
        (its own set-up; its widths met by the worker's earlier cells)."""
        evals = self.evaluations * (self.eval_s or 0.0)
        steps = self.steps * self.step_s + evals
        if fresh:
            return steps + self.startup_s + self.first_meetings * self.first_meeting_s
        return steps + self.setup_s


@dataclass(frozen=True)
class ModelCost:
    """What the measured cells of one model on one device say a protocol cell costs."""

    model: str
    device: str
    on_gpu: bool
    cells: int
    steps: int  # training steps of the measured cells, summed
    seconds_per_step: float  # training step only: dev evaluations taken out
    wall_seconds_per_step: float  # train_time_s / steps, dev evaluations in (the old figure)
    # Steps run / step cap over the measured on-protocol cells (how much early stopping
    # saves); None when no measured cell ran on protocol (a shrunken cap says nothing).
    budget_share: float | None
    startup_s: float  # process start to the first step of a fresh process's first cell
    setup_s: float  # cell start to its first step (what a warm worker's cell pays)
    task_step_s: dict[str, float] = field(default_factory=dict)
    task_eval_s: dict[str, float] = field(default_factory=dict)
    task_share: dict[str, float] = field(default_factory=dict)
    # How many measured cells are off-protocol, and the distinct reasons their results give
    # (`protocol.off_protocol_reasons`): their step may cost otherwise than a protocol step's.
    off_protocol: int = 0
    off_reasons: tuple[str, ...] = ()
    memory_bytes: int | None = None  # one training process at 256 tokens (model_memory)
    # Cells that ran after another in their process (`later_in_process`): their steps met
    # the batch widths warm and give `seconds_per_step`; a first cell's steps cost
    # `first_meeting_s` more each, since each of its steps met a width for the first time.
    later_cells: int = 0
    first_meeting_s: float = 0.0

    def task_cost(self, task: str, whole_cap: bool = False) -> TaskCost:
        """One protocol cell of `task`: at the measured early-stopping point, or with
        `whole_cap` at its step cap."""
        share = None if whole_cap else self.task_share.get(task, self.budget_share)
        steps = cell_step_cap(task) * (1.0 if share is None else share)
        return TaskCost(
            steps=steps,
            step_s=self.task_step_s.get(task, self.seconds_per_step),
            step_s_measured_on_task=task in self.task_step_s,
            evaluations=protocol_evaluations(task, steps),
            eval_s=self.task_eval_s.get(task),
            startup_s=self.startup_s,
            setup_s=self.setup_s,
            # at most one width per padded length: max_seq_len of them
            first_meetings=min(math.ceil(steps), PROTOCOL_RECIPE.max_seq_len),
            first_meeting_s=self.first_meeting_s,
        )

    def workers_per_gpu(self, card_bytes: int, given: int | None = None) -> int:
        """K warm workers per GPU for this model on a card of `card_bytes` (`given` when
        set; 1 on a CPU, or when the model's size is unknown)."""
        if not self.on_gpu:
            return 1
        if given is not None:
            return given
        if self.memory_bytes is None:
            return 1
        return workers_per_gpu(self.memory_bytes, card_bytes)

    def hours(
        self, tasks: list[str], fresh: bool = True, k: int = 1, whole_cap: bool = False
    ) -> float:
        """Device-hours of every protocol cell of `tasks`: one fresh process per cell, or
        warm workers, K per GPU (throughput `measured_gain(K)` times one worker's)."""
        secs = sum(CELLS_PER_PAIR * self.task_cost(t, whole_cap).seconds(fresh) for t in tasks)
        return secs / 3600 / (1.0 if fresh else measured_gain(k))


@dataclass(frozen=True)
class _Measured:
    """What one finished cell's result says about its costs."""

    task: str
    steps: int
    train_s: float  # train_time_s: the loop, its dev evaluations in
    step_s: float  # the loop less its dev evaluations
    dev_s: float | None  # dev_eval_time_s, None for a --limit cell (its dev split is cut)
    evaluations: int
    startup_s: float | None  # process_start_to_first_step_s
    setup_s: float | None  # time_to_first_step_s
    wall_s: float | None
    on_protocol: bool
    cap: int
    reasons: tuple[str, ...]
    process_cell: int | None = None  # its number among its process's cells (1: the first)

    @property
    def gap(self) -> float | None:
        """Seconds between its process's start (a warm unit's arrival) and this cell's."""
        if self.startup_s is None or self.setup_s is None:
            return None
        return self.startup_s - self.setup_s


def _measured(r) -> _Measured:
    t = r.data["training"]
    steps, train_s = int(t["steps"]), float(t["train_time_s"])
    dev = t.get("dev_eval_time_s")
    dev_s = min(float(dev or 0.0), train_s)
    limited = bool(r.data["recipe"].get("limit"))
    on = bool(r.data["protocol"].get("on_protocol"))
    return _Measured(
        task=r.cell["task"],
        steps=steps,
        train_s=train_s,
        step_s=train_s - dev_s,
        dev_s=None if dev is None or limited else float(dev),
        evaluations=len(t.get("dev_history") or []),
        startup_s=_float(t.get("process_start_to_first_step_s")),
        setup_s=_float(t.get("time_to_first_step_s")),
        wall_s=_float(t.get("wall_time_s")),
        on_protocol=on,
        cap=int(t.get("max_steps") or steps),
        reasons=() if on else tuple(r.data["protocol"].get("off_protocol_reasons") or
                                    ["off-protocol"]),
        process_cell=t.get("process_cell"),
    )  # fmt: skip


def _float(value) -> float | None:
    return None if value is None else float(value)


def later_in_process(cells: list[_Measured]) -> list[bool]:
    """Which cells ran after another cell in their process, so met their batch widths warm.

    A cell's gap (`process_start_to_first_step_s` less `time_to_first_step_s`) is what its
    process did before the cell began: a process's first cell waited only for the imports;
    a later one also for at least one whole earlier cell. So a cell is later when its gap
    exceeds the smallest gap (a first cell's imports) by at least (0.9 of) the shortest
    cell (`wall_time_s`). A first cell whose imports took longer than that by more than the
    shortest cell counts as later; a result without the timings counts as a first cell.
    A result that records its number among its process's cells (`training.process_cell`,
    written since 2026-12-06) says so exactly, and that number decides."""
    gaps = [c.gap for c in cells if c.gap is not None and c.process_cell is None]
    walls = [c.wall_s for c in cells if c.wall_s is not None]
    floor = min(gaps) + 0.9 * min(walls) if gaps and walls else None
    return [
        c.process_cell > 1
        if c.process_cell is not None
        else floor is not None and c.gap is not None and c.gap >= floor
        for c in cells
    ]


def _cost(model: str, device: str, on_gpu: bool, cells: list[_Measured]) -> ModelCost:
    """A model's costs on one device from its measured cells (see the module docstring)."""
    later = later_in_process(cells)
    warm = [c for c, w in zip(cells, later, strict=True) if w]
    cold = [c for c, w in zip(cells, later, strict=True) if not w]
    basis = warm or cells  # without a later cell, steps carry their first meetings

    def per_step(group: list[_Measured]) -> float:
        return sum(c.step_s for c in group) / sum(c.steps for c in group)

    step = per_step(basis)
    tasks = dict.fromkeys(c.task for c in cells)
    task_step = {}
    for task in tasks:
        of_task = [c for c in basis if c.task == task]
        if of_task:
            task_step[task] = per_step(of_task)
    first_meeting = 0.0
    if warm and cold:  # what a cold step costs beyond a warm one
        extra = sum(c.step_s - c.steps * task_step.get(c.task, step) for c in cold)
        first_meeting = max(0.0, extra / sum(c.steps for c in cold))
    evals: dict[str, list[float]] = {}
    for c in cells:
        if c.evaluations and c.dev_s is not None:
            acc = evals.setdefault(c.task, [0.0, 0])
            acc[0] += c.dev_s
            acc[1] += c.evaluations
    # start-up: per task the smallest (a process's first cell), the median over tasks
    startups = []
    for task in tasks:
        of_task = [c.startup_s for c in cells if c.task == task and c.startup_s is not None]
        if of_task:
            startups.append(min(of_task))
    setups = [c.setup_s for c in cells if c.setup_s is not None]
    on = [c for c in cells if c.on_protocol]
    runs = {t: (sum(c.steps for c in on if c.task == t), sum(c.cap for c in on if c.task == t))
            for t in tasks}  # fmt: skip
    size = model_size(model)
    recipe = PROTOCOL_RECIPE
    memory = None
    if size is not None:
        memory = training_memory_bytes(size, recipe.max_seq_len, recipe.batch_size)
    reasons = dict.fromkeys(r for c in cells for r in c.reasons)
    return ModelCost(
        model=model,
        device=device,
        on_gpu=on_gpu,
        cells=len(cells),
        steps=sum(c.steps for c in cells),
        seconds_per_step=step,
        wall_seconds_per_step=sum(c.train_s for c in cells) / sum(c.steps for c in cells),
        budget_share=sum(c.steps for c in on) / sum(c.cap for c in on) if on else None,
        startup_s=statistics.median(startups) if startups else 0.0,
        setup_s=statistics.median(setups) if setups else 0.0,
        task_step_s=task_step,
        task_eval_s={t: s / n for t, (s, n) in evals.items() if n},
        task_share={t: run / cap for t, (run, cap) in runs.items() if cap},
        off_protocol=len(cells) - len(on),
        off_reasons=tuple(reasons),
        memory_bytes=memory,
        later_cells=len(warm),
        first_meeting_s=first_meeting,
    )


def measure(results_dirs: list[str], warn=None) -> list[ModelCost]:
    """Per (model, device): what a step, an evaluation and a start-up of the finished cells
    cost, and how much of their step cap the on-protocol ones ran."""
    groups: dict[tuple[str, str], list[_Measured]] = {}
    gpu: dict[tuple[str, str], bool] = {}
    for directory in results_dirs:
        if not Path(directory).is_dir():
            raise HarnessError(f"--results-dir {directory} is not a directory")
        for r in load_results(directory, warn=warn):
            t = r.data["training"]
            if not r.ok or not t.get("steps") or not t.get("train_time_s"):
                continue
            hw = r.data["provenance"].get("hardware") or {}
            device = hw.get("gpu") or f"CPU ({hw.get('cpu') or 'unknown'})"
            groups.setdefault((r.cell["model"], device), []).append(_measured(r))
            gpu[(r.cell["model"], device)] = bool(hw.get("gpu"))
    return [_cost(m, d, gpu[(m, d)], cells) for (m, d), cells in sorted(groups.items())]


def unlike_protocol(c: ModelCost) -> list[str]:
    """How the measured cells of `c` differ from the protocol's cells, one clause each."""
    notes = []
    if c.off_protocol:
        notes.append(
            f"{c.off_protocol} of the {c.cells} cell(s) are off-protocol "
            f"({name_reasons(c.off_reasons)})"
        )
    if not c.on_gpu:
        notes.append("they ran on a CPU: these are CPU-hours, not GPU-hours")
    if not c.later_cells:
        notes.append(
            "no cell ran after another in its process, so s/step holds each step's first "
            "meeting with its batch width, which a protocol cell pays for at most "
            f"{PROTOCOL_RECIPE.max_seq_len} of its steps (on an H200 a fresh process's first "
            "cell stepped 5.1x slower than its second): run two cells in one process "
            "(`--seed 42,43`) to separate them"
        )
    if c.steps / c.cells < SHORT_CELL_STEPS:
        notes.append(
            f"they ran {c.steps / c.cells:.0f} steps on average, against hundreds to "
            "thousands in a protocol cell"
        )
    if c.budget_share is None:
        notes.append("no cell ran on protocol, so no early-stopping point: each cell is "
                     "counted at its whole step cap")  # fmt: skip
    return notes


def _rows(costs: list[ModelCost], tasks: list[str], card_bytes: int, k_given) -> list[dict]:
    rows = []
    for c in costs:
        k = c.workers_per_gpu(card_bytes, k_given)
        rows.append(
            {
                "model": c.model,
                "device": c.device,
                "measured_cells": c.cells,
                "seconds_per_step": round(c.seconds_per_step, 4),
                "wall_seconds_per_step": round(c.wall_seconds_per_step, 4),
                "seconds_per_dev_evaluation": {t: round(s, 3) for t, s in c.task_eval_s.items()},
                "startup_s": round(c.startup_s, 2),
                "cells_after_another_in_process": c.later_cells,
                "first_meeting_s": round(c.first_meeting_s, 4),
                "cell_setup_s": round(c.setup_s, 2),
                "budget_share": None if c.budget_share is None else round(c.budget_share, 3),
                "workers_per_gpu": k,
                "worker_memory_gib": None
                if c.memory_bytes is None
                else round(c.memory_bytes / GIB, 1),
                "hours_upper_bound": round(c.hours(tasks, whole_cap=True), 1),
                "hours": round(c.hours(tasks, fresh=True, k=1), 1),
                "hours_warm": round(c.hours(tasks, fresh=False, k=k), 1),
                "off_protocol_cells": c.off_protocol,
                "off_protocol_reasons": list(c.off_reasons),
                "unlike_protocol": unlike_protocol(c),
            }
        )
    return rows


def _by_task(costs: list[ModelCost], tasks: list[str], card_bytes: int, k_given) -> dict:
    """Per device, per task: the hours of every model measured on that device, summed."""
    out: dict[str, dict[str, dict]] = {}
    for c in costs:
        k = c.workers_per_gpu(card_bytes, k_given)
        per = out.setdefault(c.device, {})
        for task in tasks:
            tc = c.task_cost(task)
            row = per.setdefault(
                task,
                {"step_cap": cell_step_cap(task), "hours": 0.0, "hours_warm": 0.0,
                 "evaluations_counted": True},
            )  # fmt: skip
            row["hours"] += c.hours([task], fresh=True, k=1)
            row["hours_warm"] += c.hours([task], fresh=False, k=k)
            row["evaluations_counted"] &= tc.eval_s is not None
    return out


def render(
    costs: list[ModelCost],
    tasks: list[str],
    fmt: str = "markdown",
    card_gib: float = DEFAULT_CARD_GIB,
    workers: int | None = None,
) -> str:
    """The estimate as markdown tables or JSON."""
    card_bytes = int(card_gib * GIB)
    rows = _rows(costs, tasks, card_bytes, workers)
    by_task = _by_task(costs, tasks, card_bytes, workers)
    totals = {
        device: {
            "hours": round(sum(r["hours"] for r in per.values()), 1),
            "hours_warm": round(sum(r["hours_warm"] for r in per.values()), 1),
        }
        for device, per in by_task.items()
    }
    for per in by_task.values():  # rounded after the totals, which sum the exact hours
        for row in per.values():
            row["hours"], row["hours_warm"] = round(row["hours"], 1), round(row["hours_warm"], 1)
    if fmt == "json":
        return json.dumps(
            {
                "tasks": tasks,
                "cells_per_pair": CELLS_PER_PAIR,
                "step_caps": {t: cell_step_cap(t) for t in tasks},
                "card_memory_gib": card_gib,
                "workers_per_gpu_given": workers,
                "models": rows,
                "by_task": by_task,
                "total": totals,
            },
            indent=2,
        )
    total = CELLS_PER_PAIR * sum(cell_step_cap(t) for t in tasks)
    lines = [
        f"{len(tasks)} task(s), {CELLS_PER_PAIR} cells per (model, task), at most {total:,} "
        "optimizer steps per model; warm workers: "
        + (f"K = {workers} per GPU" if workers else f"K per {card_gib:g} GiB GPU"),
        "",
        "| model | device | cells (after another) | s/step | s/step with dev evals "
        "| 1st meeting s | start-up s | budget run "
        "| K | hours, a process per cell | hours, warm, K per GPU | hours, upper bound |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['device']} | {r['measured_cells']} "
        f"({r['cells_after_another_in_process']}) | {r['seconds_per_step']:.4f} "
        f"| {r['wall_seconds_per_step']:.4f} | {r['first_meeting_s']:.4f} | {r['startup_s']:.1f} "
        f"| {_show(r['budget_share'], '{:.0%}')} | {r['workers_per_gpu']} "
        f"| {r['hours']:,.1f} | {r['hours_warm']:,.1f} | {r['hours_upper_bound']:,.1f} |"
        for r in rows
    ]
    for device, per in by_task.items():
        lines += [
            "",
            f"On {device}, every model measured there:",
            "",
            "| task | step cap | hours, a process per cell | hours, warm | dev evaluations |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        lines += [
            f"| {task} | {r['step_cap']:,} | {r['hours']:,.1f} | {r['hours_warm']:,.1f} "
            f"| {'counted' if r['evaluations_counted'] else 'not counted: no cell measured'} |"
            for task, r in per.items()
        ]
        lines.append(
            f"| **total** | | **{totals[device]['hours']:,.1f}** "
            f"| **{totals[device]['hours_warm']:,.1f}** | |"
        )
    lines += [
        "",
        "s/step: the cells' training steps alone (train_time_s less dev_eval_time_s, over "
        "steps), from the cells that ran after another in their process (batch widths mostly "
        "met before; all cells when none did); 1st meeting s: what a step of a process's first cell "
        "cost beyond that, paid by a fresh process for each new batch width (at most "
        f"{PROTOCOL_RECIPE.max_seq_len} a cell). A cell: its step cap times the share the "
        "on-protocol cells ran before early stopping (budget run; the whole cap without one), "
        "plus the protocol's dev evaluations at the measured seconds of one, plus start-up: "
        "per cell in a fresh process (start-up s, and its first meetings), per worker when "
        "warm, each warm cell paying its own set-up. K: warm workers per GPU that fit the "
        "card (core/gpu_share.py); their throughput is the one measured for K = 2 on an H200 "
        "(1.72x one worker's; K > 2 not measured, no more assumed). Upper bound: every cell "
        "at its cap, one process per cell.",
    ]
    for c in costs:
        notes = unlike_protocol(c)
        if notes:
            lines += ["", f"unlike the protocol's cells: {c.model} on {c.device}: "
                      + "; ".join(notes)]  # fmt: skip
    return "\n".join(lines)


def _show(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval estimate",
        description="Estimate the device-hours of the full protocol from measured cells.",
    )
    p.add_argument(
        "--results-dir",
        action="append",
        required=True,
        metavar="DIR",
        help="a directory of finished cells to measure (repeatable)",
    )
    p.add_argument("--tasks", default="all", help="tasks or groups to estimate (default: all)")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown")
    p.add_argument(
        "--workers-per-gpu",
        type=int,
        default=None,
        metavar="K",
        help="warm workers per GPU for the warm figure (default: as many as fit "
        "--gpu-memory-gib, at most 4, as run_all.sh --gpus chooses)",
    )
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=DEFAULT_CARD_GIB,
        metavar="GIB",
        help="the GPU's memory, for the warm workers per GPU (K) that fit it (default: 80, "
        "an H100; an H200 has 141)",
    )
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tasks = resolve_task_names([t for t in args.tasks.split(",") if t.strip()])
    for task in tasks:
        cell_step_cap(task)  # a task without a known size fails before anything is read
    if not args.gpu_memory_gib > 0:
        raise HarnessError(f"--gpu-memory-gib {args.gpu_memory_gib:g} must be positive")
    if args.workers_per_gpu is not None and args.workers_per_gpu < 1:
        raise HarnessError(f"--workers-per-gpu {args.workers_per_gpu} must be at least 1")
    costs = measure(args.results_dir)
    if not costs:
        print(
            "error: no finished cell with training time in "
            f"{', '.join(args.results_dir)}; run a cell first",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    print(render(costs, tasks, args.format, args.gpu_memory_gib, args.workers_per_gpu))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
