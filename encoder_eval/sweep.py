"""`python -m encoder_eval.sweep`: write the launch script for one phase of the protocol.

Usage::

    # selection phase: every (model, task, grid LR, select seed 42-44) cell, dev only
    python -m encoder_eval.sweep --phase select --out-dir runs/select \\
        --results-dir results/select --mode shell
    bash runs/select/run_all.sh

    # reporting phase: the 5 report seeds (45-49) at each pair's selected LR
    python -m encoder_eval.sweep --phase report --selection selection.json \\
        --out-dir runs/report --results-dir results/report --mode shell

    # on a cluster: one sbatch per missing cell, or one array job per phase
    python -m encoder_eval.sweep --phase select --mode slurm --slurm-template my.sbatch ...
    python -m encoder_eval.sweep --phase select --mode slurm-array --slurm-template my.sbatch ...
    bash runs/select/launch.sh

    python -m encoder_eval.sweep --show-grid     # the LR grid, seed sets and recipe flags

What runs: `--models` (default: every model of MODEL_REGISTRY, or only the `--model`
additions when any are given), `--tasks` (default: the five multilingual tasks),
`--model NAME=PATH_OR_HUB_ID[:MODE]` (repeatable) to add a model without editing the
registry. Smoke-run shrinking: `--lr-keys lr03,lr06`, `--seeds 42,43`, `--max-steps N`,
`--max-seq-len N`; the cells then carry the shrunken values, `run` marks them
off-protocol, and `summarize` refuses them without `--allow-partial`.

Every cell command carries the whole recipe explicitly (`--weight-decay 0.1
--adam-beta2 0.95 --early-stop --patience 3 --epoch-cap 20 --bsz 32 ...`). Every script
is idempotent: a cell that is done (`results.cell_state`: its result file parses, validates
and names the cell) is skipped when the script gets to it, a corrupt result file is moved
aside into `<results dir>/.corrupt/` and its cell runs again, so re-running a script fills
the gaps. Nothing here imports torch: it runs on a login node.

Adding a model is one row of `MODEL_REGISTRY` (re-exported here from `models.py`)::

    "my-encoder-base": ("org/my-encoder-base", "auto"),
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import experiment
from .errors import ArgumentParser, HarnessError, unknown_name
from .models import MODEL_REGISTRY, MODES, ModelEntry, model_entry, parse_model_spec
from .protocol import (
    LR_GRID,
    PHASE_SEEDS,
    PROTOCOL_RECIPE,
    SELECTION_SPLITS,
    lr_for_key,
    lr_key_for,
)
from .results import CORRUPT, DONE_STATES, QUARANTINE_DIR, cell_state, result_filename
from .tasks import MULTILINGUAL_TASKS, TASK_KNOBS, task_knobs

__all__ = [
    "MODEL_REGISTRY",
    "Cell",
    "Emitted",
    "Plan",
    "build_plan",
    "emit",
    "emit_shell",
    "emit_slurm",
    "emit_slurm_array",
    "main",
]

EXIT_INPUT_ERROR = 2
PHASES = ("select", "report")
EMIT_MODES = ("shell", "slurm", "slurm-array")
# How many cells share one `encoder_eval.run` process (see `Plan.units`).
GROUPS = ("pair", "lr", "cell")
DEFAULT_GROUP = {"shell": "pair", "slurm": "cell", "slurm-array": "cell"}
DEFAULT_MAX_ARRAY_SIZE = 1001
# Flags that define a cell's identity; --extra-run-args must not override them.
_RESERVED_RUN_FLAGS = (
    "--model-key", "--model-path", "--mode", "--task", "--lr", "--seed", "--phase",
    "--results-dir", "--out-json", "--skip-existing",
)  # fmt: skip
# Exported to a Slurm template, in this order (manifest columns after N and the N result files).
SLURM_VARIABLES = (
    "OUT_JSON", "MODEL", "MODEL_PATH", "MODE", "TASK", "LR", "LR_KEY", "SEED", "PHASE",
    "RESULTS_DIR", "DATA_DIR", "DEVICE", "MAX_STEPS", "RECIPE_ARGS", "RUN_ARGS", "N_CELLS",
)  # fmt: skip


# ----------------------------------------------------------------------------- parsing helpers


def split_csv(text: str | None) -> list[str]:
    """`'a, b,,c'` -> `['a', 'b', 'c']` (order kept, duplicates dropped); None -> []."""
    out: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if item and item not in out:
            out.append(item)
    return out


def parse_seeds(text: str | None, flag: str = "--seeds") -> list[int] | None:
    """Parse a comma-separated seed list (None when the flag was not given)."""
    if text is None:
        return None
    try:
        seeds = [int(s) for s in split_csv(text)]
    except ValueError:
        raise HarnessError(
            f"{flag} {text!r} must be comma-separated integers, e.g. 42,43"
        ) from None
    if not seeds:
        raise HarnessError(f"{flag} is empty; give at least one seed, e.g. {flag} 42")
    if any(s < 0 for s in seeds):
        raise HarnessError(f"{flag} {text!r} holds a negative seed; seeds are >= 0")
    return seeds


def parse_lr_keys(text: str | None) -> list[str] | None:
    """Parse `--lr-keys lr03,lr06` against the grid (None when the flag was not given)."""
    if text is None:
        return None
    keys = split_csv(text)
    if not keys:
        raise HarnessError("--lr-keys is empty; give grid keys such as lr03,lr06")
    for key in keys:
        lr_for_key(key)  # raises with the valid keys
    return sorted(keys, key=lambda k: LR_GRID[k])


def model_table(extra_specs: list[str] | None = None) -> tuple[dict[str, tuple], list[str]]:
    """The registry merged with `--model NAME=PATH[:MODE]` additions, and the added names."""
    table = dict(MODEL_REGISTRY)
    added = []
    for spec in extra_specs or []:
        name, entry = parse_model_spec(spec)
        if name in MODEL_REGISTRY:
            raise HarnessError(
                f"--model {name}=... shadows the registry model {name!r}; choose another NAME"
            )
        if name in added:
            raise HarnessError(f"--model {name}=... is given twice; give each NAME once")
        table[name] = tuple(entry)
        added.append(name)
    return table, added


def resolve_models(
    models: list[str] | None, extra_specs: list[str] | None = None, trust_added: bool = False
) -> dict[str, ModelEntry]:
    """Which models a sweep covers: `models` (names of the registry or of additions), else the
    additions when there are any, else the whole registry."""
    table, added = model_table(extra_specs)
    names = models if models else (added or list(MODEL_REGISTRY))
    out = {}
    for name in names:
        if name not in table:
            raise unknown_name("model", name, table)
        entry = model_entry(name, table)
        if name in added and trust_added:
            entry = entry._replace(trust_remote_code=True)
        out[name] = entry
    return out


def resolve_tasks(tasks: list[str] | None) -> list[str]:
    names = tasks if tasks else list(MULTILINGUAL_TASKS)
    for name in names:
        task_knobs(name)  # raises with the valid names
    return names


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Cell:
    """One (model, task, learning rate, seed) of a phase, with how to load its model."""

    model: str
    model_path: str
    mode: str
    trust_remote_code: bool
    task: str
    lr_key: str
    lr: float
    seed: int
    phase: str

    @property
    def filename(self) -> str:
        return result_filename(self.model, self.task, self.lr, self.seed)

    @property
    def pair(self) -> tuple[str, str]:
        return (self.model, self.task)

    @property
    def label(self) -> str:
        return f"{self.model}/{self.task}/{self.lr_key}/s{self.seed}"


@dataclass
class Plan:
    """Every cell of one phase plus what each cell command needs besides its identity."""

    phase: str
    cells: list[Cell]
    results_dir: str
    max_steps: int = PROTOCOL_RECIPE.max_steps
    max_seq_len: int = PROTOCOL_RECIPE.max_seq_len
    selection_split: str = PROTOCOL_RECIPE.selection_split
    data_dir: str | None = None
    device: str = "auto"
    extra_run_args: list[str] = field(default_factory=list)
    shrunk: list[str] = field(default_factory=list)  # how this plan departs from the protocol

    def out_json(self, cell: Cell) -> str:
        return os.path.join(self.results_dir, cell.filename)

    def recipe_args(self) -> list[str]:
        """The recipe, spelled out flag by flag (the protocol's values unless shrunk)."""
        r = PROTOCOL_RECIPE
        return [
            "--weight-decay", f"{r.weight_decay:g}", "--adam-beta2", f"{r.adam_beta2:g}",
            "--warmup-ratio", f"{r.warmup_ratio:g}", "--bsz", str(r.batch_size),
            "--early-stop", "--patience", str(r.patience), "--epoch-cap", str(r.epoch_cap),
            "--max-steps", str(self.max_steps), "--max-seq-len", str(self.max_seq_len),
            "--precision", r.precision, "--selection-split", self.selection_split,
        ]  # fmt: skip

    def run_args(self, cells: list[Cell]) -> list[str]:
        """Arguments of `python -m encoder_eval.run` for the cells of one unit.

        A unit is every (LR, seed) combination of its LRs and seeds for one (model, task):
        the process runs them LR by LR, each LR's seeds in order (see `Plan.units`).
        """
        first = cells[0]
        lrs = list(dict.fromkeys(c.lr for c in cells))
        seeds = list(dict.fromkeys(c.seed for c in cells))
        if (
            any(c.pair != first.pair for c in cells)
            or len(cells) != len(lrs) * len(seeds)
            or ({(c.lr, c.seed) for c in cells} != {(lr, s) for lr in lrs for s in seeds})
        ):
            raise ValueError("run_args takes the cells of one unit (LRs x seeds of one pair)")
        args = [
            "--model-key", first.model, "--model-path", first.model_path, "--mode", first.mode,
            "--task", first.task, "--lr", ",".join(f"{lr:g}" for lr in lrs),
            "--seed", ",".join(map(str, seeds)),
            "--phase", self.phase, "--results-dir", self.results_dir, "--skip-existing",
            "--trust-remote-code" if first.trust_remote_code else "--no-trust-remote-code",
            *self.recipe_args(), "--device", self.device,
        ]  # fmt: skip
        if self.data_dir:
            args += ["--data-dir", self.data_dir]
        if any(s not in PHASE_SEEDS[self.phase] for s in seeds):
            args.append("--allow-off-protocol")  # run.py then marks the result off-protocol
        args += ["--progress", "json", *self.extra_run_args]
        return args

    def units(self, cells: list[Cell] | None = None, group: str = "pair") -> list[list[Cell]]:
        """Split cells into units, each run by one process, in plan order.

        group "pair": every cell of one (model, task), when they are all combinations of
        their LRs and seeds (a plan's always are; a subset that is not, e.g. from `status
        --emit`, falls back to one unit per LR); "lr": the seeds of one (model, task, LR);
        "cell": one cell per unit.
        """
        if group not in GROUPS:
            raise HarnessError(f"--group {group!r} must be one of {', '.join(GROUPS)}")
        if group == "cell":
            return [[c] for c in (self.cells if cells is None else cells)]
        by_pair: dict[tuple, list[Cell]] = {}
        for cell in self.cells if cells is None else cells:
            by_pair.setdefault(cell.pair, []).append(cell)
        units = []
        for pair_cells in by_pair.values():
            by_lr: dict[float, list[Cell]] = {}
            for cell in pair_cells:
                by_lr.setdefault(cell.lr, []).append(cell)
            seed_sets = {tuple(sorted(c.seed for c in v)) for v in by_lr.values()}
            if group == "pair" and len(seed_sets) == 1:
                seeds = [c.seed for c in next(iter(by_lr.values()))]
                units.append([c for lr in by_lr for s in seeds for c in by_lr[lr] if c.seed == s])
            else:
                units.extend(by_lr.values())
        return units

    def cell_state(self, cell: Cell) -> str:
        """'ok' or 'diverged' (done), 'missing' or 'corrupt', by `results.cell_state`."""
        return cell_state(self.out_json(cell), self.phase)[0]


def _abs_if_local(path: str) -> str:
    """Absolute path for a local model directory (jobs may start elsewhere); Hub ids unchanged."""
    return os.path.abspath(path) if os.path.exists(path) else path


def build_plan(
    phase: str,
    *,
    results_dir: str | os.PathLike,
    models: list[str] | None = None,
    extra_models: list[str] | None = None,
    tasks: list[str] | None = None,
    lr_keys: list[str] | None = None,
    seeds: list[int] | None = None,
    selection: dict | None = None,
    max_steps: int | None = None,
    max_seq_len: int | None = None,
    data_dir: str | os.PathLike | None = None,
    device: str | None = None,
    extra_run_args: list[str] | None = None,
    trust_remote_code: bool = False,
    selection_split: str | None = None,
) -> Plan:
    """Expand a phase into its cells, checking every input; raises HarnessError on bad input.

    select: models x tasks x LR keys (default: the whole grid) x seeds (default 42-44).
    report: models x tasks x seeds (default 45-49) at each pair's LR in `selection`, with
    the selection split its select cells used (a contradicting `selection_split` is refused).
    """
    if phase not in PHASES:
        raise HarnessError(f"--phase {phase!r} must be select or report")
    resolved = resolve_models(models, extra_models, trust_added=trust_remote_code)
    task_list = resolve_tasks(tasks)
    shrunk = []
    if seeds is None:
        seeds = list(PHASE_SEEDS[phase])
    elif seeds != list(PHASE_SEEDS[phase]):
        shrunk.append(f"seeds {','.join(map(str, seeds))} (protocol: {list(PHASE_SEEDS[phase])})")
    if phase == "select":
        if selection is not None:
            raise HarnessError("--selection is for --phase report; drop it for --phase select")
        if lr_keys is None:
            lr_keys = list(LR_GRID)
        for key in lr_keys:
            lr_for_key(key)  # raises with the valid keys
        lr_keys = sorted(dict.fromkeys(lr_keys), key=LR_GRID.__getitem__)  # grid order
        if lr_keys != list(LR_GRID):
            shrunk.append(f"lr keys {','.join(lr_keys)} (protocol: all {len(LR_GRID)})")
    else:
        if lr_keys is not None:
            raise HarnessError(
                "--lr-keys is for --phase select; the report phase runs each pair's selected LR"
            )
        if selection is None:
            raise HarnessError(
                "--phase report needs --selection selection.json; "
                "create it with python -m encoder_eval.select"
            )
    selection_split = _selection_split(phase, selection, selection_split)
    if max_steps is not None and max_steps < 1:
        raise HarnessError("--max-steps must be at least 1")
    if max_seq_len is not None and max_seq_len < 1:
        raise HarnessError("--max-seq-len must be at least 1")
    max_steps = PROTOCOL_RECIPE.max_steps if max_steps is None else max_steps
    max_seq_len = PROTOCOL_RECIPE.max_seq_len if max_seq_len is None else max_seq_len
    if max_steps != PROTOCOL_RECIPE.max_steps:
        shrunk.append(f"max steps {max_steps} (protocol: {PROTOCOL_RECIPE.max_steps})")
    if max_seq_len != PROTOCOL_RECIPE.max_seq_len:
        shrunk.append(f"max seq len {max_seq_len} (protocol: {PROTOCOL_RECIPE.max_seq_len})")
    device = device or "auto"
    if device not in ("auto", "cuda", "cpu"):
        raise HarnessError(f"--device {device!r} must be auto, cuda or cpu")
    extra = list(extra_run_args or [])
    for arg in extra:
        if arg.split("=", 1)[0] in _RESERVED_RUN_FLAGS:
            raise HarnessError(
                f"--extra-run-args may not set {arg.split('=', 1)[0]}; the sweep sets it per cell"
            )
    if data_dir is not None:
        if not Path(data_dir).is_dir():
            raise HarnessError(f"--data-dir {data_dir} is not a directory; give the mirror's path")
        data_dir = os.path.abspath(data_dir)

    cells: list[Cell] = []
    missing_pairs = []
    for name, entry in resolved.items():
        path = _abs_if_local(entry.path)
        for task in task_list:
            if phase == "select":
                pair_lrs = [(key, LR_GRID[key]) for key in lr_keys]
            else:
                chosen = selection.get("pairs", {}).get(name, {}).get(task) or {}
                if not chosen.get("lr_key"):
                    missing_pairs.append(f"{name}/{task}")
                    continue
                pair_lrs = [(chosen["lr_key"], float(chosen["lr"]))]
            for key, lr in pair_lrs:
                if lr_key_for(lr) != key:
                    raise HarnessError(
                        f"selection gives {name}/{task} lr {lr:g} under key {key!r}, which "
                        "disagrees with the grid; regenerate it with encoder_eval.select"
                    )
                for seed in seeds:
                    cells.append(Cell(name, path, entry.mode, bool(entry.trust_remote_code),
                                      task, key, lr, seed, phase))  # fmt: skip
    if missing_pairs:
        raise HarnessError(
            f"the selection has no selected LR for {len(missing_pairs)} pair(s): "
            f"{', '.join(missing_pairs)}; finish the select phase or narrow --models/--tasks"
        )
    return Plan(
        phase=phase, cells=cells, results_dir=os.path.abspath(results_dir),
        max_steps=max_steps, max_seq_len=max_seq_len, selection_split=selection_split,
        data_dir=None if data_dir is None else str(data_dir), device=device,
        extra_run_args=extra, shrunk=shrunk,
    )  # fmt: skip


def _selection_split(phase: str, selection: dict | None, requested: str | None) -> str:
    """The split that picks LRs and checkpoints: as requested, and for a report phase the
    one its select cells used (a report phase never contradicts its select phase)."""
    if requested is not None and requested not in SELECTION_SPLITS:
        raise HarnessError(f"--selection-split {requested!r}: valid: {', '.join(SELECTION_SPLITS)}")
    if phase != "report" or selection is None:
        return requested or PROTOCOL_RECIPE.selection_split
    used = {
        (entry.get("select_setup") or {}).get("selection_split")
        for by_task in selection.get("pairs", {}).values()
        for entry in by_task.values()
        if isinstance(entry, dict) and entry.get("lr_key")
    } - {None}
    if len(used) > 1:
        raise HarnessError(f"the selection mixes selection splits ({', '.join(sorted(used))}); "
                           "select each variant into its own selection file")  # fmt: skip
    chosen = next(iter(used), None) or requested or PROTOCOL_RECIPE.selection_split
    if requested is not None and requested != chosen:
        raise HarnessError(
            f"--selection-split {requested} contradicts the selection, whose select cells used "
            f"{chosen}; drop the flag (the report phase follows its select phase)"
        )
    return chosen


# ----------------------------------------------------------------------------- emitting


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

    def describe(self) -> str:
        todo = self.n_cells - self.n_done
        what = f"{self.n_cells} cell(s) ({self.n_done} already done, {todo} to run)"
        what += f" in {self.n_units} {'process(es)' if self.mode == 'shell' else 'job(s)'}, "
        what += f"one per {_GROUP_WORDS[self.group]}"
        text = f"wrote {self.script}: {what}; run: bash {shlex.quote(str(self.script))}"
        if self.corrupt:
            where = Path(self.corrupt[0]).parent / QUARANTINE_DIR
            text += (
                f"\nnote: {len(self.corrupt)} corrupt result file(s) among the cells to run; "
                f"the script moves them aside into {shlex.quote(str(where))} and re-runs "
                "their cells"
            )
        return text


_GROUP_WORDS = {"pair": "(model, task)", "lr": "(model, task, LR)", "cell": "cell"}


def _unit_label(cells: list[Cell], group: str) -> str:
    """`model_task[_lrkey][_sSEED]`, file-name safe: names a unit's log and job.

    The LR key is added when the unit has one LR, the seed for `--group cell`."""
    first = cells[0]
    label = f"{first.model}_{first.task}"
    if len({c.lr_key for c in cells}) == 1:
        label += f"_{first.lr_key}"
    if group == "cell":
        label += f"_s{first.seed}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", label)


def _states(plan: Plan, cells: list[Cell]) -> tuple[int, list[str]]:
    """(cells that are done, paths of corrupt result files) among `cells`."""
    done, corrupt = 0, []
    for cell in cells:
        state = plan.cell_state(cell)
        if state in DONE_STATES:
            done += 1
        elif state == CORRUPT:
            corrupt.append(plan.out_json(cell))
    return done, corrupt


# Every script decides "done" with `python -m encoder_eval.done` (no torch: fast on a login
# node), which also moves corrupt results aside. `__ON_FAILURE__` is the script's reaction
# to a check that could not run (exit status > 1 in $rc).
_CHECK_FUNCTION = r"""
# check FILE...: STATES gets one word per file, in order (ok and diverged are done; see
# python -m encoder_eval.done --help), N_DONE how many are done. Corrupt result files are
# moved aside into .corrupt/ in their results directory (one line each), so their cells run.
check() {
    local out rc=0 s
    STATES=(); N_DONE=0
    if [ "$#" -eq 0 ]; then return 0; fi
    out=$(printf '%s\0' "$@" |
        "$PYTHON" -m encoder_eval.done --phase "$PHASE" --states --files0-from -) || rc=$?
    if [ "$rc" -gt 1 ]; then
        __ON_FAILURE__
    fi
    while IFS= read -r s; do
        if [ -n "$s" ]; then STATES+=("$s"); fi
        case $s in ok | diverged) N_DONE=$((N_DONE + 1)) ;; esac
    done <<<"$out"
}
"""
_CHECK_FAILED = (
    'echo "error: could not check the result files with $PYTHON (exit $rc); set PYTHON to the'
    ' interpreter encoder_eval is installed in, then run this script again" >&2'
)


def _check_function(on_failure: str) -> str:
    """The bash `check` function of a generated script, reacting to a failed check so."""
    return _CHECK_FUNCTION.replace("__ON_FAILURE__", on_failure)


def _unit_passes(units_body: list[str], first_pass: str) -> list[str]:
    """Bash that lists the units once in a function, calls it with `unit` defined as
    `first_pass` (to collect every result file for one check), and leaves the second pass,
    with the real `unit`, to the caller."""
    return [
        "units() {  # every unit of this script, in order",
        *units_body,
        "}",
        "",
        "# First pass: check every result file at once, so done units cost no Python start-up.",
        "ALL_OUTS=()",
        f"unit() {{ {first_pass}; }}",
        "units",
        'check ${ALL_OUTS[@]+"${ALL_OUTS[@]}"}',
        'DONE_AT_START=(${STATES[@]+"${STATES[@]}"}); seen_outs=0',
        "",
    ]


# Bash for the second pass: how many of this unit's `n` files were done at the first pass.
_DONE_AT_START = [
    "    local i",
    "    for ((i = seen_outs; i < seen_outs + n; i++)); do",
    "        case ${DONE_AT_START[i]:-} in ok | diverged) have=$((have + 1)) ;; esac",
    "    done",
    "    seen_outs=$((seen_outs + n))",
]


def _q(value) -> str:
    return shlex.quote(str(value))


def _write_script(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, path)


def _job_name(plan: Plan, cells: list[Cell]) -> str:
    """`ee-<phase>-<hash of the results dir>-<unit>`: unique across sweeps, readable in squeue.

    A one-cell job is named for its result file; a job of several cells for its unit."""
    if len(cells) == 1:
        stem = re.sub(r"[^A-Za-z0-9._+-]", "_", cells[0].filename.removesuffix(".json"))
    else:
        stem = _unit_label(cells, "pair") + f"_{len(cells)}cells"
    return f"ee-{plan.phase}-{_short_hash(plan.results_dir)}-{stem[:160]}"


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def _unit_env(plan: Plan, cells: list[Cell]) -> dict[str, str]:
    """The variables a Slurm template receives for one job's cells (see `emit_slurm`)."""
    cell = cells[0]
    run_args = plan.run_args(cells)
    outs = [plan.out_json(c) for c in cells]
    return {
        "OUT_JSON": outs[0] if len(outs) == 1 else shlex.join(outs),
        "MODEL": cell.model,
        "MODEL_PATH": cell.model_path,
        "MODE": cell.mode,
        "TASK": cell.task,
        "LR": ",".join(dict.fromkeys(f"{c.lr:g}" for c in cells)),
        "LR_KEY": ",".join(dict.fromkeys(c.lr_key for c in cells)),
        "SEED": ",".join(dict.fromkeys(str(c.seed) for c in cells)),
        "PHASE": plan.phase,
        "RESULTS_DIR": plan.results_dir,
        "DATA_DIR": plan.data_dir or "",
        "DEVICE": plan.device,
        "MAX_STEPS": str(plan.max_steps),
        "RECIPE_ARGS": shlex.join(plan.recipe_args()),
        "RUN_ARGS": shlex.join(run_args),
        "N_CELLS": str(len(cells)),
    }


def _header(plan: Plan, what: str) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"# Generated by python -m encoder_eval.sweep: {what}",
        f"# phase {plan.phase}, {len(plan.cells)} cells, results in {plan.results_dir}",
    ]
    if plan.shrunk:
        lines.append("# SHRUNKEN (results are off-protocol): " + "; ".join(plan.shrunk))
    return "\n".join(lines) + "\n"


def _prepare_out_dir(plan: Plan, out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir).absolute()
    if out.exists() and not out.is_dir():
        raise HarnessError(f"--out-dir {out} exists and is not a directory; choose another")
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


def emit_shell(
    plan: Plan, out_dir: str | os.PathLike, cells: list[Cell] | None = None,
    python: str | None = None, group: str = "pair",
) -> Emitted:  # fmt: skip
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
    """
    cells = _cells_or_all(plan, cells)
    out = _prepare_out_dir(plan, out_dir)
    units = plan.units(cells, group)
    python = python or sys.executable
    script = out / "run_all.sh"
    body = [
        _header(plan, f"run every cell in order, one process per {_GROUP_WORDS[group]}"),
        "set -u",
        f"PYTHON=${{PYTHON:-{_q(python)}}}",
        f"PHASE={plan.phase}",
        f"LOG_DIR={_q(out / 'logs')}",
        f"RERUN={_q('bash ' + shlex.quote(str(script)))}",
        f'mkdir -p "$LOG_DIR" {_q(plan.results_dir)}',
        f"TOTAL_CELLS={len(cells)}",
        f"TOTAL_UNITS={len(units)}",
        "cells_done=0; units_seen=0; units_run=0; units_skipped=0; failed=0; failed_units=()",
        "current=",
        "",
        "# Ctrl-C reaches this script and its unit's process; the process saves what it must",
        "# and exits 130, and this script then stops instead of going on to the next unit.",
        "interrupted() {",
        "    trap - INT",
        '    echo "interrupted${current:+ during $current}: finished cells are kept and an'
        ' interrupted one resumes where it stopped; run $RERUN again to go on" >&2',
        "    exit 130",
        "}",
        "trap interrupted INT",
        _check_function(
            'if [ "$rc" -eq 130 ]; then interrupted; fi\n        '
            + _CHECK_FAILED
            + "\n        exit 2"
        ),
    ]
    units_body = []
    for unit_cells in units:
        words = ["unit", _unit_label(unit_cells, group), str(len(unit_cells))]
        words += [plan.out_json(c) for c in unit_cells]
        words += ["--", *plan.run_args(unit_cells)]
        units_body.append(" ".join(_q(w) for w in words))
    body += _unit_passes(units_body, 'ALL_OUTS+=("${@:3:$2}")')
    body += [
        "unit() {  # unit LABEL N OUT_1..OUT_N -- RUN_ARGS...",
        "    local label=$1 n=$2; shift 2",
        '    local outs=("${@:1:$n}"); shift "$n"; shift  # drop the --',
        '    local log="$LOG_DIR/$label.log" have=0 rc',
        *_DONE_AT_START,
        '    if [ "$have" -lt "$n" ]; then  # again: another runner may have done some since',
        '        check "${outs[@]}"; have=$N_DONE',
        "    fi",
        "    units_seen=$((units_seen + 1))",
        '    if [ "$have" -eq "$n" ]; then',
        "        cells_done=$((cells_done + n)); units_skipped=$((units_skipped + 1))",
        '        echo "[cells $cells_done/$TOTAL_CELLS done, units $units_seen/$TOTAL_UNITS,'
        ' failed $failed] skip $label (all $n cells done)"',
        "        return 0",
        "    fi",
        "    current=$label",
        '    echo "[cells $cells_done/$TOTAL_CELLS done, units $((units_seen - 1))/$TOTAL_UNITS,'
        ' failed $failed] starting $label ($((n - have)) of $n cells to run), log: $log"',
        # Appended, not truncated: a second runner of this script must not wipe this log.
        '    "$PYTHON" -m encoder_eval.run "$@" >>"$log" 2>&1',
        "    rc=$?",
        '    if [ "$rc" -eq 130 ]; then interrupted; fi',
        "    units_run=$((units_run + 1))",
        '    check "${outs[@]}"; have=$N_DONE',
        "    cells_done=$((cells_done + have))",
        '    if [ "$rc" -ne 0 ] || [ "$have" -ne "$n" ]; then',
        '        failed=$((failed + 1)); failed_units+=("$label")',
        '        echo "FAILED $label (exit $rc, $have of $n cells written), see $log" >&2',
        "        tail -n 5 \"$log\" | sed 's/^/    /' >&2",
        "    fi",
        "    current=",
        "}",
        "units",
        "",
        'echo "[cells $cells_done/$TOTAL_CELLS done, units $units_seen/$TOTAL_UNITS,'
        ' failed $failed] finished: $units_run run, $units_skipped skipped (already done)"',
        'if [ "$failed" -gt 0 ]; then',
        '    echo "failed units: ${failed_units[*]} (logs in $LOG_DIR);'
        ' re-run this script to retry them" >&2',
        "    exit 1",
        "fi",
        "",
    ]
    _make_dirs(plan, out)
    _write_script(script, "\n".join(body))
    n_done, corrupt = _states(plan, cells)
    return Emitted("shell", script, len(cells), n_done, len(units), [script], corrupt, group)


def _read_template(template: str | os.PathLike | None, *, need_bash: bool) -> str:
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
            f"--slurm-template {template} never passes the cell to encoder_eval.run: it uses "
            'neither "$@" nor $RUN_ARGS (nor all of '
            + ", ".join(f"${v}" for v in _OWN_COMMAND)
            + '); add the line python -m encoder_eval.run "$@" (see examples/slurm_template.sh)'
        )
    return text


# A template that writes its own command line must use at least these variables.
_OWN_COMMAND = ("MODEL_PATH", "TASK", "LR", "SEED", "OUT_JSON")


def _template_runs_the_cell(text: str) -> bool:
    """Whether a template's code (comments aside) hands a job its cell: "$@" / $RUN_ARGS, or
    the identity variables for a command of its own."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    if re.search(r"\$@|\$\{@\}|\bRUN_ARGS\b", code):
        return True
    return all(re.search(rf"\$\{{?{name}\b", code) for name in _OWN_COMMAND)


def _sbatch_path(path: Path) -> str:
    """A path for sbatch --output, with `%` escaped (sbatch expands %j, %x, ... in it)."""
    return str(path).replace("%", "%%")


_QUEUE_PRELUDE = r"""
# Jobs of this sweep already queued or running (by job name): never submit a cell twice.
declare -A QUEUED=()
if command -v squeue >/dev/null 2>&1; then
    while IFS= read -r name; do [ -n "$name" ] && QUEUED["$name"]=1; done < <(
        squeue -h -u "$(id -un)" -t pending,running,suspended,configuring,completing \
            -o '%j' 2>/dev/null)
fi
"""


def emit_slurm(
    plan: Plan, out_dir: str | os.PathLike, template: str | os.PathLike | None,
    cells: list[Cell] | None = None, requeue: bool = False, group: str = "cell",
    python: str | None = None,
) -> Emitted:  # fmt: skip
    """Write `out_dir/launch.sh`: one `sbatch` per cell not done, each running your template.

    With `group` "lr" or "pair" (`--group`), one job runs a unit of several cells in one
    process instead (`Plan.units`): the seeds of one (model, task, LR), or every cell of
    one (model, task). Each cell still writes its own result file as it ends.

    The template contract
    ---------------------
    Your template is an ordinary sbatch batch script: a `#!` line (sbatch requires one),
    any `#SBATCH` directives your cluster needs (GPU, time, partition, account), then the
    lines that activate your environment and run the cell. It is copied to
    `out_dir/template.sh` when the launch script is written, and `launch.sh` submits
    that copy once per cell that is not done yet, as::

        VAR=value ... sbatch --export=ALL --job-name=ee-<phase>-<cell> \\
            --output=<out_dir>/logs/%x-%j.out [--requeue] template.sh RUN_ARGS...

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

    slurm-array mode (`emit_slurm_array`) keeps this same contract for every array task.
    """
    cells = _cells_or_all(plan, cells)
    text = _read_template(template, need_bash=False)
    out = _prepare_out_dir(plan, out_dir)
    tpl = out / "template.sh"
    logs = out / "logs"
    lines = [
        _header(plan, "submit one sbatch job per cell not done"),
        "set -euo pipefail",
        f"TEMPLATE={_q(tpl)}",
        f"REQUEUE=({'--requeue' if requeue else ''})",
        f"PYTHON=${{PYTHON:-{_q(python or sys.executable)}}}",
        f"PHASE={plan.phase}",
        _QUEUE_PRELUDE,
        _check_function(_CHECK_FAILED + "\n        exit 2"),
        "submitted=0; done_cells=0; queued=0",
    ]
    units = plan.units(cells, group)
    units_body = []
    for unit_cells in units:
        env = _unit_env(plan, unit_cells)
        words = ["unit", _job_name(plan, unit_cells), _sbatch_path(logs) + "/%x-%j.out"]
        words += [str(len(unit_cells)), *(plan.out_json(c) for c in unit_cells)]
        words += [f"{k}={v}" for k, v in env.items()]
        words += ["--", *plan.run_args(unit_cells)]
        units_body.append(" ".join(_q(w) for w in words))
    lines += _unit_passes(units_body, 'ALL_OUTS+=("${@:4:$3}")')
    lines += [
        "unit() {  # unit JOB_NAME LOG N OUT_JSON_1..OUT_JSON_N VAR=VALUE... -- RUN_ARGS...",
        "    local name=$1 log=$2 n=$3; shift 3",
        '    shift "$n"  # the result files: checked in the first pass',
        "    local envs=() have=0",
        '    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift',
        *_DONE_AT_START,
        "    done_cells=$((done_cells + have))",
        '    if [ "$have" -eq "$n" ]; then return 0; fi',
        '    if [ -n "${QUEUED[$name]+x}" ]; then queued=$((queued + n - have)); return 0; fi',
        '    env "${envs[@]}" sbatch --export=ALL --job-name="$name" --output="$log" \\',
        '        ${REQUEUE[@]+"${REQUEUE[@]}"} "$TEMPLATE" "$@"',
        "    submitted=$((submitted + 1))",
        "}",
        "units",
        "",
        'echo "submitted $submitted job(s); $done_cells cell(s) already done;'
        ' $queued cell(s) already queued or running"',
        "",
    ]
    _make_dirs(plan, out)
    _write_script(tpl, text)
    script = out / "launch.sh"
    _write_script(script, "\n".join(lines))
    n_done, corrupt = _states(plan, cells)
    return Emitted("slurm", script, len(cells), n_done, len(units), [script, tpl], corrupt, group)


_ARRAY_PREAMBLE = r"""
# >>> inserted by encoder_eval.sweep (slurm-array): load this array task's cells.
# $1 is the cells manifest, $2 the list of manifest rows this array job covers.
__ee_manifest=$1 __ee_rows=$2
__ee_index=$(sed -n "$((${SLURM_ARRAY_TASK_ID:?not an array task} + 1))p" "$__ee_rows")
if [ -z "$__ee_index" ]; then
    echo "encoder_eval: no manifest row for array task $SLURM_ARRAY_TASK_ID in $__ee_rows" >&2
    exit 1
fi
__ee_row=$(sed -n "$((__ee_index + 2))p" "$__ee_manifest")  # line 1 is the header
__ee_f=()
while [[ $__ee_row == *$'\t'* ]]; do
    __ee_f+=("${__ee_row%%$'\t'*}")
    __ee_row=${__ee_row#*$'\t'}
done
__ee_f+=("$__ee_row")
__ee_n=${__ee_f[0]}  # the row: N, N result files, the variables, the run arguments
__ee_i=$((__ee_n + 1))
for __ee_var in __VARIABLES__; do
    export "$__ee_var=${__ee_f[$__ee_i]}"
    __ee_i=$((__ee_i + 1))
done
# Done already (e.g. by another runner since the launch)? The check is encoder_eval.done
# (no torch) run by $PYTHON, else by the Python that wrote this script; it moves corrupt
# result files aside. When it cannot run here, the task runs: the run skips done cells.
__ee_python=${PYTHON:-__PYTHON__}
__ee_rc=0
printf '%s\0' "${__ee_f[@]:1:__ee_n}" |
    "$__ee_python" -m encoder_eval.done --phase "$PHASE" --files0-from - || __ee_rc=$?
if [ "$__ee_rc" -eq 0 ]; then
    echo "encoder_eval: all $__ee_n cell(s) of this task are already done, skipping"
    exit 0
elif [ "$__ee_rc" -ne 1 ]; then
    echo "encoder_eval: could not check this task's result files with $__ee_python (exit" \
        "$__ee_rc); running the task, which skips the cells already done" >&2
fi
set -- "${__ee_f[@]:__ee_i}"
unset __ee_manifest __ee_rows __ee_index __ee_row __ee_f __ee_i __ee_var __ee_n __ee_python \
    __ee_rc
# <<< end of the inserted part; the template follows.
"""


def _split_template_header(text: str) -> tuple[str, str]:
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
    plan: Plan, out_dir: str | os.PathLike, template: str | os.PathLike | None,
    cells: list[Cell] | None = None, requeue: bool = False, group: str = "cell",
    python: str | None = None,
) -> Emitted:  # fmt: skip
    """Write a cells manifest, an array job script and `launch.sh` for one array job per phase.

    * `out_dir/manifest.tsv`: a header line, then one unit per line (one array task: a
      cell, or with `--group lr|pair` several cells run by one process), tab-separated:
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
      over a rows file written to `out_dir/arrays/`. It refuses to submit while jobs of this
      sweep are still queued or running (scancel them or wait), and submits nothing when
      every cell is done. `EE_ARRAY_CHUNK=N` lowers the chunk size;
      `EE_ARRAY_THROTTLE=N` adds Slurm's `%N` limit on simultaneously running tasks.
    """
    cells = _cells_or_all(plan, cells)
    text = _read_template(template, need_bash=True)
    out = _prepare_out_dir(plan, out_dir)
    rows = []
    units = plan.units(cells, group)
    for unit_cells in units:
        env = _unit_env(plan, unit_cells)
        outs = [plan.out_json(c) for c in unit_cells]
        values = [str(len(outs)), *outs, *(env[k] for k in SLURM_VARIABLES)]
        values += plan.run_args(unit_cells)
        for v in values:
            if "\t" in v or "\n" in v or "\r" in v:
                raise HarnessError(
                    f"cell {unit_cells[0].label} has a value with a tab or newline ({v!r}), "
                    "which the array manifest cannot hold; use --mode slurm for this sweep"
                )
        rows.append("\t".join(values))
    manifest = out / "manifest.tsv"
    array = out / "array.sh"
    head, rest = _split_template_header(text)
    python = python or sys.executable
    preamble = _ARRAY_PREAMBLE.replace("__VARIABLES__", " ".join(SLURM_VARIABLES))
    preamble = preamble.replace("__PYTHON__", _q(python))
    job_name = f"ee-{plan.phase}-{_short_hash(plan.results_dir)}-array"
    launch = [
        _header(plan, "submit one Slurm array job (chunked to MaxArraySize) over the manifest"),
        "set -euo pipefail",
        f"MANIFEST={_q(manifest)}",
        f"ARRAY_SCRIPT={_q(array)}",
        f"ARRAYS_DIR={_q(out / 'arrays')}",
        f"LOG={_q(_sbatch_path(out / 'logs') + '/%x-%A_%a.out')}",
        f"JOB_NAME={_q(job_name)}",
        f"REQUEUE=({'--requeue' if requeue else ''})",
        f"PYTHON=${{PYTHON:-{_q(python)}}}",
        f"PHASE={plan.phase}",
        _check_function(_CHECK_FAILED + "\n        exit 2"),
        "if command -v squeue >/dev/null 2>&1 &&",
        '    [ -n "$(squeue -h -u "$(id -un)" -n "$JOB_NAME" -o %i 2>/dev/null)" ]; then',
        '    echo "jobs of this sweep ($JOB_NAME) are still queued or running; wait for them'
        ' or run scancel --name=$JOB_NAME, then launch again" >&2',
        "    exit 3",
        "fi",
        "",
        "max=$(scontrol show config 2>/dev/null |"
        " sed -n 's/^MaxArraySize *= *\\([0-9][0-9]*\\).*/\\1/p' | head -n 1) || true",
        f"max=${{max:-{DEFAULT_MAX_ARRAY_SIZE}}}",
        "chunk=${EE_ARRAY_CHUNK:-$max}",
        '[ "$chunk" -gt "$max" ] && chunk=$max',
        "throttle=${EE_ARRAY_THROTTLE:+%$EE_ARRAY_THROTTLE}",
        "",
        "# Manifest rows (0-based, header excluded) with a cell not done yet.",
        "row_cells=(); ALL_OUTS=()",
        "while IFS=$'\\t' read -r -a f; do  # f: N, then N result files, then the rest",
        '    row_cells+=("${f[0]}"); ALL_OUTS+=("${f[@]:1:f[0]}")',
        'done < <(tail -n +2 "$MANIFEST")',
        'check ${ALL_OUTS[@]+"${ALL_OUTS[@]}"}',
        "pending=(); n=0; cells=0; todo=0; seen_outs=0",
        'for size in "${row_cells[@]}"; do',
        "    missing=0",
        "    for ((i = seen_outs; i < seen_outs + size; i++)); do",
        "        case ${STATES[i]:-} in ok | diverged) ;; *) missing=$((missing + 1)) ;; esac",
        "    done",
        '    [ "$missing" -gt 0 ] && pending+=("$n")',
        "    seen_outs=$((seen_outs + size)); n=$((n + 1)); cells=$((cells + size))",
        "    todo=$((todo + missing))",
        "done",
        'if [ "${#pending[@]}" -eq 0 ]; then',
        '    echo "submitted 0 array task(s): all $cells cells are done"',
        "    exit 0",
        "fi",
        'mkdir -p "$ARRAYS_DIR"',
        "stamp=$(date +%Y%m%d-%H%M%S)-$$",
        "k=0; total=0",
        "for ((start = 0; start < ${#pending[@]}; start += chunk)); do",
        '    part=("${pending[@]:start:chunk}")',
        '    rows="$ARRAYS_DIR/rows-$stamp-$k.txt"',
        '    printf \'%s\\n\' "${part[@]}" >"$rows"',
        '    sbatch --export=ALL --job-name="$JOB_NAME" --output="$LOG" \\',
        '        --array="0-$((${#part[@]} - 1))$throttle" ${REQUEUE[@]+"${REQUEUE[@]}"} \\',
        '        "$ARRAY_SCRIPT" "$MANIFEST" "$rows"',
        "    k=$((k + 1)); total=$((total + ${#part[@]}))",
        "done",
        'echo "submitted $total array task(s) ($todo cell(s) to run) in $k array job(s)'
        ' of at most $chunk; $((cells - todo)) cell(s) already done"',
        "",
    ]
    _make_dirs(plan, out)
    manifest.write_text(
        "\t".join(["N", "OUT_JSON_1..N", *SLURM_VARIABLES, "RUN_ARG..."])
        + "\n"
        + "".join(r + "\n" for r in rows),
        encoding="utf-8",
    )
    _write_script(array, head + preamble + rest)
    script = out / "launch.sh"
    _write_script(script, "\n".join(launch))
    n_done, corrupt = _states(plan, cells)
    files = [script, array, manifest]
    return Emitted("slurm-array", script, len(cells), n_done, len(units), files, corrupt, group)


def emit(
    plan: Plan, out_dir: str | os.PathLike, mode: str = "shell", *,
    cells: list[Cell] | None = None, template: str | os.PathLike | None = None,
    requeue: bool = False, python: str | None = None, group: str | None = None,
) -> Emitted:  # fmt: skip
    """Write the launch script of `mode` for `cells` (default: every cell of the plan).

    `group` says which cells share one process (`Plan.units`); default `DEFAULT_GROUP`:
    one per (model, task) in shell mode, one per cell in the Slurm modes.
    """
    if mode not in EMIT_MODES:
        raise HarnessError(f"--mode {mode!r} must be one of {', '.join(EMIT_MODES)}")
    group = group or DEFAULT_GROUP[mode]
    if group not in GROUPS:
        raise HarnessError(f"--group {group!r} must be one of {', '.join(GROUPS)}")
    if mode == "shell":
        if template is not None or requeue:
            raise HarnessError("--slurm-template and --requeue are for --mode slurm/slurm-array")
        return emit_shell(plan, out_dir, cells, python=python, group=group)
    if mode == "slurm":
        return emit_slurm(plan, out_dir, template, cells, requeue, group, python)
    return emit_slurm_array(plan, out_dir, template, cells, requeue, group, python)


# ----------------------------------------------------------------------------- CLI


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Flags that define which cells a phase has (shared by sweep and status)."""
    g = p.add_argument_group("what runs")
    g.add_argument("--experiment", metavar="FILE", help="an experiment file (TOML; see "
                   "examples/experiment.toml) that fills the flags not given")  # fmt: skip
    g.add_argument("--phase", choices=PHASES, help="select: LR grid x select seeds, dev only; "
                   "report: report seeds at each pair's selected LR")  # fmt: skip
    g.add_argument("--selection", help="selection.json from encoder_eval.select (report phase)")
    g.add_argument("--models", help="comma-separated model names (default: every registry "
                   "model, or only the --model additions when any are given)")  # fmt: skip
    g.add_argument("--model", action="append", default=[], metavar="NAME=PATH[:MODE]",
                   help=f"add a model for this sweep (repeatable); MODE: {' | '.join(MODES)}, "
                   "default auto")  # fmt: skip
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let the --model additions run model-authored code")  # fmt: skip
    g.add_argument("--tasks", help="comma-separated tasks (default: the multilingual five: "
                   f"{','.join(MULTILINGUAL_TASKS)}); all: {','.join(TASK_KNOBS)}")  # fmt: skip
    g = p.add_argument_group("shrinking for smoke runs (results are marked off-protocol)")
    g.add_argument("--lr-keys", help="a subset of the grid, e.g. lr03,lr06 (select phase)")
    g.add_argument("--seeds", help="seeds instead of the phase's (select 42-44, report 45-49)")
    g.add_argument("--max-steps", type=int, help="step cap (protocol: "
                   f"{PROTOCOL_RECIPE.max_steps})")  # fmt: skip
    g.add_argument("--max-seq-len", type=int, help="truncation length (protocol: "
                   f"{PROTOCOL_RECIPE.max_seq_len})")  # fmt: skip
    g = p.add_argument_group("protocol variant")
    g.add_argument("--selection-split", choices=SELECTION_SPLITS, help="what picks the LR "
                   "and the early-stopping checkpoint: dev (default, the specification's) or "
                   "holdout (strict: a fixed slice of train; see EVALUATION_METHODOLOGY.md); "
                   "a report phase follows its selection")  # fmt: skip
    g = p.add_argument_group("where")
    g.add_argument("--results-dir", help="result JSON directory (default: results/<phase>)")
    g.add_argument("--data-dir", help="offline data mirror passed to every cell")
    g.add_argument("--device", choices=("auto", "cuda", "cpu"),
                   help="passed to every cell (default: auto)")  # fmt: skip
    g.add_argument("--extra-run-args", default="", help="more encoder_eval.run flags for every "
                   "cell, as one shell-quoted string, e.g. '--micro-batch 8'")  # fmt: skip


def add_emit_arguments(p: argparse.ArgumentParser, out_flag: str = "--out-dir") -> None:
    g = p.add_argument_group("the launch script")
    g.add_argument("--mode", choices=EMIT_MODES, default="shell",
                   help="shell: run_all.sh; slurm: launch.sh with one sbatch per cell; "
                   "slurm-array: launch.sh submitting array jobs over a manifest")  # fmt: skip
    g.add_argument("--slurm-template", help="your sbatch script (contract: the emit_slurm "
                   "docstring in encoder_eval/sweep.py; example: examples/slurm_template.sh)")  # fmt: skip
    g.add_argument("--group", choices=GROUPS, help="cells run by one process: pair = every "
                   "cell of a (model, task), lr = the seeds of one (model, task, LR), cell = "
                   "one (default: pair for shell, cell for slurm/slurm-array, where long "
                   "jobs meet time limits)")  # fmt: skip
    g.add_argument("--requeue", action="store_true", help="pass --requeue to sbatch")
    g.add_argument("--python", help="interpreter run_all.sh runs cells with, and every "
                   "script checks which cells are done with (default: this one; $PYTHON "
                   "overrides at run time)")  # fmt: skip


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Build the Plan the parsed plan flags describe (unset ones filled by `experiment`)."""
    experiment.apply_to_args(args)
    if args.phase is None:
        raise HarnessError("give --phase select or --phase report")
    selection = None
    if args.selection is not None:
        from .select import load_selection

        selection = load_selection(args.selection)
    try:
        extra = shlex.split(args.extra_run_args or "")
    except ValueError as exc:
        raise HarnessError(f"--extra-run-args is not valid shell quoting ({exc})") from None
    return build_plan(
        args.phase,
        results_dir=args.results_dir or os.path.join("results", args.phase),
        models=split_csv(args.models) or None, extra_models=args.model,
        tasks=split_csv(args.tasks) or None, lr_keys=parse_lr_keys(args.lr_keys),
        seeds=parse_seeds(args.seeds), selection=selection, max_steps=args.max_steps,
        max_seq_len=args.max_seq_len, data_dir=args.data_dir, device=args.device,
        extra_run_args=extra, trust_remote_code=args.trust_remote_code,
        selection_split=args.selection_split,
    )  # fmt: skip


def format_grid() -> str:
    lines = ["key    learning rate"]
    lines += [f"{key}   {lr:g}" for key, lr in LR_GRID.items()]
    lines.append(f"select seeds: {','.join(map(str, PHASE_SEEDS['select']))}")
    lines.append(f"report seeds: {','.join(map(str, PHASE_SEEDS['report']))}")
    dummy = Plan(phase="select", cells=[], results_dir="")
    lines.append("recipe flags on every cell: " + shlex.join(dummy.recipe_args()))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m encoder_eval.sweep",
        description="Write the launch script (shell, Slurm, or Slurm array) for one phase of "
        "the protocol. Scripts skip cells that are done and move corrupt result files aside, "
        "so re-running fills gaps.",
    )
    add_plan_arguments(p)
    add_emit_arguments(p)
    p.add_argument("--out-dir", help="where the script and logs go (default: runs/<phase>)")
    p.add_argument("--show-grid", action="store_true",
                   help="print the LR grid, seed sets and recipe flags, then exit")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.show_grid:
        print(format_grid())
        return 0
    try:
        plan = plan_from_args(args)
        out_dir = args.out_dir or os.path.join("runs", plan.phase)
        emitted = emit(plan, out_dir, args.mode, template=args.slurm_template,
                       requeue=args.requeue, python=args.python, group=args.group)  # fmt: skip
        manifests = experiment.write_for_plan(plan, out_dir, args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    if plan.shrunk:
        print("note: shrunken sweep, its results are off-protocol: " + "; ".join(plan.shrunk))
    print(emitted.describe())
    print(f"wrote {' and '.join(map(str, manifests))}: what this sweep runs, for later commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
