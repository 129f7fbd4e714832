"""The results table: mean ± std over the report seeds at each pair's selected LR and its
refusal rules.

`build_table` turns loaded results and a selection into a `Table`; every problem that makes
the table unpublishable is a `Problem` naming its rule and cells (the rules are listed in
`encoder-eval summarize --help` and EVALUATION_METHODOLOGY.md). Its renderings (markdown,
json, csv, latex, footnotes, refusal) are `reports/table_render.py`; reading one or several
results folders into a table is `reports/table_loading.py`. The command is
`encoder_eval.summarize`; `compare`, `leaderboard` and the probe tables build on `Table`.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from encoder_eval.core import aggregate
from encoder_eval.core.comparability import cell_setup, setup_differences, transformers_version
from encoder_eval.core.errors import (
    HarnessError,
    brief,
)
from encoder_eval.core.metrics import metric_spec
from encoder_eval.core.protocol import LR_GRID, REPORT_SEEDS, SELECT_SEEDS, name_reasons
from encoder_eval.core.results import LoadedResult, result_filename
from encoder_eval.data.tasks import (
    BENCHMARK_SCORES,
    TASK_KNOBS,
    in_suite_average,
    task_knobs,
    task_label,
)

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
CI_METHODS = ("t", "bootstrap")
BUCKET_ORDER = ("multilingual", "glue", "superglue", "ranking")


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
        """The cells with a score over other than the expected seeds (`†`); a cell with no
        score is `—`, not one of them (`empty_cells`)."""
        n = len(self.expected_seeds)
        return [c for c in self.cells.values() if c.n != n and c.mean is not None]

    def empty_cells(self) -> list[CellStats]:
        """The selected cells with no score (no finished seed or fold): shown as `—`."""
        return [c for c in self.cells.values() if c.mean is None]


def task_header(task: str) -> str:
    knobs = TASK_KNOBS[task]
    star = "*" if knobs.report_split == "validation" else ""
    metric = metric_spec(knobs.metric).label
    return f"{task_label(task)}{star} ({metric})"


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
    by_backend: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
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
        if "attn_backend" in setup:  # (nor this, before issue 49)
            by_backend[c.cell["model"]][setup["attn_backend"]].append(c)
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
        ("loader", "{}'s attention kernel (SDPA backend)", by_backend),
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
    unusable: dict[str, str] | None = None,
) -> Table:
    """Aggregate report-phase results at each pair's selected LR and collect every problem.
    `unusable` names the result files that are there but not done results (file name ->
    `status`'s word and why, `table_loading.unusable_files`): such a seed is listed as
    that, not as missing."""
    unusable = unusable or {}
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
                name = result_filename(model, task, lr, s)
                missing_cells.append(
                    f"{model}/{task}/{key}/s{s}: {unusable.get(name) or f'missing ({name})'}"
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
        words = Counter(c.split(": ", 1)[1].split(" ", 1)[0] for c in missing_cells)
        what = (
            "are missing"
            if set(words) == {"missing"}
            else "have no done result ("
            + ", ".join(f"{k} {w}" for w, k in sorted(words.items(), key=lambda x: x[0]))
            + ")"
        )
        problems.append(
            Problem("missing_seeds", f"{len(missing_cells)} report seed(s) {what}", missing_cells)
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
