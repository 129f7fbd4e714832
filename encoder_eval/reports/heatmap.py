"""The score figure of a table with many models: a models x tasks heatmap.

Grouped bars (`plots.score_figure`) read well for a few models; at the protocol's size
(14 models x 17 tasks: 238 bars in 14 colours, several near-identical) they do not. The
heatmap has one cell per (model, task): its colour is the model's place on that task
(0: the task's worst mean, 1: its best, in the metric's direction), so tasks of different
scales share one colour scale; its text is the mean x100, as in the table. As in the
table, the best model of each task is boxed and bold, `≈` flags every model the marks find
not distinguishable from it, `†` a cell averaged over fewer seeds, and `—` a cell with no
score. `report` draws it past `HEATMAP_MODELS` models.
"""

from __future__ import annotations

from pathlib import Path

from encoder_eval.core.metrics import sign
from encoder_eval.data.tasks import TASK_KNOBS, task_label
from encoder_eval.reports.plots import DPI, SCORE_SCALE, new_figure, save_png
from encoder_eval.reports.table import Table

HEATMAP_MODELS = 4  # more models than this: the report's score figure is the heatmap
CAPTION = (
    "Report scores x100 (mean over seeds), models x tasks: colour is the place within the "
    "task (its best model 1, its worst 0); boxed: the task's best, ≈ not distinguishable "
    "from it (as in the table)"
)


def task_places(table: Table) -> dict[tuple[str, str], float]:
    """Per scored cell, its model's place on its task in [0, 1]: (score - worst) / (best -
    worst) in the metric's direction; 1 for every model when all score the same."""
    out = {}
    for task in table.tasks:
        direction = sign(TASK_KNOBS[task].metric) if task in TASK_KNOBS else 1.0
        scored = {
            m: direction * c.mean
            for m in table.models
            if (c := table.cells.get((m, task))) is not None and c.mean is not None
        }
        if not scored:
            continue
        low, high = min(scored.values()), max(scored.values())
        for m, value in scored.items():
            out[(m, task)] = 1.0 if high == low else (value - low) / (high - low)
    return out


def best_of(table: Table, task: str) -> str | None:
    """The task's best model: the marks' when computed, else the best mean."""
    marks = (table.marks or {}).get(task)
    if marks is not None:
        return marks.best
    places = task_places(table)
    ranked = [m for m in table.models if places.get((m, task)) == 1.0]
    return ranked[0] if len(ranked) == 1 else None


def score_heatmap(table: Table, out_dir: Path) -> Path:
    """Write `scores_heatmap.png` (see the module's docstring) into `out_dir`."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    models, tasks = table.models, table.tasks
    places = task_places(table)
    grid = np.full((len(models), len(tasks)), np.nan)
    for (m, t), value in places.items():
        grid[models.index(m), tasks.index(t)] = value
    width = min(30.0, 3.0 + 0.95 * len(tasks))
    height = min(24.0, 1.9 + 0.42 * len(models))
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    cmap = colormaps["viridis"].with_extremes(bad="0.88")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    expected = len(table.expected_seeds)
    for j, task in enumerate(tasks):
        best = best_of(table, task)
        for i, model in enumerate(models):
            cell = table.cells.get((model, task))
            if cell is None or cell.mean is None:
                ax.text(j, i, "—", ha="center", va="center", fontsize=8, color="0.35")
                continue
            text = f"{SCORE_SCALE * cell.mean:.1f}"
            if table.mark(model, task) == "tied":
                text += "≈"
            if cell.n != expected:
                text += "†"
            place = places[(model, task)]
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if place < 0.55 else "black",
                fontweight="bold" if model == best else "normal",
            )
            if model == best:
                ax.add_patch(
                    Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2)
                )
    labels = [
        task_label(t)
        + ("*" if t in TASK_KNOBS and TASK_KNOBS[t].report_split == "validation" else "")
        for t in tasks
    ]
    ax.set_xticks(range(len(tasks)), labels, rotation=40, ha="right", fontsize=9)
    ax.set_yticks(range(len(models)), models, fontsize=9)
    ax.tick_params(length=0)
    bar = fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01)
    bar.set_label("place within the task (1: its best model)", fontsize=8)
    marks = "boxed: best per task" + (
        "; ≈ not distinguishable from it" if table.marks is not None else " (by mean)"
    )
    title = f"Report scores x100, mean over seeds; {marks}; † fewer seeds; — no score"
    if table.problems:
        title += " (not a protocol table)"
    ax.set_title(title, fontsize=10, loc="left")
    fig.tight_layout()
    path = Path(out_dir) / "scores_heatmap.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path, dpi=DPI)
    return path


def wants_heatmap(table: Table) -> bool:
    """Whether the table's score figure is the heatmap: past `HEATMAP_MODELS` models,
    grouped bars no longer read well."""
    return len(table.models) > HEATMAP_MODELS
