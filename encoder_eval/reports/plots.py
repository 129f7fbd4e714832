"""Figures for a finished sweep: learning-rate sensitivity per (model, task) and final scores.

`plot_lr_sensitivity` draws one PNG per (model, task) from select-phase results: the dev
score against the learning rate, with the seed mean, the seed range, each seed, the seeds
that diverged and the learning rate the selection chose. `plot_final_scores` draws one
grouped bar chart of report scores (tasks on x, one colour per model, 95 % t-interval error
bars). `plot_critical_difference` draws the leaderboard's Friedman/Nemenyi diagram
(`cd.png`). `plot_regression_scatter` and `plot_confusion_matrix` draw a probe's held-out
predictions (NeuCo-Bench mode, `encoder_eval.reports.neuco`). `write_plots` loads result
directories and a selection file and writes the first two; `summarize --plots DIR` calls it.

Figures are drawn on matplotlib's Agg canvas directly (`Figure` + `FigureCanvasAgg`), so
nothing here touches pyplot's global backend or figure registry, and matplotlib is imported
only when a function draws (importing this module stays cheap).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from encoder_eval.core import aggregate
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import atomic_open, safe_filename_part
from encoder_eval.core.protocol import LR_GRID, REPORT_SEEDS, lr_key_for, name_reasons
from encoder_eval.core.results import load_results
from encoder_eval.core.schema import CellResult
from encoder_eval.data.tasks import TASK_KNOBS
from encoder_eval.plans.selection import load_selection as _load

DPI = 120
SCORE_SCALE = 100  # every figure's scores are x100, as the summarize table's
VALIDATION_NOTE = "* reported on the validation split (the task has no labelled test set)"


__all__ = ["safe_filename_part"]  # the one file-name rule (fileio), kept importable here


# --------------------------------------------------------------------------- helpers


def _as_result(result) -> CellResult:
    """Accept a `CellResult`, a `results.LoadedResult` or a result dict (validated here)."""
    if isinstance(result, CellResult):
        return result
    if hasattr(result, "result"):
        return result.result
    return CellResult.from_dict(result)


def save_png(fig, path: Path, **kwargs) -> None:
    """Write a figure as PNG atomically: a reader never sees a half-drawn file."""
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", **kwargs)


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _selection_pairs(selection: dict | None) -> dict:
    """The {model: {task: entry}} mapping of a selection file (or of a plain dict of that shape)."""
    if not isinstance(selection, dict):
        return {}
    pairs = selection.get("pairs", selection)
    return pairs if isinstance(pairs, dict) else {}


def selected_lr(selection: dict | None, model: str, task: str) -> tuple[str | None, float | None]:
    """(lr_key, lr) the selection chose for (model, task); (None, None) when it has no choice.

    An entry may be a dict with `lr_key` and/or `lr`, or a bare lr key string such as 'lr06'.
    """
    entry = _selection_pairs(selection).get(model, {})
    entry = entry.get(task) if isinstance(entry, dict) else None
    if isinstance(entry, str):
        entry = {"lr_key": entry}
    if not isinstance(entry, dict):
        return None, None
    key = entry.get("lr_key") if isinstance(entry.get("lr_key"), str) else None
    lr = entry.get("lr") if _finite(entry.get("lr")) and entry.get("lr") > 0 else None
    if lr is None and key in LR_GRID:
        lr = LR_GRID[key]
    if key is None and lr is not None:
        key = lr_key_for(lr) or f"lr{lr:.3g}"
    if lr is None:
        return key, None
    return key, float(lr)


def _task_info(task: str, results: Iterable[CellResult]) -> tuple[str, str | None]:
    """(metric, report split) of a task: from its results, else from TASK_KNOBS."""
    metric, split = None, None
    for result in results:
        metric = metric or result.metric
        if split is None and result.report is not None and isinstance(result.report.split, str):
            split = result.report.split
    knobs = TASK_KNOBS.get(task)
    if knobs is not None:
        metric = metric or knobs.metric
        split = split or knobs.report_split
    return metric or "score", split


def _task_order(tasks: Iterable[str]) -> list[str]:
    """Tasks in the suite's order (TASK_KNOBS), unknown ones after it, alphabetically."""
    known = list(TASK_KNOBS)
    return sorted(set(tasks), key=lambda t: (0, known.index(t), t) if t in known else (1, 0, t))


def new_figure(width: float, height: float):
    """A figure drawn off screen (Agg, no pyplot state), so plotting works without a display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _model_colours(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# --------------------------------------------------------------------------- LR sensitivity


def plot_lr_sensitivity(
    select_results: list[CellResult | dict], selection: dict | None, out_dir: Path
) -> list[Path]:
    """Write `lr_<model>_<task>.png` for every (model, task) in the select-phase results.

    x: learning rate (log scale; ticks show each value, with its grid key on the top axis);
    y: dev score x100 (`SCORE_SCALE`, the scale of the table and the score chart). Drawn:
    the mean over the seeds that finished (line with markers), their min-max range (shaded
    band), each seed (faint dots), each diverged seed (red x at the bottom of the axes) and
    the selection's chosen learning rate (dashed vertical line).
    Results of another phase are ignored. Returns the written paths, in (model, task) order.
    """
    from matplotlib.ticker import NullFormatter, NullLocator

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_pair: dict[tuple[str, str], list[CellResult]] = {}
    for result in map(_as_result, select_results):
        if result.cell.phase != "select":
            continue
        by_pair.setdefault((result.cell.model, result.cell.task), []).append(result)

    written = []
    for (model, task), results in sorted(by_pair.items()):
        metric, _ = _task_info(task, results)
        # lr -> (lr key, [(seed, dev score)] that finished, [seeds] without a dev score:
        # diverged or undefined); learning rates are grouped by their key, never by value
        lr_of = {r.cell.lr_key: float(r.cell.lr) for r in results}
        points: dict[float, tuple[str, list[tuple[int, float]], list[int]]] = {}
        for (_, _, key), seeds in aggregate.group_by_lr_key(results, "dev").items():
            scaled = [(seed, SCORE_SCALE * score) for seed, score in seeds.finished]
            points[lr_of[key]] = (key, scaled, seeds.diverged + seeds.undefined)
        chosen_key, chosen_lr = selected_lr(selection, model, task)
        if chosen_key in lr_of:
            chosen_lr = lr_of[chosen_key]  # the line sits on the data point of its key

        fig = new_figure(9.5, 5.0)
        ax = fig.add_subplot()
        lrs = sorted(points)
        means, lows, highs = [], [], []
        for lr in lrs:
            scores = [s for _, s in points[lr][1]]
            mean = aggregate.seed_mean(scores)
            means.append(math.nan if mean is None else mean)
            lows.append(min(scores) if scores else math.nan)
            highs.append(max(scores) if scores else math.nan)

        all_scores = [s for lr in lrs for _, s in points[lr][1]]
        if any(len(points[lr][1]) > 1 for lr in lrs):  # a spread exists to show
            ax.fill_between(
                lrs,
                lows,
                highs,
                color="tab:blue",
                alpha=0.18,
                linewidth=0,
                label="seed range (min–max)",
            )
        if all_scores:
            xs = [lr for lr in lrs for _ in points[lr][1]]
            ax.scatter(
                xs,
                all_scores,
                s=16,
                color="0.35",
                alpha=0.45,
                zorder=3,
                linewidths=0,
                label="individual seeds",
            )
            ax.plot(
                lrs,
                means,
                "-o",
                color="tab:blue",
                linewidth=2,
                markersize=6,
                zorder=4,
                label="seed mean",
            )
            lo, hi = min(all_scores), max(all_scores)
            span = hi - lo if hi > lo else max(abs(hi) * 0.05, 0.01 * SCORE_SCALE)
            # Headroom below the data so the diverged markers never sit on a data point.
            ax.set_ylim(lo - 0.22 * span, hi + 0.08 * span)
        else:
            ax.text(
                0.5,
                0.5,
                "no seed finished: every run diverged",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="tab:red",
            )
            ax.set_yticks([])

        n_diverged = sum(len(points[lr][2]) for lr in lrs)
        if n_diverged:
            from matplotlib.transforms import blended_transform_factory

            trans = blended_transform_factory(ax.transData, ax.transAxes)
            xs, ys = [], []
            for lr in lrs:
                for i, _ in enumerate(points[lr][2]):
                    xs.append(lr)
                    ys.append(0.035 + 0.045 * i)  # stack several diverged seeds at one LR
            ax.scatter(
                xs,
                ys,
                marker="x",
                s=45,
                color="tab:red",
                linewidths=2,
                zorder=5,
                transform=trans,
                clip_on=False,
                label=f"diverged seed, drawn at the bottom ({n_diverged} in all)",
            )

        tick_lrs = sorted(set(lrs) | ({chosen_lr} if chosen_lr else set()))
        tick_keys = {lr: points[lr][0] for lr in lrs}
        if chosen_lr and chosen_lr not in tick_keys:
            tick_keys[chosen_lr] = chosen_key or f"lr{chosen_lr:.3g}"
        if chosen_lr is not None:
            ax.axvline(
                chosen_lr,
                color="tab:green",
                linestyle="--",
                linewidth=1.8,
                zorder=2,
                label=f"selected LR: {chosen_key} ({chosen_lr:.3g})",
            )

        ax.set_xscale("log")
        if len(tick_lrs) == 1:  # a single LR: give the log axis some width around it
            ax.set_xlim(tick_lrs[0] / 1.3, tick_lrs[0] * 1.3)
        else:
            ax.set_xlim(tick_lrs[0] / 1.08, tick_lrs[-1] * 1.08)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(
            tick_lrs,
            [f"{lr:.2e}" for lr in tick_lrs],
            rotation=35,
            ha="right",
            rotation_mode="anchor",
            fontsize=9,
        )
        top = ax.secondary_xaxis("top")
        top.xaxis.set_minor_locator(NullLocator())
        top.set_xticks(tick_lrs, [tick_keys[lr] for lr in tick_lrs], fontsize=8, color="0.3")

        ax.set_xlabel("learning rate (log scale)")
        ax.set_ylabel(f"dev score x{SCORE_SCALE} ({metric}), as in the table")
        ax.set_title(f"{model} · {task}: dev {metric} vs learning rate", pad=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.grid(True, axis="x", alpha=0.15)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
        fig.tight_layout()
        path = out_dir / f"lr_{safe_filename_part(model)}_{safe_filename_part(task)}.png"
        save_png(fig, path, dpi=DPI)
        written.append(path)
    return written


# Beyond this many (model, task) pairs a page shows one learning-rate figure per task (every
# model's seed-mean curve, `plot_lr_overview`) instead of one per pair: 14 models x 17 tasks
# drew 238 figures, 100 of a report's 120 CPU seconds and most of a 33 MB page.
MAX_LR_FIGURES = 24


def plot_lr_overview(
    select_results: list[CellResult | dict], selection: dict | None, out_dir: Path
) -> list[Path]:
    """Write `lr_<task>.png` for every task of the select-phase results: per model, its
    seed-mean dev score x100 against the learning rate (log scale), its selected learning
    rate ringed. The per-pair figures (`plot_lr_sensitivity`) add each seed, the spread
    and the diverged seeds. Returns the written paths, in task order."""
    from matplotlib.ticker import NullFormatter, NullLocator

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_task: dict[str, dict[str, list[CellResult]]] = {}
    for result in map(_as_result, select_results):
        if result.cell.phase == "select":
            by_task.setdefault(result.cell.task, {}).setdefault(result.cell.model, []).append(
                result
            )
    written = []
    for task, models in sorted(by_task.items()):
        metric, _ = _task_info(task, [r for rs in models.values() for r in rs])
        fig = new_figure(9.5, 5.0)
        ax = fig.add_subplot()
        all_lrs: set[float] = set()
        for colour, (model, results) in zip(
            _model_colours(len(models)), sorted(models.items()), strict=True
        ):
            lr_of = {r.cell.lr_key: float(r.cell.lr) for r in results}
            curve = {}
            for (_, _, key), seeds in aggregate.group_by_lr_key(results, "dev").items():
                mean = aggregate.seed_mean([score for _, score in seeds.finished])
                curve[lr_of[key]] = math.nan if mean is None else SCORE_SCALE * mean
            lrs = sorted(curve)
            all_lrs |= set(lrs)
            ax.plot(lrs, [curve[lr] for lr in lrs], "-o", color=colour, linewidth=1.5,
                    markersize=3.5, label=model)  # fmt: skip
            chosen_key, _ = selected_lr(selection, model, task)
            if chosen_key in lr_of and not math.isnan(curve.get(lr_of[chosen_key], math.nan)):
                ax.plot([lr_of[chosen_key]], [curve[lr_of[chosen_key]]], "o", markersize=9,
                        markerfacecolor="none", markeredgecolor=colour, markeredgewidth=1.8)  # fmt: skip
        ax.set_xscale("log")
        ticks = sorted(all_lrs)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(ticks, [f"{lr:.2e}" for lr in ticks], rotation=35, ha="right",
                      rotation_mode="anchor", fontsize=9)  # fmt: skip
        ax.set_xlabel("learning rate (log scale)")
        ax.set_ylabel(f"dev score x{SCORE_SCALE} ({metric}), mean over seeds")
        ax.set_title(f"{task}: dev {metric} vs learning rate (ring: the selected LR)", pad=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        path = out_dir / f"lr_{safe_filename_part(task)}.png"
        save_png(fig, path, dpi=DPI)
        written.append(path)
    return written


# --------------------------------------------------------------------------- final scores


def final_score_table(
    report_results: list[CellResult | dict], selection: dict | None = None
) -> dict:
    """Aggregate report results per (model, task), as `plot_final_scores` draws them.

    Returns {(model, task): {"mean", "std", "low", "high", "cut", "n", "n_diverged",
    "lr_keys", "selected", "metric", "split", "off_protocol"}}:
    the mean report score over the seeds that finished (None when none did), its sample
    standard deviation (ddof=1; None with fewer than two seeds), the bounds of its 95 %
    t-interval over seeds cut to the metric's range and whether they were cut
    (`aggregate.seed_interval`, as the table's; None with fewer than two), how many seeds
    finished and diverged, the lr keys averaged, whether they were filtered to a selected LR,
    and the distinct off-protocol reasons its results record (empty: on protocol). The
    numbers come from `aggregate`, as the table's do. With a selection, only results at the
    pair's chosen LR key count; a pair the selection lacks (or has no LR for) keeps all its
    report results and has `selected` False. Results of another phase are ignored.
    """
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for result in map(_as_result, report_results):
        cell = result.cell
        if cell.phase != "report":
            continue
        key, lr = selected_lr(selection, cell.model, cell.task)
        if lr is not None and cell.lr_key != key:
            continue  # a report result at a learning rate the selection did not choose
        groups.setdefault((cell.model, cell.task), []).append(result)

    table = {}
    for (model, task), results in groups.items():
        seeds = aggregate.SeedScores()
        for result in results:
            seeds.add(result, "report")
        metric, split = _task_info(task, results)
        low, high, cut = aggregate.seed_interval(seeds.values, metric) or (None, None, False)
        table[(model, task)] = {
            "selected": selected_lr(selection, model, task)[1] is not None,
            "mean": seeds.mean,
            "std": seeds.std,
            "low": low,
            "high": high,
            "cut": cut,
            "n": seeds.n,
            "n_diverged": len(seeds.diverged),
            "lr_keys": sorted({r.cell.lr_key for r in results}),
            "metric": metric,
            "split": split,
            "off_protocol": list(
                dict.fromkeys(
                    why
                    for r in results
                    if not r.protocol.on_protocol
                    for why in (r.protocol.off_protocol_reasons or ["off-protocol"])
                )
            ),
        }
    return table


def plot_final_scores(
    report_results: list[CellResult | dict],
    out_dir: Path,
    selection: dict | None = None,
    expected_n: int | None = None,
) -> Path:
    """Write `scores.png` (`score_figure`) into `out_dir`; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = score_figure(report_results, selection, expected_n)
    path = out_dir / "scores.png"
    save_png(fig, path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    return path


def score_figure(
    report_results: list[CellResult | dict],
    selection: dict | None = None,
    expected_n: int | None = None,
):
    """The score chart: report score x100 (the table's scale) per task (x) and model (bar
    colour), as a matplotlib Figure.

    A bar is the mean report score over the seeds that finished, at the selection's chosen
    learning rate when `selection` is given and has the pair (else over every report result
    of the pair; a bar averaging several learning rates is hatched); its error bar is the
    95 % t-interval of the mean over seeds, cut to the metric's range as in the table
    (`aggregate.seed_interval`; none with one seed; a cut one is noted). Tasks
    reported on the validation split are marked `*` (explained in a note); tasks named `synthetic_*`
    are labelled "(synthetic)". As in the table, a bar averaged over other than `expected_n`
    seeds (default: the protocol's report seeds) carries `†` (avg@k, in a note), and
    off-protocol results make the title say it is not a protocol figure, with their reasons
    in a note. See `final_score_table`.
    """
    expected_n = len(REPORT_SEEDS) if expected_n is None else expected_n
    groups = final_score_table(report_results, selection)

    models = sorted({m for m, _ in groups}, key=lambda m: (m.lower(), m))
    tasks = _task_order(t for _, t in groups)
    colours = _model_colours(len(models))
    n_models = max(len(models), 1)
    group_width = 0.8
    bar_width = group_width / n_models
    # Wider with every task (about 1 inch for four models), within limits a screen can show.
    width = min(26.0, max(7.0, 3.0 + len(tasks) * max(0.75, 0.16 * n_models + 0.3)))
    fig = new_figure(width, 5.5 if width < 14 else 6.5)
    ax = fig.add_subplot()

    any_validation = False
    any_diverged = False
    any_mixed = False
    cut: list[str] = []  # the bars whose error bar was cut to the metric's range
    partial: dict[int, list[str]] = {}  # avg@k -> the bars averaged over k seeds
    off: dict[str, None] = {}  # the distinct off-protocol reasons of the bars' results
    labels = []
    for ti, task in enumerate(tasks):
        rows = [groups[(m, task)] for m in models if (m, task) in groups]
        metric, split = rows[0]["metric"], rows[0]["split"]
        label = f"{task}{'*' if split == 'validation' else ''}\n({metric})"
        if task.startswith("synthetic_"):
            label += " (synthetic)"
        any_validation |= split == "validation"
        labels.append(label)
        for mi, model in enumerate(models):
            row = groups.get((model, task))
            x = ti - group_width / 2 + bar_width * (mi + 0.5)
            if row is None:  # no report result for this pair: say so instead of a silent gap
                ax.annotate(
                    "n/a",
                    (x, 0),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="0.5",
                )
                continue
            diverged = row["n_diverged"]
            any_diverged |= diverged > 0
            off.update(dict.fromkeys(row["off_protocol"]))
            if row["mean"] is None:
                ax.annotate(
                    "all\ndiverged",
                    (x, 0),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="tab:red",
                )
                continue
            # Hatched: not at a selected LR (the selection lacks the pair), or several LRs.
            mixed = len(row["lr_keys"]) > 1 or (selection is not None and not row["selected"])
            any_mixed |= mixed
            mean = SCORE_SCALE * row["mean"]
            ax.bar(
                x,
                mean,
                bar_width * 0.92,
                color=colours[mi],
                zorder=2,
                hatch="///" if mixed else None,
                edgecolor="white" if mixed else None,
                linewidth=0,
            )
            top = mean
            if row["low"] is not None:
                below, above = row["mean"] - row["low"], row["high"] - row["mean"]
                yerr = [[SCORE_SCALE * max(below, 0.0)], [SCORE_SCALE * max(above, 0.0)]]
                ax.errorbar(x, mean, yerr=yerr, color="black", capsize=3, linewidth=1, zorder=3)
                top = max(top, SCORE_SCALE * row["high"])
                if row["cut"]:
                    cut.append(f"{model}/{task}")
            lift = 2
            if row["n"] != expected_n:  # the table's dagger: averaged over other than avg@n
                partial.setdefault(row["n"], []).append(f"{model}/{task}")
                ax.annotate(
                    "†",
                    (x, top),
                    xytext=(0, lift),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=9,
                )
                lift += 10
            if diverged:
                ax.annotate(
                    f"{diverged} div.",
                    (x, top),
                    xytext=(0, lift),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="tab:red",
                )

    from matplotlib.patches import Patch

    handles = [Patch(color=colours[mi], label=model) for mi, model in enumerate(models)]
    if not tasks:
        ax.text(
            0.5,
            0.5,
            "no report results",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="0.4",
        )
    ax.set_xticks(
        range(len(tasks)),
        labels,
        rotation=30,
        ha="right",
        rotation_mode="anchor",
        multialignment="right",
        fontsize=9,
    )
    ax.set_xlim(-0.6, len(tasks) - 0.4 if tasks else 0.6)
    ax.axhline(0, color="0.3", linewidth=0.8, zorder=1)
    ax.set_ylabel(f"report score x{SCORE_SCALE} (task metric), as in the table")
    ax.set_xlabel("task (metric)")
    which = (
        "at the selected learning rate"
        if selection is not None
        else "over all report results (no selection given)"
    )
    title = (
        f"Report scores {which}\n(bar: mean over seeds, error bar: 95 % t-interval "
        "over seeds; none for one seed)"
    )
    if off:
        title = "Not a protocol figure: off-protocol results (see the note)\n" + title
    ax.set_title(title, pad=10)
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    if handles:
        ax.legend(
            handles=handles,
            title="model",
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=9,
            frameon=False,
        )
    notes = []
    if any_validation:
        notes.append(VALIDATION_NOTE)
    if any_diverged:
        notes.append("red 'n div.' = n seeds diverged (left out of the mean)")
    if any_mixed:
        notes.append("hatched = no selected LR for the pair: mean over all its report results")
    if cut:
        shown = ", ".join(cut[:6]) + (", ..." if len(cut) > 6 else "")
        notes.append(f"error bar cut at the metric's range (as in the table): {shown}")
    for k in sorted(partial):
        shown = ", ".join(partial[k][:6]) + (", ..." if len(partial[k]) > 6 else "")
        notes.append(f"† avg@{k} instead of avg@{expected_n}: {shown}")
    if off:
        notes.append(f"off-protocol: {name_reasons(off)}")
    fig.tight_layout()
    if notes:
        # Place the note just under the tick labels, which tight_layout has already placed.
        renderer = fig.canvas.get_renderer()
        bottom = ax.get_tightbbox(renderer).y0 / fig.bbox.height
        fig.text(
            0.01, bottom - 0.01, "\n".join(notes), ha="left", va="top", fontsize=8.5, color="0.25"
        )
    return fig


# --------------------------------------------------------------------------- critical difference


def plot_critical_difference(result, out_dir: Path) -> Path:
    """Write `cd.png`, Demšar's critical-difference diagram of a
    `leaderboard.CriticalDifference`: the mean-rank axis (1 = best, on the left), each model
    at its mean rank, the Nemenyi CD as a scale bar, and a thick bar joining each group of
    models not significantly different. Only draws; the numbers come from the leaderboard."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = list(result.models)
    ranks = [float(r) for r in result.mean_ranks]
    k = len(models)
    order = sorted(range(k), key=lambda i: (ranks[i], models[i]))
    left = order[: (k + 1) // 2]  # the better half is labelled on the left
    right = order[(k + 1) // 2 :]
    n_rows = max(len(left), len(right))
    fig = new_figure(8.0, 2.2 + 0.32 * n_rows + 0.18 * len(result.cliques))
    ax = fig.add_subplot()
    ax.set_axis_off()
    lo, hi = 1, k
    axis_y = 0.0
    ax.hlines(axis_y, lo, hi, color="black", linewidth=1)
    for t in range(lo, hi + 1):
        ax.vlines(t, axis_y, axis_y + 0.12, color="black", linewidth=1)
        ax.text(t, axis_y + 0.17, str(t), ha="center", va="bottom", fontsize=9)
    for half in (i / 2 for i in range(2 * lo + 1, 2 * hi, 2)):
        ax.vlines(half, axis_y, axis_y + 0.06, color="black", linewidth=0.7)
    # The CD scale bar, above the axis from rank 1.
    cd_y = axis_y + 0.65
    ax.hlines(cd_y, lo, lo + result.cd, color="black", linewidth=1.5)
    ax.vlines([lo, lo + result.cd], cd_y - 0.06, cd_y + 0.06, color="black", linewidth=1.5)
    ax.text(
        lo + result.cd / 2,
        cd_y + 0.09,
        f"CD = {result.cd:.2f}",
        ha="center",
        va="bottom",
        fontsize=9,
    )
    # The cliques, as thick bars just under the axis.
    clique_y = axis_y - 0.2
    for ci, clique in enumerate(result.cliques):
        xs = [ranks[models.index(m)] for m in clique]
        y = clique_y - 0.16 * ci
        ax.hlines(y, min(xs) - 0.03, max(xs) + 0.03, color="tab:red", linewidth=3.5)
    label_top = clique_y - 0.16 * len(result.cliques) - 0.15
    for side, members in (("left", left), ("right", right)):
        for row, i in enumerate(members if side == "left" else reversed(members)):
            y = label_top - 0.3 * row
            x_end = lo - 0.25 if side == "left" else hi + 0.25
            ax.plot([ranks[i], ranks[i], x_end], [axis_y, y, y], color="0.25", linewidth=0.9)
            ax.text(
                x_end + (-0.05 if side == "left" else 0.05),
                y,
                f"{models[i]} ({ranks[i]:.2f})",
                ha="right" if side == "left" else "left",
                va="center",
                fontsize=9,
            )
    bottom = label_top - 0.3 * (n_rows - 1) - 0.3
    ax.set_xlim(
        lo - 0.3 - 0.12 * max(len(m) for m in models) / 2,
        hi + 0.3 + 0.12 * max(len(m) for m in models) / 2,
    )
    ax.set_ylim(bottom, cd_y + 0.45)
    verdict = (
        f"Friedman p = {result.pvalue:.3g} < {result.alpha:g}: bars join models not "
        "significantly different (Nemenyi)"
        if result.rejected
        else f"Friedman p = {result.pvalue:.3g} ≥ {result.alpha:g}: no pair is called different"
    )
    ax.set_title(f"Mean rank over {result.n_tasks} tasks (1 = best)\n{verdict}", fontsize=10)
    fig.tight_layout()
    path = out_dir / "cd.png"
    save_png(fig, path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    return path


# --------------------------------------------------------------------------- probe plots


def plot_regression_scatter(
    folds: list[tuple[Sequence[float], Sequence[float]]], title: str, path: Path
) -> Path:
    """Write a PNG scatter of true against predicted values, one colour per fold, of the
    (labels, predictions) pairs given (a probe's held-out rows), with the identity line."""
    fig = new_figure(5.5, 5.0)
    ax = fig.add_subplot()
    colours = _model_colours(len(folds))
    everything = []
    for i, (labels, preds) in enumerate(folds):
        ax.scatter(labels, preds, s=10, alpha=0.6, color=colours[i], label=f"fold {i + 1}")
        everything += [*labels, *preds]
    lo, hi = (min(everything), max(everything)) if everything else (0.0, 1.0)
    ax.plot([lo, hi], [lo, hi], color="0.3", linestyle="--", linewidth=1, label="y = x")
    ax.set_xlabel("label")
    ax.set_ylabel("prediction")
    ax.set_title(title, fontsize=10)
    if len(folds) <= 10:
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path, dpi=DPI)
    return path


def confusion_counts(folds: list[tuple[Sequence, Sequence]], classes: Sequence) -> list[list[int]]:
    """counts[i][j]: rows of true class `classes[i]` predicted `classes[j]`, summed over the
    (labels, predictions) pairs given."""
    index = {c: i for i, c in enumerate(classes)}
    counts = [[0] * len(classes) for _ in classes]
    for labels, preds in folds:
        for true, pred in zip(labels, preds, strict=True):
            counts[index[true]][index[pred]] += 1
    return counts


def plot_confusion_matrix(
    folds: list[tuple[Sequence, Sequence]], classes: Sequence, title: str, path: Path
) -> Path:
    """Write a PNG confusion matrix (rows: true class, columns: predicted; counts summed
    over the (labels, predictions) pairs given, a probe's held-out rows of each fold)."""
    counts = confusion_counts(folds, classes)
    side = 2.5 + 0.5 * len(classes)
    fig = new_figure(side + 1.0, side)
    ax = fig.add_subplot()
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    top = max(max(row) for row in counts) or 1
    for i, row in enumerate(counts):
        for j, value in enumerate(row):
            ax.text(
                j,
                i,
                str(value),
                ha="center",
                va="center",
                fontsize=9,
                color="white" if value > top / 2 else "black",
            )
    ticks = list(range(len(classes)))
    ax.set_xticks(ticks, [str(c) for c in classes])
    ax.set_yticks(ticks, [str(c) for c in classes])
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path, dpi=DPI)
    return path


# --------------------------------------------------------------------------- convenience


def load_selection(path: str | Path, warn: Callable[[str], None] | None = None) -> dict | None:
    """Read a selection file with `select.load_selection`; warn and return None when bad."""
    try:
        return _load(path)
    except HarnessError as exc:
        if warn is not None:
            warn(f"plotting without a selection: {exc}")
        return None


def write_plots(
    results_dir_select: Path | list[Path] | None,
    results_dir_report: Path | list[Path] | None,
    selection_path: Path | None,
    out_dir: Path,
    warn: Callable[[str], None] | None = None,
    expected_n: int | None = None,
    selection: dict | None = None,
    max_lr_figures: int | None = None,
) -> list[Path]:
    """Load select/report results and the selection, write every figure into `out_dir`
    (`expected_n`: the report seeds a score chart's bar averages without a `†`). Each
    results argument is a folder or a list of folders (a table over several,
    `table_loading.load_table`); `selection`, when given, is the selection already read (the one a
    table over several folders merged) instead of `selection_path`.

    Bad result files are skipped with one warning each (`results.load_results`). The LR
    sensitivity plots need select results, the score chart report results; a part whose
    input is missing is skipped with a warning. With `max_lr_figures`, more (model, task)
    pairs than that get one overview figure per task (`plot_lr_overview`) instead of one
    figure per pair. Returns the written paths.
    """
    import sys

    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if selection is None and selection_path is not None:
        selection = load_selection(selection_path, warn)
    written: list[Path] = []
    for phase, dirs in (("select", results_dir_select), ("report", results_dir_report)):
        if dirs is None:
            continue
        dirs = [Path(d) for d in ([dirs] if isinstance(dirs, (str, Path)) else dirs)]
        cells = {}  # a cell in two folders (the same content: `load_table`) counts once
        for d in dirs:
            for r in load_results(d, warn=warn, phase=phase):
                c = r.cell
                cells.setdefault((c["model"], c["task"], c["lr_key"], c["seed"]), r.result)
        found = list(cells.values())
        where = ", ".join(map(str, dirs))
        if phase == "select" and found:
            pairs = {(model, task) for model, task, _, _ in cells}
            if max_lr_figures is not None and len(pairs) > max_lr_figures:
                written += plot_lr_overview(found, selection, out_dir)
            else:
                written += plot_lr_sensitivity(found, selection, out_dir)
        elif phase == "select":
            warn(f"no select results under {where}: no learning-rate plots")
        elif found:
            written.append(plot_final_scores(found, out_dir, selection, expected_n))
        else:
            warn(f"no report results under {where}: no score chart")
    return written
