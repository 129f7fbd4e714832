"""Which cells of a plan Slurm holds: the queued and running jobs its launch scripts submitted.

Every job a launch script submits (`emit.py`) is named `ee-<phase>-<hash of the results
directory>-...` (`emit.job_prefix`) and carries, as its Slurm comment, where its cells are
written down: `ee-unit:<i>:<out dir>/units.json` for a job of `--mode slurm` (entry i of that
file), `ee-rows:<out dir>/arrays/rows-....txt` for an array job (array task t runs the entry
on line t + 1 of that rows file). `units.json` lists each job's result files (all its units'
in a warm job, `emit.slurm_jobs`), so one
`squeue` call tells which result files jobs of this results directory will write, however
the cells were grouped and whichever script (sweep or `status --emit`) submitted them.
"""

from __future__ import annotations

import getpass
import json
import shutil
import subprocess
from pathlib import Path

from encoder_eval.core.errors import HarnessError
from encoder_eval.plans.emit import ROWS_COMMENT, UNIT_COMMENT, UNITS_FILE, job_prefix
from encoder_eval.plans.plan import Plan

QUEUED, RUNNING = "queued", "running"
# squeue's job states of a job that has not started (every other state it lists has).
_WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
SQUEUE_TIMEOUT_S = 120


def squeue_lines(user: str | None = None) -> list[str] | None:
    """`%i|%T|%K|%j|%k` (job id, state, array task id, name, comment) of each of `user`'s
    jobs and array tasks (`squeue -r`), or None when squeue is not installed. A squeue
    that fails is a HarnessError: without it, queued cells cannot be told from missing."""
    if shutil.which("squeue") is None:
        return None
    argv = ["squeue", "-h", "-r", "-u", user or getpass.getuser(), "-o", "%i|%T|%K|%j|%k"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"squeue did not answer ({exc}); cannot tell queued cells") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HarnessError(f"squeue failed ({why}); cannot tell queued cells")
    return proc.stdout.splitlines()


class _Files:
    """units.json and rows files read once each; `problems` says what could not be read."""

    def __init__(self) -> None:
        self.units: dict[Path, list[list[str]] | None] = {}
        self.rows: dict[Path, list[str] | None] = {}
        self.problems: list[str] = []

    def _read(self, path: Path, cache: dict, parse) -> object:
        if path not in cache:
            try:
                cache[path] = parse(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                cache[path] = None
                self.problems.append(f"cannot read {path} ({exc}), which a job names")
        return cache[path]

    def unit(self, units_file: Path, index: int) -> list[str]:
        units = self._read(units_file, self.units, json.loads)
        return units[index] if units is not None and 0 <= index < len(units) else []

    def row(self, rows_file: Path, task: int) -> list[str]:
        rows = self._read(rows_file, self.rows, str.splitlines)
        if rows is None or not 0 <= task < len(rows) or not rows[task].strip().isdigit():
            return []
        return self.unit(rows_file.parent.parent / UNITS_FILE, int(rows[task]))


def held_cells(plan: Plan, lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """({result file: 'queued' or 'running'}, problems) for the jobs among squeue `lines`
    (`squeue_lines`) that belong to this plan's phase and results directory. A cell both
    queued and running (two jobs) is running."""
    prefix = job_prefix(plan)
    files = _Files()
    held: dict[str, str] = {}
    unknown = []
    for line in lines:
        parts = line.split("|", 4)
        if len(parts) < 5 or not parts[3].startswith(prefix):
            continue
        job, state, task, _, comment = parts
        outs: list[str] = []
        if comment.startswith(UNIT_COMMENT):
            index, _, units_file = comment[len(UNIT_COMMENT) :].partition(":")
            if index.isdigit():
                outs = files.unit(Path(units_file), int(index))
        elif comment.startswith(ROWS_COMMENT) and task.isdigit():
            outs = files.row(Path(comment[len(ROWS_COMMENT) :]), int(task))
        if not outs:
            unknown.append(job)
        for out in outs:
            if held.get(out) != RUNNING:
                held[out] = QUEUED if state in _WAITING else RUNNING
    if unknown:
        files.problems.append(
            f"{len(unknown)} job(s) of this results directory name no cells this harness can "
            f"read (first: {unknown[0]}; submitted by an older launch script?): their cells "
            "count as missing"
        )
    return held, files.problems
