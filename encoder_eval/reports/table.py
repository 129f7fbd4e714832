"""The results table: mean ± std over the report seeds at each pair's selected LR, its
refusal rules, footnotes and renderings (markdown, json, csv, latex).

`build_table` turns loaded results and a selection into a `Table`; every problem that makes
the table unpublishable is a `Problem` naming its rule and cells (the rules are listed in
`encoder-eval summarize --help` and EVALUATION_METHODOLOGY.md). The command is
`encoder_eval.summarize`; `compare`, `leaderboard` and the probe tables build on `Table`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.core import aggregate
from encoder_eval.core.comparability import cell_setup, setup_differences, transformers_version
from encoder_eval.core.errors import (
    HarnessError,
    brief,
)
from encoder_eval.core.metrics import metric_spec
from encoder_eval.core.protocol import LR_GRID, REPORT_SEEDS, SELECT_SEEDS, name_reasons
from encoder_eval.core.results import LoadedResult, load_results, result_filename
from encoder_eval.data.tasks import (
    BENCHMARK_LABELS,
    BENCHMARK_SCORES,
    SEPARATE_BUCKETS,
    TASK_KNOBS,
    in_suite_average,
    task_knobs,
    task_label,
)
from encoder_eval.plans.experiment import (
    Experiment,
    as_dir_list,
    from_selection,
    in_results_dir,
    pair_selections,
    protocol_differences,
    summarize_inputs,
)
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports import latex
from encoder_eval.reports.latex import Score

TABLE_SCHEMA = "encoder-eval-table"
RULES = (
    "no_selection",
    "selection_off_protocol",
    "selection_partial",
    "missing_seeds",
    "wrong_lr",
    "off_protocol",
    "diverged",
    "undefined_metric",
    "recipe",
    "precision",
    "selection_split",
    "transformers",
    "model_revision",
    "loader",
    "data_identity",
    "select_report_mismatch",
)
# What each selection split means, as the table's footnote states it.
SELECTION_SPLIT_NOTES = {
    "dev": "LR selection and early stopping on the official dev split (the specification's "
    "default; for dev-reported tasks the score is a maximum over evaluations).",
    "holdout": "LR selection and early stopping on a held-out slice of train (strict: the "
    "official dev split is untouched until the report score).",
}
CI_METHODS = ("t", "bootstrap")
CI_NOTES = {
    "t": "[low, high]: 95 % interval of the seed mean, Student t quantile on n - 1 degrees "
    "of freedom (none for one seed).",
    "bootstrap": "[low, high]: 95 % two-level bootstrap interval of the seed mean (seeds and "
    "report examples resampled, percentile method).",
}
MARKS_NOTES = {
    "table": "Bold: the task's best model by mean; ≈: not distinguishable from it (the verdict "
    "of `encoder-eval compare`: a t-test carrying seed and test-set variance). Every pair of "
    "models on every task is tested, Holm-corrected as one family, so the chance that any "
    "mark of the table comes from a false difference is at most 0.05.",
    "task": "Bold: the task's best model by mean; ≈: not distinguishable from it (the verdict "
    "of `encoder-eval compare`: a t-test carrying seed and test-set variance, Holm-corrected "
    "across the task's comparisons with the best only, --marks-family task: this does not "
    "account for the best being picked by its mean, nor for the other tasks).",
}
BUCKET_LABELS = {
    "multilingual": "Multilingual",
    "glue": "GLUE",
    "superglue": "SuperGLUE",
    "ranking": "Ranking",
}
BUCKET_ORDER = ("multilingual", "glue", "superglue", "ranking")

FORMATS = ("markdown", "json", "csv", "latex")


@dataclass
class Problem:
    """One reason the table cannot be printed as a protocol table."""

    rule: str
    message: str
    cells: list[str] = field(default_factory=list)  # result files (or expected file names)

    def to_dict(self) -> dict:
        return {"rule": self.rule, "message": self.message, "cells": self.cells}


@dataclass
class CellStats:
    """The aggregate of one (model, task) over its report seeds at the selected LR."""

    model: str
    task: str
    metric: str
    lr_key: str | None
    lr: float | None
    scores: dict[int, float]  # seed -> report mean, finished seeds at the selected LR
    diverged: list[int]
    missing: list[int]
    off_protocol: bool
    undefined: list[int] = field(default_factory=list)  # finished, but report.mean is null

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def mean(self) -> float | None:
        return aggregate.seed_mean(self.scores.values())

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof=1); None for fewer than two seeds."""
        return aggregate.seed_std(self.scores.values())

    @property
    def t_interval(self) -> tuple[float, float] | None:
        """The 95 % interval of the seed mean with the t quantile on n - 1 degrees of
        freedom, cut to the metric's range (`aggregate.seed_interval`); None for fewer than
        two seeds."""
        found = aggregate.seed_interval(self.scores.values(), self.metric)
        return None if found is None else found[:2]

    @property
    def t_interval_cut(self) -> bool:
        """Whether the t interval reached past the metric's range and was cut to it."""
        found = aggregate.seed_interval(self.scores.values(), self.metric)
        return found is not None and found[2]


@dataclass
class Table:
    models: list[str]
    tasks: list[str]
    cells: dict[tuple[str, str], CellStats]
    problems: list[Problem]
    expected_seeds: list[int]
    selection_splits: list[str] = field(default_factory=list)  # those the cells used
    ci_method: str = "t"  # CI_METHODS: how `interval` is computed
    bootstrap: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    marks: dict | None = None  # task -> compare.TaskMarks; None: not computed
    marks_family: str = "table"  # what the marks' correction runs over (compare.MARK_FAMILIES)
    kind: str = "fine-tune"  # or "probe": rows are (model, pooling), "seeds" are probe folds

    def interval(self, model: str, task: str) -> tuple[float, float] | None:
        """The cell's 95 % interval under `ci_method`."""
        if self.ci_method == "bootstrap":
            return self.bootstrap.get((model, task))
        c = self.cells.get((model, task))
        return None if c is None else c.t_interval

    def mark(self, model: str, task: str) -> str | None:
        """ "best", "tied" (not distinguishable from the best) or None."""
        m = (self.marks or {}).get(task)
        if m is None:
            return None
        return "best" if m.best == model else "tied" if model in m.tied else None

    @property
    def selection_split(self) -> str | None:
        """The table's selection split; None when its cells mix several (or there are none)."""
        return self.selection_splits[0] if len(self.selection_splits) == 1 else None

    @property
    def buckets(self) -> list[str]:
        present = {TASK_KNOBS[t].bucket for t in self.tasks}
        return [b for b in BUCKET_ORDER if b in present] + sorted(present - set(BUCKET_ORDER))

    @property
    def bucket_columns(self) -> list[str]:
        """The buckets a printed table gives a column: those holding two or more of its
        tasks. A bucket of one task would repeat that task's column under the bucket's name
        (a "SuperGLUE" column over CB alone reads like the SuperGLUE score)."""
        count = Counter(TASK_KNOBS[t].bucket for t in self.tasks)
        return [b for b in self.buckets if count[b] > 1]

    def bucket_mean(self, model: str, bucket: str) -> float | None:
        return self._avg(model, [t for t in self.tasks if TASK_KNOBS[t].bucket == bucket])

    def overall_mean(self, model: str) -> float | None:
        """The mean of the model's task means, ranking tasks left out (`in_suite_average`)."""
        return self._avg(model, [t for t in self.tasks if in_suite_average(t)])

    @property
    def benchmark_scores(self) -> list[str]:
        """The benchmark scores (`tasks.BENCHMARK_SCORES`) whose whole task set the table
        holds (a benchmark score over some of its tasks would be another number)."""
        return [
            name for name, tasks in BENCHMARK_SCORES.items() if all(t in self.tasks for t in tasks)
        ]

    def benchmark_score(self, model: str, name: str) -> float | None:
        """The macro-average of the model's means over the benchmark's task set; None
        unless the table holds every task of the set and each has a score."""
        tasks = list(BENCHMARK_SCORES[name])
        if not all(t in self.tasks for t in tasks):
            return None
        return self._avg(model, tasks)

    def _avg(self, model: str, tasks: list[str]) -> float | None:
        means = [self.cells[(model, t)].mean for t in tasks if (model, t) in self.cells]
        if not tasks or len(means) < len(tasks) or any(m is None for m in means):
            return None
        return math.fsum(means) / len(means)

    def partial_cells(self) -> list[CellStats]:
        n = len(self.expected_seeds)
        return [c for c in self.cells.values() if c.n != n]


def _order_models(names: set[str], selection: dict) -> list[str]:
    sel_order = list(selection.get("pairs", {}))
    return [m for m in sel_order if m in names] + sorted(names - set(sel_order))


def _group_disagreement(rule: str, what: str, groups: dict[str, list[LoadedResult]]) -> Problem:
    parts = []
    cells = []
    for value, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        parts.append(f"{brief(value)} in {len(members)} cell(s)")
        cells += [f"{m.path} ({what} {brief(value)})" for m in members]
    return Problem(rule, f"cells disagree on {what}: " + "; ".join(parts), cells)


def _recipe_problems(cells: list[LoadedResult]) -> list[Problem]:
    problems = []
    by_precision = defaultdict(list)
    by_split = defaultdict(list)
    by_recipe = defaultdict(list)
    by_tf = defaultdict(list)
    by_rev: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_loader: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_data: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_attn: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        setup = cell_setup(c.data)
        sig = dict(setup["recipe"])
        by_precision[str(sig.pop("precision", None))].append(c)
        by_split[str(sig.pop("selection_split", None))].append(c)
        by_recipe[json.dumps(sig, sort_keys=True)].append(c)
        by_tf[transformers_version(c.data)].append(c)
        by_rev[c.cell["model"]][str(setup["model_revision"])].append(c)
        loader = f"mode={setup['mode']}, trust_remote_code={setup['trust_remote_code']}"
        by_loader[c.cell["model"]][loader].append(c)
        by_data[c.cell["task"]][setup["data_identity"]].append(c)
        if "attn_implementation" in setup:  # (results that predate it do not record it)
            by_attn[c.cell["model"]][setup["attn_implementation"]].append(c)
    if len(by_precision) > 1:
        problems.append(_group_disagreement("precision", "precision", by_precision))
    if len(by_split) > 1:
        problems.append(_group_disagreement("selection_split", "selection split", by_split))
    if len(by_recipe) > 1:
        # Name only the entries that differ, so the message stays readable.
        sigs = [json.loads(k) for k in by_recipe]
        keys = sorted({k for s in sigs for k in s if len({json.dumps(x.get(k)) for x in sigs}) > 1})
        groups = {
            ", ".join(f"{k}={json.loads(sig).get(k)}" for k in keys): members
            for sig, members in by_recipe.items()
        }
        problems.append(_group_disagreement("recipe", "recipe", groups))
    if len(by_tf) > 1:
        problems.append(_group_disagreement("transformers", "transformers version", by_tf))
    for rule, what, per in (
        ("model_revision", "{}'s model revision", by_rev),
        ("loader", "{}'s loader", by_loader),
        ("loader", "{}'s attention implementation", by_attn),
        ("data_identity", "{}'s data", by_data),
    ):
        for name, groups in per.items():
            if len(groups) > 1:
                problems.append(_group_disagreement(rule, what.format(name), groups))
    return problems


def _selection_problems(selection: dict, pairs: list[tuple[str, str, dict]]) -> list[Problem]:
    """What `selection.json` itself says is wrong with the choices the table's pairs use."""
    off, partial = [], []
    policy = selection.get("policy") or {}
    keys, seeds = policy.get("lr_keys"), policy.get("seeds")
    if (
        keys is not None
        and seeds is not None
        and (sorted(keys) != sorted(LR_GRID) or sorted(seeds) != sorted(SELECT_SEEDS))
    ):
        off.append(
            f"the select sweep ran lr keys {','.join(keys)} and seeds "
            f"{','.join(map(str, seeds))}; the protocol's are {','.join(LR_GRID)} and "
            f"{','.join(map(str, SELECT_SEEDS))}"
        )
    for model, task, entry in pairs:
        if entry.get("on_protocol") is False:
            off.append(f"{model}/{task}: its select cells are off-protocol")
        if entry.get("partial"):
            missing = "; ".join(
                f"{k} seeds {v}" for k, v in (entry.get("missing_by_lr") or {}).items()
            )
            partial.append(
                f"{model}/{task}: its LR was chosen over missing select cells ({missing})"
            )
    entries = [e for by_task in selection.get("pairs", {}).values() for e in by_task.values()]
    if (
        selection.get("on_protocol") is False
        and not off
        and not any(e.get("on_protocol") is False or e.get("partial") for e in entries)
    ):
        off.append("selection.json says on_protocol: false")
    problems = []
    if off:
        problems.append(
            Problem(
                "selection_off_protocol",
                "the selection is off-protocol; "
                "run the whole select sweep on protocol, then select",
                off,
            )
        )
    if partial:
        problems.append(
            Problem(
                "selection_partial",
                f"{len(partial)} pair(s) were selected with "
                "--allow-partial; finish the select sweep and re-run select",
                partial,
            )
        )
    return problems


def build_table(
    results: list[LoadedResult],
    selection: dict,
    *,
    models: list[str] | None = None,
    tasks: list[str] | None = None,
    expected_seeds: list[int] | None = None,
) -> Table:
    """Aggregate report-phase results at each pair's selected LR and collect every problem."""
    expected = list(expected_seeds or REPORT_SEEDS)
    results = [r for r in results if r.cell["phase"] == "report"]
    pairs_sel = selection.get("pairs", {})
    if models is None:
        model_set = set(pairs_sel) | {r.cell["model"] for r in results}
    else:
        model_set = set(models)
    if tasks is None:
        task_set = {t for by_task in pairs_sel.values() for t in by_task}
        task_set |= {r.cell["task"] for r in results}
    else:
        task_set = set(tasks)
    for t in task_set:
        task_knobs(t)  # raises for an unknown task, with the valid names
    model_list = _order_models(model_set, selection) if models is None else list(models)
    task_list = [t for t in TASK_KNOBS if t in task_set] if tasks is None else list(tasks)
    if not model_list or not task_list:
        raise HarnessError(
            "nothing to tabulate: no report results and no selected pairs; check "
            "--results-dir and --selection"
        )

    by_pair: dict[tuple[str, str], list[LoadedResult]] = defaultdict(list)
    for r in results:
        by_pair[(r.cell["model"], r.cell["task"])].append(r)

    problems: list[Problem] = []
    no_sel, missing_cells, wrong_lr, off, diverged = [], [], [], [], []
    off_reasons: dict[str, None] = {}  # the distinct off-protocol reasons, in order
    undefined, unrecorded, phase_mismatch = [], [], []
    selected: list[tuple[str, str, dict]] = []
    included: list[LoadedResult] = []
    cells: dict[tuple[str, str], CellStats] = {}
    for model in model_list:
        for task in task_list:
            here = by_pair.get((model, task), [])
            chosen = (pairs_sel.get(model) or {}).get(task) or {}
            key, lr = chosen.get("lr_key"), chosen.get("lr")
            if not key:
                no_sel.append(
                    f"{model}/{task}"
                    + (
                        f": {len(here)} result(s) but no selected LR"
                        if here
                        else ": no selected LR"
                    )
                )
                continue
            selected.append((model, task, chosen))
            select_setup = chosen.get("select_setup")
            if not isinstance(select_setup, dict):
                unrecorded.append(
                    f"{model}/{task}: selection.json does not record what its select cells ran with"
                )
            stats = CellStats(model, task, task_knobs(task).metric, key, lr, {}, [], [], False)
            for r in sorted(here, key=lambda r: (r.cell["lr"], r.cell["seed"])):
                if r.cell["lr_key"] != key:
                    wrong_lr.append(f"{r.path} (lr {r.cell['lr_key']}, selected {key})")
                    continue
                included.append(r)
                if not r.data["protocol"]["on_protocol"]:
                    why = r.data["protocol"].get("off_protocol_reasons") or []
                    off_reasons.update(dict.fromkeys(why))
                    reasons = "; ".join(why)
                    off.append(f"{r.path} ({reasons or 'off-protocol'})")
                    stats.off_protocol = True
                if isinstance(select_setup, dict):
                    has = "its select cells have"
                    differs = setup_differences(cell_setup(r.data), select_setup, has)
                    if differs:
                        phase_mismatch.append(f"{r.path} ({'; '.join(differs)})")
                outcome, score = aggregate.seed_outcome(r.result, "report")
                if outcome == aggregate.UNDEFINED:
                    stats.undefined.append(r.cell["seed"])
                    why = r.result.report.undefined or {}
                    reasons = "; ".join(f"{lang}: {text}" for lang, text in why.items())
                    undefined.append(f"{r.path} (report mean undefined: {reasons})")
                elif outcome == aggregate.FINISHED:
                    stats.metric = r.data["metric"]
                    stats.scores[r.cell["seed"]] = score
                else:
                    stats.diverged.append(r.cell["seed"])
                    step = r.data["training"].get("diverged_at_step")
                    diverged.append(f"{r.path} (diverged at step {step})")
            stats.missing = [
                s
                for s in expected
                if s not in stats.scores and s not in stats.diverged + stats.undefined
            ]
            for s in stats.missing:
                missing_cells.append(
                    f"{model}/{task}/{key}/s{s}: missing ({result_filename(model, task, lr, s)})"
                )
            cells[(model, task)] = stats
    if no_sel:
        problems.append(
            Problem(
                "no_selection",
                f"{len(no_sel)} pair(s) have no selected LR in the selection file",
                no_sel,
            )
        )
    problems += _selection_problems(selection, selected)
    if missing_cells:
        problems.append(
            Problem(
                "missing_seeds", f"{len(missing_cells)} report seed(s) are missing", missing_cells
            )
        )
    if wrong_lr:
        problems.append(
            Problem(
                "wrong_lr",
                f"{len(wrong_lr)} result(s) sit at an LR other than "
                "the selected one (never averaged)",
                wrong_lr,
            )
        )
    if off:
        why = name_reasons(off_reasons)
        problems.append(
            Problem(
                "off_protocol",
                f"{len(off)} result(s) are off-protocol" + (f" ({why})" if why else ""),
                off,
            )
        )
    if diverged:
        problems.append(
            Problem(
                "diverged",
                f"{len(diverged)} report seed(s) diverged (counted, never averaged)",
                diverged,
            )
        )
    if undefined:
        problems.append(
            Problem(
                "undefined_metric",
                f"{len(undefined)} report seed(s) have an "
                "undefined score (never averaged, never read as 0)",
                undefined,
            )
        )
    problems += _recipe_problems(included)
    if unrecorded:
        problems.append(
            Problem(
                "select_report_mismatch",
                f"{len(unrecorded)} pair(s) cannot be "
                "checked against their select cells; regenerate selection.json "
                "with encoder-eval select",
                unrecorded,
            )
        )
    if phase_mismatch:
        problems.append(
            Problem(
                "select_report_mismatch",
                f"{len(phase_mismatch)} report cell(s) "
                "ran otherwise than their pair's select cells; re-run the select "
                "and report phases with one setup",
                phase_mismatch,
            )
        )
    splits = {str(cell_setup(r.data)["selection_split"]) for r in included}
    if not included:
        splits = {str((e.get("select_setup") or {}).get("selection_split")) for *_, e in selected}
    splits.discard("None")
    return Table(model_list, task_list, cells, problems, expected, sorted(splits))


# ----------------------------------------------------------------------------- rendering


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def score_cell(
    cell: CellStats | None,
    expected_n: int,
    interval: tuple[float, float] | None = None,
    mark: str | None = None,
) -> Score:
    """`72.31 ± 1.05 [70.98, 73.64]` (x100: mean ± std [95 % interval]); `—` for no score;
    `†` when averaged over fewer seeds; bold when `mark` is "best", `≈` when "tied"."""
    if cell is None or cell.mean is None:
        return Score("—")
    std = "n/a" if cell.std is None else f"{100 * cell.std:.2f}"
    ci = "" if interval is None else f" [{_pct(interval[0])}, {_pct(interval[1])}]"
    return Score(
        f"{_pct(cell.mean)} ± {std}{ci}",
        best=mark == "best",
        tied=mark == "tied",
        dagger=cell.n != expected_n,
    )


def format_cell(
    cell: CellStats | None,
    expected_n: int,
    interval: tuple[float, float] | None = None,
    mark: str | None = None,
) -> str:
    """The markdown of `score_cell`."""
    return score_cell(cell, expected_n, interval, mark).markdown()


def task_header(task: str) -> str:
    knobs = TASK_KNOBS[task]
    star = "*" if knobs.report_split == "validation" else ""
    metric = metric_spec(knobs.metric).label
    return f"{task_label(task)}{star} ({metric})"


def _seed_range(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


PROBE_NOTES = (
    "Scores x100: mean ± sample std (ddof=1) over the {n} probe folds (repeated shuffle-splits "
    "of train) of each fold's linear probe on frozen embeddings, scored on the report split; "
    "rows are model:pooling.",
    "[low, high]: 95 % interval of the fold mean, Student t quantile on n - 1 degrees of "
    "freedom. The folds share the report examples and most training rows, so it speaks of "
    "the probe's fitting noise, not of a new training set or test set.",
)


def _dagger_notes(table: Table) -> list[str]:
    """`† avg@k instead of avg@n: cells` for the cells averaged over fewer seeds (or folds)."""
    by_n: dict[int, list[str]] = defaultdict(list)
    for c in table.partial_cells():
        by_n[c.n].append(f"{c.model}/{c.task}")
    n = len(table.expected_seeds)
    return [f"† avg@{k} instead of avg@{n}: {', '.join(by_n[k])}." for k in sorted(by_n)]


def _cut_note(table: Table) -> list[str]:
    """The note naming the cells whose t interval was cut to the metric's range."""
    if table.ci_method != "t" and table.kind != "probe":
        return []
    found = (table.cells.get((m, t)) for m in table.models for t in table.tasks)
    cut = [c for c in found if c is not None and c.t_interval_cut]  # in the table's order
    if not cut:
        return []
    ranges = {c.metric: metric_spec(c.metric).score_range for c in cut}
    shown = "; ".join(
        f"{metric_spec(m).label} [{_pct(lo)}, {_pct(hi)}]" for m, (lo, hi) in ranges.items()
    )
    cells = ", ".join(f"{c.model}/{c.task}" for c in cut)
    return [
        f"Intervals cut at the metric's range ({shown}), which the t interval of so few "
        f"seeds reaches past: {cells}."
    ]


def footnotes(table: Table) -> list[str]:
    n = len(table.expected_seeds)
    if table.kind == "probe":
        notes = [PROBE_NOTES[0].format(n=n), PROBE_NOTES[1], *_cut_note(table)]
        if any(TASK_KNOBS[t].report_split == "validation" for t in table.tasks):
            notes.append("* reported on the dev (validation) split: the test labels are hidden.")
        notes += _dagger_notes(table)
        notes += [f"Not a protocol table: {p.message} [{p.rule}]." for p in table.problems]
        return notes
    seeds = _seed_range(table.expected_seeds)
    partial = table.partial_cells()
    over = (
        f"over the report seeds each cell has (the protocol's: {seeds}, avg@{n}; see †)"
        if partial
        else f"over report seeds {seeds} (avg@{n})"
    )
    notes = [
        f"Scores x100: mean ± sample std (ddof=1) of the report-split score {over}, at the LR "
        "chosen on the select seeds.",
        CI_NOTES[table.ci_method],
        *_cut_note(table),
    ]
    if table.marks is not None:
        notes.append(MARKS_NOTES[table.marks_family])
        for task, m in table.marks.items():
            if m.notes:
                notes.append(f"{task}: " + "; ".join(m.notes) + ".")
    if table.selection_split in SELECTION_SPLIT_NOTES:
        notes.append(SELECTION_SPLIT_NOTES[table.selection_split])
    elif len(table.selection_splits) > 1:
        notes.append(
            "LR selection and early stopping: the cells mix selection splits "
            f"({', '.join(table.selection_splits)}) [selection_split]."
        )
    if any(TASK_KNOBS[t].report_split == "validation" for t in table.tasks):
        notes.append("* reported on the dev (validation) split: the test labels are hidden.")
    for name in table.benchmark_scores:
        tasks = BENCHMARK_SCORES[name]
        notes.append(
            f"{BENCHMARK_LABELS[name]}: the macro-average of the task means over "
            f"{', '.join(task_label(t) for t in tasks)} (each task's metric "
            "as in its column" + ("; ReCoRD excluded" if name == "superglue_score" else "") + ")."
        )
    separate = [t for t in table.tasks if not in_suite_average(t)]
    if separate:
        notes.append(
            f"Average leaves out the ranking tasks ({', '.join(separate)}), which "
            "have their own column."
        )
    notes += _dagger_notes(table)
    for p in table.problems:
        notes.append(f"Not a protocol table: {p.message} [{p.rule}].")
    return notes


def table_grid(table: Table) -> tuple[list[str], list[list[Score | str]]]:
    """The table's header and rows, each cell with its marks: what every text format shows."""
    n = len(table.expected_seeds)
    head = ["Model", *(task_header(t) for t in table.tasks)]
    head += [BUCKET_LABELS.get(b, b.title()) for b in table.bucket_columns]
    head += [BENCHMARK_LABELS[name] for name in table.benchmark_scores] + ["Average"]
    rows: list[list[Score | str]] = []
    for model in table.models:
        row: list[Score | str] = [model]
        row += [
            score_cell(
                table.cells.get((model, t)), n, table.interval(model, t), table.mark(model, t)
            )
            for t in table.tasks
        ]
        row += [_pct(table.bucket_mean(model, b)) for b in table.bucket_columns]
        row += [_pct(table.benchmark_score(model, name)) for name in table.benchmark_scores]
        row.append(_pct(table.overall_mean(model)))
        rows.append(row)
    return head, rows


def render_markdown(table: Table) -> str:
    head, rows = table_grid(table)
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "---|" + "---:|" * (len(head) - 1),
    ]
    for row in rows:
        cells = [c.markdown() if isinstance(c, Score) else c for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *footnotes(table)]) + "\n"


def render_latex(table: Table) -> str:
    """The table for a paper: booktabs, marks as in markdown, the footnotes as table notes."""
    head, rows = table_grid(table)
    return latex.render_table(head, rows, footnotes(table))


def table_to_dict(table: Table) -> dict:
    """The table as plain data (the json format; also what a plotting hook takes)."""
    rows = []
    for model in table.models:
        cells = {}
        for t in table.tasks:
            c = table.cells.get((model, t))
            ci = table.interval(model, t)
            cells[t] = (
                None
                if c is None
                else {
                    "mean": c.mean,
                    "std": c.std,
                    "n": c.n,
                    "seeds": sorted(c.scores),
                    "ci": None
                    if ci is None
                    else {"low": ci[0], "high": ci[1], "method": table.ci_method},
                    "mark": table.mark(model, t),
                    "scores": {str(s): v for s, v in sorted(c.scores.items())},
                    "diverged_seeds": c.diverged,
                    "undefined_seeds": c.undefined,
                    "missing_seeds": c.missing,
                    "lr_key": c.lr_key,
                    "lr": c.lr,
                    "metric": c.metric,
                    "off_protocol": c.off_protocol,
                }
            )
        rows.append(
            {
                "model": model,
                "cells": cells,
                "buckets": {b: table.bucket_mean(model, b) for b in table.buckets},
                "benchmark_scores": {
                    name: table.benchmark_score(model, name) for name in table.benchmark_scores
                },
                "average": table.overall_mean(model),
            }
        )
    return {
        "schema": TABLE_SCHEMA,
        "version": 1,
        "kind": table.kind,
        "std": "sample standard deviation (ddof=1)",
        "ci_method": table.ci_method,
        "expected_seeds": table.expected_seeds,
        "selection_split": table.selection_split,
        "selection_splits": table.selection_splits,
        "benchmark_scores": {
            name: {"label": BENCHMARK_LABELS[name], "tasks": list(BENCHMARK_SCORES[name])}
            for name in table.benchmark_scores
        },
        "average_excludes_buckets": list(SEPARATE_BUCKETS),
        "tasks": [
            {
                "task": t,
                "metric": TASK_KNOBS[t].metric,
                "bucket": TASK_KNOBS[t].bucket,
                "report_split": TASK_KNOBS[t].report_split,
                "dev_reported": TASK_KNOBS[t].report_split == "validation",
            }
            for t in table.tasks
        ],
        "rows": rows,
        "footnotes": footnotes(table),
        "problems": [p.to_dict() for p in table.problems],
    }


CSV_COLUMNS = (
    "model",
    "kind",
    "task",
    "metric",
    "report_split",
    "bucket",
    "lr_key",
    "lr",
    "n",
    "seeds",
    "mean",
    "std",
    "ci_low",
    "ci_high",
    "ci_method",
    "mark",
    "diverged_seeds",
)


def _csv_row(model: str, kind: str, name: str, mean: float | None, **fields) -> list:
    """One row of `render_csv`: the named columns filled, every other one empty."""
    row = dict.fromkeys(CSV_COLUMNS, "")
    row.update(model=model, kind=kind, task=name, mean="" if mean is None else repr(mean))
    row.update(fields)
    return [row[c] for c in CSV_COLUMNS]


def render_csv(table: Table) -> str:
    """Long format: one row per (model, task), then one per bucket and overall average."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for model in table.models:
        for t in table.tasks:
            k = TASK_KNOBS[t]
            c = table.cells.get((model, t))
            known = {"report_split": k.report_split, "bucket": k.bucket}
            if c is None:
                w.writerow(_csv_row(model, "task", t, None, metric=k.metric, **known))
                continue
            ci = table.interval(model, t)
            w.writerow(
                _csv_row(
                    model,
                    "task",
                    t,
                    c.mean,
                    **known,
                    metric=c.metric,
                    lr_key=c.lr_key,
                    lr="" if c.lr is None else f"{c.lr:g}",
                    n=c.n,
                    seeds=" ".join(map(str, sorted(c.scores))),
                    std="" if c.std is None else repr(c.std),
                    ci_low="" if ci is None else repr(ci[0]),
                    ci_high="" if ci is None else repr(ci[1]),
                    ci_method=table.ci_method,
                    mark=table.mark(model, t) or "",
                    diverged_seeds=" ".join(map(str, c.diverged)),
                )
            )
        for b in table.buckets:
            w.writerow(_csv_row(model, "bucket", b, table.bucket_mean(model, b), bucket=b))
        for name in table.benchmark_scores:
            w.writerow(_csv_row(model, "benchmark", name, table.benchmark_score(model, name)))
        w.writerow(_csv_row(model, "average", "", table.overall_mean(model)))
    return buf.getvalue()


def render(table: Table, fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(table)
    if fmt == "json":
        return json.dumps(table_to_dict(table), indent=2) + "\n"
    if fmt == "csv":
        return render_csv(table)
    if fmt == "latex":
        return render_latex(table)
    raise HarnessError(f"--format {fmt!r} must be one of {', '.join(FORMATS)}")


def format_refusal(table: Table, command: str = "summarize") -> str:
    """The refusal of `command` (summarize, report, export, compare) over a table with
    problems: each problem with its cells."""
    refuses = (
        "summarize refuses to print this table"
        if command == "summarize"
        else f"{command} refuses this table"
    )
    lines = [
        f"error: {refuses} ({len(table.problems)} problem(s)); fix "
        "them, or pass --allow-partial to print it anyway with footnotes"
    ]
    for p in table.problems:
        lines.append(f"[{p.rule}] {p.message}:")
        lines += [f"  {c}" for c in p.cells]
    return "\n".join(lines)


def refusal(table: Table, allow_partial: bool, command: str = "summarize") -> str | None:
    """`command`'s refusal message when the table has problems and `--allow-partial` was
    not given; None when the table may be shown."""
    if table.problems and not allow_partial:
        return format_refusal(table, command)
    return None


# ----------------------------------------------------------------------------- loading


def add_table_arguments(
    p: argparse.ArgumentParser,
    *,
    allow_partial: str,
    results_dir: str = "report-phase result directory",
    filters: bool = True,
    several: bool = True,
) -> None:
    """The flags of every command that reads the report table of results folders
    (`load_table`): `--results-dir` and `--selection` (both repeatable:
    `experiment.pair_selections`), `--models`, `--tasks`, `--allow-partial` (its help,
    `allow_partial`, says what the command does despite problems). `filters=False`: no
    `--models`/`--tasks` (`push` shares the whole folder). `several=False`: the command
    reads one folder, and refuses a repeated flag (`one_results_dir`), never keeping the
    last."""
    p.add_argument(
        "--results-dir",
        action="append",
        required=True,
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
    return _Folder(
        path,
        experiment,
        experiment_path,
        selection_path,
        load_selection(selection_path),
        load_results(path, warn=warn, phase="report"),
        ran_seeds,
        select_dir,
    )


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
    table = build_table(results, merged, models=models, tasks=tasks)
    return LoadedTable(
        table,
        results,
        merged,
        [f.selection_path for f in folders],
        {f.path: f.ran_seeds for f in folders},
        list(dict.fromkeys(f.select_dir for f in folders if f.select_dir)),
        dirs,
    )
