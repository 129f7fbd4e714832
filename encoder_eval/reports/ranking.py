"""Models ranked across tasks: mean ranks, aggregates (mean score, NeuCo-Bench's weighted
score, wins), bootstrap intervals of each position, and the Friedman test with Nemenyi's
critical difference.

`build_leaderboard` turns a `Table` (fine-tune or probe) into a `Leaderboard`; the statistics
are EVALUATION_METHODOLOGY.md section 11. The command is `encoder_eval.leaderboard`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field

import numpy as np

from encoder_eval.core.errors import (
    HarnessError,
)
from encoder_eval.core.metrics import direction, sign
from encoder_eval.reports import latex
from encoder_eval.reports.table import Table
from encoder_eval.reports.table_render import format_refusal

LEADERBOARD_SCHEMA = "encoder-eval-leaderboard"
DEFAULT_SEED = 0
DEFAULT_REPLICATES = 1000
CONFIDENCE = 0.95
ALPHA = 0.05  # the Friedman test's and the Nemenyi critical difference's level
# The four aggregates: name -> (label, whether a higher value is better).
AGGREGATES: dict[str, tuple[str, bool]] = {
    "mean_score": ("Mean score", True),
    "mean_rank": ("Mean rank", False),
    "borda": ("Borda", True),
    "neuco_rank": ("NeuCo weighted rank", False),
}


@dataclass(frozen=True)
class Scores:
    """The complete models' report scores: `seeds[i][j]` the seed scores of model i on task j
    (oriented so that higher is better), and which tasks' metrics are lower-is-better."""

    models: list[str]
    tasks: list[str]
    seeds: list[list[np.ndarray]]
    flipped: list[str] = field(default_factory=list)  # tasks whose scores were negated

    def task_means(self) -> np.ndarray:
        """The (models x tasks) matrix of task means over seeds."""
        return np.array([[float(np.mean(s)) for s in row] for row in self.seeds])


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of one model: its value, its position among the models (1 = best, ties
    averaged) and the bootstrap percentile interval of that position (None without one)."""

    value: float
    position: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class CriticalDifference:
    """Friedman's test across tasks and Nemenyi's critical difference of mean ranks: `cliques`
    are the maximal groups of models (by mean rank) not significantly different; when Friedman
    does not reject at `alpha`, no pair is called different and one clique holds every model."""

    models: list[str]
    mean_ranks: list[float]
    n_tasks: int
    statistic: float
    pvalue: float
    alpha: float
    q_alpha: float
    cd: float
    rejected: bool
    cliques: list[list[str]]


@dataclass
class Leaderboard:
    models: list[str]  # ordered by mean rank (ties by mean score, then name)
    tasks: list[str]
    task_means: dict[str, dict[str, float]]  # model -> task -> mean (as reported, not negated)
    task_ranks: dict[str, dict[str, float]]
    weights: dict[str, float]  # the NeuCo task weights
    equal_weights: bool  # every task's std was 0
    aggregates: dict[str, dict[str, Aggregate]]  # model -> aggregate name -> Aggregate
    replicates: int
    seed: int
    dropped: dict[str, list[str]]  # model -> what it misses (only with --allow-partial)
    problems: list[str]  # the summarize table's problems, as notes (only with --allow-partial)
    flipped: list[str]
    critical_difference: CriticalDifference | None
    cd_note: str | None  # why there is no critical difference
    kind: str = "fine-tune"  # the table's kind: "probe" rows are model:pooling, folds as seeds


# ----------------------------------------------------------------------------- inputs


def missing_tasks(table: Table) -> dict[str, list[str]]:
    """{model: ['task (why)', ...]} for every model of `table` lacking a task: no cell, or no
    finished seed in it."""
    missing: dict[str, list[str]] = {}
    for model in table.models:
        for task in table.tasks:
            cell = table.cells.get((model, task))
            if cell is None:
                why = "no cell (no selected LR)"
            elif cell.n == 0 and (cell.diverged or cell.undefined):
                why = "no finished report seed"
            elif cell.n == 0:
                why = "no report result"
            else:
                continue
            missing.setdefault(model, []).append(f"{task} ({why})")
    return missing


def table_scores(table: Table, models: list[str] | None = None) -> Scores:
    """The seed scores of `models` (default: every model of the table) on every task,
    negated for a lower-is-better metric so that higher is better throughout."""
    models = list(table.models if models is None else models)
    flipped = []
    for task in table.tasks:
        metrics = {table.cells[(m, task)].metric for m in models}
        if any(sign(m) < 0 for m in metrics):
            flipped.append(task)
    seeds = []
    for model in models:
        row = []
        for task in table.tasks:
            values = np.array([v for _, v in sorted(table.cells[(model, task)].scores.items())])
            row.append(-values if task in flipped else values)
        seeds.append(row)
    return Scores(models, list(table.tasks), seeds, flipped)


# ----------------------------------------------------------------------------- aggregates


def task_ranks(means: np.ndarray) -> np.ndarray:
    """Per task (column), the models' ranks by task mean: 1 = best, ties share the average."""
    from scipy import stats as sps  # on use: `leaderboard --help` stays light

    return sps.rankdata(-means, method="average", axis=0)


def neuco_weights(means: np.ndarray) -> tuple[np.ndarray, bool]:
    """NeuCo-Bench's task weights: each task's std of task means across models over the sum
    of those stds (the ddof cancels out); equal weights, and True, when every std is 0."""
    stds = np.std(means, axis=0)
    total = float(stds.sum())
    if total == 0.0:
        return np.full(means.shape[1], 1.0 / means.shape[1]), True
    return stds / total, False


def aggregates(means: np.ndarray) -> dict[str, np.ndarray]:
    """The four aggregates of each model (rows) from the (models x tasks) task-mean matrix,
    higher is better in `means`."""
    ranks = task_ranks(means)
    weights, _ = neuco_weights(means)
    k = means.shape[0]
    return {
        "mean_score": means.mean(axis=1),
        "mean_rank": ranks.mean(axis=1),
        "borda": (k - ranks).sum(axis=1),  # models beaten + 0.5 per tie = k - average rank
        "neuco_rank": ranks @ weights,
    }


def positions(values: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Each model's position under one aggregate: 1 = best, ties share the average."""
    from scipy import stats as sps

    return sps.rankdata(-direction(higher_is_better) * values, method="average")


def bootstrap_positions(scores: Scores, replicates: int, seed: int) -> dict[str, np.ndarray]:
    """{aggregate: (replicates x models) positions}: each replicate resamples every (model,
    task)'s seeds with replacement, then the tasks with replacement, and recomputes the
    aggregates (the NeuCo weights on the resampled tasks)."""
    rng = np.random.default_rng(seed)
    k, n_tasks = len(scores.models), len(scores.tasks)
    means = np.empty((replicates, k, n_tasks))
    for i, row in enumerate(scores.seeds):
        for j, values in enumerate(row):
            draws = rng.integers(0, values.size, size=(replicates, values.size))
            means[:, i, j] = values[draws].mean(axis=1)
    task_draws = rng.integers(0, n_tasks, size=(replicates, n_tasks))
    out = {name: np.empty((replicates, k)) for name in AGGREGATES}
    for b in range(replicates):
        values = aggregates(means[b][:, task_draws[b]])
        for name, (_, higher) in AGGREGATES.items():
            out[name][b] = positions(values[name], higher)
    return out


# ----------------------------------------------------------------------------- Friedman


def nemenyi_q(k: int, alpha: float = ALPHA) -> float:
    """The Nemenyi test's q_alpha for k models: the studentized range quantile on infinite
    degrees of freedom over sqrt(2) (Demšar 2006, table 5a: k=3 gives 2.343 at 0.05)."""
    from scipy import stats as sps

    return float(sps.studentized_range.ppf(1.0 - alpha, k, np.inf) / math.sqrt(2.0))


def _cliques(models: list[str], mean_ranks: np.ndarray, cd: float) -> list[list[str]]:
    """Maximal runs of models, ordered by mean rank, whose mean ranks differ by less than
    `cd` (not significantly different); a model alone is no clique."""
    order = np.argsort(mean_ranks, kind="stable")
    r = mean_ranks[order]
    spans: list[tuple[int, int]] = []
    for i in range(len(r)):
        j = i
        while j + 1 < len(r) and r[j + 1] - r[i] < cd:
            j += 1
        if j > i and not any(a <= i and j <= b for a, b in spans):
            spans.append((i, j))
    return [[models[order[x]] for x in range(a, b + 1)] for a, b in spans]


def critical_difference(
    means: np.ndarray, models: list[str], alpha: float = ALPHA
) -> CriticalDifference:
    """Friedman's test (scipy `friedmanchisquare`, tasks as blocks) on the (models x tasks)
    task means, higher is better, and Nemenyi's CD = q_alpha sqrt(k(k+1)/(6N)). Needs three
    models or more and two tasks or more (HarnessError otherwise)."""
    k, n = means.shape
    if k < 3:
        raise HarnessError(f"the Friedman test needs three models or more, got {k}")
    if n < 2:
        raise HarnessError(f"the Friedman test needs two tasks or more, got {n}")
    from scipy import stats as sps

    res = sps.friedmanchisquare(*means)
    statistic, pvalue = float(res.statistic), float(res.pvalue)
    if not math.isfinite(statistic):
        raise HarnessError("the Friedman test is undefined: every task ties all models")
    mean_ranks = task_ranks(means).mean(axis=1)
    q = nemenyi_q(k, alpha)
    cd = q * math.sqrt(k * (k + 1) / (6.0 * n))
    rejected = pvalue < alpha
    cliques = _cliques(models, mean_ranks, cd) if rejected else [list(models)]
    return CriticalDifference(
        list(models),
        [float(x) for x in mean_ranks],
        n,
        statistic,
        pvalue,
        alpha,
        q,
        cd,
        rejected,
        cliques,
    )


# ----------------------------------------------------------------------------- the board


def build_leaderboard(
    table: Table,
    *,
    allow_partial: bool = False,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = DEFAULT_SEED,
) -> Leaderboard:
    """The leaderboard of `table`'s complete models; raises `Refused` when a model misses a
    task or the table has problems, unless `allow_partial` (then those become notes)."""
    if replicates < 1:
        raise HarnessError(f"--bootstrap {replicates}: give a number of replicates >= 1")
    missing = missing_tasks(table)
    if (missing or table.problems) and not allow_partial:
        raise Refused(table, missing)
    models = [m for m in table.models if m not in missing]
    if not models:
        raise Refused(table, missing, "no model has a score on every task")
    scores = table_scores(table, models)
    means = scores.task_means()
    ranks = task_ranks(means)
    weights, equal = neuco_weights(means)
    values = aggregates(means)
    boot = bootstrap_positions(scores, replicates, seed)
    lo, hi = 100 * (1 - CONFIDENCE) / 2, 100 * (1 + CONFIDENCE) / 2
    per_model: dict[str, dict[str, Aggregate]] = {m: {} for m in models}
    for name, (_, higher) in AGGREGATES.items():
        pos = positions(values[name], higher)
        low, high = np.percentile(boot[name], [lo, hi], axis=0)
        for i, m in enumerate(models):
            per_model[m][name] = Aggregate(
                float(values[name][i]), float(pos[i]), float(low[i]), float(high[i])
            )
    signs = np.array([direction(t not in scores.flipped) for t in scores.tasks])
    shown = means * signs  # back to the metric's own direction for display
    cd, cd_note = None, None
    try:
        cd = critical_difference(means, models)
    except HarnessError as exc:
        cd_note = f"no critical-difference test: {exc}"
    order = sorted(
        range(len(models)),
        key=lambda i: (values["mean_rank"][i], -values["mean_score"][i], models[i]),
    )
    return Leaderboard(
        models=[models[i] for i in order],
        tasks=list(scores.tasks),
        task_means={
            m: dict(zip(scores.tasks, map(float, shown[i]), strict=True))
            for i, m in enumerate(models)
        },
        task_ranks={
            m: dict(zip(scores.tasks, map(float, ranks[i]), strict=True))
            for i, m in enumerate(models)
        },
        weights=dict(zip(scores.tasks, map(float, weights), strict=True)),
        equal_weights=equal,
        aggregates=per_model,
        replicates=replicates,
        seed=seed,
        dropped={m: missing[m] for m in table.models if m in missing},
        problems=[f"{p.message} [{p.rule}]" for p in table.problems],
        flipped=scores.flipped,
        critical_difference=cd,
        cd_note=cd_note,
        kind=table.kind,
    )


class Refused(Exception):
    """The table cannot be ranked: models miss tasks, or the summarize table has problems."""

    def __init__(self, table: Table, missing: dict[str, list[str]], why: str | None = None):
        super().__init__(why or "refused")
        self.table, self.missing, self.why = table, missing, why

    def message(self) -> str:
        lines = []
        if self.why:
            lines.append(f"error: leaderboard refuses: {self.why}")
        if self.missing:
            if not self.why:
                lines.append(
                    f"error: leaderboard refuses: {len(self.missing)} model(s) miss a "
                    "task; run the missing cells, or pass --allow-partial to drop "
                    "those models (the output says so)"
                )
            lines += [f"  {m}: {', '.join(tasks)}" for m, tasks in self.missing.items()]
        if self.table.problems and not self.why:
            lines.append(format_refusal(self.table))
        return "\n".join(lines)


# ----------------------------------------------------------------------------- rendering


def _fmt_value(name: str, value: float) -> str:
    return f"{100 * value:.2f}" if name == "mean_score" else f"{value:.2f}"


def _fmt_pos(x: float) -> str:
    return f"{x:g}"


def format_aggregate(name: str, agg: Aggregate) -> str:
    """`72.31 (1; 1–2)`: the value, the position and its bootstrap interval."""
    interval = f"{_fmt_pos(agg.low)}–{_fmt_pos(agg.high)}"
    return f"{_fmt_value(name, agg.value)} ({_fmt_pos(agg.position)}; {interval})"


def notes(board: Leaderboard) -> list[str]:
    """The lines under the table: what each cell is, the bootstrap, drops and problems."""
    pct = f"{100 * CONFIDENCE:g} %"
    out = [
        f"Over {len(board.tasks)} task(s): {', '.join(board.tasks)}. Each cell: the aggregate "
        f"(the model's position under it, 1 = best; {pct} bootstrap interval of that position).",
        "Mean score x100: mean over tasks of the task mean (each task weighs the same). Mean "
        "rank: per task rank by task mean (1 = best, ties averaged), mean over tasks; lowest "
        "best. Borda: per task the number of models beaten (a tie 0.5), summed; highest best. "
        "NeuCo weighted rank: Σ task rank x task weight; lowest best.",
        "NeuCo task weights (std of the task means across models / sum of those stds): "
        + ", ".join(f"{t} {w:.3f}" for t, w in board.weights.items())
        + (" (every std is 0: equal weights)" if board.equal_weights else "")
        + ".",
        f"Bootstrap: {board.replicates} replicates, seed {board.seed}; each resamples every "
        f"(model, task)'s {'probe folds' if board.kind == 'probe' else 'seeds'} and then the "
        "tasks with replacement; interval = 2.5 and 97.5 percentiles of the position.",
    ]
    if board.flipped:
        out.append(f"Lower-is-better metrics enter negated: {', '.join(board.flipped)}.")
    cd = board.critical_difference
    if cd is not None:
        verdict = (
            "rejects equal mean ranks"
            if cd.rejected
            else "does not reject equal mean ranks: no pair is called different"
        )
        groups = "; ".join("{" + ", ".join(c) + "}" for c in cd.cliques) or "none"
        out.append(
            f"Friedman χ² = {cd.statistic:.3f}, p = {cd.pvalue:.3g} (k = {len(cd.models)} "
            f"models, N = {cd.n_tasks} tasks): {verdict} at α = {cd.alpha:g}. Nemenyi CD = "
            f"{cd.cd:.3f} (q = {cd.q_alpha:.3f}); not significantly different: {groups}."
        )
    elif board.cd_note:
        out.append(board.cd_note[0].upper() + board.cd_note[1:] + ".")
    for model, what in board.dropped.items():
        out.append(f"Dropped (--allow-partial): {model}, missing {', '.join(what)}.")
    for problem in board.problems:
        out.append(f"Not a protocol table: {problem}.")
    return out


def _grid(board: Leaderboard) -> tuple[list[str], list[list[str]]]:
    head = ["Model", *(label for label, _ in AGGREGATES.values())]
    return head, [
        [m, *(format_aggregate(n, board.aggregates[m][n]) for n in AGGREGATES)]
        for m in board.models
    ]


def render_markdown(board: Leaderboard) -> str:
    head, rows = _grid(board)
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(AGGREGATES)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([*lines, "", *notes(board)]) + "\n"


def render_latex(board: Leaderboard) -> str:
    """The leaderboard as a booktabs table, its notes as table notes."""
    head, rows = _grid(board)
    return latex.render_table(head, rows, notes(board))


def leaderboard_to_dict(board: Leaderboard) -> dict:
    """The leaderboard as plain data (the json format)."""
    cd = board.critical_difference
    return {
        "schema": LEADERBOARD_SCHEMA,
        "version": 1,
        "tasks": board.tasks,
        "aggregates": {
            n: {"label": lab, "higher_is_better": hib} for n, (lab, hib) in AGGREGATES.items()
        },
        "rows": [
            {
                "model": m,
                "task_means": board.task_means[m],
                "task_ranks": board.task_ranks[m],
                **{
                    n: {"value": a.value, "position": a.position, "low": a.low, "high": a.high}
                    for n, a in board.aggregates[m].items()
                },
            }
            for m in board.models
        ],
        "neuco_weights": board.weights,
        "neuco_equal_weights": board.equal_weights,
        "bootstrap": {
            "replicates": board.replicates,
            "seed": board.seed,
            "confidence": CONFIDENCE,
        },
        "critical_difference": None
        if cd is None
        else {
            "friedman_statistic": cd.statistic,
            "friedman_p": cd.pvalue,
            "alpha": cd.alpha,
            "rejected": cd.rejected,
            "q_alpha": cd.q_alpha,
            "cd": cd.cd,
            "n_tasks": cd.n_tasks,
            "mean_ranks": dict(zip(cd.models, cd.mean_ranks, strict=True)),
            "cliques": cd.cliques,
        },
        "dropped": board.dropped,
        "problems": board.problems,
        "negated_tasks": board.flipped,
        "notes": notes(board),
    }


def render_csv(board: Leaderboard) -> str:
    """Long format: one row per (model, aggregate)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "aggregate", "value", "position", "low", "high"])
    for m in board.models:
        for n, a in board.aggregates[m].items():
            w.writerow([m, n, repr(a.value), a.position, a.low, a.high])
    return buf.getvalue()


def render(board: Leaderboard, fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(board)
    if fmt == "json":
        return json.dumps(leaderboard_to_dict(board), indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        return render_csv(board)
    if fmt == "latex":
        return render_latex(board)
    raise HarnessError(f"--format {fmt!r} must be markdown, json or csv")


# ----------------------------------------------------------------------------- command
