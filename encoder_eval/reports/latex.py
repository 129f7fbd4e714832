"""Tables for the paper: `--format latex` of `summarize`, `compare` and `leaderboard`.

One renderer for all three: a booktabs `tabular` inside a `table` float, the best score in
bold, `$\\approx$` for a model not distinguishable from it, `$^\\dagger$` for a cell over
fewer seeds, and the command's footnotes as table notes under the rule. Every task, model and
note text is escaped, so a name like `m_1&2` cannot break the document. The snippet needs
`\\usepackage{booktabs}` and `\\usepackage{graphicx}` (a wide table is scaled to the line
width, a narrow one is left as it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREAMBLE = "\\usepackage{booktabs}\n\\usepackage{graphicx}\n"

_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    # characters pdflatex's default input encoding has no glyph for
    "±": r"$\pm$",
    "≈": r"$\approx$",
    "†": r"$^\dagger$",
    "—": "---",
    "–": "--",
    "×": r"$\times$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "Δ": r"$\Delta$",
    "α": r"$\alpha$",
    "σ": r"$\sigma$",
    "β": r"$\beta$",
    "…": r"\ldots{}",
    "’": "'",
    "“": "``",
    "”": "''",
    "−": "-",
    "·": r"$\cdot$",
    "²": r"$^2$",
}


def escape(text: object) -> str:
    """`text` as LaTeX that prints it literally; characters outside ASCII that pdflatex
    cannot set are replaced by their LaTeX spelling or, failing that, by `?`."""
    out = []
    for ch in str(text):
        if ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif ord(ch) < 128 or 0xC0 <= ord(ch) <= 0x17F:  # ASCII, accented Latin letters
            out.append(ch)
        else:
            out.append("?")
    return "".join(out)


@dataclass(frozen=True)
class Score:
    """One table cell: its text and its marks (bold best, ≈ tied, † fewer seeds)."""

    text: str
    best: bool = False
    tied: bool = False
    dagger: bool = False

    def markdown(self) -> str:
        text = f"**{self.text}**" if self.best else self.text
        return text + (" ≈" if self.tied else "") + (" †" if self.dagger else "")

    def latex(self) -> str:
        body = escape(self.text)
        if self.best:
            body = f"\\textbf{{{body}}}"
        if self.tied:
            body += r" $\approx$"
        if self.dagger:
            body += r"$^\dagger$"
        return body


def render_table(
    head: Sequence[str],
    rows: Sequence[Sequence[Score | str]],
    notes: Sequence[str] = (),
    *,
    align: str | None = None,
    caption: str | None = None,
    label: str | None = None,
) -> str:
    """A booktabs table: `head` over `rows` (first column left-aligned, the rest right unless
    `align` says otherwise), then `notes`, one paragraph each, in a footnote-size block."""
    width = len(head)
    if any(len(r) != width for r in rows):
        raise ValueError("every row needs one entry per column")
    align = align or "l" + "r" * (width - 1)

    def cell(c: Score | str) -> str:
        return c.latex() if isinstance(c, Score) else escape(c)

    lines = [
        "% encoder-eval table: needs " + PREAMBLE.replace("\n", " ").strip(),
        "\\begin{table}[htbp]",
        "\\centering",
        "\\small",
        "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%",
        f"\\begin{{tabular}}{{{align}}}",
        "\\toprule",
        " & ".join(escape(h) for h in head) + " \\\\",
        "\\midrule",
        *(" & ".join(cell(c) for c in row) + " \\\\" for row in rows),
        "\\bottomrule",
        "\\end{tabular}}",
    ]
    if notes:
        lines += ["\\par\\smallskip", "\\begin{minipage}{\\linewidth}\\footnotesize"]
        lines += [escape(n) + "\\par" for n in notes]
        lines.append("\\end{minipage}")
    if caption:
        lines.append(f"\\caption{{{escape(caption)}}}")
    if label:
        lines.append(f"\\label{{{escape(label)}}}")
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


def standalone(body: str) -> str:
    """A complete document around a table snippet (what the tests compile)."""
    return (
        "\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage[utf8]{inputenc}\n"
        f"{PREAMBLE}\\begin{{document}}\n{body}\\end{{document}}\n"
    )
