"""status.py: counts of done / diverged / failed / missing cells, and re-emitting the missing."""

from __future__ import annotations

import json

from result_helpers import make_result, write_result

from encoder_eval import status
from encoder_eval.protocol import LR_GRID

PLAN = ["--phase", "select", "--model", "m=org/m", "--tasks", "glue_rte",
        "--lr-keys", "lr03,lr06", "--seeds", "42,43"]  # fmt: skip


def fill(rdir):
    """lr03: two ok seeds; lr06: s42 diverged, s43 an unparseable file; plus a stranger."""
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
    assert "failed        0" in out and "missing       1" in out
    assert "other         1" in out
    assert "m/glue_rte/lr06/s42" in out.split("diverged:")[1]
    assert "m/glue_rte/lr06/s43" in out.split("missing:")[1]

    (rdir / "m_glue_rte_lr06_s43.json").write_text("{ truncated")
    assert status.main([*PLAN, "--results-dir", str(rdir)]) == 1
    out = capsys.readouterr().out
    assert "failed        1" in out and "missing       0" in out
    assert "not valid JSON" in out and "delete" in out


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
    units = [line for line in script.splitlines() if line.startswith("unit ")]
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
    assert "nothing missing" in capsys.readouterr().out
    assert not emit_dir.exists()


def test_report_phase_reads_the_selection(tmp_path, capsys):
    sel = tmp_path / "sel.json"
    sel.write_text(json.dumps({"schema": "encoder-eval-selection", "version": 1,
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
