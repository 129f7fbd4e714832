"""`compare`'s verdicts rendered: markdown, LaTeX, JSON and CSV, and the footnotes that say
how to read them (`reports/verdicts.py` computes the rows)."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import asdict

from encoder_eval.core import stats
from encoder_eval.reports import latex
from encoder_eval.reports.table import task_header
from encoder_eval.reports.verdicts import COMPARE_SCHEMA, MDD_SEEDS, Comparison, Row


def _num(x: float | None, scale: float = 100.0, digits: int = 2) -> str:
    return "—" if x is None else f"{scale * x:.{digits}f}"


def _p(x: float | None) -> str:
    if x is None:
        return "—"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


CORRECTION_LABELS = {"holm": "Holm", "fdr_bh": "Benjamini-Hochberg"}


FAMILY_NOTES = {
    "pair": "each pair's tasks (--family pair: the chance of any false 'better' is at most "
    "alpha per pair of models; over several pairs it adds up, which the default, --family "
    "table, bounds)",
    "table": "every row of this comparison, all pairs and tasks (the chance of any false "
    "'better' anywhere in it is at most alpha; with one pair, that pair's tasks)",
}


def footnotes(cmp: Comparison) -> list[str]:
    name = CORRECTION_LABELS[cmp.correction]
    return [
        "Scores x100. Δ = mean(A) - mean(B) over report seeds, with its Welch 95 % interval "
        "(seed level) and its two-level bootstrap 95 % interval (seeds and examples resampled).",
        f"p seed: Welch's t-test over seeds; p example: paired permutation test swapping whole "
        f"examples on the seed-averaged score ({cmp.n_resamples} resamples, seed {cmp.seed}); "
        "p combined: a t-test whose variance is Welch's seed variance plus the test-set "
        "variance of Δ (sd shown; bootstrap over examples, counting only what a model's seeds "
        "share, since the seed variance already holds their per-example disagreement), "
        f"Satterthwaite df. Corrected ({name}, alpha {cmp.alpha}) within one family: "
        f"{FAMILY_NOTES[cmp.family]}; the verdict's p-values (combined, or Welch's for a row "
        "without predictions) are corrected together, p seed and p example each as diagnostics.",
        f"Verdict: A or B better only when the corrected p-value of its test (shown beside it) "
        f"is <= {cmp.alpha}: the combined test, or Welch's when predictions are missing; a "
        "seed-level test alone ignores the test sample, an example-level test alone treats "
        "each model as fixed and ignores seeds.",
        "ASO: ε_min of A over B / B over A (below 0.5: almost stochastically dominant; shown, "
        "not used for the verdict). McNemar (accuracy): on each model's seed-majority "
        "correctness, shown only.",
        "Seeds needed: report seeds per model for 80 % power of the verdict's test at the "
        f"level its correction applies to a family's first test (alpha {cmp.alpha} / the "
        "family's number of tests: Holm's first step), given the seed stds and test-set sd (— "
        f"when the test set's noise alone hides Δ); MDD@{MDD_SEEDS}: the smallest difference "
        f"{MDD_SEEDS} seeds detect at 80 % power at that level. Both are post hoc: they plug "
        "in the observed seed stds and test-set sd, and seeds needed the observed Δ, which "
        "overstates a true difference that was selected for being large.",
        *cmp.notes,
    ]


def render_markdown(cmp: Comparison) -> str:
    lines: list[str] = []
    by_pair: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in cmp.rows:
        by_pair[(r.model_a, r.model_b)].append(r)
    for (a, b), rows in by_pair.items():
        lines += [f"### A = {a}, B = {b}", ""]
        lines.append(
            "| Task | A | B | Δ [Welch 95 %] | Δ [bootstrap 95 %] | p seed (adj) | "
            "p example (adj) | test-set sd | p combined (adj) | McNemar p | "
            f"ASO A>B / B>A | verdict | seeds needed | MDD@{MDD_SEEDS} |"
        )
        lines.append("|---|" + "---:|" * 13)
        for r in rows:
            delta = (
                "—" if r.diff is None else (f"{_num(r.diff)} [{_num(r.ci_low)}, {_num(r.ci_high)}]")
            )
            boot = "—" if r.boot_low is None else f"[{_num(r.boot_low)}, {_num(r.boot_high)}]"
            verdict_p = (
                ""
                if r.p_verdict_adj is None
                else (f" (p adj {_p(r.p_verdict_adj)}, {r.verdict_test})")
            )
            aso = (
                "—" if r.aso_a_over_b is None else (f"{r.aso_a_over_b:.2f} / {r.aso_b_over_a:.2f}")
            )
            lines.append(
                f"| {task_header(r.task)} | {_num(r.mean_a)} (n={r.n_a}) | "
                f"{_num(r.mean_b)} (n={r.n_b}) | {delta} | {boot} | "
                f"{_p(r.p_seed)} ({_p(r.p_seed_adj)}) | {_p(r.p_example)} ({_p(r.p_example_adj)}) "
                f"| {_num(r.example_sd)} | {_p(r.p_combined)} ({_p(r.p_combined_adj)}) "
                f"| {_p(r.p_mcnemar)} | {aso} | **{r.verdict}**{verdict_p} | "
                f"{'—' if r.seeds_needed is None else r.seeds_needed} | {_num(r.mdd_5)} |"
            )
        notes = [f"{r.task}: {n}" for r in rows for n in r.notes]
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    return "\n".join([*lines, *footnotes(cmp)]) + "\n"


def render_latex(cmp: Comparison) -> str:
    """One booktabs table per pair for a paper: each task's means, Δ with its Welch interval,
    the verdict's adjusted p-value and test, the verdict (bold when a model is better), and
    the seeds needed; every note and footnote as table notes."""
    by_pair: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in cmp.rows:
        by_pair[(r.model_a, r.model_b)].append(r)
    head = ["Task", "A", "B", "Δ [95 %]", "p (adj)", "verdict", "seeds needed"]
    out = []
    for (a, b), rows in by_pair.items():
        body = []
        for r in rows:
            delta = (
                "—" if r.diff is None else f"{_num(r.diff)} [{_num(r.ci_low)}, {_num(r.ci_high)}]"
            )
            p = "—" if r.p_verdict_adj is None else f"{_p(r.p_verdict_adj)} ({r.verdict_test})"
            body.append(
                [
                    task_header(r.task),
                    f"{_num(r.mean_a)} (n={r.n_a})",
                    f"{_num(r.mean_b)} (n={r.n_b})",
                    delta,
                    p,
                    latex.Score(r.verdict, best=r.verdict in (stats.A_BETTER, stats.B_BETTER)),
                    "—" if r.seeds_needed is None else str(r.seeds_needed),
                ]
            )
        notes = [f"{r.task}: {n}" for r in rows for n in r.notes] + footnotes(cmp)
        out.append(latex.render_table(head, body, notes, caption=f"A = {a}, B = {b}"))
    return "\n".join(out)


def to_dict(cmp: Comparison) -> dict:
    return {
        "schema": COMPARE_SCHEMA,
        "version": 1,
        "alpha": cmp.alpha,
        "correction": cmp.correction,
        "family": cmp.family,
        "n_resamples": cmp.n_resamples,
        "seed": cmp.seed,
        "rows": [asdict(r) for r in cmp.rows],
        "footnotes": footnotes(cmp),
    }


CSV_FIELDS = [f for f in Row.__dataclass_fields__ if f != "notes"] + ["notes"]


def render_csv(cmp: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in cmp.rows:
        d = asdict(r)
        w.writerow(
            [
                "" if d[k] is None else ("; ".join(d[k]) if k == "notes" else d[k])
                for k in CSV_FIELDS
            ]
        )
    return buf.getvalue()


def render(cmp: Comparison, fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(cmp)
    if fmt == "json":
        return json.dumps(to_dict(cmp), indent=2) + "\n"
    if fmt == "latex":
        return render_latex(cmp)
    return render_csv(cmp)
