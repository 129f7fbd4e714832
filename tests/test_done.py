"""`python -m encoder_eval.done`: the one definition of a done cell, as the scripts call it.

Done is a result that parses, validates and names its cell, phase included; a file named
like a cell result that reads and fails that is moved aside into `.corrupt/` (never
deleted) so the cell runs again; anything else (unreadable, a newer harness's, another
model's, not named like a cell result) is left in place and is not done.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_helpers import (
    _drop_dac_capabilities,
    _permissions_problem,
    env,
    skip_without_permission_bits,
)
from result_helpers import make_result, write_result

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import QUARANTINE_DIR, cell_lock, result_filename, settle_cell
from encoder_eval.plans.plan import PlanInputs

MODEL, TASK = "m", "glue_rte"


def _path(rdir: Path, key: str, seed: int) -> Path:
    return rdir / result_filename(MODEL, TASK, LR_GRID[key], seed)


def _done(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "encoder_eval.done", *map(str, args)],
                          input=stdin, capture_output=True, env=env(), timeout=60)  # fmt: skip


def _cells(rdir: Path) -> tuple[list[Path], dict[str, bytes]]:
    """Seven cells: ok, diverged, truncated, of the other phase, another cell's result,
    missing, empty; returns their paths and the bytes of the four corrupt ones."""
    ok = write_result(rdir, make_result(MODEL, TASK, "lr03", 42, "select", 0.5))
    diverged = write_result(
        rdir, make_result(MODEL, TASK, "lr03", 43, "select", None, status="diverged")
    )
    truncated, report, other, missing, empty = (
        _path(rdir, key, seed)
        for key, seed in (("lr06", 42), ("lr06", 43), ("lr10", 42), ("lr10", 43), ("lr03", 44))
    )
    truncated.write_text(ok.read_text()[:-20])
    report.write_text(json.dumps(make_result(MODEL, TASK, "lr06", 43, "report", 0.5)))
    other.write_bytes(ok.read_bytes())
    empty.write_text("")
    corrupt = {p.name: p.read_bytes() for p in (truncated, report, other, empty)}
    return [ok, diverged, truncated, report, other, missing, empty], corrupt


def test_states_exit_status_and_corrupt_files_moved_aside_intact(tmp_path):
    files, corrupt = _cells(tmp_path)
    proc = _done("--phase", "select", "--states", *files)
    assert proc.returncode == 1
    states = proc.stdout.decode().split()
    assert states == ["ok", "diverged", "moved", "moved", "moved", "missing", "moved"]
    moved = proc.stderr.decode().splitlines()
    assert len(moved) == 4 and all(line.startswith("moved the corrupt result ") for line in moved)
    for why in ("not valid JSON", "a report cell in a select results directory",
                "disagrees with its filename", "empty file"):  # fmt: skip
        assert sum(why in line for line in moved) == 1, why
    kept = sorted((tmp_path / QUARANTINE_DIR).iterdir())
    assert {k.name.rsplit(".", 2)[0] for k in kept} == set(corrupt)
    assert all(k.read_bytes() == corrupt[k.name.rsplit(".", 2)[0]] for k in kept)
    # Again, the names as NUL-separated stdin: nothing left to move, nothing done anew.
    again = _done("--phase", "select", "--states", "--files0-from", "-",
                  stdin=b"".join(bytes(f) + b"\0" for f in files))  # fmt: skip
    assert again.returncode == 1 and again.stderr == b""
    assert again.stdout.decode().split() == ["ok", "diverged"] + ["missing"] * 5
    assert _done("--phase", "select", *files[:2]).returncode == 0  # diverged is done too
    assert _done("--phase", "report", files[0]).returncode == 1  # not a report cell


def test_a_corrupt_result_whose_cell_another_runner_holds_stays(tmp_path):
    path = _path(tmp_path, "lr06", 42)
    path.write_text("{")
    with cell_lock(path) as mine:
        assert mine
        proc = _done("--states", path)
    assert proc.returncode == 1 and proc.stdout.decode().split() == ["corrupt"]
    assert path.read_text() == "{" and not (tmp_path / QUARANTINE_DIR).exists()


def test_imports_no_torch():
    """The scripts call it on login nodes, once per launch: it must start fast."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "encoder_eval.done",
                           "--states", "/nonexistent/x.json"], capture_output=True, text=True,
                          env=env(), timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "missing\n"
    modules = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:")]  # fmt: skip
    assert "encoder_eval.core.results" in modules
    heavy = {"torch", "transformers", "datasets", "sklearn", "scipy"}
    assert not [m for m in modules if m.split(".")[0] in heavy]


def test_bad_input_is_one_error_line(tmp_path):
    proc = _done("--files0-from", tmp_path / "nope")
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith("error: cannot read --files0-from ") and "give a readable file" in line
    proc = _done("--phase", "dev", tmp_path / "x.json")
    assert proc.returncode == 2 and proc.stderr.decode().count("\n") == 1


# ----------------------------------------------------------------------------- what moves


def test_a_newer_harness_result_is_left_in_place_not_moved(tmp_path):
    """Issue 23 item 8: only a file that reads and fails to parse or validate is moved. A
    newer harness's result stays where it is, with one line, and is not done ('kept'); a
    real corrupt one still moves."""
    newer = write_result(tmp_path, make_result(MODEL, TASK, "lr03", 42, "select", 0.5))
    data = json.loads(newer.read_text())
    data["schema_version"] += 1
    newer.write_text(json.dumps(data))
    before = newer.read_bytes()
    torn = _path(tmp_path, "lr06", 42)
    torn.write_text("{")
    proc = _done("--phase", "select", "--states", newer, torn)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.decode().split() == ["kept", "moved"]
    err = proc.stderr.decode().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"left {newer} in place (written by a newer harness")
    assert "its cell is not done, and is not run over it" in err[0]
    assert err[1].startswith(f"moved the corrupt result {torn}")
    assert newer.read_bytes() == before
    assert [p.name.rsplit(".", 2)[0] for p in (tmp_path / QUARANTINE_DIR).iterdir()] == [torn.name]


def test_a_teammates_result_this_user_cannot_read_stays_where_it_is(tmp_path):
    """A mode-000 result, read by `done` without root's permission override: kept, not
    moved, one line naming the permission problem."""
    path = write_result(tmp_path, make_result(MODEL, TASK, "lr03", 42, "select", 0.5))
    before = path.read_bytes()
    path.chmod(0)
    problem = _permissions_problem(path)
    if problem:
        path.chmod(0o644)
    skip_without_permission_bits(problem, "permission bits cannot stop this test's commands")
    proc = subprocess.run([sys.executable, "-m", "encoder_eval.done", "--states", str(path)],
                          capture_output=True, env=env(), timeout=60,
                          preexec_fn=_drop_dac_capabilities)  # fmt: skip
    path.chmod(0o644)
    assert proc.returncode == 1 and proc.stdout.decode().split() == ["kept"], proc.stderr
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"left {path} in place (cannot be read (Permission denied))")
    assert path.read_bytes() == before and not (tmp_path / QUARANTINE_DIR).exists()


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.ESTALE])
def test_a_file_that_cannot_be_read_is_not_corruption(tmp_path, monkeypatch, code):
    """A teammate's result this user may not read, or EIO/ESTALE on NFS: the file is kept,
    never moved, and the cell is not done. (The error is injected at `io.open`: root, who
    runs these tests, reads any file, and an I/O error cannot be made here.)"""
    path = write_result(tmp_path, make_result(MODEL, TASK, "lr03", 42, "select", 0.5))
    real_open = io.open

    def failing_open(file, *args, **kwargs):
        if os.fspath(file) == os.fspath(path):
            raise OSError(code, os.strerror(code))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", failing_open)
    lines: list[str] = []
    state, data, why = settle_cell(path, "select", warn=lines.append)
    monkeypatch.undo()
    assert (state, data) == ("kept", None) and os.strerror(code) in why
    assert path.exists() and not (tmp_path / QUARANTINE_DIR).exists()
    (line,) = lines
    assert line.startswith(f"left {path} in place")


def test_done_moves_only_files_named_like_a_cell_result(tmp_path):
    """Issue 29 item 7: `done results/report/*` on a folder holding experiment.toml, a
    predictions file of an older harness and notes leaves them all where they are."""
    result = write_result(tmp_path, make_result(MODEL, TASK, "lr06", 45, "report", 0.5))
    preds = result.with_name(result.name.replace(".json", ".predictions.json"))
    preds.write_text(json.dumps({"schema": "encoder-eval-predictions", "schema_version": 0}))
    exp = tmp_path / "experiment.toml"
    exp.write_text("version = 1\n")
    notes = tmp_path / "notes.json"
    notes.write_text("{")
    files = sorted(p for p in tmp_path.iterdir())
    before = {p: p.read_bytes() for p in files}
    proc = _done("--phase", "report", "--states", *files)
    assert proc.returncode == 1
    states = dict(zip(files, proc.stdout.decode().split(), strict=True))
    assert states[result] == "ok"
    assert all(states[p] == "kept" for p in (preds, exp, notes)), states
    assert {p: p.read_bytes() for p in files} == before
    assert not (tmp_path / QUARANTINE_DIR).exists()
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 3 and all("not named like a cell result, so never moved" in x
                                   for x in lines)  # fmt: skip


def test_colliding_model_names_are_refused_and_never_count_as_each_other(tmp_path):
    """Issue 23 item 10: `a/b` and `a_b` write one result file. A plan holding both is
    refused naming both; a result of one under the other's name is not the other's done
    cell, and nothing moves or overwrites it."""
    from encoder_eval.plans import plan as plan_mod

    with pytest.raises(HarnessError) as refused:
        plan_mod.build_plan("select", PlanInputs(tmp_path, extra_models=["a/b=org/x",
                            "a_b=org/y"], tasks=[TASK]), lr_keys=["lr03"], seeds=[42])  # fmt: skip
    message = str(refused.value)
    assert "'a/b'" in message and "'a_b'" in message and "one result file" in message
    theirs = write_result(tmp_path, make_result("a/b", TASK, "lr03", 42, "select", 0.5))
    assert theirs.name == result_filename("a_b", TASK, LR_GRID["lr03"], 42)
    mine = plan_mod.build_plan(
        "select",
        PlanInputs(tmp_path, extra_models=["a_b=org/y"], tasks=[TASK]),
        lr_keys=["lr03"],
        seeds=[42],
    )
    (cell,) = mine.cells
    state, _, why = mine.cell_status(cell)
    assert state == "kept" and "a valid result of model 'a/b'" in why
    proc = _done("--phase", "select", "--model", "a_b", "--states", theirs)
    assert proc.returncode == 1 and proc.stdout.decode().split() == ["kept"]
    assert theirs.exists() and not (tmp_path / QUARANTINE_DIR).exists()
    assert _done("--phase", "select", "--model", "a/b", theirs).returncode == 0
