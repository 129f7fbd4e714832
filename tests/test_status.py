"""status.py: counts of done / diverged / corrupt / missing cells, and re-emitting the rest."""

from __future__ import annotations

import json
import shlex

from result_helpers import make_result, write_result
from spec_helpers import unit_argvs

from encoder_eval import status
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import QUARANTINE_DIR
from encoder_eval.plans import selection

PLAN = ["--phase", "select", "--model", "m=org/m", "--tasks", "glue_rte",
        "--lr-keys", "lr03,lr06", "--seeds", "42,43"]  # fmt: skip


def fill(rdir):
    """lr03: two ok seeds; lr06: s42 diverged, s43 missing; plus a stranger."""
    write_result(rdir, make_result("m", "glue_rte", "lr03", 42, "select", 0.5))
    write_result(rdir, make_result("m", "glue_rte", "lr03", 43, "select", 0.6))
    write_result(rdir, make_result("m", "glue_rte", "lr06", 42, "select", None, status="diverged"))
    write_result(rdir, make_result("other", "glue_rte", "lr03", 42, "select", 0.5))


def test_counts_and_lists(tmp_path, capsys):
    rdir = tmp_path / "res"
    fill(rdir)
    assert status.main([*PLAN, "--results-dir", str(rdir)]) == 1
    out = capsys.readouterr().out
    assert "4 cells planned" in out
    assert "done          2" in out and "diverged      1" in out
    assert "corrupt       0" in out and "missing       1" in out
    assert "other         1" in out
    assert "m/glue_rte/lr06/s42" in out.split("diverged:")[1]
    assert "m/glue_rte/lr06/s43" in out.split("missing:")[1]

    (rdir / "m_glue_rte_lr06_s43.json").write_text("{ truncated")
    assert status.main([*PLAN, "--results-dir", str(rdir)]) == 1
    out = capsys.readouterr().out
    assert "corrupt       1" in out and "missing       0" in out
    assert "not valid JSON" in out and "moves them aside" in out


def test_corrupt_and_other_cells_results_are_not_done_and_are_emitted(tmp_path, capsys):
    """A truncated file, another cell's valid result and a result of the other phase under a
    cell's name are corrupt: listed with why, re-emitted, and never moved by status."""
    rdir = tmp_path / "res"
    fill(rdir)
    lr03_s42 = rdir / "m_glue_rte_lr03_s42.json"
    lr03_s43 = rdir / "m_glue_rte_lr03_s43.json"
    truncated = lr03_s42.read_text()[:50]
    lr03_s42.write_text(truncated)
    write_result(rdir, make_result("m", "glue_rte", "lr06", 43, "report", 0.7))  # other phase
    lr03_s43.write_text((rdir / "m_glue_rte_lr06_s43.json").read_text())  # another cell
    (rdir / QUARANTINE_DIR).mkdir()
    (rdir / QUARANTINE_DIR / "m_glue_rte_lr06_s42.json.20260101T000000.000000Z").write_text("{")
    emit_dir = tmp_path / "rest"
    argv = [*PLAN, "--results-dir", str(rdir), "--emit", str(emit_dir), "--mode", "shell"]
    assert status.main(argv) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "done          0" in out and "corrupt       3" in out and "missing       0" in out
    assert "moved aside   1" in out and f"{rdir / QUARANTINE_DIR}" in out
    corrupt = out.split("corrupt:")[1]
    assert "m/glue_rte/lr03/s42" in corrupt and "not valid JSON" in corrupt
    assert "m/glue_rte/lr03/s43" in corrupt and "disagrees with its filename" in corrupt
    assert "m/glue_rte/lr06/s43" in corrupt and "a report cell in a select results" in corrupt
    assert "3 cell(s) (0 already done, 3 to run)" in out
    assert "3 corrupt result file(s) among the cells to run" in out
    units = [line for line in (emit_dir / "run_all.sh").read_text().splitlines()
             if line.startswith("unit ")]  # fmt: skip
    assert len(units) == 2  # lr03 (both seeds) and lr06 s43
    assert lr03_s42.read_text() == truncated  # status only reads
    assert QUARANTINE_DIR not in captured.err  # readers pass over .corrupt/ silently


def test_complete_phase_exits_0(tmp_path, capsys):
    rdir = tmp_path / "res"
    fill(rdir)
    write_result(rdir, make_result("m", "glue_rte", "lr06", 43, "select", 0.7))
    assert status.main([*PLAN, "--results-dir", str(rdir)]) == 0
    assert "missing       0" in capsys.readouterr().out


def test_emit_writes_a_script_for_only_the_missing_cells(tmp_path, capsys):
    rdir = tmp_path / "res"
    fill(rdir)
    emit_dir = tmp_path / "rest"
    rc = status.main(
        [*PLAN, "--results-dir", str(rdir), "--emit", str(emit_dir), "--mode", "shell"]
    )
    assert rc == 1
    out = capsys.readouterr().out
    assert "1 cell(s) (0 already done, 1 to run)" in out
    script = (emit_dir / "run_all.sh").read_text()
    units = [shlex.join(argv) for argv in unit_argvs(script)]
    assert len(units) == 1
    assert "--seed 43" in units[0] and f"--lr {LR_GRID['lr06']:g}" in units[0]


def test_emit_slurm_uses_the_sweep_emitter(tmp_path, capsys):
    rdir = tmp_path / "res"
    fill(rdir)
    tpl = tmp_path / "t.sh"
    tpl.write_text('#!/bin/bash\npython -m encoder_eval.run "$@"\n')
    emit_dir = tmp_path / "rest"
    status.main([*PLAN, "--results-dir", str(rdir), "--emit", str(emit_dir), "--mode", "slurm",
                 "--slurm-template", str(tpl)])  # fmt: skip
    launch = (emit_dir / "launch.sh").read_text()
    assert launch.count("\nunit ") == 1 and "m_glue_rte_lr06_s43.json" in launch


def test_nothing_missing_writes_nothing(tmp_path, capsys):
    rdir = tmp_path / "res"
    fill(rdir)
    write_result(rdir, make_result("m", "glue_rte", "lr06", 43, "select", 0.7))
    emit_dir = tmp_path / "rest"
    assert status.main([*PLAN, "--results-dir", str(rdir), "--emit", str(emit_dir)]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert not emit_dir.exists()


def test_report_phase_reads_the_selection(tmp_path, capsys):
    sel = tmp_path / "sel.json"
    sel.write_text(json.dumps({"schema": "encoder-eval-selection", "version": selection.VERSION,
                               "pairs": {"m": {"glue_rte": {"lr_key": "lr06",
                                                            "lr": LR_GRID["lr06"]}}}}))  # fmt: skip
    rdir = tmp_path / "rep"
    write_result(rdir, make_result("m", "glue_rte", "lr06", 45, "report", 0.5))
    rc = status.main(["--phase", "report", "--selection", str(sel), "--model", "m=org/m",
                      "--tasks", "glue_rte", "--results-dir", str(rdir)])  # fmt: skip
    assert rc == 1
    out = capsys.readouterr().out
    assert "5 cells planned" in out and "done          1" in out and "missing       4" in out


def test_input_errors_exit_2(tmp_path, capsys):
    assert status.main(["--phase", "select", "--results-dir", str(tmp_path),
                        "--models", "nope"]) == 2  # fmt: skip
    assert status.main(["--phase", "report", "--results-dir", str(tmp_path)]) == 2
    assert status.main(["--phase", "select"]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 3


def test_resume_states_are_listed_and_only_those_of_done_cells_cleaned(tmp_path, capsys):
    """A stopped cell leaves `.resume-<result>.pt` (hundreds of MB for a real model): status
    says where each is, how big, and whether its cell is done; --clean-resume removes those
    of done cells only, `--clean-resume all` every one but a state whose cell is running."""
    from encoder_eval.core.results import cell_lock

    rdir = tmp_path / "res"
    fill(rdir)
    states = {
        "m_glue_rte_lr03_s42.json": 2_500_000,  # done: left over
        "m_glue_rte_lr06_s43.json": 1_000_000,  # missing: the next run resumes from it
        "other_glue_rte_lr03_s42.json": 500_000,  # done, outside the plan
        "x_glue_rte_lr10_s42.json": 300_000,  # not done, outside the plan (abandoned)
    }
    for name, size in states.items():
        (rdir / f".resume-{name}.pt").write_bytes(b"\0" * size)
    argv = [*PLAN, "--results-dir", str(rdir)]
    assert status.main(argv) == 1
    out = capsys.readouterr().out
    section = out.split("resume states: 4 (4.3 MB)")[1]
    assert (f"m/glue_rte/lr03/s42  {rdir}/.resume-m_glue_rte_lr03_s42.json.pt  2.5 MB  "
            "(its cell is done: left over") in section  # fmt: skip
    assert (f"m/glue_rte/lr06/s43  {rdir}/.resume-m_glue_rte_lr06_s43.json.pt  1.0 MB  "
            "(its cell is not done: its next run resumes from it)") in section  # fmt: skip
    assert "(not in this plan)" in section and "--clean-resume all" in section

    assert status.main([*argv, "--clean-resume"]) == 1
    out = capsys.readouterr().out
    assert "removed 2 resume state(s), 3.0 MB" in out
    left = sorted(p.name for p in rdir.glob(".resume-*"))
    assert left == [".resume-m_glue_rte_lr06_s43.json.pt", ".resume-x_glue_rte_lr10_s42.json.pt"]
    assert "resume states: 2 (1.3 MB)" in out

    with cell_lock(rdir / "m_glue_rte_lr06_s43.json") as mine:  # a runner is on that cell
        assert mine
        assert status.main([*argv, "--clean-resume", "all"]) == 1
    captured = capsys.readouterr()
    assert "removed 1 resume state(s), 0.3 MB" in captured.out
    assert "another runner is running its cell" in captured.err
    assert [p.name for p in rdir.glob(".resume-*")] == [".resume-m_glue_rte_lr06_s43.json.pt"]
    assert (rdir / "m_glue_rte_lr03_s42.json").exists()  # results are never touched


def test_status_reads_each_result_file_once(tmp_path, capsys, monkeypatch):
    """Counting, deciding what --emit runs, the warnings and the resume states all come
    from one read of each file (status used to read and validate every result twice)."""
    from collections import Counter

    from encoder_eval.core import results

    rdir = tmp_path / "res"
    fill(rdir)  # two done, one diverged, one stranger (another model's, not in the plan)
    (rdir / "m_glue_rte_lr06_s43.json").write_text("{ truncated")  # corrupt: emitted
    (rdir / ".resume-m_glue_rte_lr03_s42.json.pt").write_bytes(b"\0")  # a done cell's
    reads: Counter = Counter()
    real = results.read_bytes

    def counting(path, *args, **kwargs):
        reads[str(path)] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(results, "read_bytes", counting)
    argv = [*PLAN, "--results-dir", str(rdir), "--emit", str(tmp_path / "rest")]
    assert status.main([*argv, "--mode", "shell", "--clean-resume"]) == 1
    out = capsys.readouterr().out
    assert "corrupt       1" in out and "done          2" in out and "removed 1 resume" in out
    files = sorted(str(p) for p in rdir.glob("*.json"))
    assert len(files) == 5 and dict(reads) == dict.fromkeys(files, 1)
