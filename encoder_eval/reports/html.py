"""A report to browse: one self-contained HTML file of a results folder.

`build_report` gathers what the other report commands compute (the `summarize` table with
its footnotes, its figures, `compare`'s verdicts, the leaderboard with its
critical-difference plot, a probe table) into a `Report`; `render_html` writes it as one
page that needs no network when viewed: inline CSS, the figures as base64 `data:` URIs,
one short inline script (it opens the provenance of a cell whose link was followed), and
the table's json (`table_to_dict`, what `summarize --format json` prints) embedded for
tools. Every user string (model, task and file names, notes, recorded JSON) is escaped
with `html.escape`. The command is `encoder_eval.report`.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from encoder_eval import __version__
from encoder_eval.core import stats
from encoder_eval.core.results import LoadedResult
from encoder_eval.reports.comparison_cache import ComparisonCache
from encoder_eval.reports.heatmap import CAPTION as HEATMAP_CAPTION
from encoder_eval.reports.heatmap import score_heatmap, wants_heatmap
from encoder_eval.reports.latex import Score
from encoder_eval.reports.plots import MAX_LR_FIGURES, plot_critical_difference, write_plots
from encoder_eval.reports.probe_table import load_probe_results, probe_folder, probe_table
from encoder_eval.reports.ranking import (
    AGGREGATES,
    Leaderboard,
    Refused,
    build_leaderboard,
    format_aggregate,
)
from encoder_eval.reports.ranking import notes as leaderboard_notes
from encoder_eval.reports.stats_settings import DEFAULTS, StatsSettings
from encoder_eval.reports.table import Table
from encoder_eval.reports.table_loading import check_results_dirs, load_table
from encoder_eval.reports.table_render import footnotes, refusal, table_grid
from encoder_eval.reports.table_render import table_to_dict as table_dict
from encoder_eval.reports.verdicts import (
    VERDICT_FLAGS,
    Comparison,
    add_statistics,
    compare_table,
    included_cells,
)
from encoder_eval.reports.verdicts_render import footnotes as compare_footnotes

# What a cell's provenance panel shows of each result file, in this order.
PROVENANCE_SECTIONS = ("cell", "protocol", "recipe", "provenance", "training")


@dataclass
class Figure:
    """A PNG to embed, with its caption."""

    caption: str
    png: bytes
    wide: bool = False  # drawn for the section's whole width (the heatmap)


@dataclass
class Report:
    """Everything the page shows; `notes` say why a section is absent."""

    title: str
    table: Table
    cells: dict[tuple[str, str], list[tuple[LoadedResult, bool]]]  # results, counted or not
    figures: list[Figure] = field(default_factory=list)
    comparison: Comparison | None = None
    leaderboard: Leaderboard | None = None
    cd_plot: Figure | None = None
    probe: Table | None = None  # a probe table shown beside a fine-tune table
    notes: dict[str, str] = field(default_factory=dict)  # section -> why it is not shown


# ----------------------------------------------------------------------------- gathering


def _png(path: Path, caption: str, wide: bool = False) -> Figure:
    return Figure(caption, Path(path).read_bytes(), wide)


def _cell_results(
    table: Table, results: list[LoadedResult]
) -> dict[tuple[str, str], list[tuple[LoadedResult, bool]]]:
    """Per table cell, every report result of its pair, each flagged with whether the cell's
    score counts it (finished, at the selected LR; `verdicts.included_cells`)."""
    counted = {id(r) for rs in included_cells(table, results).values() for r in rs}
    out: dict[tuple[str, str], list[tuple[LoadedResult, bool]]] = {}
    for r in sorted(results, key=lambda r: (r.cell["lr_key"], r.cell["seed"])):
        key = (r.cell["model"], r.cell["task"])
        if key in table.cells or (key[0] in table.models and key[1] in table.tasks):
            out.setdefault(key, []).append((r, id(r) in counted))
    return out


def _leaderboard(report: Report, table: Table, allow_partial: bool, workdir: Path) -> None:
    """Add the leaderboard and its critical-difference plot, or the reason there is none."""
    try:
        board = build_leaderboard(table, allow_partial=allow_partial)
    except Refused as exc:
        report.notes["leaderboard"] = exc.message().replace("error: ", "", 1)
        return
    report.leaderboard = board
    if board.critical_difference is None:
        report.notes["cd"] = board.cd_note or "no critical-difference test"
    else:
        path = plot_critical_difference(board.critical_difference, workdir / "cd")
        report.cd_plot = _png(path, "Critical difference: mean rank over tasks (Nemenyi)")


def build_report(
    results_dir: str | Path | list,
    *,
    selection: str | None = None,
    select_results_dir: str | None = None,
    probe_results_dir: str | None = None,
    models: list[str] | None = None,
    tasks: list[str] | None = None,
    allow_partial: bool = False,
    settings: StatsSettings = DEFAULTS,
    cache: ComparisonCache | None = None,
    title: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> Report:
    """Read a report-phase results folder (or a folder of probe results) and compute every
    section. The caller checks `report.table.problems` first: a table with problems is
    refused unless `allow_partial`, as `summarize` refuses it. `settings`: the marks as
    `summarize` makes them, the verdicts as `compare` makes them (`StatsSettings`); the
    comparisons are read from / kept in `cache`. `results_dir`: a folder,
    or several (one table over them, `table_loading.load_table`; fine-tuned report results only)."""
    dirs = check_results_dirs(results_dir)
    title = title or f"encoder-eval report: {', '.join(Path(d).name for d in dirs)}"
    if probes := probe_folder(dirs):
        table = probe_table(load_probe_results(probes, warn=warn), models=models, tasks=tasks)
        report = Report(title, table, {})
        report.notes["compare"] = "probe results: compare reads fine-tuned report cells"
        report.notes["figures"] = "probe results: no learning-rate or score figures"
    else:
        loaded = load_table(dirs, selection, models=models, tasks=tasks, warn=warn)
        table, results = loaded.table, loaded.results
        report = Report(title, table, {})
        if refusal(table, allow_partial) is not None:
            return report  # refused: nothing else is computed
        if len(table.models) >= 2:  # first: its full rows also serve the marks' requests
            report.comparison = compare_table(
                table,
                results,
                settings,
                cache,
                flags=VERDICT_FLAGS,  # the page shows the bootstrap interval, not the rest
            )
        else:
            report.notes["compare"] = "compare needs at least two models"
        add_statistics(table, results, replace(settings, ci="t"), cache)
        report.cells = _cell_results(table, results)
        with tempfile.TemporaryDirectory(prefix="encoder-eval-report-") as tmp:
            select_dirs = [select_results_dir] if select_results_dir else loaded.select_dirs
            written = write_plots(
                [Path(d) for d in select_dirs] or None,
                [Path(d) for d in dirs],
                None,
                Path(tmp) / "plots",
                warn=warn,
                selection=loaded.selection,
                max_lr_figures=MAX_LR_FIGURES,
            )
            # The score chart first, then the learning-rate curves in file order. Past a
            # few models the chart is the models x tasks heatmap, not grouped bars.
            heat = wants_heatmap(table)
            if heat:
                path = score_heatmap(table, Path(tmp) / "heatmap")
                report.figures.append(_png(path, HEATMAP_CAPTION, wide=True))
            for path in sorted(written, key=lambda p: (p.name != "scores.png", p.name)):
                if heat and path.name == "scores.png":
                    continue
                caption = (
                    "Report scores (mean over seeds, 95 % t-interval)"
                    if path.name == "scores.png"
                    else "Learning-rate sensitivity: " + path.stem.removeprefix("lr_")
                )
                report.figures.append(_png(path, caption))
            if not select_dirs:
                report.notes["lr"] = (
                    "no select results (give --select-results-dir): no learning-rate curves"
                )
            _leaderboard(report, table, allow_partial, Path(tmp))
        if probe_results_dir:
            report.probe = probe_table(load_probe_results(probe_results_dir, warn=warn))
        return report
    if refusal(table, allow_partial) is None:
        with tempfile.TemporaryDirectory(prefix="encoder-eval-report-") as tmp:
            _leaderboard(report, table, allow_partial, Path(tmp))
    return report


# ----------------------------------------------------------------------------- rendering

CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dee7; --bg:#ffffff; --soft:#f4f6fa;
        --accent:#2457c5; --warn-bg:#fff6e0; --warn:#8a5a00; --best:#e8f0ff; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",
       sans-serif; color:var(--fg); background:var(--soft); }
header { background:#1d2330; color:#fff; padding:18px 32px; }
header h1 { margin:0; font-size:22px; font-weight:600; }
header p { margin:4px 0 0; color:#c4cad6; font-size:13px; }
nav { padding:8px 32px; background:#fff; border-bottom:1px solid var(--line); font-size:14px; }
nav a { margin-right:18px; color:var(--accent); text-decoration:none; }
main { padding:8px 32px 48px; max-width:1500px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px; padding:16px 20px;
          margin:18px 0; }
h2 { margin:0 0 12px; font-size:18px; }
h3 { margin:18px 0 8px; font-size:15px; }
.scroll { overflow-x:auto; }
table { border-collapse:collapse; font-variant-numeric:tabular-nums; font-size:14px; }
th, td { padding:6px 12px; border-bottom:1px solid var(--line); text-align:right;
         white-space:nowrap; }
th { background:var(--soft); font-weight:600; }
th:first-child, td:first-child { text-align:left; }
td.best { background:var(--best); font-weight:700; }
td a { color:inherit; text-decoration:none; border-bottom:1px dotted var(--muted); }
td a:hover { color:var(--accent); }
.mark { color:var(--accent); font-weight:600; }
ol.notes, ul.notes { color:var(--muted); font-size:13px; margin:12px 0 0; padding-left:20px; }
.banner { background:var(--warn-bg); color:var(--warn); border:1px solid #f0d48a;
          border-radius:6px; padding:10px 14px; margin:12px 0 0; font-size:14px; }
.note { color:var(--muted); font-style:italic; }
.figures { display:flex; flex-wrap:wrap; gap:16px; margin-top:12px; align-items:flex-start; }
figure { margin:0; border:1px solid var(--line); border-radius:6px; padding:8px;
         background:#fff; max-width:778px; }
figure.small { max-width:458px; }
figure.wide { max-width:100%; }
table.pairs td { text-align:center; } table.pairs td.self { color:var(--muted); }
table.pairs td.a-ahead { background:#e6f4ea; } table.pairs td.b-ahead { background:#fdecee; }
table.pairs a { color:inherit; text-decoration:none; }
figure img { display:block; max-width:100%; height:auto; }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
.verdict-better { color:#116329; font-weight:700; }
details { border:1px solid var(--line); border-radius:6px; margin:6px 0; padding:4px 10px; }
details[open] { background:#fbfcfe; }
details:target { outline:2px solid var(--accent); }
summary { cursor:pointer; font-weight:600; }
pre { background:var(--soft); padding:8px; border-radius:4px; overflow-x:auto; font-size:12px;
      white-space:pre-wrap; word-break:break-word; }
.counted { color:#116329; } .not-counted { color:#a40e26; }
"""

# Opens the provenance panel a link points at (an anchor alone does not open <details>).
SCRIPT = """
function openTarget() {
  var id = decodeURIComponent(location.hash.slice(1));
  var el = id && document.getElementById(id);
  if (el && el.tagName === "DETAILS") { el.open = true; }
}
window.addEventListener("hashchange", openTarget);
document.addEventListener("DOMContentLoaded", openTarget);
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _json_script(data: object) -> str:
    """JSON that is safe inside a <script> element (no `</script>`, no `<!--`)."""
    text = json.dumps(data, ensure_ascii=False, sort_keys=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def cell_anchor(model: str, task: str) -> str:
    """The id of a cell's provenance panel (ASCII, so it is a valid URL fragment)."""
    raw = f"{model}\x00{task}".encode()
    return "prov-" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _img(fig: Figure, small: bool = False) -> str:
    data = base64.b64encode(fig.png).decode("ascii")
    cls = ' class="wide"' if fig.wide else ' class="small"' if small else ""
    return (
        f'<figure{cls}><img alt="{_e(fig.caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(fig.caption)}</figcaption></figure>"
    )


def _notes(items: list[str], tag: str = "ul") -> str:
    if not items:
        return ""
    return f'<{tag} class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in items) + f"</{tag}>"


def _score_td(score: Score, model: str, task: str, cell, linked: bool) -> str:
    text = _e(score.text)
    if linked:
        text = f'<a href="#{cell_anchor(model, task)}" title="provenance">{text}</a>'
    marks = (
        ' <span class="mark" title="not distinguishable from the best">≈</span>'
        if score.tied
        else ""
    )
    marks += (
        ' <span class="mark" title="fewer seeds than expected">†</span>' if score.dagger else ""
    )
    attrs = f' data-model="{_e(model)}" data-task="{_e(task)}"'
    if cell is not None and cell.mean is not None:
        attrs += f' data-mean="{cell.mean!r}" data-n="{cell.n}"'
        if cell.std is not None:
            attrs += f' data-std="{cell.std!r}"'
    cls = ' class="score best"' if score.best else ' class="score"'
    return f"<td{cls}{attrs}>{text}{marks}</td>"


def render_table(table: Table, *, table_id: str, linked: set[tuple[str, str]]) -> str:
    """The table (`table_grid`: the cells every text format shows) as HTML, each score cell
    carrying its raw mean and std as data attributes, and linking to its provenance."""
    head, rows = table_grid(table)
    out = [f'<div class="scroll"><table id="{_e(table_id)}"><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for model, row in zip(table.models, rows, strict=True):
        out.append(f'<tr data-model="{_e(model)}"><td>{_e(row[0])}</td>')
        for i, value in enumerate(row[1:]):
            if i < len(table.tasks):
                task = table.tasks[i]
                out.append(
                    _score_td(
                        value, model, task, table.cells.get((model, task)), (model, task) in linked
                    )
                )
            else:
                out.append(f"<td>{_e(value)}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _problems_banner(table: Table) -> str:
    if not table.problems:
        return ""
    items = "".join(f"<li>{_e(p.message)} [{_e(p.rule)}]</li>" for p in table.problems)
    return (
        f'<div class="banner"><strong>Not a protocol table</strong> (shown with '
        f"--allow-partial):<ul>{items}</ul></div>"
    )


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def _p(x: float | None) -> str:
    return "—" if x is None else ("<0.001" if x < 0.001 else f"{x:.3f}")


PAIRS_SHOWN_OPEN = 3  # up to this many pairs each pair's table is open; past it, folded


def pair_anchor(model_a: str, model_b: str) -> str:
    """The id of a pair's verdicts (ASCII, so it is a valid URL fragment)."""
    raw = f"{model_a}\x00{model_b}".encode()
    return "pair-" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _tally(rows: list) -> tuple[int, int, int, int]:
    """(A better, B better, not distinguishable, not tested) over a pair's rows."""
    count = Counter(r.verdict for r in rows)
    a, b, same = count[stats.A_BETTER], count[stats.B_BETTER], count[stats.NOT_DISTINGUISHABLE]
    return a, b, same, len(rows) - a - b - same


def render_pair_matrix(by_pair: dict[tuple[str, str], list]) -> str:
    """Every pair at a glance: per (row model, column model), the tasks where the row's
    model is better / the column's is better / they are not distinguishable (each task's
    verdict of the tables below), linking to that pair's table."""
    models = list(dict.fromkeys(m for pair in by_pair for m in pair))
    out = ['<div class="scroll"><table class="pairs" id="pair-matrix"><thead><tr>']
    out.append("<th>row vs column</th>" + "".join(f"<th>{_e(m)}</th>" for m in models))
    out.append("</tr></thead><tbody>")
    for row in models:
        out.append(f'<tr data-model="{_e(row)}"><td>{_e(row)}</td>')
        for col in models:
            pair = (row, col) if (row, col) in by_pair else (col, row)
            if row == col or pair not in by_pair:
                out.append('<td class="self">·</td>' if row == col else "<td></td>")
                continue
            a, b, same, untested = _tally(by_pair[pair])
            ahead, behind = (a, b) if pair == (row, col) else (b, a)
            text = f"{ahead} / {behind} / {same}" + (f" ({untested} n/t)" if untested else "")
            title = (
                f"{row} against {col}: {row} better on {ahead} task(s), {col} better on "
                f"{behind}, not distinguishable on {same}"
                + (f", {untested} not tested" if untested else "")
            )
            cls = "a-ahead" if ahead > behind else "b-ahead" if behind > ahead else ""
            out.append(
                f'<td class="{cls}" data-col="{_e(col)}" title="{_e(title)}">'
                f'<a href="#{pair_anchor(*pair)}">{_e(text)}</a></td>'
            )
        out.append("</tr>")
    out.append("</tbody></table></div>")
    out.append(
        _notes(
            [
                "Each cell: the row's model against the column's over the tasks, as tasks "
                "where the row's is better / the column's is better / not distinguishable "
                "(the verdicts below, corrected over their family); green: the row's model "
                "ahead, red: behind; n/t: not tested (too few seeds). A cell links to its "
                "pair's table."
            ]
        )
    )
    return "".join(out)


def render_comparison(cmp: Comparison) -> str:
    """compare's verdicts: with three pairs or more a matrix of every pair's tally first,
    then one table per pair (folded past `PAIRS_SHOWN_OPEN` pairs)."""
    by_pair: dict[tuple[str, str], list] = {}
    for r in cmp.rows:
        by_pair.setdefault((r.model_a, r.model_b), []).append(r)
    out = []
    if len(by_pair) >= 3:
        out.append(render_pair_matrix(by_pair))
    fold = len(by_pair) > PAIRS_SHOWN_OPEN
    head = (
        "Task",
        "A",
        "B",
        "Δ [Welch 95 %]",
        "Δ [bootstrap 95 %]",
        "p (adj)",
        "verdict",
        "seeds needed",
    )
    for (a, b), rows in by_pair.items():
        if fold:
            better_a, better_b, same, untested = _tally(rows)
            out.append(
                f'<details class="pair" id="{pair_anchor(a, b)}"><summary>A = {_e(a)}, '
                f"B = {_e(b)}: A better on {better_a}, B better on {better_b}, not "
                f"distinguishable on {same}"
                + (f", {untested} not tested" if untested else "")
                + "</summary>"
            )
        else:
            out.append(f'<h3 id="{pair_anchor(a, b)}">A = {_e(a)}, B = {_e(b)}</h3>')
        out.append('<div class="scroll"><table class="verdicts"><thead><tr>')
        out += [f"<th>{_e(h)}</th>" for h in head]
        out.append("</tr></thead><tbody>")
        for r in rows:
            delta = (
                "—" if r.diff is None else (f"{_pct(r.diff)} [{_pct(r.ci_low)}, {_pct(r.ci_high)}]")
            )
            boot = "—" if r.boot_low is None else f"[{_pct(r.boot_low)}, {_pct(r.boot_high)}]"
            p = "—" if r.p_verdict_adj is None else f"{_p(r.p_verdict_adj)} ({r.verdict_test})"
            cls = "verdict-better" if r.verdict.endswith("better") else ""
            out.append(
                f'<tr data-task="{_e(r.task)}"><td>{_e(r.task)}</td>'
                f"<td>{_pct(r.mean_a)} (n={r.n_a})</td><td>{_pct(r.mean_b)} (n={r.n_b})</td>"
                f"<td>{_e(delta)}</td><td>{_e(boot)}</td><td>{_e(p)}</td>"
                f'<td class="{cls}">{_e(r.verdict)}</td>'
                f"<td>{'—' if r.seeds_needed is None else r.seeds_needed}</td></tr>"
            )
        out.append("</tbody></table></div>")
        out.append(_notes([f"{r.task}: {n}" for r in rows for n in r.notes]))
        if fold:
            out.append("</details>")
    out.append(
        "<details><summary>How to read the verdicts</summary>"
        + _notes(compare_footnotes(cmp), "ol")
        + "</details>"
    )
    return "".join(out)


def render_leaderboard(board: Leaderboard) -> str:
    head = ["Model", *(label for label, _ in AGGREGATES.values())]
    out = ['<div class="scroll"><table id="leaderboard"><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for m in board.models:
        cells = "".join(
            f"<td>{_e(format_aggregate(n, board.aggregates[m][n]))}</td>" for n in AGGREGATES
        )
        out.append(f'<tr data-model="{_e(m)}"><td>{_e(m)}</td>{cells}</tr>')
    out.append("</tbody></table></div>")
    out.append(_notes(leaderboard_notes(board), "ol"))
    return "".join(out)


def _provenance(report: Report) -> str:
    out = []
    for (model, task), entries in report.cells.items():
        counted = sum(1 for _, c in entries if c)
        out.append(
            f'<details id="{cell_anchor(model, task)}"><summary>{_e(model)} / '
            f"{_e(task)}: {counted} of {len(entries)} result file(s) counted"
            "</summary>"
        )
        for r, is_counted in entries:
            c = r.cell
            report_mean = (r.data.get("report") or {}).get("mean")
            state = (
                '<span class="counted">counted</span>'
                if is_counted
                else '<span class="not-counted">not counted</span>'
            )
            out.append(
                f"<details><summary>{_e(r.path.name)}: {_e(c['lr_key'])} (lr "
                f"{_e(c['lr'])}), seed {_e(c['seed'])}, {_e(r.data.get('status'))}, "
                f"report {_pct(report_mean)} — {state}</summary>"
            )
            for name in PROVENANCE_SECTIONS:
                if name in r.data:
                    body = json.dumps(r.data[name], indent=2, ensure_ascii=False)
                    out.append(f"<h3>{_e(name)}</h3><pre>{_e(body)}</pre>")
            out.append("</details>")
        out.append("</details>")
    return "".join(out)


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>{body}</section>'


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page (no external resource of any kind)."""
    t = report.table
    kind = "probe" if t.kind == "probe" else "fine-tune"
    sections = []
    body = _problems_banner(t)
    body += render_table(t, table_id="results-table", linked=set(report.cells))
    body += _notes(footnotes(t), "ol")
    sections.append(("table", "Results table", body))
    if report.figures or "lr" in report.notes or "figures" in report.notes:
        small = len(report.figures) > 2
        figs = "".join(_img(f, small=small and i > 0) for i, f in enumerate(report.figures))
        body = f'<div class="figures">{figs}</div>' if figs else ""
        for key in ("figures", "lr"):
            if key in report.notes:
                body += f'<p class="note">{_e(report.notes[key])}</p>'
        sections.append(("figures", "Figures", body))
    if report.comparison is not None or "compare" in report.notes:
        body = (
            render_comparison(report.comparison)
            if report.comparison is not None
            else f'<p class="note">{_e(report.notes["compare"])}</p>'
        )
        sections.append(("compare", "Is A really better than B? (compare)", body))
    if report.leaderboard is not None or "leaderboard" in report.notes:
        if report.leaderboard is not None:
            body = render_leaderboard(report.leaderboard)
            if report.cd_plot is not None:
                body += f'<div class="figures">{_img(report.cd_plot)}</div>'
            elif "cd" in report.notes:
                body += f'<p class="note">{_e(report.notes["cd"])}</p>'
        else:
            body = f'<pre class="note">{_e(report.notes["leaderboard"])}</pre>'
        sections.append(("leaderboard", "Leaderboard across tasks", body))
    if report.probe is not None:
        body = _problems_banner(report.probe)
        body += render_table(report.probe, table_id="probe-table", linked=set())
        body += _notes(footnotes(report.probe), "ol")
        sections.append(("probe", "Linear probes on frozen embeddings", body))
    if report.cells:
        body = (
            "<p>Each score of the table links here: the result files behind it, with "
            "the cell, protocol, recipe, provenance and training record of each.</p>"
            + _provenance(report)
        )
        sections.append(("provenance", "Provenance of each cell", body))
    nav = "".join(f'<a href="#{sid}">{_e(title.split(" (")[0])}</a>' for sid, title, _ in sections)
    n_results = sum(len(v) for v in report.cells.values())
    sub = (
        f"{len(t.models)} model(s) x {len(t.tasks)} task(s), {kind} table"
        + (f", {n_results} report result file(s)" if n_results else "")
        + f" · encoder-eval {__version__}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No network when viewed: nothing may be fetched, not even a favicon.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        '<link rel="icon" href="data:,">'
        f"<title>{_e(report.title)}</title><style>{CSS}</style>"
        f"<script>{SCRIPT}</script></head><body>"
        f"<header><h1>{_e(report.title)}</h1><p>{_e(sub)}</p></header>"
        f"<nav>{nav}</nav><main>"
        + "".join(_section(sid, title, body) for sid, title, body in sections)
        + "</main>"
        f'<script type="application/json" id="table-data">{_json_script(table_dict(t))}</script>'
        "</body></html>\n"
    )
