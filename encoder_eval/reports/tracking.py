"""Checkpoint tracking, the library behind `encoder-eval track` and the training callback
(`reports.checkpoint_eval`): one receipt per checkpoint, then a noise-aware regression
report over the ordered sequence.

A receipt (`<out-dir>/receipts/<id>.receipt.json`, schema `encoder-eval-receipt`) is built
from ordinary harness cells in `<out-dir>/results`: probe cells (`encoder_eval.probe`, one
pooling, the folds as noise) or report-phase fine-tune cells at one fixed learning rate (given,
or read from a selection file) over N seeds. The cells run through the same plan as `sweep`,
so a receipt is idempotent: done cells are not run again, and an existing receipt of the same
checkpoint (same weights) and setup is kept.

`track_regression` compares each checkpoint with a reference, `best` (the best earlier
score: catches slow drift) or `prior` (the previous checkpoint: catches step drops),
direction-aware. A drop is flagged when it exceeds `threshold` relative to the reference
and, unless `noise_alpha` is 0, a one-sided Welch t bound: drop > t_{1-level}(Welch df) ·
SE, SE the standard error of the difference of the two means (seed or fold spread of both
checkpoints). The level spreads `noise_alpha` over the sequence so that, per task, the
chance of any false flag over a sequence of up to `horizon` checkpoints with no true change
is at most `noise_alpha`: level = noise_alpha / (H - 1), H = max(horizon, checkpoints), and
under `best` divided again by the number of earlier checkpoints the best is the maximum of
(a Bonferroni bound: a drop below the maximum is a drop below one of them). A reference
within `zero_floor` of zero is measured against `zero_floor` instead of its own magnitude:
an absolute threshold.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from encoder_eval.cells.capability import AXES
from encoder_eval.cells.capability import evaluate_checkpoint as score_suite
from encoder_eval.cells.predictions import load_predictions, predictions_path
from encoder_eval.cells.probe_cell import DEFAULT_MAX_SEQ_LEN, DEFAULT_POOLINGS
from encoder_eval.cells.probing import DEFAULT_K_FOLDS, DEFAULT_SEED, ProbeConfig
from encoder_eval.core import aggregate
from encoder_eval.core.comparability import receipt_setup
from encoder_eval.core.errors import (
    EXIT_OK,
    HarnessError,
    quote,
    report_errors,
    unknown_name,
)
from encoder_eval.core.fileio import (
    FileProblem,
    check_output_dir,
    read_json,
    write_json_atomic,
    write_output,
)
from encoder_eval.core.metrics import sign
from encoder_eval.core.protocol import LR_GRID, PHASE_SEEDS, lr_for_key
from encoder_eval.core.provenance import directory_content_hash
from encoder_eval.core.receipt import TaskResult
from encoder_eval.core.results import DONE_STATES, cell_state, read_result
from encoder_eval.core.schema import (
    CellResult,
    check_fields,
    is_int,
    is_list_of,
    is_name,
    is_number,
    is_str,
)
from encoder_eval.data.models import loader_settings
from encoder_eval.data.taskfile import register_task_files
from encoder_eval.data.tasks import resolve_task_names
from encoder_eval.plans.plan import (
    build_plan,
    build_probe_plan,
    resolve_tasks,
    run_precision,
    split_csv,
)
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports.plots import _new_figure, _save

RECEIPT_SCHEMA = "encoder-eval-receipt"
REPORT_SCHEMA = "encoder-eval-regression"
SCHEMA_VERSION = 1
EVAL_KINDS = ("probe", "finetune", "synthetic")
REFERENCES = ("best", "prior")
DEFAULT_THRESHOLD = 0.05  # the seed's relative threshold
DEFAULT_NOISE_ALPHA = 0.05  # per task: any false flag over the horizon, at most this
DEFAULT_HORIZON = 10  # checkpoints the noise level is spread over (more when there are more)
DEFAULT_ZERO_FLOOR = 0.1  # metric units: below it a reference's magnitude is replaced by this
RECEIPT_SUFFIX = ".receipt.json"
CHECKPOINT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
STEP_DIR = re.compile(r"checkpoint-(\d+)")


# ----------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of the sequence: its id (a file-name-safe label), where its weights
    live, its position, and metadata read from the listing (a folder's step)."""

    id: str
    path: str
    index: int
    metadata: dict = field(default_factory=dict)


def check_checkpoint_id(cid: str) -> str:
    if not CHECKPOINT_ID.fullmatch(cid):
        raise HarnessError(
            f"checkpoint id {cid!r} must be letters, digits, '.', '_' or '-' (it names files)"
        )
    return cid


def _check_dir(cid: str, path: str) -> str:
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full):
        raise HarnessError(
            f"checkpoint {cid}: {path!r} is not a directory; give the folder "
            "holding its config.json"
        )
    return full


def read_checkpoints(source: str | os.PathLike) -> list[Checkpoint]:
    """The ordered checkpoints of `source`: a file of `id<TAB>path` lines (in file order;
    `#` comments and blank lines skipped; relative paths are relative to the file), or a
    folder of `checkpoint-<step>` directories, ordered by step (id = directory name)."""
    src = Path(source)
    if src.is_dir():
        steps = sorted(
            (int(m.group(1)), p)
            for p in src.iterdir()
            if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))
        )
        if not steps:
            raise HarnessError(f"--checkpoints {source}: no checkpoint-<step> folders in it")
        return [
            Checkpoint(p.name, str(p.resolve()), i, {"step": step})
            for i, (step, p) in enumerate(steps)
        ]
    if not src.is_file():
        raise HarnessError(f"--checkpoints {source}: no such file or folder")
    out: list[Checkpoint] = []
    for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise HarnessError(f"{source}:{n}: expected 'id<TAB>path', got {line!r}")
        cid, path = check_checkpoint_id(parts[0].strip()), parts[1].strip()
        if not os.path.isabs(os.path.expanduser(path)):
            path = str(src.parent / path)
        out.append(Checkpoint(cid, _check_dir(cid, path), len(out)))
    if not out:
        raise HarnessError(f"--checkpoints {source}: no checkpoints listed")
    dupes = sorted({c.id for c in out if [d.id for d in out].count(c.id) > 1})
    if dupes:
        raise HarnessError(f"--checkpoints {source}: ids listed twice: {', '.join(dupes)}")
    return out


# ----------------------------------------------------------------------------- setup


@dataclass(frozen=True)
class TrackSetup:
    """How every checkpoint of a sequence is evaluated; receipts of different setups are not
    compared. probe: one pooling, `k_folds` folds seeded by `seed`. finetune: report-phase
    cells at `lr_key` over `seeds` (`lr_source` says where the LR came from)."""

    kind: str
    tasks: tuple[str, ...]
    max_seq_len: int | None = None
    pooling: str | None = None
    k_folds: int | None = None
    seed: int | None = None
    precision: str | None = None
    lr_key: str | None = None
    lr: float | None = None
    lr_source: str | None = None
    seeds: tuple[int, ...] = ()
    max_steps: int | None = None
    n_examples: int | None = None  # synthetic: examples per axis

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tasks"], d["seeds"] = list(self.tasks), list(self.seeds)
        return d

    def comparable(self) -> dict:
        """The entries that must agree between receipts (`comparability.receipt_setup`:
        where the LR came from need not)."""
        return receipt_setup(self.to_dict())


def _lr_from_selection(path: str, model: str | None, tasks: list[str]) -> dict[str, tuple]:
    pairs = load_selection(path).get("pairs", {})
    if model is None:
        if len(pairs) != 1:
            raise HarnessError(
                f"--selection {path} holds {len(pairs)} models; name the one "
                f"whose LRs to use with --selection-model ({', '.join(pairs)})"
            )
        model = next(iter(pairs))
    if model not in pairs:
        raise unknown_name("selection model", model, pairs)
    out = {}
    for task in tasks:
        entry = pairs[model].get(task) or {}
        if not entry.get("lr_key"):
            raise HarnessError(f"--selection {path} has no selected LR for {model}/{task}")
        out[task] = (entry["lr_key"], float(entry["lr"]))
    keys = {k for k, _ in out.values()}
    if len(keys) > 1:
        raise HarnessError(
            f"--selection {path}: {model}'s tasks use several LRs ({', '.join(sorted(keys))}); "
            "tracking runs one fixed LR, give it with --lr-key"
        )
    return out


def build_setup(
    kind: str,
    tasks: list[str],
    *,
    max_seq_len: int | None = None,
    pooling: str | None = None,
    k_folds: int | None = None,
    seed: int | None = None,
    precision: str | None = None,
    lr_key: str | None = None,
    selection: str | None = None,
    selection_model: str | None = None,
    seeds: list[int] | None = None,
    max_steps: int | None = None,
    n_examples: int | None = None,
) -> TrackSetup:
    """Check and complete the evaluation setup, filling the defaults of its kind."""
    if kind not in EVAL_KINDS:
        raise unknown_name("evaluation kind", kind, EVAL_KINDS)
    if kind == "synthetic":
        given = [
            v is not None
            for v in (max_seq_len, pooling, k_folds, precision, lr_key, selection, seeds, max_steps)
        ]
        if tasks or any(given):
            raise HarnessError(
                "--kind synthetic scores the capability suite's four axes "
                "(perplexity, modular arithmetic, parity, induction): it takes "
                "only --seed and --n-examples"
            )
        n = 256 if n_examples is None else n_examples
        if n < 2:
            raise HarnessError(f"--n-examples {n} must be at least 2")
        return TrackSetup("synthetic", AXES, seed=0 if seed is None else seed, n_examples=n)
    if n_examples is not None:
        raise HarnessError("--n-examples is for --kind synthetic")
    if not tasks:
        raise HarnessError(f"--kind {kind} needs --tasks (task keys and groups)")
    task_list = tuple(resolve_tasks(tasks))
    if kind == "probe":
        from encoder_eval.cells.embed import (  # imports torch: on use only
            EmbedSetup,
            check_poolings,
        )

        if any(v is not None for v in (lr_key, selection, seeds, max_steps)):
            raise HarnessError(
                "--lr-key, --selection, --seeds and --max-steps are for --kind "
                "finetune; a probe receipt takes --pooling, --k-folds, --seed"
            )
        pools = check_poolings(split_csv(pooling) if pooling else list(DEFAULT_POOLINGS))
        if len(pools) != 1:
            raise HarnessError("--pooling: a track runs one pooling")
        return TrackSetup(
            "probe",
            task_list,
            max_seq_len or DEFAULT_MAX_SEQ_LEN,
            pools[0],
            k_folds or DEFAULT_K_FOLDS,
            DEFAULT_SEED if seed is None else seed,
            EmbedSetup(precision=precision or "bf16").precision,
        )

    if any(v is not None for v in (pooling, k_folds, seed)):
        raise HarnessError("--pooling, --k-folds and --seed are for --kind probe")
    # recorded only when it is not the protocol's bf16: earlier receipts stay comparable
    precision = "fp32" if run_precision(precision) == "fp32" else None
    if (lr_key is None) == (selection is None):
        raise HarnessError(
            "--kind finetune needs its fixed LR: --lr-key KEY (one of "
            f"{', '.join(LR_GRID)}) or --selection selection.json"
        )
    if lr_key is not None:
        lr, source = lr_for_key(lr_key), "given (--lr-key)"
    else:
        chosen = _lr_from_selection(selection, selection_model, list(task_list))
        lr_key, lr = next(iter(chosen.values()))
        source = f"selection {os.path.abspath(selection)}" + (
            f" (model {selection_model})" if selection_model else ""
        )
    return TrackSetup(
        "finetune",
        task_list,
        max_seq_len,
        lr_key=lr_key,
        lr=lr,
        lr_source=source,
        seeds=tuple(seeds or PHASE_SEEDS["report"]),
        max_steps=max_steps,
        precision=precision,
    )


# ----------------------------------------------------------------------------- receipts


@dataclass
class Receipt:
    """Every task's score for one checkpoint (the seed's per-rung receipt)."""

    checkpoint_id: str
    checkpoint_index: int
    tasks: list[TaskResult]
    seeds: list[int]
    metadata: dict
    setup: dict
    checkpoint_path: str
    model_revision: str
    created_at: str = ""

    def scores(self) -> dict[str, float]:
        return {t.name: t.score for t in self.tasks}

    def task(self, name: str) -> TaskResult | None:
        return next((t for t in self.tasks if t.name == name), None)

    def to_dict(self) -> dict:
        return {"schema": RECEIPT_SCHEMA, "schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, obj: Any) -> Receipt:
        """The receipt of a JSON object; ValueError naming the first problem when invalid."""
        if not isinstance(obj, dict) or obj.get("schema") != RECEIPT_SCHEMA:
            raise ValueError(f"not an {RECEIPT_SCHEMA} file")
        if obj.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {quote(obj.get('schema_version'))}, expected 1")
        body = {k: v for k, v in obj.items() if k not in ("schema", "schema_version")}
        check_fields(body, _RECEIPT_TYPES, "")
        for i, t in enumerate(body["tasks"]):
            if not isinstance(t, dict):
                raise ValueError(f"tasks[{i}] is not an object")
            check_fields(t, _TASK_TYPES, f"tasks[{i}].")
            if not is_number(t["score"]):
                raise ValueError(
                    f"task {quote(t['name'])}: score {quote(t['score'])} is not a finite number"
                )
            details = t["details"]
            std, n = details.get("std"), details.get("n")
            if not (std is None or is_number(std)) or not (n is None or is_int(n)):
                raise ValueError(
                    f"task {quote(t['name'])}: details.std or details.n is not a number"
                )
            if not isinstance(details.get("metric", ""), str):
                raise ValueError(f"task {quote(t['name'])}: details.metric is not a string")
        _check_setup(body["setup"])
        body["tasks"] = [TaskResult(**t) for t in body["tasks"]]
        return cls(**body)


# field -> (check, what it must be): a receipt's fields and one task's, as written.
_RECEIPT_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "checkpoint_id": (lambda x: is_str(x) and bool(CHECKPOINT_ID.fullmatch(x)), "an id"),
    "checkpoint_index": (is_int, "an integer"),
    "tasks": (lambda x: isinstance(x, list), "a list"),
    "seeds": (is_list_of(is_int), "a list of integers"),
    "metadata": (lambda x: isinstance(x, dict), "an object"),
    "setup": (lambda x: isinstance(x, dict), "an object"),
    "checkpoint_path": (is_str, "a string"),
    "model_revision": (is_str, "a string"),
    "created_at": (is_str, "a string"),
}
_TASK_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (is_name, "a name"),
    "score": (lambda x: True, "a number"),
    "higher_is_better": (lambda x: isinstance(x, bool), "true or false"),
    "n_examples": (lambda x: x is None or is_int(x), "an integer or null"),
    "details": (lambda x: isinstance(x, dict), "an object"),
}
# TrackSetup's fields as a receipt records them (None: not used by this kind).
# How a receipt's setup field is checked, by TrackSetup's annotation of it (one place says
# what a setup holds: the dataclass).
_TYPE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (is_int, "an integer"),
    "float": (is_number, "a number"),
    "str": (is_str, "a string"),
    "tuple[str, ...]": (is_list_of(is_name), "a list of names"),
    "tuple[int, ...]": (is_list_of(is_int), "a list of integers"),
}


def _setup_check(f) -> tuple[Callable[[Any], bool], str]:
    if f.name == "kind":
        return (lambda x: x in EVAL_KINDS, " or ".join(EVAL_KINDS))
    base, _, null = str(f.type).partition(" | ")
    check, what = _TYPE_CHECKS[base]
    if null:
        return (lambda x, c=check: x is None or c(x), f"{what} or null")
    return check, what


_SETUP_TYPES = {f.name: _setup_check(f) for f in fields(TrackSetup)}


def _check_setup(setup: dict) -> None:
    """A receipt's setup has TrackSetup's fields (those absent take their defaults)."""
    check_fields(setup, _SETUP_TYPES, "setup.", optional=True)
    if "kind" not in setup or "tasks" not in setup:
        raise ValueError("setup names no kind or tasks")


def receipt_path(out_dir: str | os.PathLike, checkpoint_id: str) -> Path:
    return Path(out_dir) / "receipts" / f"{checkpoint_id}{RECEIPT_SUFFIX}"


def read_receipt(path: str | os.PathLike) -> Receipt:
    """The receipt in `path`; HarnessError naming the file when it is not a valid one."""
    try:
        return Receipt.from_dict(read_json(path))
    except FileProblem as exc:
        raise HarnessError(f"{path}: not a valid {RECEIPT_SCHEMA} ({exc.reason})") from None
    except ValueError as exc:
        raise HarnessError(f"{path}: not a valid {RECEIPT_SCHEMA} ({exc})") from None


def load_receipts(out_dir: str | os.PathLike, warn: Callable[[str], None] | None = None):
    """Every readable receipt of `out_dir`, in checkpoint order; an unreadable one is skipped
    with a warning (never a crash), two receipts at one index are refused."""
    warn = warn or (lambda m: print(m, file=sys.stderr))
    receipts = []
    for path in sorted((Path(out_dir) / "receipts").glob(f"*{RECEIPT_SUFFIX}")):
        try:
            receipts.append(read_receipt(path))
        except HarnessError as exc:
            warn(f"warning: skipping {exc}")
    receipts.sort(key=lambda r: r.checkpoint_index)
    seen: dict[int, str] = {}
    for r in receipts:
        if r.checkpoint_index in seen:
            raise HarnessError(
                f"checkpoints {seen[r.checkpoint_index]} and {r.checkpoint_id} "
                f"both have index {r.checkpoint_index}; re-issue one receipt "
                "with another --index"
            )
        seen[r.checkpoint_index] = r.checkpoint_id
    return receipts


def results_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "results"


def build_track_plan(
    setup: TrackSetup,
    checkpoints: Sequence[Checkpoint],
    out_dir: str | os.PathLike,
    *,
    data_dir: str | None = None,
    device: str | None = None,
    no_cache: bool = False,
):
    """The sweep `Plan` of the cells behind the receipts of `checkpoints` (each checkpoint is
    a `--model ID=PATH` addition): the probe phase, or the report phase under a selection
    that gives every (checkpoint, task) the fixed LR."""
    specs = [f"{c.id}={c.path}" for c in checkpoints]
    names = [c.id for c in checkpoints]
    common = dict(
        results_dir=results_dir(out_dir),
        models=names,
        extra_models=specs,
        tasks=list(setup.tasks),
        max_seq_len=setup.max_seq_len,
        data_dir=data_dir,
        device=device,
    )
    if no_cache and setup.kind != "probe":
        raise HarnessError("--no-cache is for --kind probe (fine-tune cells cache no embeddings)")
    if setup.kind == "probe":
        common["extra_run_args"] = ["--no-cache"] if no_cache else []
        return build_probe_plan(
            poolings=[setup.pooling],
            k_folds=setup.k_folds,
            seed=setup.seed,
            precision=setup.precision,
            **common,
        )
    selection = {
        "pairs": {
            c.id: {t: {"lr_key": setup.lr_key, "lr": setup.lr} for t in setup.tasks}
            for c in checkpoints
        }
    }
    extra = ["--precision", "fp32"] if setup.precision == "fp32" else []
    return build_plan(
        "report",
        selection=selection,
        seeds=list(setup.seeds),
        max_steps=setup.max_steps,
        extra_run_args=extra,
        **common,
    )


def _run_missing(
    plan, setup: TrackSetup, log: Callable[[str], None], no_cache: bool = False
) -> None:
    """Run every unit of `plan` that has a cell not done, in this process, through the typed
    cell API (`_run_unit`)."""
    for unit in plan.units():
        if all(plan.cell_state(c) in DONE_STATES for c in unit):
            continue
        log(f"track: running {len(unit)} cell(s) of {unit[0].model}/{unit[0].task}")
        rc = int(report_errors(_run_unit)(plan, unit, setup, no_cache) or 0)
        if rc != EXIT_OK:
            raise HarnessError(
                f"cells of {unit[0].model}/{unit[0].task} failed (exit {rc}); see the log "
                "above, fix, and run the receipt again (done cells are kept)"
            )


def _run_unit(plan, unit: list, setup: TrackSetup, no_cache: bool) -> int:
    """Run one unit of a track plan as its launch script's command would, from typed
    configurations, and return that command's exit code. Imports torch."""
    from encoder_eval.cells import probe_cell, runner

    if plan.probe is not None:
        return probe_cell.run_probe(unit_probe_run(plan, unit, no_cache))
    return runner.run_configs(unit_cell_configs(plan, unit, setup), skip_existing=True)


def unit_probe_run(plan, unit: list, no_cache: bool = False):
    """The checked `probe_cell.ProbeRun` of one unit of a track probe plan: what
    `plan.run_args(unit)` says to the `probe` command, as a value."""
    from encoder_eval.cells import probe_cell
    from encoder_eval.cells.embed import check_poolings  # imports torch: on use only

    register_task_files(plan.tasks_files)
    check_output_dir(plan.results_dir, "--results-dir")
    first = unit[0]
    model = probe_cell.ProbeModel(
        first.model, first.model_path, first.trust_remote_code, first.revision, first.code_revision
    )
    return probe_cell.ProbeRun(
        models=[model],
        tasks=resolve_task_names([first.task]),
        poolings=check_poolings(c.pooling for c in unit),
        results_dir=Path(plan.results_dir),
        data_dir=plan.data_dir,
        config=ProbeConfig(k_folds=plan.probe.k_folds, seed=plan.probe.seed),
        max_seq_len=plan.max_seq_len,
        precision=plan.probe.precision,
        device=plan.device,
        cache=not no_cache,
    )


def unit_cell_configs(plan, unit: list, setup: TrackSetup) -> list:
    """The checked `train.CellConfig`s of one unit of a track fine-tune plan
    (`runner.unit_configs`): what `plan.run_args(unit)` says to the `run` command, as values
    (the precision is the setup's)."""
    from encoder_eval.cells import runner
    from encoder_eval.cells.train import CellConfig  # imports torch: on use only

    register_task_files(plan.tasks_files)
    check_output_dir(plan.results_dir, "--results-dir")
    first = unit[0]
    lrs = list(dict.fromkeys(c.lr for c in unit))
    seeds = list(dict.fromkeys(c.seed for c in unit))
    off = any(s not in PHASE_SEEDS[plan.phase] for s in seeds)
    runner.check_cell_values(lrs, seeds, plan.phase, allow_off_protocol=off)
    recipe = dataclasses.replace(
        plan.recipe(),
        mode=first.mode,
        **loader_settings(first.mode),
        **({"precision": "fp32"} if setup.precision == "fp32" else {}),
    )
    base = CellConfig(
        model_path=first.model_path,
        task=first.task,
        lr=lrs[0],
        seed=seeds[0],
        model_key=first.model,
        phase=plan.phase,
        recipe=recipe,
        data_dir=plan.data_dir,
        device=plan.device,
        model_revision=first.revision,
        model_code_revision=first.code_revision,
        trust_remote_code=first.trust_remote_code,
        progress="json",
    )
    return runner.unit_configs(base, lrs, seeds, plan.results_dir)


def _mean_by_language(rows: list[dict]) -> dict[str, float]:
    langs = sorted({lang for r in rows for lang in r})
    return {
        lang: math.fsum(r[lang] for r in rows if r.get(lang) is not None)
        / max(1, sum(r.get(lang) is not None for r in rows))
        for lang in langs
    }


def _probe_task_result(plan, cell, revision: str) -> TaskResult:
    path = Path(plan.out_json(cell))
    r = read_result(path)[0]
    if r is None:
        raise HarnessError(f"{path}: missing or unreadable after its run")
    found = (r["provenance"].get("model") or {}).get("revision")
    _check_revision(path, found, revision, cell.model)
    if r.get("mean_score") is None:
        raise HarnessError(
            f"{path}: the probe score is undefined ({r.get('undefined')}); a "
            "receipt needs a score on every task"
        )
    folds = [v for v in r.get("q_t") or [] if v is not None]
    return TaskResult(
        cell.task,
        float(r["mean_score"]),
        sign(r["metric"]) > 0,
        sum((r.get("n") or {}).get("report", {}).values()) or None,
        {
            "metric": r["metric"],
            "std": r.get("std_dev"),
            "n": len(folds),
            "noise_from": "probe folds",
            "folds": folds,
            "q_stat": r.get("q_stat"),
            "per_language": _mean_by_language([f.get("languages") or {} for f in r["folds"]]),
            "model_revision": found,
            "result": str(path),
        },
    )


def _finetune_task_result(plan, cells, revision: str) -> TaskResult:
    scores, per_lang, diverged, undefined, n_examples, off = {}, [], [], [], None, False
    metric = None
    for cell in cells:
        path = Path(plan.out_json(cell))
        state, data, reason = cell_state(path, "report", model=cell.model, task=cell.task)
        if data is None:
            raise HarnessError(f"{path}: {reason or state} after its run")
        _check_revision(path, data["provenance"].get("model_revision"), revision, cell.model)
        metric = data["metric"]
        off = off or not data["protocol"]["on_protocol"]
        outcome, score = aggregate.seed_outcome(CellResult.from_dict(data), "report")
        if outcome == aggregate.FINISHED:
            scores[cell.seed] = score
            per_lang.append(data["report"]["per_language"])
        elif outcome == aggregate.UNDEFINED:
            undefined.append(cell.seed)
        else:
            diverged.append(cell.seed)
        if n_examples is None and predictions_path(path).exists():
            try:
                preds = load_predictions(predictions_path(path))
                n_examples = sum(len(p) for p in preds.languages.values())
            except HarnessError:
                pass
    task = cells[0].task
    if not scores:
        raise HarnessError(
            f"{cells[0].model}/{task}: no seed finished with a defined score "
            f"(diverged {diverged}, undefined {undefined})"
        )
    return TaskResult(
        task,
        aggregate.seed_mean(scores.values()),
        sign(metric) > 0,
        n_examples,
        {
            "metric": metric,
            "std": aggregate.seed_std(scores.values()),
            "n": len(scores),
            "noise_from": "report seeds",
            "seeds": sorted(scores),
            "per_seed": {str(s): v for s, v in sorted(scores.items())},
            "diverged_seeds": diverged,
            "undefined_seeds": undefined,
            "per_language": _mean_by_language(per_lang),
            "lr_key": plan.cells[0].lr_key,
            "model_revision": revision,
            "off_protocol": off,
        },
    )


def _check_revision(path: Path, found: str | None, expected: str, cid: str) -> None:
    if found != expected:
        raise HarnessError(
            f"{path} was made from other weights than checkpoint {cid} holds now "
            f"({found} vs {expected}); give the new weights a new id, or another --out-dir"
        )


def evaluate_checkpoint(
    setup: TrackSetup,
    checkpoint: Checkpoint,
    out_dir: str | os.PathLike,
    *,
    metadata: dict | None = None,
    data_dir: str | None = None,
    device: str | None = None,
    no_cache: bool = False,
    log: Callable[[str], None] = print,
) -> Receipt:
    """The receipt of one checkpoint: run its cells that are not done, then write
    `receipts/<id>.receipt.json` atomically. An existing receipt of the same weights and
    setup is returned as it is; one of other weights or another setup is refused."""
    check_checkpoint_id(checkpoint.id)
    revision = directory_content_hash(checkpoint.path)
    meta = {**checkpoint.metadata, **(metadata or {})}
    path = receipt_path(out_dir, checkpoint.id)
    if path.exists():
        old = read_receipt(path)
        if old.model_revision != revision:
            raise HarnessError(
                f"{path} is the receipt of other weights ({old.model_revision}); "
                f"{checkpoint.id} now holds {revision}: give it a new id"
            )
        if TrackSetup(**_setup_args(old.setup)).comparable() != setup.comparable():
            raise HarnessError(
                f"{path} was made with another setup ({old.setup}); use "
                "another --out-dir for another setup"
            )
        if old.checkpoint_index == checkpoint.index and (not metadata or old.metadata == meta):
            log(f"track: {checkpoint.id}: receipt exists, kept ({path})")
            return old
    if setup.kind == "synthetic":
        tasks = _synthetic_task_results(setup, checkpoint, device, log)
    else:
        tasks = _cell_task_results(
            setup, checkpoint, out_dir, revision, data_dir, device, no_cache, log
        )
    receipt = Receipt(
        checkpoint.id,
        checkpoint.index,
        tasks,
        list(setup.seeds) if setup.kind == "finetune" else [setup.seed],
        meta,
        setup.to_dict(),
        checkpoint.path,
        revision,
        datetime.now(UTC).isoformat(timespec="seconds"),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, receipt.to_dict())
    log(f"track: {checkpoint.id}: wrote {path}")
    return receipt


def _cell_task_results(
    setup: TrackSetup,
    checkpoint: Checkpoint,
    out_dir,
    revision: str,
    data_dir,
    device,
    no_cache: bool,
    log,
) -> list[TaskResult]:
    """Probe or fine-tune: run the checkpoint's cells that are not done, then read them."""
    plan = build_track_plan(
        setup, [checkpoint], out_dir, data_dir=data_dir, device=device, no_cache=no_cache
    )
    _run_missing(plan, setup, log, no_cache)
    tasks = []
    for task in setup.tasks:
        cells = [c for c in plan.cells if c.task == task]
        if setup.kind == "probe":
            tasks.append(_probe_task_result(plan, cells[0], revision))
        else:
            tasks.append(_finetune_task_result(plan, cells, revision))
    return tasks


def _synthetic_task_results(
    setup: TrackSetup, checkpoint: Checkpoint, device: str | None, log
) -> list[TaskResult]:
    """The capability suite on the checkpoint loaded as a causal LM (fp32, local files only),
    scored over its tokenizer's vocabulary when it has one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from encoder_eval.cells.train import resolve_device  # imports torch: on use only

    log(
        f"track: {checkpoint.id}: synthetic capability suite ({setup.n_examples} examples per axis)"
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint.path, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise HarnessError(
            f"{checkpoint.id}: {checkpoint.path} does not load as a causal "
            f"language model ({str(exc).splitlines()[0][:200]}); --kind "
            "synthetic is for decoder checkpoints"
        ) from None
    vocab = None  # the tokenizer's size, when the checkpoint has one (the embedding may be padded)
    if any(Path(checkpoint.path, f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        try:
            tokenizer = AutoTokenizer.from_pretrained(checkpoint.path, local_files_only=True)
            vocab = min(len(tokenizer), model.config.vocab_size)
        except (OSError, ValueError):
            vocab = None
    model.to(resolve_device(device or "auto"))
    report = score_suite(
        model,
        checkpoint_id=checkpoint.id,
        seed=setup.seed,
        n_examples=setup.n_examples,
        vocab=vocab,
    )
    return report.tasks


def _setup_args(d: dict) -> dict:
    args = dict(d)
    args["tasks"], args["seeds"] = tuple(args.get("tasks", ())), tuple(args.get("seeds", ()))
    return args


# ----------------------------------------------------------------------------- regression


@dataclass(frozen=True)
class Check:
    """One (task, checkpoint) compared with its reference. `status`: flagged, within_noise
    (past the threshold but not the noise), within_threshold, or not_worse. `relative_delta`
    is (current - reference) / max(|reference|, zero_floor), signed; `rule` says whether the
    reference's magnitude (relative) or the floor (absolute) divided."""

    task: str
    checkpoint_id: str
    checkpoint_index: int
    current_score: float
    reference_score: float
    reference_checkpoint_id: str
    reference_index: int
    relative_delta: float
    threshold: float
    higher_is_better: bool
    rule: str
    drop: float  # how much worse, in metric units (negative: better)
    noise: float | None  # standard error of the difference of the two means
    level: float | None  # the one-sided level of this check's noise bound (None: rule off)
    df: float | None  # Welch-Satterthwaite degrees of freedom of `noise`
    critical: float | None  # t quantile at 1 - level on df: a flag needs drop > critical x noise
    status: str

    @property
    def flagged(self) -> bool:
        return self.status == "flagged"


# A flag is a Check whose status is "flagged"; the seed's name is kept for readers of its API.
RegressionFlag = Check


@dataclass
class RegressionReport:
    """The regression receipt of a sequence: every check, and the flagged ones."""

    checks: list[Check]
    n_checkpoints: int
    threshold: float
    reference: str
    noise_alpha: float
    horizon: int
    zero_floor: float
    checkpoints: list[str] = field(default_factory=list)
    setup: dict = field(default_factory=dict)

    @property
    def flags(self) -> list[Check]:
        return [c for c in self.checks if c.flagged]

    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "n_checkpoints": self.n_checkpoints,
            "checkpoints": self.checkpoints,
            "threshold": self.threshold,
            "reference": self.reference,
            "noise_alpha": self.noise_alpha,
            "horizon": self.horizon,
            "zero_floor": self.zero_floor,
            "setup": self.setup,
            "flags": [asdict(c) for c in self.flags],
            "checks": [asdict(c) for c in self.checks],
        }


def _noise(a: TaskResult, b: TaskResult) -> tuple[float, float] | None:
    """(standard error of the difference of the two means, its Welch-Satterthwaite df), or
    None when a side has no spread measured (one seed)."""
    parts = []
    for t in (a, b):
        std, n = t.details.get("std"), t.details.get("n") or 0
        if std is None or n < 2:
            return None
        parts.append((std * std / n, n - 1))
    var = sum(u for u, _ in parts)
    denom = sum(u * u / df for u, df in parts)
    return math.sqrt(var), (math.inf if denom == 0 else var * var / denom)


def _critical(level: float, df: float) -> float:
    """The one-sided t quantile at 1 - level on df degrees of freedom (normal for infinite)."""
    from scipy import stats as sps

    return float(sps.norm.isf(level) if math.isinf(df) else sps.t.isf(level, df))


def track_regression(
    receipts: Sequence[Receipt],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    reference: str = "best",
    noise_alpha: float = DEFAULT_NOISE_ALPHA,
    horizon: int = DEFAULT_HORIZON,
    zero_floor: float = DEFAULT_ZERO_FLOOR,
) -> RegressionReport:
    """Compare every checkpoint after the first with its reference on each task (see the
    module docstring for the rule). With no noise measured (one seed), only the threshold
    decides, the check's `noise` is None, and the false-flag bound does not hold."""
    if reference not in REFERENCES:
        raise unknown_name("reference", reference, REFERENCES)
    if threshold < 0 or zero_floor < 0 or not 0 <= noise_alpha < 1:
        raise HarnessError("--threshold and --zero-floor must be >= 0, --noise-alpha in [0, 1)")
    if horizon < 2:
        raise HarnessError(f"--horizon {horizon}: a sequence to check has 2 checkpoints or more")
    checks: list[Check] = []
    tasks = list(dict.fromkeys(t.name for r in receipts for t in r.tasks))
    for task in tasks:
        present = sum(r.task(task) is not None for r in receipts)
        per_check = noise_alpha / (max(horizon, present) - 1)
        seen: list[tuple[Receipt, TaskResult]] = []
        for r in receipts:
            cur = r.task(task)
            if cur is None:
                continue
            if seen:
                direction = cur.sign
                if reference == "prior":
                    ref_r, ref = seen[-1]
                else:
                    ref_r, ref = seen[0]
                    for cand_r, cand in seen[1:]:
                        if direction * cand.score > direction * ref.score:
                            ref_r, ref = cand_r, cand
                drop = direction * (ref.score - cur.score)
                absolute = abs(ref.score) < zero_floor
                denom = zero_floor if absolute else abs(ref.score)
                measured = _noise(cur, ref)
                noise, df = (None, None) if measured is None else measured
                level = critical = None
                if noise_alpha > 0 and noise is not None:
                    level = per_check / (len(seen) if reference == "best" else 1)
                    critical = _critical(level, df)
                if denom == 0 or drop / denom <= threshold:
                    status = "not_worse" if drop <= 0 else "within_threshold"
                elif critical is not None and drop <= critical * noise:
                    status = "within_noise"
                else:
                    status = "flagged"
                checks.append(
                    Check(
                        task,
                        r.checkpoint_id,
                        r.checkpoint_index,
                        cur.score,
                        ref.score,
                        ref_r.checkpoint_id,
                        ref_r.checkpoint_index,
                        (cur.score - ref.score) / denom if denom else 0.0,
                        threshold,
                        direction > 0,
                        "absolute" if absolute else "relative",
                        drop,
                        noise,
                        level,
                        df,
                        critical,
                        status,
                    )
                )
            seen.append((r, cur))
    return RegressionReport(
        checks,
        len(receipts),
        threshold,
        reference,
        noise_alpha,
        horizon,
        zero_floor,
        [r.checkpoint_id for r in receipts],
        receipts[0].setup if receipts else {},
    )


def check_comparable(receipts: Sequence[Receipt]) -> None:
    """Refuse receipts made under different setups: their scores do not compare."""
    groups: dict[str, list[str]] = {}
    for r in receipts:
        key = json.dumps(TrackSetup(**_setup_args(r.setup)).comparable(), sort_keys=True)
        groups.setdefault(key, []).append(r.checkpoint_id)
    if len(groups) > 1:
        parts = [f"{', '.join(ids)}: {key}" for key, ids in groups.items()]
        raise HarnessError(
            "the receipts were made under different setups; track each setup "
            "in its own --out-dir: " + " | ".join(parts)
        )


# ----------------------------------------------------------------------------- outputs


def _pts(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def format_markdown(report: RegressionReport, receipts: Sequence[Receipt]) -> str:
    """The report as markdown: the rule, then per task every checkpoint with its score,
    reference, relative change, noise and verdict. Scores are in points (x100)."""
    s = report.setup
    how = (
        f"probe ({s.get('pooling')} pooling, {s.get('k_folds')} folds, seed {s.get('seed')})"
        if s.get("kind") == "probe"
        else f"fine-tune at {s.get('lr_key')} ({s.get('lr_source')}), seeds "
        f"{','.join(map(str, s.get('seeds') or []))}"
    )
    a = report.noise_alpha
    noise_rule = (
        f" and a one-sided Welch t bound on the seed/fold spread: drop > t_(1-level) x SE, the "
        f"level spreading {a:g} over the sequence so that per task the chance of any false "
        f"flag over up to {report.horizon} checkpoints (or all of them, when there are more) "
        "with no true change is at most "
        f"{a:g}"
        + (
            ", the best earlier score counted as the maximum it is."
            if report.reference == "best"
            else "."
        )
        if a
        else " (noise rule off: --noise-alpha 0)."
    )
    lines = [
        f"# Regression report: {report.n_checkpoints} checkpoints, {len(report.flags)} flag(s)",
        "",
        f"Evaluation: {how}. Reference: **{report.reference}**"
        f" ({'best earlier score' if report.reference == 'best' else 'previous checkpoint'}). "
        f"A drop is flagged when it exceeds {100 * report.threshold:g} % of the reference "
        f"(of {report.zero_floor:g} when the reference is closer to zero: absolute)"
        + noise_rule
        + " A check without a measured spread (one seed) has the threshold alone.",
        "",
    ]
    by_key = {(c.task, c.checkpoint_id): c for c in report.checks}
    tasks = list(dict.fromkeys(t.name for r in receipts for t in r.tasks))
    for task in tasks:
        lines += [
            f"## {task}",
            "",
            "| # | checkpoint | score ± std (n) | reference | Δ rel | "
            "drop / noise (needed) | verdict |",
            "|---:|---|---:|---|---:|---:|---|",
        ]
        for r in receipts:
            t = r.task(task)
            if t is None:
                continue
            c = by_key.get((task, r.checkpoint_id))
            std, n = t.details.get("std"), t.details.get("n")
            score = f"{_pts(t.score)} ± {_pts(std)} ({n})"
            if c is None:
                lines.append(
                    f"| {r.checkpoint_index} | {r.checkpoint_id} | {score} | — | — | — | first |"
                )
                continue
            ratio = "—" if not c.noise else f"{c.drop / c.noise:.2f}"
            if c.critical is not None and c.noise:
                ratio += f" ({c.critical:.2f})"
            verdict = "**REGRESSED**" if c.flagged else c.status.replace("_", " ")
            lines.append(
                f"| {r.checkpoint_index} | {r.checkpoint_id} | {score} | "
                f"{c.reference_checkpoint_id} ({_pts(c.reference_score)}) | "
                f"{100 * c.relative_delta:+.2f} %{' abs' if c.rule == 'absolute' else ''} | "
                f"{ratio} | {verdict} |"
            )
        lines.append("")
    if report.flags:
        lines.append(
            "Flags: "
            + "; ".join(
                f"{f.task} at {f.checkpoint_id} ({_pts(f.current_score)} vs "
                f"{f.reference_checkpoint_id} {_pts(f.reference_score)})"
                for f in report.flags
            )
        )
    else:
        lines.append("No regression flagged.")
    return "\n".join(lines) + "\n"


def plot_tracks(
    report: RegressionReport, receipts: Sequence[Receipt], out_dir: str | os.PathLike
) -> list[Path]:
    """One PNG per task: score against checkpoint, a band of ± one seed/fold std, and the
    flagged checkpoints marked."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flagged = {(f.task, f.checkpoint_id) for f in report.flags}
    paths = []
    tasks = list(dict.fromkeys(t.name for r in receipts for t in r.tasks))
    for task in tasks:
        pts = [(r, r.task(task)) for r in receipts if r.task(task) is not None]
        xs = [r.checkpoint_index for r, _ in pts]
        ys = [100 * t.score for _, t in pts]
        sd = [100 * (t.details.get("std") or 0.0) for _, t in pts]
        fig = _new_figure(max(4.0, 0.9 * len(xs) + 2), 3.2)
        ax = fig.add_subplot(1, 1, 1)
        ax.fill_between(
            xs,
            [y - s for y, s in zip(ys, sd, strict=True)],
            [y + s for y, s in zip(ys, sd, strict=True)],
            alpha=0.25,
            label="± 1 std",
        )
        ax.plot(xs, ys, marker="o", label="score")
        bad = [
            (x, y)
            for (r, _), x, y in zip(pts, xs, ys, strict=True)
            if (task, r.checkpoint_id) in flagged
        ]
        if bad:
            ax.scatter(
                [b[0] for b in bad],
                [b[1] for b in bad],
                s=120,
                marker="x",
                color="red",
                zorder=3,
                label="regressed",
            )
        ax.set_xticks(xs, [r.checkpoint_id for r, _ in pts], rotation=30, ha="right")
        metric = pts[0][1].details.get("metric", "score")
        ax.set_ylabel(f"{metric} (x100)")
        ax.set_title(f"{task}: reference {report.reference}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"track_{task}.png"
        _save(fig, path)
        paths.append(path)
    return paths


def write_report(
    receipts: Sequence[Receipt],
    out_dir: str | os.PathLike,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    reference: str = "best",
    noise_alpha: float = DEFAULT_NOISE_ALPHA,
    horizon: int = DEFAULT_HORIZON,
    zero_floor: float = DEFAULT_ZERO_FLOOR,
    plots: bool = True,
) -> tuple[RegressionReport, str]:
    """Track, then write `regression.json`, `regression.md` and the plots into `out_dir`."""
    if len(receipts) < 2:
        raise HarnessError(
            f"{len(receipts)} receipt(s) in {out_dir}; tracking needs two or more checkpoints"
        )
    check_comparable(receipts)
    report = track_regression(
        receipts,
        threshold=threshold,
        reference=reference,
        noise_alpha=noise_alpha,
        horizon=horizon,
        zero_floor=zero_floor,
    )
    text = format_markdown(report, receipts)
    out = Path(out_dir)
    write_json_atomic(out / "regression.json", report.to_dict())
    write_output(text, out / "regression.md")
    if plots:
        plot_tracks(report, receipts, out / "plots")
    return report, text
