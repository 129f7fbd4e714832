"""`encoder-eval estimate`: the protocol's compute cost, from measured cells.

The step budget of a cell is fixed by the protocol (`protocol.step_budget` on the task's
full training split); the cost of a step is measured: the seconds per optimizer step
(evaluations included) of finished cells in the given results directories, per model and
device. Their product, over every cell of the full protocol, is an upper bound (no early
stopping); scaled by the share of its budget the measured cells actually ran, it is the
expected cost. A model runs at the speed its measured cells show on *their* device: run one
cell on the GPU you plan for, then estimate from it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    report_errors,
)
from encoder_eval.core.protocol import (
    LR_GRID,
    PROTOCOL_RECIPE,
    REPORT_SEEDS,
    SELECT_SEEDS,
    name_reasons,
    step_budget,
)
from encoder_eval.core.results import load_results
from encoder_eval.data.tasks import TASK_KNOBS, resolve_task_names, task_knobs

CELLS_PER_PAIR = len(LR_GRID) * len(SELECT_SEEDS) + len(REPORT_SEEDS)  # 30 select + 5 report


def cell_step_cap(task: str) -> int:
    """The most optimizer steps one protocol cell of `task` can run on the full data."""
    rows = task_knobs(task).train_rows  # from the dataset card: the task row's `train_rows`
    if rows is None:
        known = [k for k, v in TASK_KNOBS.items() if v.train_rows is not None]
        raise HarnessError(
            f"no full-data size is known for task {task!r}; estimate covers {', '.join(known)}"
        )
    return PROTOCOL_RECIPE.max_steps if math.isinf(rows) else step_budget(int(rows))[1]


@dataclass(frozen=True)
class ModelCost:
    """What the measured cells of one model say a step costs, and how much budget they ran."""

    model: str
    device: str
    cells: int
    seconds_per_step: float
    # Steps run / step cap over the measured on-protocol cells (how much early stopping
    # saves); None when no measured cell ran on protocol (a shrunken cap says nothing).
    budget_share: float | None
    # How many measured cells are off-protocol, and the distinct reasons their results give
    # (`protocol.off_protocol_reasons`): their step may cost otherwise than a protocol step's.
    off_protocol: int = 0
    off_reasons: tuple[str, ...] = ()

    def hours(self, tasks: list[str]) -> tuple[float, float | None]:
        """(upper bound, expected) device-hours for every protocol cell of `tasks`."""
        steps = CELLS_PER_PAIR * sum(cell_step_cap(t) for t in tasks)
        upper = steps * self.seconds_per_step / 3600
        return upper, None if self.budget_share is None else upper * self.budget_share


def measure(results_dirs: list[str], warn=None) -> list[ModelCost]:
    """Per (model, device): seconds per optimizer step and budget share of the finished cells."""
    sums: dict[tuple[str, str], list[float]] = {}
    reasons: dict[tuple[str, str], dict[str, None]] = {}
    for directory in results_dirs:
        if not Path(directory).is_dir():
            raise HarnessError(f"--results-dir {directory} is not a directory")
        for r in load_results(directory, warn=warn):
            t = r.data["training"]
            if not r.ok or not t.get("steps") or not t.get("train_time_s"):
                continue
            hw = r.data["provenance"].get("hardware") or {}
            device = hw.get("gpu") or f"CPU ({hw.get('cpu') or 'unknown'})"
            acc = sums.setdefault((r.cell["model"], device), [0, 0.0, 0, 0, 0, 0])
            acc[0] += 1
            acc[1] += float(t["train_time_s"])
            acc[2] += int(t["steps"])
            if r.data["protocol"].get("on_protocol"):
                acc[3] += int(t["steps"])
                acc[4] += int(t.get("max_steps") or t["steps"])
            else:
                acc[5] += 1
                why = r.data["protocol"].get("off_protocol_reasons") or ["off-protocol"]
                reasons.setdefault((r.cell["model"], device), {}).update(dict.fromkeys(why))
    return [
        ModelCost(
            model,
            device,
            int(n),
            secs / steps,
            run / caps if caps else None,
            int(off),
            tuple(reasons.get((model, device), {})),
        )
        for (model, device), (n, secs, steps, run, caps, off) in sorted(sums.items())
    ]


def render(costs: list[ModelCost], tasks: list[str], fmt: str = "markdown") -> str:
    """The estimate as a markdown table or JSON."""
    rows = []
    for c in costs:
        upper, expected = c.hours(tasks)
        rows.append(
            {
                "model": c.model,
                "device": c.device,
                "measured_cells": c.cells,
                "seconds_per_step": round(c.seconds_per_step, 4),
                "budget_share": None if c.budget_share is None else round(c.budget_share, 3),
                "hours_upper_bound": round(upper, 1),
                "hours_expected": None if expected is None else round(expected, 1),
                "off_protocol_cells": c.off_protocol,
                "off_protocol_reasons": list(c.off_reasons),
            }
        )
    if fmt == "json":
        return json.dumps(
            {
                "tasks": tasks,
                "cells_per_pair": CELLS_PER_PAIR,
                "step_caps": {t: cell_step_cap(t) for t in tasks},
                "models": rows,
            },
            indent=2,
        )
    total = CELLS_PER_PAIR * sum(cell_step_cap(t) for t in tasks)
    lines = [
        f"{len(tasks)} task(s), {CELLS_PER_PAIR} cells per (model, task), at most {total:,} "
        "optimizer steps per model",
        "",
        "| model | device | measured cells | s/step | budget run | hours (upper bound) "
        "| hours (expected) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['device']} | {r['measured_cells']} | {r['seconds_per_step']:.4f} "
        f"| {_show(r['budget_share'], '{:.0%}')} | {r['hours_upper_bound']:,.1f} "
        f"| {_show(r['hours_expected'], '{:,.1f}')} |"
        for r in rows
    ]
    lines += [
        "",
        "s/step: train_time_s / steps of the measured cells (dev evaluations "
        "included); expected: the upper bound times the share of their step cap the "
        "measured on-protocol cells ran before early stopping (n/a without one). A "
        "step's cost depends on the task's text lengths: measure on tasks like those "
        "you estimate.",
    ]
    for c in costs:
        if c.off_protocol:
            lines += [
                "",
                f"not the protocol recipe: {c.off_protocol} of {c.model}'s "
                f"{c.cells} measured cell(s) on {c.device} are off-protocol "
                f"({name_reasons(c.off_reasons)}); a protocol cell's step may cost "
                "otherwise: measure on-protocol cells for a figure to plan by",
            ]
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
    return p


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tasks = resolve_task_names([t for t in args.tasks.split(",") if t.strip()])
    for task in tasks:
        cell_step_cap(task)  # a task without a known size fails before anything is read
    costs = measure(args.results_dir)
    if not costs:
        print(
            "error: no finished cell with training time in "
            f"{', '.join(args.results_dir)}; run a cell first",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    print(render(costs, tasks, args.format))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
