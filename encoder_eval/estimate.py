"""`encoder-eval estimate`: the protocol's device-hours, from measured cells.

A protocol cell's cost is built from three measured parts and the protocol's own counts:

- **steps**: the task's step cap (`protocol.step_budget` on its full training split) times
  the share of it that measured on-protocol cells of the task (else of the model) ran before
  early stopping; the whole cap when none did;
- **seconds per step**: the cells' own training steps, `training.train_time_s` less the dev
  evaluations inside it (`training.dev_eval_time_s`), over `training.steps`, from cells of
  the task where there are some, else of the model; wall time with dev evaluations is not a
  step's cost (a 4-step smoke cell evaluates dev after every step);
- **dev evaluations**: the protocol's cadence on the task (`protocol.eval_interval`) times the
  measured seconds of one evaluation of that task (`dev_eval_time_s` over the evaluations in
  `dev_history`); a task no cell measured is counted without them, and the output says so;
- **start-up**: one fresh process per cell (the default) pays `process_start_to_first_step_s`
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

    def seconds(self, fresh: bool) -> float:
        evals = self.evaluations * (self.eval_s or 0.0)
        return self.steps * self.step_s + evals + (self.startup_s if fresh else self.setup_s)


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
        )

    def workers_per_gpu(self, card_bytes: int) -> int:
        """K warm workers per GPU for this model on a card of `card_bytes` (1 on a CPU, or
        when the model's size is unknown)."""
        if not self.on_gpu or self.memory_bytes is None:
            return 1
        return workers_per_gpu(self.memory_bytes, card_bytes)

    def hours(
        self, tasks: list[str], fresh: bool = True, k: int = 1, whole_cap: bool = False
    ) -> float:
        """Device-hours of every protocol cell of `tasks`: one fresh process per cell, or
        warm workers, K per GPU (throughput `measured_gain(K)` times one worker's)."""
        secs = sum(CELLS_PER_PAIR * self.task_cost(t, whole_cap).seconds(fresh) for t in tasks)
        return secs / 3600 / (1.0 if fresh else measured_gain(k))


@dataclass
class _Tally:
    cells: int = 0
    steps: int = 0
    train_s: float = 0.0
    step_s: float = 0.0
    run: int = 0
    caps: int = 0
    off: int = 0
    reasons: dict[str, None] = field(default_factory=dict)
    setups: list[float] = field(default_factory=list)
    task_steps: dict[str, list[float]] = field(default_factory=dict)  # [step s, steps]
    task_evals: dict[str, list[float]] = field(default_factory=dict)  # [eval s, evaluations]
    task_runs: dict[str, list[int]] = field(default_factory=dict)  # [run, caps] on protocol
    task_startups: dict[str, float] = field(default_factory=dict)  # smallest per task
    on_gpu: bool = False


def _add(tally: _Tally, r) -> None:
    t, task = r.data["training"], r.cell["task"]
    steps, train_s = int(t["steps"]), float(t["train_time_s"])
    evals = len(t.get("dev_history") or [])
    dev_s = min(float(t.get("dev_eval_time_s") or 0.0), train_s)
    tally.cells += 1
    tally.steps += steps
    tally.train_s += train_s
    tally.step_s += train_s - dev_s
    acc = tally.task_steps.setdefault(task, [0.0, 0])
    acc[0] += train_s - dev_s
    acc[1] += steps
    if evals and t.get("dev_eval_time_s") is not None and not r.data["recipe"].get("limit"):
        acc = tally.task_evals.setdefault(task, [0.0, 0])  # a --limit cell's dev is cut
        acc[0] += float(t["dev_eval_time_s"])
        acc[1] += evals
    start = t.get("process_start_to_first_step_s")
    if start is not None:
        tally.task_startups[task] = min(float(start), tally.task_startups.get(task, math.inf))
    if t.get("time_to_first_step_s") is not None:
        tally.setups.append(float(t["time_to_first_step_s"]))
    if r.data["protocol"].get("on_protocol"):
        cap = int(t.get("max_steps") or steps)
        tally.run += steps
        tally.caps += cap
        acc = tally.task_runs.setdefault(task, [0, 0])
        acc[0] += steps
        acc[1] += cap
    else:
        tally.off += 1
        why = r.data["protocol"].get("off_protocol_reasons") or ["off-protocol"]
        tally.reasons.update(dict.fromkeys(why))


def measure(results_dirs: list[str], warn=None) -> list[ModelCost]:
    """Per (model, device): what a step, an evaluation and a start-up of the finished cells
    cost, and how much of their step cap the on-protocol ones ran."""
    tallies: dict[tuple[str, str], _Tally] = {}
    for directory in results_dirs:
        if not Path(directory).is_dir():
            raise HarnessError(f"--results-dir {directory} is not a directory")
        for r in load_results(directory, warn=warn):
            t = r.data["training"]
            if not r.ok or not t.get("steps") or not t.get("train_time_s"):
                continue
            hw = r.data["provenance"].get("hardware") or {}
            device = hw.get("gpu") or f"CPU ({hw.get('cpu') or 'unknown'})"
            tally = tallies.setdefault((r.cell["model"], device), _Tally())
            tally.on_gpu = bool(hw.get("gpu"))
            _add(tally, r)
    out = []
    for (model, device), t in sorted(tallies.items()):
        size = model_size(model)
        memory = (
            None
            if size is None
            else training_memory_bytes(
                size, PROTOCOL_RECIPE.max_seq_len, PROTOCOL_RECIPE.batch_size
            )
        )
        startups = list(t.task_startups.values())
        out.append(
            ModelCost(
                model=model,
                device=device,
                on_gpu=t.on_gpu,
                cells=t.cells,
                steps=t.steps,
                seconds_per_step=t.step_s / t.steps,
                wall_seconds_per_step=t.train_s / t.steps,
                budget_share=t.run / t.caps if t.caps else None,
                startup_s=statistics.median(startups) if startups else 0.0,
                setup_s=statistics.median(t.setups) if t.setups else 0.0,
                task_step_s={k: s / n for k, (s, n) in t.task_steps.items() if n},
                task_eval_s={k: s / n for k, (s, n) in t.task_evals.items() if n},
                task_share={k: run / cap for k, (run, cap) in t.task_runs.items() if cap},
                off_protocol=t.off,
                off_reasons=tuple(t.reasons),
                memory_bytes=memory,
            )
        )
    return out


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
    if c.steps / c.cells < SHORT_CELL_STEPS:
        notes.append(
            f"they ran {c.steps / c.cells:.0f} steps on average: in a fresh process a cell "
            "meets each batch width for the first time, which weighs more in a short cell "
            "than in a protocol cell of thousands of steps (on an H200 a fresh process's "
            "first cell stepped 5.1x slower than its second)"
        )
    if c.budget_share is None:
        notes.append("no cell ran on protocol, so no early-stopping point: each cell is "
                     "counted at its whole step cap")  # fmt: skip
    return notes


def _rows(costs: list[ModelCost], tasks: list[str], card_bytes: int) -> list[dict]:
    rows = []
    for c in costs:
        k = c.workers_per_gpu(card_bytes)
        rows.append(
            {
                "model": c.model,
                "device": c.device,
                "measured_cells": c.cells,
                "seconds_per_step": round(c.seconds_per_step, 4),
                "wall_seconds_per_step": round(c.wall_seconds_per_step, 4),
                "seconds_per_dev_evaluation": {t: round(s, 3) for t, s in c.task_eval_s.items()},
                "startup_s": round(c.startup_s, 2),
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


def _by_task(costs: list[ModelCost], tasks: list[str], card_bytes: int) -> dict:
    """Per device, per task: the hours of every model measured on that device, summed."""
    out: dict[str, dict[str, dict]] = {}
    for c in costs:
        k = c.workers_per_gpu(card_bytes)
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
) -> str:
    """The estimate as markdown tables or JSON."""
    card_bytes = int(card_gib * GIB)
    rows = _rows(costs, tasks, card_bytes)
    by_task = _by_task(costs, tasks, card_bytes)
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
                "models": rows,
                "by_task": by_task,
                "total": totals,
            },
            indent=2,
        )
    total = CELLS_PER_PAIR * sum(cell_step_cap(t) for t in tasks)
    lines = [
        f"{len(tasks)} task(s), {CELLS_PER_PAIR} cells per (model, task), at most {total:,} "
        f"optimizer steps per model; warm workers: K per {card_gib:g} GiB GPU",
        "",
        "| model | device | cells | s/step | s/step with dev evals | start-up s | budget run "
        "| K | hours, a process per cell | hours, warm, K per GPU | hours, upper bound |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['device']} | {r['measured_cells']} | {r['seconds_per_step']:.4f} "
        f"| {r['wall_seconds_per_step']:.4f} | {r['startup_s']:.1f} "
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
        "steps); a cell: its step cap times the share the on-protocol cells ran before early "
        "stopping (budget run; the whole cap without one), plus the protocol's dev "
        "evaluations at the measured seconds of one, plus start-up: per cell in a fresh "
        "process (start-up s), per worker when warm, each warm cell paying its own set-up. "
        "K: warm workers per GPU that fit the card (core/gpu_share.py); their throughput "
        "is the one measured for K = 2 on an H200 (1.72x one worker's; K > 2 not measured, "
        "no more assumed). Upper bound: every cell at its cap, one process per cell.",
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
    costs = measure(args.results_dir)
    if not costs:
        print(
            "error: no finished cell with training time in "
            f"{', '.join(args.results_dir)}; run a cell first",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    print(render(costs, tasks, args.format, args.gpu_memory_gib))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
