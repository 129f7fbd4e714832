"""`--format latex` of summarize, compare and leaderboard: compiled with a real pdflatex,
the page rendered with pdftoppm, and its text read back with pdftotext, so an escaping
mistake or a wrong number shows. Needs Debian's texlive-latex-recommended and poppler-utils
(.ci/run installs them; ENCODER_EVAL_REQUIRE_LATEX=1 makes their absence a failure)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from result_helpers import make_result, make_selection, write_many

from encoder_eval import compare, leaderboard, summarize
from encoder_eval.core.protocol import PHASE_SEEDS
from encoder_eval.reports.latex import Score, escape, render_table, standalone

HOSTILE = "m_1&2%#$"  # a model name every LaTeX special character of which must be escaped
MODELS = (HOSTILE, "base~x")
TASKS = ("glue_rte", "sg_cb")
SCORES = {(HOSTILE, "glue_rte"): [0.71, 0.72, 0.70, 0.73, 0.71],
          ("base~x", "glue_rte"): [0.61, 0.60, 0.62, 0.61, 0.63],
          (HOSTILE, "sg_cb"): [0.80, 0.82, 0.81, 0.79, 0.80],
          ("base~x", "sg_cb"): [0.81, 0.80, 0.82, 0.80, 0.79]}  # fmt: skip


def _tools() -> None:
    missing = [t for t in ("pdflatex", "pdftoppm", "pdftotext") if shutil.which(t) is None]
    if missing:
        if os.environ.get("ENCODER_EVAL_REQUIRE_LATEX") == "1":
            pytest.fail(f"missing {', '.join(missing)}: install texlive-latex-recommended and "
                        "poppler-utils (.ci/run does)")  # fmt: skip
        pytest.skip(f"missing {', '.join(missing)}")


def compile_page(tex: str, out: Path) -> str:
    """Compile a snippet into a PDF, render page 1 to PNG, and return the page's text."""
    _tools()
    out.mkdir(parents=True, exist_ok=True)
    (out / "t.tex").write_text(standalone(tex), encoding="utf-8")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
                          cwd=out, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    subprocess.run(["pdftoppm", "-png", "-r", "80", "-f", "1", "-l", "1", "t.pdf", "page"],
                   cwd=out, check=True, timeout=60)  # fmt: skip
    assert (out / "page-1.png").stat().st_size > 2000
    text = subprocess.run(["pdftotext", "-layout", "t.pdf", "-"], cwd=out, capture_output=True,
                          text=True, check=True, timeout=60).stdout  # fmt: skip
    return text


def test_escape_makes_every_special_character_literal(tmp_path) -> None:
    nasty = r"a\b&c%d$e#f_g{h}i~j^k<l>m|n ± ≈ † — 日本"
    assert escape("x_y & z") == r"x\_y \& z"
    text = compile_page(render_table(["Model", "Score"], [[nasty, Score("1.00", best=True)]],
                                     [nasty]), tmp_path)  # fmt: skip
    assert "a\\b&c%d$e#f_g{h}i" in text.replace(" ", "")
    assert "??" in text  # characters pdflatex cannot set are replaced, not a failed build


@pytest.fixture
def report_dir(tmp_path):
    sel = make_selection({(m, t): "lr06" for m in MODELS for t in TASKS})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    write_many(tmp_path / "report", [
        make_result(m, t, "lr06", seed, "report", score)
        for (m, t), scores in SCORES.items()
        for seed, score in zip(PHASE_SEEDS["report"], scores, strict=True)
    ])  # fmt: skip
    return tmp_path


def test_summarize_latex_compiles_with_its_numbers_and_notes(report_dir, capsys) -> None:
    args = ["--results-dir", str(report_dir / "report"), "--selection",
            str(report_dir / "selection.json"), "--format", "latex"]  # fmt: skip
    assert summarize.main(args) == 0
    tex = capsys.readouterr().out
    assert r"\toprule" in tex and r"\textbf{" in tex and r"m\_1\&2\%\#\$" in tex
    text = compile_page(tex, report_dir / "pdf")
    flat = " ".join(text.split())
    mean = 100 * statistics.mean(SCORES[(HOSTILE, "glue_rte")])
    std = 100 * statistics.stdev(SCORES[(HOSTILE, "glue_rte")])
    assert f"{mean:.2f} ± {std:.2f}" in flat
    assert HOSTILE in flat and "base~x" in flat
    assert "Scores x100: mean ± sample std" in flat  # the footnotes are table notes


def test_compare_and_leaderboard_latex_compile(report_dir, capsys) -> None:
    rdir = str(report_dir / "report")
    sel = str(report_dir / "selection.json")
    assert compare.main(["--results-dir", rdir, "--selection", sel, "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    flat = " ".join(compile_page(tex, report_dir / "cmp").split())
    assert "A better" in flat or "B better" in flat
    assert f"A = {HOSTILE}" in flat or f"B = {HOSTILE}" in flat
    # No predictions files here: the note names the missing file, not its temporary path
    # (read in the source: pdftotext sets "fi" as a ligature).
    assert escape(f"{HOSTILE}_glue_rte_lr06_s45.predictions.json: no predictions file") in tex
    assert escape(str(report_dir)) not in tex and str(report_dir) not in tex
    assert leaderboard.main(["--results-dir", rdir, "--selection", sel, "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    flat = " ".join(compile_page(tex, report_dir / "lb").split())
    assert HOSTILE in flat and "base~x" in flat
