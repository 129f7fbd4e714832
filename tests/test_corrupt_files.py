"""Corrupt and foreign files in a results directory: `select`, `summarize` and `status` skip
each with exactly one warning naming the file and why, ignore the harness's own hidden
files silently, and still refuse a table the skips leave incomplete; `run --skip-existing`
moves a corrupt result aside (never deleting it) and runs its cell again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fault_helpers import SHRINK, py, sh
from result_helpers import make_result, make_selection, write_result

from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import (
    QUARANTINE_DIR,
    SCHEMA_VERSION,
    STATS_CACHE_DIR,
    TMP_PREFIX,
    read_result,
    result_filename,
)

MODEL, TASK = "m", "glue_rte"


def _name(key: str, seed: int) -> str:
    return result_filename(MODEL, TASK, LR_GRID[key], seed)


def plant(rdir: Path, phase: str, key: str, good: list[int], bad: list[int]) -> dict[str, str]:
    """Write valid results for `good` seeds and one kind of corruption per `bad` seed, plus
    foreign and stray files; return {file name: regex its warning must match}."""
    for seed in good:
        write_result(rdir, make_result(MODEL, TASK, key, seed, phase, 0.6 + seed / 1000))
    valid_text = (rdir / _name(key, good[0])).read_text()
    expect = {}
    identity, empty, truncated = (rdir / _name(key, s) for s in bad)
    identity.write_text(valid_text)  # another cell's result under this cell's name
    expect[identity.name] = "disagrees with its filename"
    empty.write_text("")
    expect[empty.name] = "empty file"
    truncated.write_text(valid_text[: len(valid_text) // 2])
    expect[truncated.name] = "not valid JSON"
    (rdir / "notes.json").write_text(json.dumps({"note": "hand-written", "score": 0.9}))
    expect["notes.json"] = "not a valid result: schema is None"
    future = make_result(MODEL, TASK, "lr10", 44, phase, 0.99)
    future["schema_version"] = SCHEMA_VERSION + 1
    (rdir / _name("lr10", 44)).write_text(json.dumps(future))
    expect[_name("lr10", 44)] = rf"written by a newer harness \(schema_version {SCHEMA_VERSION + 1}"
    (rdir / "README.txt").write_text("these are my results\n")
    expect["README.txt"] = "not a result file"
    (rdir / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1\x00")
    expect[".DS_Store"] = "not a result file"
    old = rdir / "old"  # a backup of the missing cells: never read, or it would fill the gaps
    old.mkdir()
    for seed in bad:
        (old / _name(key, seed)).write_text(
            json.dumps(make_result(MODEL, TASK, key, seed, phase, 0.01))
        )
    expect["old"] = "subdirectory"
    # The harness's own files: ignored without a word.
    (rdir / f".lock-{_name(key, good[0])}").write_text("")
    (rdir / f"{TMP_PREFIX}{truncated.name}.x1y2z3").write_text(valid_text[:40])
    (rdir / f".resume-{truncated.name}.pt").write_bytes(b"\x80\x04torn")
    (rdir / _name(key, good[0]).replace(".json", ".predictions.json")).write_text("{}")
    (rdir / QUARANTINE_DIR).mkdir()  # corrupt results moved aside: never read, never warned
    kept = rdir / QUARANTINE_DIR / f"{_name(key, good[0])}.20260101T000000.000000Z"
    kept.write_text(valid_text)
    (rdir / STATS_CACHE_DIR).mkdir()  # comparisons kept by summarize/compare: never read
    (rdir / STATS_CACHE_DIR / "0123.111.json").write_text(valid_text)
    return expect


def check_warnings(stderr: str, rdir: Path, expect: dict[str, str]) -> None:
    lines = [line for line in stderr.splitlines() if line.startswith("warning:")]
    for name, why in expect.items():
        mine = [line for line in lines if f"{rdir / name}:" in line]
        assert len(mine) == 1, f"{name}: {len(mine)} warnings in\n{stderr}"
        assert re.search(why, mine[0]), mine[0]
    assert len(lines) == len(expect), stderr  # nothing else: the harness's own files are silent
    for own in (".lock-", TMP_PREFIX, ".resume-", ".predictions.json", QUARANTINE_DIR,
                STATS_CACHE_DIR):  # fmt: skip
        assert own not in stderr


@pytest.fixture
def select_dir(tmp_path):
    rdir = tmp_path / "select"
    rdir.mkdir()
    expect = plant(rdir, "select", "lr06", good=[42], bad=[43, 44, 45])
    # lr03 is complete; lr06 keeps only seed 42 (43-45 are corrupt): with seeds 42,43 the
    # grid is incomplete.
    for seed in (42, 43):
        write_result(rdir, make_result(MODEL, TASK, "lr03", seed, "select", 0.5))
    return rdir, expect


def test_select_skips_each_bad_file_once_and_refuses_the_incomplete_grid(tmp_path, select_dir):
    rdir, expect = select_dir
    out = tmp_path / "selection.json"
    proc = sh(py("encoder_eval.select", "--results-dir", rdir, "--out", out,
                 "--lr-keys", "lr03,lr06", "--seeds", "42,43"), tmp_path, ok=(1,))  # fmt: skip
    check_warnings(proc.stderr, rdir, expect)
    assert "1 select cell(s) are missing" in proc.stderr
    assert f"m/glue_rte/lr06/s43: missing ({_name('lr06', 43)})" in proc.stderr
    assert not out.exists()


def test_status_skips_each_bad_file_once_and_reports_incomplete(tmp_path, select_dir):
    rdir, expect = select_dir
    proc = sh(py("encoder_eval.status", "--phase", "select", "--model", f"{MODEL}=org/m",
                 "--tasks", TASK, "--lr-keys", "lr03,lr06", "--seeds", "42,43",
                 "--results-dir", rdir), tmp_path, ok=(1,))  # fmt: skip
    check_warnings(proc.stderr, rdir, expect)
    assert re.search(r"done\s+3\b", proc.stdout) and re.search(r"corrupt\s+1\b", proc.stdout)
    assert "disagrees with its filename" in proc.stdout  # the failed cell, with why


SELECTION = make_selection({(MODEL, TASK): "lr06"})


@pytest.fixture
def report_dir(tmp_path):
    rdir = tmp_path / "report"
    rdir.mkdir()
    expect = plant(rdir, "report", "lr06", good=[45, 49], bad=[46, 47, 48])
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(SELECTION))
    return rdir, sel, expect


def test_summarize_skips_each_bad_file_once_and_refuses_the_incomplete_table(tmp_path, report_dir):
    rdir, sel, expect = report_dir
    proc = sh(py("encoder_eval.summarize", "--results-dir", rdir, "--selection", sel),
              tmp_path, ok=(1,))  # fmt: skip
    check_warnings(proc.stderr, rdir, expect)
    # each bad seed named as `status` names it: corrupt, with why; none "missing"
    assert "[missing_seeds] 3 report seed(s) have no done result (3 corrupt)" in proc.stderr
    for seed in (46, 47, 48):
        assert f"m/glue_rte/lr06/s{seed}: corrupt ({rdir / _name('lr06', seed)}: " in proc.stderr
    assert ": missing" not in proc.stderr
    assert proc.stdout == ""


def test_summarize_and_status_agree_on_corrupt_seeds_and_the_footnote_names_empty_cells(
    tmp_path, capsys
):
    from encoder_eval import status, summarize

    rdir = tmp_path / "report"
    for seed in range(45, 50):
        write_result(rdir, make_result(MODEL, TASK, "lr06", seed, "report", 0.6 + seed / 1000))
        (rdir / result_filename("other", TASK, LR_GRID["lr06"], seed)).write_text("{torn")
    (rdir / _name("lr06", 49)).write_text("")
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(make_selection({(m, TASK): "lr06" for m in (MODEL, "other")})))
    assert status.main(["--phase", "report", "--selection", str(sel), "--model", f"{MODEL}=org/m",
                        "--model", "other=org/o", "--tasks", TASK, "--results-dir",
                        str(rdir)]) == 1  # fmt: skip
    assert re.search(r"corrupt\s+6\b", capsys.readouterr().out)
    args = ["--results-dir", str(rdir), "--selection", str(sel), "--no-marks"]
    assert summarize.main(args) == 1
    err = capsys.readouterr().err
    assert "6 report seed(s) have no done result (6 corrupt)" in err and ": missing" not in err
    assert summarize.main([*args, "--allow-partial"]) == 0
    out = capsys.readouterr().out
    assert "avg@0" not in out
    assert "† avg@4 instead of avg@5: m/glue_rte." in out
    assert "— no finished report seed (see below): other/glue_rte." in out


def test_summarize_with_plots_still_warns_once_per_file(tmp_path, report_dir, select_dir):
    rdir, sel, expect = report_dir
    sdir, sexpect = select_dir
    proc = sh(py("encoder_eval.summarize", "--results-dir", rdir, "--selection", sel,
                 "--allow-partial", "--format", "json", "--plots", tmp_path / "plots",
                 "--select-results-dir", sdir), tmp_path)  # fmt: skip
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    check_warnings("\n".join(w for w in warned if str(rdir) in w), rdir, expect)
    check_warnings("\n".join(w for w in warned if str(sdir) in w), sdir, sexpect)
    cell = json.loads(proc.stdout)["rows"][0]["cells"][TASK]
    assert cell["seeds"] == [45, 49] and cell["missing_seeds"] == [46, 47, 48]
    assert cell["mean"] == pytest.approx((0.645 + 0.649) / 2)  # the backups in old/ unused


def test_run_skip_existing_moves_corrupt_and_other_cells_results_aside_and_reruns(
    tmp_path, tiny_models, small_mirror
):
    """A truncated result and a valid select result under a report cell's name are not done:
    `run --skip-existing` moves each into .corrupt/ byte for byte and runs the cell again."""
    rdir = tmp_path / "results"
    rdir.mkdir()
    lr = LR_GRID["lr06"]
    truncated, other_phase = (rdir / result_filename("tiny", TASK, lr, s) for s in (45, 46))
    good = json.dumps(make_result("tiny", TASK, "lr06", 45, "report", 0.6))
    truncated.write_text(good[: len(good) // 2])
    other_phase.write_text(json.dumps(make_result("tiny", TASK, "lr06", 46, "select", 0.9)))
    before = {p.name: p.read_bytes() for p in (truncated, other_phase)}
    proc = sh(py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", "tiny",
                 "--task", TASK, "--lr", f"{lr:g}", "--seed", "45,46", "--phase", "report",
                 "--data-dir", small_mirror, "--results-dir", rdir, "--skip-existing",
                 "--progress", "quiet", *SHRINK), tmp_path)  # fmt: skip
    for path in (truncated, other_phase):
        data, why = read_result(path)
        assert why is None and data["cell"]["phase"] == "report"  # run again, for real
        (kept,) = (rdir / QUARANTINE_DIR).glob(f"{path.name}.*Z")
        assert kept.read_bytes() == before[path.name]  # moved aside, never deleted
        (line,) = [x for x in proc.stderr.splitlines() if f"result {path} to {kept}" in x]
        assert line.startswith("moved the corrupt result") and "its cell runs again" in line
    assert "not valid JSON" in proc.stderr
    assert "a select cell in a report results directory" in proc.stderr


def test_run_skip_existing_leaves_a_newer_harness_result_and_does_not_run_over_it(
    tmp_path, tiny_models, small_mirror
):
    """Issue 23 item 8: a result a newer harness wrote is not corrupt: `run --skip-existing`
    leaves it, does not train the cell over it, and exits 1 naming it."""
    rdir = tmp_path / "results"
    rdir.mkdir()
    newer = make_result("tiny", TASK, "lr06", 45, "report", 0.6)
    newer["schema_version"] = SCHEMA_VERSION + 1
    path = rdir / result_filename("tiny", TASK, LR_GRID["lr06"], 45)
    path.write_text(json.dumps(newer))
    before = path.read_bytes()
    proc = sh(py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", "tiny",
                 "--task", TASK, "--lr", f"{LR_GRID['lr06']:g}", "--seed", "45",
                 "--phase", "report", "--data-dir", small_mirror, "--results-dir", rdir,
                 "--skip-existing", "--progress", "quiet", *SHRINK), tmp_path, ok=(1,))  # fmt: skip
    assert path.read_bytes() == before and not (rdir / QUARANTINE_DIR).exists()
    lines = proc.stderr.splitlines()
    assert any(x.startswith(f"left {path} in place (written by a newer harness") for x in lines)
    assert lines[-1].startswith("error: 1 cell(s) not run, to keep the file in their place")
    assert "Traceback" not in proc.stderr
