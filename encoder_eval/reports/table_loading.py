"""Reading one or several report-phase results folders into one `Table`
(`reports/table.py`): `load_table` and what it refuses across folders (other protocols, a
cell in two folders with other contents, a model selected otherwise), and the opening every
command that reads a table shares (`summarize`, `compare`, `leaderboard`, `report`,
`export`, `push`): its parser and flags (`table_parser`, `add_table_arguments`,
`one_results_dir`), the table of those
flags (`table_of_args`), the refusal (`print_refusal`), and for the commands that compute
statistics their settings, cache and heap (`open_statistics`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.core import heap
from encoder_eval.core.errors import ArgumentParser, HarnessError
from encoder_eval.core.results import CORRUPT, KEPT, LoadedResult, load_results
from encoder_eval.plans.experiment import (
    Experiment,
    as_dir_list,
    from_selection,
    in_results_dir,
    pair_selections,
    protocol_differences,
    summarize_inputs,
)
from encoder_eval.plans.plan import split_csv
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports.comparison_cache import ComparisonCache, open_cache
from encoder_eval.reports.stats_settings import StatsSettings
from encoder_eval.reports.table import Table, build_table
from encoder_eval.reports.table_render import refusal


def table_parser(command: str, description: str, **table_arguments) -> ArgumentParser:
    """The parser of `encoder-eval COMMAND` for a command that reads a table, the table's
    flags first (`add_table_arguments` with `table_arguments`)."""
    p = ArgumentParser(prog=f"encoder-eval {command}", description=description)
    add_table_arguments(p, **table_arguments)
    return p


def add_table_arguments(
    p: argparse.ArgumentParser,
    *,
    allow_partial: str,
    results_dir: str = "report-phase result directory",
    filters: bool = True,
    several: bool = True,
    required: bool = True,
) -> None:
    """The flags of every command that reads the report table of results folders
    (`load_table`): `--results-dir` and `--selection` (both repeatable:
    `experiment.pair_selections`), `--models`, `--tasks`, `--allow-partial` (its help,
    `allow_partial`, says what the command does despite problems). `filters=False`: no
    `--models`/`--tasks` (`push` shares the whole folder). `several=False`: the command
    reads one folder, and refuses a repeated flag (`one_results_dir`), never keeping the
    last. `required=False`: the command checks `--results-dir` itself (`push
    --benchmark-repo` reads no folder)."""
    p.add_argument(
        "--results-dir",
        action="append",
        required=required,
        help=results_dir + (" (repeatable: one table over several folders)" if several else ""),
    )
    p.add_argument(
        "--selection",
        action="append",
        help="selection.json from encoder-eval select (default: the one "
        + (
            "each results directory's experiment file names; repeatable: one for every "
            "folder, or one per --results-dir in order)"
            if several
            else "the results directory's experiment file names)"
        ),
    )
    if filters:
        p.add_argument("--models", help="comma-separated models (default: selection + results)")
        p.add_argument("--tasks", help="comma-separated tasks (default: selection + results)")
    p.add_argument("--allow-partial", action="store_true", help=allow_partial)


def check_results_dirs(results_dirs: str | os.PathLike | list) -> list[str]:
    """The `--results-dir` folders as a list, each an existing folder named once."""
    dirs = as_dir_list(results_dirs)
    seen: dict[Path, str] = {}
    for d in dirs:
        if not Path(d).is_dir():
            raise HarnessError(f"--results-dir {d} is not a directory")
        key = Path(d).resolve()
        if key in seen:
            raise HarnessError(
                f"--results-dir {d} names the folder {seen[key]} again; name each folder once"
            )
        seen[key] = d
    return dirs


def one_results_dir(args: argparse.Namespace, command: str, fix: str) -> None:
    """Set `args.results_dir` and `args.selection` (lists, `add_table_arguments`) to the one
    folder and selection of a command that reads one folder only; several are refused
    (`fix` says what to do instead), never one silently kept."""
    dirs = check_results_dirs(args.results_dir)
    if len(dirs) > 1:
        raise HarnessError(f"{command} reads one --results-dir, not {len(dirs)}; {fix}")
    selections = args.selection or []
    if len(selections) > 1:
        raise HarnessError(f"{command} takes one --selection, not {len(selections)}")
    args.results_dir, args.selection = dirs[0], (selections[0] if selections else None)


@dataclass
class _Folder:
    """One results folder of a table, as read: its experiment file (None without one), its
    selection, its report results, the report seeds it ran and its select results folder."""

    path: str
    experiment: Experiment | None
    experiment_path: Path
    selection_path: str
    selection: dict
    results: list[LoadedResult]
    ran_seeds: list[int] | None
    select_dir: str | None
    unusable: dict[str, str] = field(default_factory=dict)  # file name -> "corrupt (why)"

    def holds(self, alone: bool) -> list[str]:
        """The models this folder's table rows come from: those its experiment file names
        (what its report sweep ran) and those it has results of; without recorded models,
        a folder read alone also holds its selection's (a sweep not started still shows)."""
        named = list(self.experiment.models) if self.experiment is not None else []
        if not named and alone:
            named = list(self.selection.get("pairs") or {})
        return list(dict.fromkeys([*named, *(r.cell["model"] for r in self.results)]))


@dataclass
class LoadedTable:
    """The report table of one or more results folders, with what its readers need next:
    the results behind it, the selection the table used (each model's pairs from the
    folders holding it), each folder's selection file, the report seeds each sweep ran
    (None without an experiment file) and the select results folders the experiment files
    name."""

    table: Table
    results: list[LoadedResult]
    selection: dict
    selection_paths: list[str]
    ran_seeds: dict[str, list[int] | None]  # results folder -> the seeds its sweep ran
    select_dirs: list[str]
    results_dirs: list[str] = field(default_factory=list)

    @property
    def selection_path(self) -> str:
        """The first folder's selection file (the only one, with one folder)."""
        return self.selection_paths[0]

    @property
    def select_dir(self) -> str | None:
        """The first select results folder the experiment files name (None: none does)."""
        return self.select_dirs[0] if self.select_dirs else None

    def seeds_note(self) -> str | None:
        """A note when a report sweep ran other seeds than the protocol's: the table
        still expects the protocol's, so a shrunken table never looks complete."""
        expected = self.table.expected_seeds
        odd = {d: s for d, s in self.ran_seeds.items() if s is not None and s != expected}
        if not odd:
            return None
        where = len(self.ran_seeds) > 1
        ran = "; ".join(
            f"{','.join(map(str, s))}" + (f" in {d}" if where else "") for d, s in odd.items()
        )
        files = "their experiment files" if len(odd) > 1 else "its experiment file"
        return (
            f"note: the report sweep ran seeds {ran} ({files}), not the protocol's "
            f"{','.join(map(str, expected))}"
        )


def _read_folder(path: str, selection: str | None, warn: Callable[[str], None] | None) -> _Folder:
    selection_path, ran_seeds, select_dir = summarize_inputs(path, selection)
    experiment, experiment_path = in_results_dir(path)
    states: dict[Path, tuple[str, dict | None, str | None]] = {}
    results = load_results(path, warn=warn, phase="report", states=states)
    return _Folder(
        path,
        experiment,
        experiment_path,
        selection_path,
        load_selection(selection_path),
        results,
        ran_seeds,
        select_dir,
        unusable_files(states),
    )


def unusable_files(states: dict[Path, tuple[str, dict | None, str | None]]) -> dict[str, str]:
    """Per result file name that is there but not a done result, `status`'s word for it
    and why (`corrupt (...)`, `kept (...)`): the table names such a seed as `status` does,
    not as missing."""
    return {
        path.name: f"{state} ({path}: {why})"
        for path, (state, _, why) in states.items()
        if state in (CORRUPT, KEPT)
    }


def _check_protocols(folders: list[_Folder]) -> None:
    """Refuse folders whose experiment files, or whose selections' select sweeps, ran
    other protocols (`experiment.protocol_differences`): their cells share no table."""
    if len(folders) < 2:
        return  # one folder: its cells against its selection's are `build_table`'s rule
    report = [(str(f.experiment_path), f.experiment) for f in folders if f.experiment]
    select = [
        (f"{f.selection_path} (its select sweep)", exp)
        for f in folders
        if (exp := from_selection(f.selection, f.selection_path)) is not None
    ]
    for recorded in (report, select):
        for where, exp in recorded[1:]:
            if differs := protocol_differences(recorded[0][1], exp):
                raise HarnessError(
                    f"{recorded[0][0]} and {where} record other protocols "
                    f"({'; '.join(differs)}); results of other protocols share no table"
                )
    policies = {}
    for f in folders:
        policy = f.selection.get("policy") or {}
        if policy.get("lr_keys") is None or policy.get("seeds") is None:
            continue  # a selection that does not record its grid: its entries say the rest
        grid = (sorted(policy["lr_keys"]), sorted(policy["seeds"]))
        policies.setdefault(json.dumps(grid), f.selection_path)
    if len(policies) > 1:
        keys, paths = list(policies), list(policies.values())
        raise HarnessError(
            f"the selections {paths[0]} and {paths[1]} were chosen over other select grids "
            f"(lr keys and seeds {keys[0]} and {keys[1]}); results selected otherwise share "
            "no table"
        )


def _merge_results(folders: list[_Folder]) -> list[LoadedResult]:
    """Every folder's report results, each cell once: a cell (model, task, LR, seed) in two
    folders with the same content counts once; with another content it is refused."""
    seen: dict[tuple, LoadedResult] = {}
    out = []
    for f in folders:
        for r in f.results:
            c = r.cell
            key = (c["model"], c["task"], c["lr_key"], c["seed"])
            if key not in seen:
                seen[key] = r
                out.append(r)
            elif seen[key].data != r.data:
                raise HarnessError(
                    f"{seen[key].path} and {r.path} hold the same cell "
                    f"({c['model']}/{c['task']}/{c['lr_key']}/s{c['seed']}) with other "
                    "contents; keep one of them (a table counts each cell once)"
                )
    return out


def _merge_selections(folders: list[_Folder], models: list[str] | None) -> dict:
    """One selection for the table: each model's pairs from the selections of the folders
    holding it (`_Folder.holds`; a model of `models` no folder holds: from every
    selection naming it), refused when two of them choose otherwise for one of its tasks.
    A model no folder holds is left out: no phantom row of missing seeds."""
    alone = len(folders) == 1
    holders: dict[str, list[_Folder]] = {}
    for f in folders:
        for m in f.holds(alone):
            holders.setdefault(m, []).append(f)
    for m in models or []:
        if m not in holders:
            holders[m] = [f for f in folders if m in (f.selection.get("pairs") or {})]
    merged = {**folders[0].selection, "pairs": {}}
    if any(f.selection.get("on_protocol") is False for f in folders):
        merged["on_protocol"] = False
    in_order = [m for f in folders for m in f.selection.get("pairs") or {} if m in holders]
    for m in dict.fromkeys([*in_order, *holders]):  # the rows in the selections' order
        where = holders[m]
        chosen: dict[str, tuple[dict, str]] = {}
        for f in where:
            for task, entry in ((f.selection.get("pairs") or {}).get(m) or {}).items():
                if task not in chosen:
                    chosen[task] = (entry, f.selection_path)
                elif chosen[task][0] != entry:
                    first, path = chosen[task]
                    raise HarnessError(
                        f"{m}/{task} is selected otherwise in {path} (lr {first.get('lr_key')}) "
                        f"and {f.selection_path} (lr {entry.get('lr_key')}), both selections "
                        f"of folders holding {m}; give its folders one selection"
                    )
        if chosen:
            merged["pairs"][m] = {t: e for t, (e, _) in chosen.items()}
    return merged


def load_table(
    results_dirs: str | os.PathLike | list,
    selection: str | list[str] | None,
    *,
    models: list[str] | None = None,
    tasks: list[str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> LoadedTable:
    """The `summarize` table of one or more report-phase results folders: each folder's
    selection (the one its experiment file names, or `selection`: one for all or one per
    folder, `experiment.pair_selections`), its report results (bad files skipped through
    `warn`), `build_table` over them all, so the table's rules (recipe, data, software...)
    hold across folders. Refused with one error: folders of other protocols, a cell in two
    folders with other contents, a model its folders' selections choose otherwise for.
    The caller refuses a table with problems unless `--allow-partial` (`refusal`)."""
    dirs = check_results_dirs(results_dirs)
    given = [selection] if isinstance(selection, (str, os.PathLike)) else list(selection or [])
    chosen = pair_selections(dirs, given)
    folders = [_read_folder(d, s, warn) for d, s in zip(dirs, chosen, strict=True)]
    _check_protocols(folders)
    results = _merge_results(folders)
    merged = _merge_selections(folders, models)
    unusable: dict[str, str] = {}
    for f in folders:
        for name, why in f.unusable.items():
            unusable.setdefault(name, why)
    table = build_table(results, merged, models=models, tasks=tasks, unusable=unusable)
    return LoadedTable(
        table,
        results,
        merged,
        [f.selection_path for f in folders],
        {f.path: f.ran_seeds for f in folders},
        list(dict.fromkeys(f.select_dir for f in folders if f.select_dir)),
        dirs,
    )


def table_of_args(
    args: argparse.Namespace,
    warn: Callable[[str], None] | None,
    dirs: list[str] | None = None,
) -> LoadedTable:
    """`load_table` of the flags `add_table_arguments` added (`dirs`: the checked
    `--results-dir` folders, when the command checked them already)."""
    return load_table(
        args.results_dir if dirs is None else dirs,
        args.selection,
        models=split_csv(getattr(args, "models", None)) or None,
        tasks=split_csv(getattr(args, "tasks", None)) or None,
        warn=warn,
    )


def print_refusal(table: Table, allow_partial: bool, command: str = "summarize") -> bool:
    """Print `command`'s refusal of `table` on stderr (`table_render.refusal`); True when
    the table was refused (the command then exits `EXIT_INCOMPLETE`)."""
    if (refused := refusal(table, allow_partial, command)) is None:
        return False
    print(refused, file=sys.stderr)
    return True


def open_statistics(
    args: argparse.Namespace, warn: Callable[[str], None] | None
) -> tuple[StatsSettings, ComparisonCache | None]:
    """A statistics command's settings (`StatsSettings` of its flags) and the user's
    comparison cache they name (None with `--no-cache`). It also keeps large blocks in
    this process's heap for the resampling (`heap.keep_large_blocks`): the process's malloc
    settings are the command's choice, made here at its start, never a library call's."""
    heap.keep_large_blocks()
    settings = StatsSettings.from_args(args)
    return settings, open_cache(enabled=settings.cache, warn=warn)
