"""How a phase is launched: `run_all.sh` (shell) or `launch.sh` (Slurm, Slurm array) for a
Plan. The script bodies are the template files in `encoder_eval/plans/templates/`, filled by
`_fill` with shell-quoted values and code built here from shell-quoted words: no value is
ever pasted into a script as code. A probe plan (`plan.build_probe_plan`) is emitted by the
same code: its units run `encoder_eval.probe` instead of `encoder_eval.run` (`Plan.module`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from encoder_eval.cells.unit_spec import SPEC_FLAG, UnitSpec
from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_INPUT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    HarnessError,
)
from encoder_eval.core.fileio import (
    UNSAFE_IN_LABEL,
    check_output_dir,
    safe_filename_part,
    write_atomic,
)
from encoder_eval.core.progress import shell_patterns
from encoder_eval.core.results import CORRUPT, DONE_STATES, QUARANTINE_DIR
from encoder_eval.data.model_memory import model_size, training_memory_bytes
from encoder_eval.plans.plan import GROUPS, PROBE, Cell, Plan

__all__ = [
    "Emitted",
    "SlurmLaunch",
    "emit",
    "emit_shell",
    "emit_slurm",
    "emit_slurm_array",
    "slurm_jobs",
]

EMIT_MODES = ("shell", "slurm", "slurm-array")
# Cells one process runs, by mode: on a cluster the seeds of one (model, task, LR), so a job
# pays its start-up (imports, model load, tokenisation: 10-20 s) once for 3 (select) or 5
# (report) cells, and stays a few cells long against time limits (docs/slurm.md).
DEFAULT_GROUP = {"shell": "pair", "slurm": "lr", "slurm-array": "lr"}
# Units one Slurm job (or array task) runs, one after another in one warm process
# (`run --spec A --spec B ...`, `run.run_job`): a GPU process's start-up and its first
# meetings with each batch width cost most (docs/slurm.md, "Warm jobs"). `--no-warm`: 1.
DEFAULT_UNITS_PER_JOB = 4
DEFAULT_MAX_ARRAY_SIZE = 1001
# Where a Slurm job's cells are written down, in its comment (`queue.py` reads them back):
# `ee-unit:<i>:<UNITS_FILE>` for a job of --mode slurm, `ee-rows:<rows file>` for an array.
UNITS_FILE = "units.json"
SPECS_DIR = "specs"  # one spec file per unit (`cells/unit_spec.py`), beside the script
UNIT_COMMENT, ROWS_COMMENT = "ee-unit:", "ee-rows:"
SLURM_COMMENT_MAX = 1024  # sbatch refuses a longer --comment
# Exported to a Slurm template, in this order (manifest columns after N and the N result files).
SLURM_VARIABLES = (
    "OUT_JSON",
    "MODEL",
    "MODEL_PATH",
    "MODE",
    "TASK",
    "LR",
    "LR_KEY",
    "SEED",
    "PHASE",
    "RESULTS_DIR",
    "DATA_DIR",
    "DEVICE",
    "MAX_STEPS",
    "RECIPE_ARGS",
    "RUN_ARGS",
    "N_CELLS",
)


@dataclass
class Emitted:
    """What an emitter wrote."""

    mode: str
    script: Path  # run_all.sh or launch.sh
    n_cells: int
    n_done: int
    n_units: int
    files: list[Path] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)  # result files that are not done results
    group: str = "pair"
    remote_code: list[str] = field(default_factory=list)  # models that run remote code
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE  # the cluster's, for the cost note
    n_jobs: int | None = None  # Slurm jobs (array tasks): units packed by `slurm_jobs`
    units_per_job: int = 1  # at most, in one warm process

    def describe(self) -> str:
        todo = self.n_cells - self.n_done
        what = f"{self.n_cells} cell(s) ({self.n_done} already done, {todo} to run)"
        jobs = self.n_units if self.n_jobs is None else self.n_jobs
        if self.mode == "shell":
            what += f" in {self.n_units} process(es), one per {_GROUP_WORDS[self.group]}"
        elif self.units_per_job > 1:
            what += (
                f" in {jobs} job(s), each up to {self.units_per_job} units of one model in one "
                f"warm process (a unit: one {_GROUP_WORDS[self.group]}); give your template's "
                "--time for that many units, or --units-per-job N / --no-warm"
            )
        else:
            what += f" in {jobs} job(s), one per {_GROUP_WORDS[self.group]}"
        text = f"wrote {self.script}: {what}; run: bash {shlex.quote(str(self.script))}"
        if self.mode == "slurm" and jobs > self.max_array_size:
            arrays = -(-jobs // self.max_array_size)
            text += (
                f"\nnote: --mode slurm submits these {jobs} jobs with {jobs} "
                "sbatch calls, one after another (each a round trip to the controller; many "
                "clusters cap a user's queued jobs, MaxSubmitJobs, below this); --mode "
                f"slurm-array submits the same {jobs} jobs as {arrays} array job(s) "
                f"of at most {self.max_array_size} tasks (MaxArraySize)"
            )
        if self.corrupt:
            where = Path(self.corrupt[0]).parent / QUARANTINE_DIR
            text += (
                f"\nnote: {len(self.corrupt)} corrupt result file(s) among the cells to run; "
                f"the script moves them aside into {shlex.quote(str(where))} and re-runs "
                "their cells"
            )
        if self.remote_code:
            text += (
                f"\nremote code: {len(self.remote_code)} model(s) will run code from "
                f"their repositories: {'; '.join(self.remote_code)}"
            )
        return text


def remote_code_models(cells: list[Cell]) -> list[str]:
    """`name (path, pins)` of each model among `cells` that runs remote code, in order."""
    out = []
    for c in cells:
        if c.trust_remote_code:
            pins = [
                f"{k} {v}"
                for k, v in (("revision", c.revision), ("code revision", c.code_revision))
                if v
            ]
            text = f"{c.model} ({c.model_path}{', ' if pins else ', unpinned'}{', '.join(pins)})"
            if text not in out:
                out.append(text)
    return out


_GROUP_WORDS = {"pair": "(model, task)", "lr": "(model, task, LR)", "cell": "cell"}


def _unit_label(cells: list[Cell], group: str) -> str:
    """`model_task[_lrkey][_sSEED]`, file-name safe: names a unit's log and job.

    The LR key is added when the unit has one LR, the seed for `--group cell` (a probe
    unit, every pooling of a pair, is `model_task`)."""
    first = cells[0]
    label = f"{first.model}_{first.task}"
    if first.kind == PROBE:
        return safe_filename_part(label, UNSAFE_IN_LABEL)
    if len({c.lr_key for c in cells}) == 1:
        label += f"_{first.lr_key}"
    if group == "cell":
        label += f"_s{first.seed}"
    return safe_filename_part(label, UNSAFE_IN_LABEL)


def _states(
    plan: Plan, cells: list[Cell], known: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """(cells that are done, paths of corrupt result files) among `cells`; `known` gives
    the states already read, by result file (status reads each file once)."""
    done, corrupt = 0, []
    known = known or {}
    for cell in cells:
        path = plan.out_json(cell)
        state = known[path] if path in known else plan.cell_state(cell)
        if state in DONE_STATES:
            done += 1
        elif state == CORRUPT:
            corrupt.append(plan.out_json(cell))
    return done, corrupt


TEMPLATES = "templates"  # the script bodies: encoder_eval/plans/templates/*.sh
_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9_]*)__")


def _template(name: str) -> str:
    """The text of a template file shipped in the package (encoder_eval/plans/templates/NAME)."""
    return (resources.files(__package__) / TEMPLATES / name).read_text(encoding="utf-8")


def _fill(
    name: str, words: dict[str, object] | None = None, code: dict[str, str] | None = None
) -> str:
    """Template NAME with each `__KEY__` replaced: a `words` value shell-quoted (one word,
    whatever it holds), a `code` value as is (bash this module built from quoted words or
    constants). Lines marked `(template)` (shellcheck notes for the bare template) go."""
    words, code = words or {}, code or {}
    text = "".join(
        line
        for line in _template(name).splitlines(keepends=True)
        if not (line.startswith("# shellcheck") and "(template)" in line)
    )
    wanted = set(_PLACEHOLDER.findall(text))
    # What the scripts and the Python side must agree on, filled from the Python constants.
    code = {**{k: v() for k, v in SHARED_CODE.items() if k in wanted and k not in words}, **code}
    given = set(words) | set(code)
    if wanted != given or set(words) & set(code):
        raise ValueError(f"template {name}: placeholders {sorted(wanted)}, given {sorted(given)}")

    def value(match: re.Match) -> str:
        key = match.group(1)
        return _q(words[key]) if key in words else code[key]

    return _PLACEHOLDER.sub(value, text)


def shell_constants() -> str:
    """The exit codes and done states the scripts test, as bash assignments (from
    `core.errors` and `core.results`: a script never spells one of its own)."""
    codes = {
        "EXIT_INCOMPLETE": EXIT_INCOMPLETE,
        "EXIT_INPUT_ERROR": EXIT_INPUT_ERROR,
        "EXIT_PREEMPTED": EXIT_PREEMPTED,
        "EXIT_INTERRUPTED": EXIT_INTERRUPTED,
    }
    return (
        "# shellcheck disable=SC2034  # not every script tests every code\n"
        + " ".join(f"{k}={v}" for k, v in codes.items())
        + "\n"
        + f"DONE_STATES={_q(' '.join(DONE_STATES))}"
    )


# Placeholders every template may hold, filled by `_fill` from the Python side.
SHARED_CODE: dict[str, Callable[[], str]] = {
    "CONSTANTS": shell_constants,
    "PROGRESS_PATTERNS": shell_patterns,
}


def _common() -> str:
    """The bash every script shares (templates/common.sh): the done check and first pass."""
    return _fill("common.sh").rstrip("\n")


def _q(value) -> str:
    return shlex.quote(str(value))


def _write_script(path: Path, text: str) -> None:
    write_atomic(path, text, mode_bits=0o755)


def job_prefix(plan: Plan) -> str:
    """`ee-<phase>-<hash of the results dir>-`: how every job name of a plan's launch scripts
    starts (`queue.held_cells` finds a results directory's jobs by it)."""
    return f"ee-{plan.phase}-{_short_hash(plan.results_dir)}-"


def slurm_job_name(plan: Plan, cells: list[Cell]) -> str:
    """`ee-<phase>-<hash of the results dir>-<unit>`: unique across sweeps, readable in squeue.

    A one-cell job is named for its result file; a job of several cells (or a probe job,
    whatever its poolings) for its unit."""
    if cells[0].kind == PROBE:
        stem = _unit_label(cells, "pair")
    elif len(cells) == 1:
        stem = safe_filename_part(cells[0].filename.removesuffix(".json"), UNSAFE_IN_LABEL)
    else:
        stem = _unit_label(cells, "pair") + f"_{len(cells)}cells"
    return f"{job_prefix(plan)}{stem[:160]}"


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def _unit_env(plan: Plan, cells: list[Cell], run_args: list[str]) -> dict[str, str]:
    """The variables a Slurm template receives for one job's cells (see `emit_slurm`);
    `run_args`: the `run` arguments `RUN_ARGS` holds."""
    cell = cells[0]
    outs = [plan.out_json(c) for c in cells]
    probe = cell.kind == PROBE
    return {
        "OUT_JSON": outs[0] if len(outs) == 1 else shlex.join(outs),
        "MODEL": cell.model,
        "MODEL_PATH": cell.model_path,
        "MODE": cell.mode,
        "TASK": ",".join(dict.fromkeys(c.task for c in cells)),
        "LR": "" if probe else ",".join(dict.fromkeys(f"{c.lr:g}" for c in cells)),
        "LR_KEY": "" if probe else ",".join(dict.fromkeys(c.lr_key for c in cells)),
        "SEED": ",".join(dict.fromkeys(str(c.seed) for c in cells)),
        "PHASE": plan.phase,
        "RESULTS_DIR": plan.results_dir,
        "DATA_DIR": plan.data_dir or "",
        "DEVICE": plan.device,
        "MAX_STEPS": "" if probe else str(plan.max_steps),
        "RECIPE_ARGS": shlex.join(plan.recipe_args()),
        "RUN_ARGS": shlex.join(run_args),
        "N_CELLS": str(len(cells)),
    }


def slurm_jobs(plan: Plan, units: list[list[Cell]], per_job: int) -> list[list[list[Cell]]]:
    """`units` packed into Slurm jobs (array tasks), in plan order: up to `per_job`
    consecutive units of one model (its name, path, mode, trust and revisions: a job's
    warm process meets one model's code), each job run by one process (`run.run_job`);
    a probe plan's units run one a job (`encoder_eval.probe` runs one unit)."""
    if per_job < 1:
        raise HarnessError(f"--units-per-job {per_job}: give 1 or more")
    per_job = 1 if plan.kind == PROBE else per_job
    jobs: list[list[list[Cell]]] = []
    for unit in units:
        if jobs and len(jobs[-1]) < per_job and _job_model(jobs[-1][0]) == _job_model(unit):
            jobs[-1].append(unit)
        else:
            jobs.append([unit])
    return jobs


def _job_model(unit: list[Cell]) -> tuple:
    c = unit[0]
    return c.model, c.model_path, c.mode, c.trust_remote_code, c.revision, c.code_revision


def _job_parts(
    plan: Plan, job: list[list[Cell]], out: Path, group: str, specs: dict[Path, UnitSpec]
) -> tuple[list[Cell], dict[str, str], list[str]]:
    """(the job's cells, its template variables, its `run` arguments: one `--spec FILE` per
    unit) of one Slurm job (array task); each unit's spec is added to `specs`."""
    cells = [c for unit in job for c in unit]
    args = [w for unit in job for w in _spec_args(plan, unit, out, _unit_label(unit, group), specs)]
    # One unit: its flags, as written out (a job of several units has only its specs).
    env = _unit_env(plan, cells, plan.run_args(cells) if len(job) == 1 else args)
    return cells, env, args


def _job_name(plan: Plan, job: list[list[Cell]], group: str) -> str:
    """A job's name (`slurm_job_name`); a job of several units is named for its first unit
    and how many it runs (unique: the units of a plan have distinct labels)."""
    if len(job) == 1:
        return slurm_job_name(plan, job[0])
    stem = f"{_unit_label(job[0], group)}_{len(job)}units"
    return f"{job_prefix(plan)}{stem[:160]}"


def _spec_args(
    plan: Plan, cells: list[Cell], out: Path, label: str, specs: dict[Path, UnitSpec]
) -> list[str]:
    """The arguments that run a unit from its spec file, `out/specs/<label>.json` (`--spec
    FILE`; the process prints the spec's summary into the unit's log); the spec
    (`Plan.unit_spec`) is added to `specs`, which `_write_specs` writes with the script."""
    path = out / SPECS_DIR / f"{label}.json"
    specs[path] = plan.unit_spec(cells)
    return [SPEC_FLAG, str(path)]


def _write_specs(specs: dict[Path, UnitSpec]) -> None:
    for path, spec in specs.items():
        try:
            spec.write(path)
        except OSError as exc:
            raise HarnessError(f"cannot write {path}: {exc.strerror}") from None


def _slurm_comment(text: str) -> str:
    """`text` as a job's `--comment`, refused (HarnessError) when sbatch would refuse it or
    squeue could not print it on one line."""
    if len(text) > SLURM_COMMENT_MAX or not text.isprintable():
        raise HarnessError(
            f"--out-dir {text.split(':', 2)[-1]!r} is too long for a Slurm job comment "
            f"({SLURM_COMMENT_MAX} characters) or holds a control character; choose a "
            "shorter --out-dir"
        )
    return text


def _write_units(out: Path, plan: Plan, units: list[list[Cell]]) -> Path:
    """`out/units.json`: each job's result files (all its units' cells), in job order
    (`queue.py` reads it)."""
    path = out / UNITS_FILE
    write_atomic(path, json.dumps([[plan.out_json(c) for c in u] for u in units]) + "\n")
    return path


def _comment(text: str) -> str:
    """`text` made safe for one `#` comment line: a newline or other control character in a
    path would otherwise end the comment and start code."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _header(plan: Plan, what: str) -> str:
    """The comment lines naming what generated a script and for which plan."""
    lines = [
        f"# Generated by encoder-eval sweep: {what}",
        f"# phase {plan.phase}, {len(plan.cells)} cells, results in {plan.results_dir}",
    ]
    if plan.shrunk:
        lines.append("# SHRUNKEN (results are off-protocol): " + "; ".join(plan.shrunk))
    return "\n".join("# " + _comment(line[2:]) for line in lines)


def _units_code(units_words: list[list[str]]) -> str:
    """The body of a script's `units` function: one `unit WORD...` call per unit, every word
    shell-quoted."""
    return "\n".join(" ".join(_q(w) for w in words) for words in units_words)


def _prepare_out_dir(plan: Plan, out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir).absolute()
    check_output_dir(out, "--out-dir", out_dir)  # both before anything is written
    check_output_dir(plan.results_dir, "--results-dir")
    return out


def _make_dirs(plan: Plan, out: Path) -> None:
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        Path(plan.results_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"cannot create {out} or {plan.results_dir}: {exc.strerror}") from None


def _cells_or_all(plan: Plan, cells: list[Cell] | None) -> list[Cell]:
    cells = plan.cells if cells is None else cells
    if not cells:
        raise HarnessError("no cells to emit; check --models, --tasks and --seeds")
    return cells


def worker_memory_bytes(plan: Plan, cells: list[Cell]) -> int:
    """GPU memory one worker of the plan needs: its largest model's training process at the
    recipe's batch and length (`data/model_memory.py`); 0 when a model's size is unknown or
    the plan probes. `run_all.sh --gpus` chooses K workers per GPU from it at run time
    (`core/gpu_share.py`)."""
    if plan.probe is not None:
        return 0
    needs = []
    for name, path in sorted({(c.model, c.model_path) for c in cells}):
        size = model_size(name, path)
        if size is None:
            return 0
        needs.append(training_memory_bytes(size, plan.recipe.max_seq_len, plan.recipe.batch_size))
    return max(needs, default=0)


def emit_shell(
    plan: Plan,
    out_dir: str | os.PathLike,
    cells: list[Cell] | None = None,
    python: str | None = None,
    group: str = "pair",
    known: dict[str, str] | None = None,
) -> Emitted:
    """Write `out_dir/run_all.sh`: one `encoder_eval.run` process per unit (`Plan.units`).

    By default a unit is every cell of one (model, task): one process runs all its LRs and
    seeds (`--lr a,b,c --seed 42,43,44`), so imports, data loading and tokenisation are
    paid once per pair, and writes each cell's JSON as that cell ends (`--results-dir`,
    `--skip-existing`). The script skips a unit whose cells are all done
    (`results.cell_state`, checked by `encoder_eval.done`, which moves corrupt result files
    aside so their cells run again), appends each unit's output to
    `out_dir/logs/<unit>.log` (appends: two runners of one script keep both logs), prints
    `[cells 6/12 done, units 2/4, failed 0] starting ...` before each unit and a summary at
    the end, and exits 1 if any unit failed. Ctrl-C (SIGINT), or a unit that exits 130,
    stops it before the next unit with one line saying how to resume, and exit status 130.
    The interpreter is `$PYTHON` when set, else the Python that wrote the script.

    `bash run_all.sh --workers N` runs N workers at once (`--gpus 0,1` on each GPU as many
    as fit its memory, `worker_memory_bytes`, with CUDA_VISIBLE_DEVICES and
    HIP_VISIBLE_DEVICES set to it; `--workers-per-gpu K` K per GPU): each unit goes to the first
    worker that claims it, so no unit runs twice in one run of the script. A worker holds a
    non-blocking `flock` on `out_dir/locks/<unit>.lock` while its unit runs; a unit whose
    lock another runner holds (a second run_all.sh) is left for after the others, and then
    run anyway: `encoder_eval.run`'s per-cell locks (`results.cell_lock`) wait for or skip
    cells running elsewhere. Each `--progress json` line of a unit's process is shown as
    `[w1] MODEL/TASK/LR_KEY/sSEED step S/T dev D eta E` (and kept in its log). Ctrl-C
    reaches the script, which passes it on to every worker's process group.

    A probe plan's units run `python -m encoder_eval.probe` (`Plan.module`), one per
    (model, task); each result line the probe logs (`[1/2] MODEL:POOLING TASK: SCORE ...`)
    is shown as `[w1] probe MODEL:POOLING TASK: SCORE ...`.
    """
    cells = _cells_or_all(plan, cells)
    out = _prepare_out_dir(plan, out_dir)
    units = plan.units(cells, group)
    specs: dict[Path, UnitSpec] = {}
    script = out / "run_all.sh"
    units_words = []
    for unit_cells in units:
        words = ["unit", _unit_label(unit_cells, group), str(len(unit_cells))]
        words += [plan.out_json(c) for c in unit_cells]
        units_words.append([*words, "--", *_spec_args(plan, unit_cells, out, words[1], specs)])
    body = _fill(
        "run_all.sh",
        words={
            "PYTHON": python or sys.executable,
            "PHASE": plan.phase,
            "MODULE": plan.module,
            "LOG_DIR": out / "logs",
            "LOCK_DIR": out / "locks",
            "RESULTS_DIR": plan.results_dir,
            "RERUN": "bash " + shlex.quote(str(script)),
            "TOTAL_CELLS": len(cells),
            "TOTAL_UNITS": len(units),
            "WORKER_BYTES": worker_memory_bytes(plan, cells),
        },
        code={
            "HEADER": _header(plan, f"run every cell, one process per {_GROUP_WORDS[group]}"),
            "COMMON": _common(),
            "UNITS": _units_code(units_words),
        },
    )
    _make_dirs(plan, out)
    _write_specs(specs)
    _write_script(script, body)
    n_done, corrupt = _states(plan, cells, known)
    return Emitted("shell", script, len(cells), n_done, len(units), [script], corrupt, group)


def _read_template(
    template: str | os.PathLike | None, *, need_bash: bool, module: str = "encoder_eval.run"
) -> str:
    if template is None:
        raise HarnessError(
            "--mode slurm needs --slurm-template FILE (see examples/slurm_template.sh)"
        )
    path = Path(template)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read --slurm-template {template}: {exc}") from None
    first = text.splitlines()[0] if text else ""
    if not first.startswith("#!"):
        raise HarnessError(
            f"--slurm-template {template} must start with a #! line (sbatch requires one), "
            "e.g. #!/bin/bash"
        )
    if need_bash and "bash" not in first:
        raise HarnessError(
            f"--slurm-template {template} starts with {first!r}; slurm-array mode inserts bash "
            "code into it, so make its first line #!/bin/bash"
        )
    if not _template_runs_the_cell(text):
        raise HarnessError(
            f"--slurm-template {template} never passes the cell to {module}: it uses "
            'neither "$@" nor $RUN_ARGS (nor all of '
            + ", ".join(f"${v}" for v in _OWN_COMMAND)
            + f'); add the line python -m {module} "$@" (see examples/slurm_template.sh)'
        )
    if module != "encoder_eval.run" and not _template_runs(text, module):
        raise HarnessError(
            f"--slurm-template {template} never runs {module}, which this sweep's jobs run; "
            f'give a template whose run line is python -m {module} "$@"'
        )
    return text


# A template that writes its own command line must use at least these variables.
_OWN_COMMAND = ("MODEL_PATH", "TASK", "LR", "SEED", "OUT_JSON")


def _code(text: str) -> str:
    """A template's lines that are not comments."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _template_runs(text: str, module: str) -> bool:
    """Whether a template's code names `module` (a probe sweep's jobs run encoder_eval.probe)."""
    return re.search(rf"\b{re.escape(module)}\b", _code(text)) is not None


def _template_runs_the_cell(text: str) -> bool:
    """Whether a template's code (comments aside) hands a job its cell: "$@" / $RUN_ARGS, or
    the identity variables for a command of its own."""
    code = _code(text)
    if re.search(r"\$@|\$\{@\}|\bRUN_ARGS\b", code):
        return True
    return all(re.search(rf"\$\{{?{name}\b", code) for name in _OWN_COMMAND)


def _sbatch_path(path: Path) -> str:
    """A path for sbatch --output, with `%` escaped (sbatch expands %j, %x, ... in it)."""
    return str(path).replace("%", "%%")


@dataclass(frozen=True)
class SlurmLaunch:
    """What `emit_slurm` and `emit_slurm_array` write a plan's launch with: your sbatch
    `template`, the `cells` (default: every cell of the plan), `requeue` (`sbatch
    --requeue`), the `group` of cells one job runs (`Plan.units`), the `python` that checks
    done cells (default: this one) and `known`, the cells' states already read by result
    file (`results.cell_state`), and `units_per_job`, the units one job runs in one warm
    process (`slurm_jobs`; 1: one unit a job, its own process)."""

    template: str | os.PathLike | None
    cells: list[Cell] | None = None
    requeue: bool = False
    group: str = DEFAULT_GROUP["slurm"]
    python: str | None = None
    known: dict[str, str] | None = None
    units_per_job: int = DEFAULT_UNITS_PER_JOB

    def parts(self) -> tuple:
        """(template, requeue, group, python, known)."""
        return self.template, self.requeue, self.group, self.python, self.known


def emit_slurm(
    plan: Plan,
    out_dir: str | os.PathLike,
    launch: SlurmLaunch,
) -> Emitted:
    """Write `out_dir/launch.sh`: one `sbatch` per unit not done, each running your template
    (`launch`: the template and the other settings, `SlurmLaunch`).

    A unit (`Plan.units`, `--group`) is by default ("lr") the seeds of one (model, task,
    LR), run by one process; "cell" makes it one cell, "pair" every cell of one (model,
    task). Each cell still writes its own result file as it ends. The contract below is
    written for a one-cell job; a job of several cells differs as said at its end.

    The template contract
    ---------------------
    Your template is an ordinary sbatch batch script: a `#!` line (sbatch requires one),
    any `#SBATCH` directives your cluster needs (GPU, time, partition, account), then the
    lines that activate your environment and run the cell. It is copied to
    `out_dir/template.sh` when the launch script is written, and `launch.sh` submits
    that copy once per cell that is not done yet, as::

        VAR=value ... sbatch --export=ALL --job-name=ee-<phase>-<cell> \\
            --output=<out_dir>/logs/%x-%j.out --comment=ee-unit:<i>:<out_dir>/units.json \\
            [--requeue] template.sh RUN_ARGS...

    (the comment names the job's cells for `encoder-eval status`: `plans/queue.py`; it
    overrides a `#SBATCH --comment` of the template)

    so each job receives, for its cell:

    * positional arguments ``"$@"``: the complete argument list of
      ``python -m encoder_eval.run`` for this cell (identity, the explicit recipe flags,
      ``--results-dir``, ``--skip-existing``, ``--device``, ``--data-dir``, ...). The
      simplest, and recommended, run line is therefore::

          python -m encoder_eval.run "$@"

      (keep the double quotes: each argument then arrives exactly as written, whatever
      characters a path or model name holds);
    * exported variables, one value each, for logging or for writing your own command:
      ``MODEL`` (the model's name in results), ``MODEL_PATH`` (Hub id or local
      directory), ``MODE`` (auto | liquid-bidir), ``TASK``, ``LR`` (e.g. 3.59e-05),
      ``LR_KEY`` (e.g. lr06), ``SEED``, ``PHASE`` (select | report), ``OUT_JSON`` (the
      result file the cell writes), ``RESULTS_DIR``, ``DATA_DIR`` (empty: the Hub),
      ``DEVICE``, ``MAX_STEPS``, ``RECIPE_ARGS`` (the recipe flags as one shell-quoted
      string) and ``RUN_ARGS`` (the same arguments as ``"$@"``, as one shell-quoted
      string: ``eval "python -m encoder_eval.run $RUN_ARGS"`` is equivalent to the
      recommended line; ``python -m encoder_eval.run $RUN_ARGS`` without eval is not).

    Use the variables quoted (``"$MODEL_PATH"``), as with any shell variable. Values are
    passed as process arguments and environment entries, never pasted into shell code,
    so a value holding ``$(...)``, backticks, ``;``, quotes, spaces or newlines arrives
    verbatim and is never executed. Because of `--export=ALL` the job also sees the
    environment `launch.sh` ran in; sbatch's own input variables (SBATCH_PARTITION,
    SBATCH_ACCOUNT, ...) apply to every submission. `--job-name` and `--output` on the
    command line override the template's `#SBATCH` lines of those names (the job name is
    how `launch.sh` recognises a cell already queued).

    `launch.sh` checks, when it runs, which cells are done and which are already queued
    or running (by job name, via squeue), and submits only the others: running it again
    submits nothing for done or pending cells. Done is `results.cell_state`: the result
    file parses, validates and names the cell, phase included (a diverged result is done).
    A corrupt result file is moved aside into `<results dir>/.corrupt/` (never deleted) and
    its cell submitted again. The check runs `python -m encoder_eval.done` (no torch) with
    `$PYTHON` when set, else the Python that wrote the script (`--python`); the job's own
    Python is the one your template activates, and the run skips a cell already done
    (`--skip-existing`) by the same definition.

    A job of several cells (`--group lr|pair`) gets the same contract, with: ``"$@"`` and
    ``RUN_ARGS`` for the whole unit (``--lr`` and ``--seed`` take comma-separated lists);
    ``LR``, ``LR_KEY`` and ``SEED`` as comma-separated lists of the unit's distinct values
    (in run order); ``OUT_JSON`` as the unit's result files in one shell-quoted string
    (like ``RUN_ARGS``); and ``N_CELLS``, the number of cells (1 for a one-cell job).
    `launch.sh` submits a unit while any of its cells is not done; the process then skips
    the cells already done.

    A warm job (`launch.units_per_job` above 1, the default: `slurm_jobs`) runs several
    units of one model one after another in one process, with the same contract, and:
    ``"$@"`` and ``RUN_ARGS`` are one ``--spec FILE`` per unit (``python -m
    encoder_eval.run "$@"`` runs them all, `run.run_job`); ``TASK``, ``LR``, ``LR_KEY``
    and ``SEED`` list the job's distinct values, ``OUT_JSON`` and ``N_CELLS`` all its
    cells; the job is named for its first unit and its number of units, and `units.json`
    lists each job's result files.

    slurm-array mode (`emit_slurm_array`) keeps this same contract for every array task.

    A probe sweep (`--phase probe`) keeps it too, for jobs of one (model, task) each: the
    template runs ``python -m encoder_eval.probe "$@"`` (checked here), ``OUT_JSON`` holds
    the unit's result files (one per pooling), ``SEED`` is the folds' seed,
    ``RECIPE_ARGS`` the probe's settings, and ``LR``, ``LR_KEY`` and ``MAX_STEPS`` are empty.
    """
    template, requeue, group, python, known = launch.parts()
    cells = _cells_or_all(plan, launch.cells)
    text = _read_template(template, need_bash=False, module=plan.module)
    out = _prepare_out_dir(plan, out_dir)
    tpl = out / "template.sh"
    logs = out / "logs"
    jobs = slurm_jobs(plan, plan.units(cells, group), launch.units_per_job)
    specs: dict[Path, UnitSpec] = {}
    units_words, job_cells = [], []
    for i, job in enumerate(jobs):
        unit_cells, env, args = _job_parts(plan, job, out, group, specs)
        job_cells.append(unit_cells)
        words = ["unit", _job_name(plan, job, group), _sbatch_path(logs) + "/%x-%j.out"]
        words.append(_slurm_comment(f"{UNIT_COMMENT}{i}:{out / UNITS_FILE}"))
        words += [str(len(unit_cells)), *(plan.out_json(c) for c in unit_cells)]
        words += [f"{k}={v}" for k, v in env.items()]
        units_words.append([*words, "--", *args])
    launch = _fill(
        "launch_slurm.sh",
        words={"TEMPLATE": tpl, "PYTHON": python or sys.executable, "PHASE": plan.phase},
        code={
            "HEADER": _header(plan, "submit one sbatch job per unit not done"),
            "REQUEUE": "--requeue" if requeue else "",
            "COMMON": _common(),
            "UNITS": _units_code(units_words),
        },
    )
    _make_dirs(plan, out)
    _write_specs(specs)
    _write_script(tpl, text)
    units_file = _write_units(out, plan, job_cells)
    script = out / "launch.sh"
    _write_script(script, launch)
    n_done, corrupt = _states(plan, cells, known)
    files = [script, tpl, units_file]
    n_units = sum(len(job) for job in jobs)
    emitted = Emitted("slurm", script, len(cells), n_done, n_units, files, corrupt, group)
    emitted.n_jobs, emitted.units_per_job = len(jobs), max(len(job) for job in jobs)
    return emitted


def split_template_header(text: str) -> tuple[str, str]:
    """Split at the first line that is neither blank nor a comment (where sbatch stops
    reading #SBATCH directives), so inserted code never hides a directive."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
        i += 1
    head = "".join(lines[:i])
    if head and not head.endswith("\n"):
        head += "\n"
    return head, "".join(lines[i:])


def emit_slurm_array(
    plan: Plan,
    out_dir: str | os.PathLike,
    launch: SlurmLaunch,
) -> Emitted:
    """Write a cells manifest, an array job script and `launch.sh` for one array job per phase
    (`launch`: the template and the other settings, `SlurmLaunch`).

    * `out_dir/manifest.tsv`: a header line, then one unit per line (one array task: by
      default the seeds of one (model, task, LR) run by one process; `--group cell|pair`
      one cell, or every cell of a (model, task)), tab-separated:
      the number of cells N, their N result files, the variables of the `emit_slurm`
      contract, then the unit's `encoder_eval.run` arguments. Values may not contain tabs
      or newlines here (use `--mode slurm` for such values).
    * `out_dir/array.sh`: your template with a bash block inserted after its leading
      comment/`#SBATCH` lines; the block reads the task's manifest row, exports the same
      variables and sets the same positional arguments as in `emit_slurm`, and exits early
      when all the task's cells are done (checked as in `emit_slurm`, before your template
      activates its environment: with `$PYTHON` when set, else the Python that wrote the
      script; when that cannot run on the node, the task runs and skips done cells itself).
      The template therefore needs no change, but must be a bash script.
    * `out_dir/launch.sh`: at launch time lists the manifest rows with a cell not done
      (moving corrupt result files aside, as in `emit_slurm`), reads the cluster's MaxArraySize (`scontrol show config`; 1001 when it cannot
      be read), and submits `sbatch --array=0-<n-1>` chunks of at most that many tasks, each
      over a rows file written to `out_dir/arrays/` and named in the job's comment
      (`--comment=ee-rows:<rows file>`, which `encoder-eval status` reads with
      `out_dir/units.json`). It refuses to submit while array jobs of this launch
      directory are still queued or running (scancel them or wait; a `status --emit`
      script in another directory is not held up by them), and submits nothing when
      every cell is done. `EE_ARRAY_CHUNK=N` lowers the chunk size;
      `EE_ARRAY_THROTTLE=N` adds Slurm's `%N` limit on simultaneously running tasks.
    """
    template, requeue, group, python, known = launch.parts()
    cells = _cells_or_all(plan, launch.cells)
    text = _read_template(template, need_bash=True, module=plan.module)
    out = _prepare_out_dir(plan, out_dir)
    rows, job_cells = [], []
    jobs = slurm_jobs(plan, plan.units(cells, group), launch.units_per_job)
    specs: dict[Path, UnitSpec] = {}
    for job in jobs:
        unit_cells, env, args = _job_parts(plan, job, out, group, specs)
        job_cells.append(unit_cells)
        outs = [plan.out_json(c) for c in unit_cells]
        values = [str(len(outs)), *outs, *(env[k] for k in SLURM_VARIABLES), *args]
        for v in values:
            if "\t" in v or "\n" in v or "\r" in v:
                raise HarnessError(
                    f"cell {unit_cells[0].label} has a value with a tab or newline ({v!r}), "
                    "which the array manifest cannot hold; use --mode slurm for this sweep"
                )
        rows.append("\t".join(values))
    manifest = out / "manifest.tsv"
    array = out / "array.sh"
    head, rest = split_template_header(text)
    python = python or sys.executable
    preamble = _fill(
        "array_preamble.sh", words={"PYTHON": python}, code={"VARIABLES": " ".join(SLURM_VARIABLES)}
    )
    # One name per launch directory: its launch.sh waits for its own array jobs only, so a
    # `status --emit` script for the cells left can go while the sweep's jobs still run.
    job_name = f"{job_prefix(plan)}array-{_short_hash(str(out))}"
    _slurm_comment(f"{ROWS_COMMENT}{out / 'arrays'}/rows-YYYYmmdd-HHMMSS-{'9' * 10}-99.txt")
    launch = _fill(
        "launch_array.sh",
        words={
            "MANIFEST": manifest,
            "ARRAY_SCRIPT": array,
            "ARRAYS_DIR": out / "arrays",
            "LOG": _sbatch_path(out / "logs") + "/%x-%A_%a.out",
            "JOB_NAME": job_name,
            "PYTHON": python,
            "PHASE": plan.phase,
            "DEFAULT_MAX_ARRAY_SIZE": DEFAULT_MAX_ARRAY_SIZE,
            "ROWS_COMMENT": ROWS_COMMENT,
        },
        code={
            "HEADER": _header(
                plan, "submit one Slurm array job (chunked to MaxArraySize) over the manifest"
            ),
            "REQUEUE": "--requeue" if requeue else "",
            "COMMON": _common(),
        },
    )
    _make_dirs(plan, out)
    _write_specs(specs)
    header = "\t".join(["N", "OUT_JSON_1..N", *SLURM_VARIABLES, "RUN_ARG..."])
    write_atomic(manifest, header + "\n" + "".join(r + "\n" for r in rows))
    _write_script(array, head + preamble + rest)
    units_file = _write_units(out, plan, job_cells)
    script = out / "launch.sh"
    _write_script(script, launch)
    n_done, corrupt = _states(plan, cells, known)
    files = [script, array, manifest, units_file]
    n_units = sum(len(job) for job in jobs)
    emitted = Emitted("slurm-array", script, len(cells), n_done, n_units, files, corrupt, group)
    emitted.n_jobs, emitted.units_per_job = len(jobs), max(len(job) for job in jobs)
    return emitted


def emit(
    plan: Plan,
    out_dir: str | os.PathLike,
    mode: str = "shell",
    *,
    cells: list[Cell] | None = None,
    template: str | os.PathLike | None = None,
    requeue: bool = False,
    python: str | None = None,
    group: str | None = None,
    known: dict[str, str] | None = None,
    units_per_job: int | None = None,
) -> Emitted:
    """Write the launch script of `mode` for `cells` (default: every cell of the plan).

    `group` says which cells share one process (`Plan.units`); default `DEFAULT_GROUP`:
    one per (model, task) in shell mode, one per (model, task, LR) in the Slurm modes; a
    probe plan's units are always one per (model, task). `units_per_job` (Slurm modes):
    the units one job runs in one warm process (`slurm_jobs`; default
    `DEFAULT_UNITS_PER_JOB`, a probe plan 1). `known`: the cells' states already read, by
    result file (`results.cell_state`), so no file is read twice.
    """
    if mode not in EMIT_MODES:
        raise HarnessError(f"--mode {mode!r} must be one of {', '.join(EMIT_MODES)}")
    group = group or ("pair" if plan.kind == PROBE else DEFAULT_GROUP[mode])
    if group not in GROUPS:
        raise HarnessError(f"--group {group!r} must be one of {', '.join(GROUPS)}")
    if mode == "shell":
        if template is not None or requeue:
            raise HarnessError("--slurm-template and --requeue are for --mode slurm/slurm-array")
        if units_per_job is not None:
            raise HarnessError(
                "--units-per-job and --no-warm are for --mode slurm/slurm-array; run_all.sh "
                "chooses at run time (bash run_all.sh --warm | --no-warm)"
            )
        emitted = emit_shell(plan, out_dir, cells, python=python, group=group, known=known)
    else:
        if plan.kind == PROBE and (units_per_job or 1) > 1:
            raise HarnessError(
                f"--units-per-job {units_per_job}: a probe sweep runs one unit a job "
                "(encoder_eval.probe runs one unit); drop --units-per-job"
            )
        per_job = DEFAULT_UNITS_PER_JOB if units_per_job is None else units_per_job
        launch = SlurmLaunch(template, cells, requeue, group, python, known, per_job)
        if mode == "slurm":
            emitted = emit_slurm(plan, out_dir, launch)
            emitted.max_array_size = cluster_max_array_size()
        else:
            emitted = emit_slurm_array(plan, out_dir, launch)
    emitted.remote_code = remote_code_models(plan.cells if cells is None else cells)
    return emitted


def cluster_max_array_size() -> int:
    """The cluster's MaxArraySize (`scontrol show config`), or DEFAULT_MAX_ARRAY_SIZE when
    it cannot be read (no Slurm here: a sweep may be written off the cluster)."""
    if shutil.which("scontrol") is None:
        return DEFAULT_MAX_ARRAY_SIZE
    try:
        proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_MAX_ARRAY_SIZE
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", proc.stdout, re.MULTILINE)
    return int(found.group(1)) if proc.returncode == 0 and found else DEFAULT_MAX_ARRAY_SIZE
