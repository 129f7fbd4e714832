"""`python -m encoder_eval.done`: the one definition of a done cell, as the scripts call it.

Done is a result that parses, validates and names its cell, phase included; anything else
in a cell's place is moved aside into `.corrupt/` (never deleted) so the cell runs again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fault_helpers import env
from result_helpers import make_result, write_result

from encoder_eval.protocol import LR_GRID
from encoder_eval.results import QUARANTINE_DIR, cell_lock, result_filename

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
    assert "encoder_eval.results" in modules
    heavy = {"torch", "transformers", "datasets", "sklearn", "scipy"}
    assert not [m for m in modules if m.split(".")[0] in heavy]


def test_bad_input_is_one_error_line(tmp_path):
    proc = _done("--files0-from", tmp_path / "nope")
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith("error: cannot read --files0-from ") and "give a readable file" in line
    proc = _done("--phase", "dev", tmp_path / "x.json")
    assert proc.returncode == 2 and proc.stderr.decode().count("\n") == 1
