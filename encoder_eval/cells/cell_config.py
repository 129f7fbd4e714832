"""What defines one cell (`CellConfig`, filled from `run`'s flags by `runner.plan_cells`),
its label in messages, and the names of the files it writes beside its result, checked
before any training (`validate_out_path`, `derived_names`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.cells.kinds import beside_result
from encoder_eval.cells.predictions import predictions_path
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import check_output_file, temporary_name
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import (
    EXCL_SUFFIX,
    LOCK_PREFIX,
    RESUME_PREFIX,
    RESUME_SUFFIX,
    lr_key,
)
from encoder_eval.core.schema import CellId

# Which dev languages each evaluation during training scores: "deciding", those whose mean
# decides early stopping and the best checkpoint (the rest are scored once, at the end, on
# the kept weights); "all", every language at every evaluation (the same numbers, slower).
DEV_LANGUAGES = ("deciding", "all")


@dataclass
class CellConfig:
    """Everything that defines one cell; the CLI in `run.py` fills it from flags. What makes
    cells comparable (loader mode, batching, micro-batch, evaluation batch) is the recipe's."""

    model_path: str
    task: str
    lr: float
    seed: int
    model_key: str
    phase: str = "report"
    recipe: Recipe = field(default_factory=Recipe)
    data_dir: str | None = None
    device: str = "auto"
    out_json: str | None = None
    model_revision: str | None = None
    model_code_revision: str | None = None  # remote code held by another repository
    require_code_revision: bool = False  # refuse such code unless model_code_revision pins it
    trust_remote_code: bool = False
    record_model_path: bool = False
    save_predictions: bool = True  # report cells only: `encoder_eval.cells.predictions`
    progress: str = "bar"  # bar | quiet | json
    cache_dir: str | None = "default"  # tokenisation cache; None disables it
    dev_languages: str = "deciding"  # or "all" (DEV_LANGUAGES; benchmarks only)
    report_to: tuple[str, ...] = ()  # experiment trackers (`trackers.TRACKERS`); none by default
    tracking_dir: str | None = None  # their files; default: `tracking/` beside out_json

    def cell_id(self) -> CellId:
        """Which cell this is, as its result records it and trackers name its run."""
        return CellId(model=self.model_key, task=self.task, lr=self.lr, lr_key=lr_key(self.lr),
                      seed=self.seed, phase=self.phase)  # fmt: skip


def cell_label(cfg: CellConfig) -> str:
    """The cell's name in messages (`model/task/lr key/s<seed>`), one spelling in every line."""
    return f"{cfg.model_key}/{cfg.task}/{lr_key(cfg.lr)}/s{cfg.seed}"


def resume_state_path(out_json: str | None) -> Path | None:
    """Where a stopped cell saves its state beside its result file (None without one), so a
    rerun of the same command finds it."""
    if not out_json:
        return None
    path = Path(out_json)
    return path.parent / f"{RESUME_PREFIX}{path.name}{RESUME_SUFFIX}"


def validate_out_path(path: str | os.PathLike, flag: str = "--out-json") -> None:
    """Refuse, before any training, an output path whose directory cannot be created or
    written (`fileio.check_output_file`; the error names `flag`, the flag that gave it), or
    whose longest derived file name the file system would refuse; a missing directory is
    fine (`run` creates it when the cell starts)."""
    check_output_file(path, flag, create_dirs=True)
    existing = Path(path).resolve().parent
    while not existing.exists():
        existing = existing.parent
    _check_name_lengths(Path(path), existing)


# mkstemp's random part of a temporary's name (`fileio.temporary_name` is the rest).
_TMP_RANDOM_CHARS = 8


def derived_names(out_json: str | os.PathLike) -> dict[str, str]:
    """Every file name a cell writes beside its result, by what it is: the result, its
    predictions, its kind's files (`kinds.beside_result`), resume state and lock, and the writers' temporaries of each."""
    path = Path(out_json)
    files = {
        "result": path,
        "predictions": predictions_path(path),
        **beside_result(path),  # a ranking cell's TREC run
        "resume state": resume_state_path(path),
    }
    names = {what: p.name for what, p in files.items()}
    names["lock"] = f"{LOCK_PREFIX}{path.name}"
    names["lock without flock"] = f"{LOCK_PREFIX}{path.name}{EXCL_SUFFIX}"
    for what, p in files.items():
        names[f"temporary of the {what}"] = temporary_name(p) + "x" * _TMP_RANDOM_CHARS
    return names


def _name_bytes(name: str) -> int:
    try:
        return len(os.fsencode(name))
    except UnicodeError:
        return len(name.encode("utf-8", "surrogatepass"))


def _check_name_lengths(out_json: Path, existing: Path) -> None:
    """Refuse a result name whose longest derived name exceeds the file system's NAME_MAX,
    which would otherwise fail only when the trained cell is written."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if not name_max or name_max < 0:
        return
    what, name = max(derived_names(out_json).items(), key=lambda item: _name_bytes(item[1]))
    if _name_bytes(name) > name_max:
        raise HarnessError(
            f"the result name {out_json.name!r} is too long for its directory: "
            f"the {what} beside it would be named with {_name_bytes(name)} bytes, "
            f"and this file system allows {name_max}; use a shorter --model-key "
            "or --out-json name"
        )
