"""Exit codes that tell the truth (issue 50, section 2): a run of `run_all.sh` that leaves a
cell not done never exits 0, and says which cells; a stopped warm worker does not hang the
script; `launch.sh` without Slurm says what is missing. Real scripts, tiny BERT, the small
mirror; the faults are the real ones (the run's temporary folder removed, SIGSTOP, a PATH
without sbatch)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fault_helpers import (
    SHRINK,
    env,
    py,
    result_files,
    sh,
    two_long_units_sweep,
    wait_until_started,
)

from encoder_eval import sweep
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import result_filename

MODEL, TASK, SEEDS, LR_KEYS = "tiny", "glue_rte", (42, 43), ("lr03", "lr10")
SLURM_TOOLS = {"sbatch", "squeue", "scontrol", "srun", "salloc", "sinfo", "scancel", "sacct"}


def _cells() -> list[str]:
    return [result_filename(MODEL, TASK, LR_GRID[k], s) for k in LR_KEYS for s in SEEDS]


def _sweep(tmp_path: Path, tiny_models, small_mirror, *extra: str) -> tuple[Path, Path]:
    """A select sweep of 4 one-cell units (2 LRs x 2 seeds, `--group cell`)."""
    out, results = tmp_path / "runs", tmp_path / "results"
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", ",".join(LR_KEYS), "--seeds", ",".join(map(str, SEEDS)),
          "--data-dir", small_mirror, *SHRINK, "--precision", "fp32", "--out-dir", out,
          "--results-dir", results, "--mode", "shell", "--group", "cell", *extra),
       tmp_path)  # fmt: skip
    return out, results


def _written(results: Path) -> set[str]:
    return {p.name for p in result_files(results)}


@pytest.mark.parametrize(
    "flags",
    [[], ["--warm"], ["--workers", "2", "--warm"]],
    ids=["one-process-per-unit", "warm", "two-warm-workers"],
)
def test_a_run_folder_removed_mid_run_exits_non_zero_naming_the_cells_not_done(
    tmp_path, tiny_models, small_mirror, flags
):
    """A tmp purge (or a job epilogue) removes the script's temporary folder while its first
    unit runs: no further unit can be claimed, and the script must not read that as
    "another worker took it" (main: "finished: 0 run", exit 0, 1 of 4 cells written). It
    exits 1 with a last line naming the cells not done, and a rerun runs just those."""
    runs, results = _sweep(tmp_path, tiny_models, small_mirror)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(["bash", str(runs / "run_all.sh"), *flags], cwd=tmp_path,
                            env=env(TMPDIR=str(tmp)), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list((runs / "logs").glob("*.log")):  # the first unit is claimed and runs
            assert time.monotonic() < deadline and proc.poll() is None, "no unit started"
            time.sleep(0.05)
        (run_dir,) = tmp.glob("ee-run_all.*")
        while run_dir.exists():  # a worker may be adding to it meanwhile
            shutil.rmtree(run_dir, ignore_errors=True)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == EXIT_INCOMPLETE, out + err
    written = _written(results)
    missing = [name.removesuffix(".json") for name in _cells() if name not in written]
    assert 1 <= len(written) <= 2 and missing, (written, out + err)
    last = err.strip().splitlines()[-1]
    assert last == f"not done: {len(missing)} of 4 cells: {' '.join(missing)}", out + err
    assert "finished: 0 run" not in out and f"{run_dir}" in err, out + err
    assert "Traceback" not in err, err  # a warm worker that cannot open its unit says so
    # Running again runs just those, and exits 0.
    again = sh(["bash", str(runs / "run_all.sh"), *flags], tmp_path, TMPDIR=str(tmp))
    assert f"finished: {len(missing)} run, {4 - len(missing)} skipped" in again.stdout
    assert _written(results) == set(_cells())


def _warm_worker(pid: int) -> psutil.Process:
    """The `encoder_eval.run --warm-worker` process under the script `pid`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for p in psutil.Process(pid).children(recursive=True):
            try:
                if "--warm-worker" in p.cmdline():
                    return p
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    raise AssertionError("no warm worker")


def test_a_stopped_warm_worker_is_killed_and_its_unit_fails(tmp_path, tiny_models, small_mirror):
    """SIGSTOP to the warm worker alone (not to the script): past --stopped-timeout the
    script kills it, fails its unit with a line saying why, runs the next unit in a fresh
    worker and exits 1 naming the cell not done; it never waits forever."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    script = two_long_units_sweep(tiny_models["bert"], small_mirror, runs, results, tmp_path)
    assert "--stopped-timeout" in sh(["bash", str(script), "--help"], tmp_path).stdout
    first = runs / "logs" / f"{MODEL}_{TASK}_lr03.log"
    proc = subprocess.Popen(["bash", str(script), "--warm", "--stopped-timeout", "3"],
                            cwd=tmp_path, env=env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        wait_until_started(first, proc)
        worker = _warm_worker(proc.pid)
        worker.send_signal(signal.SIGSTOP)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == EXIT_INCOMPLETE, out + err
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert re.search(rf"warm worker \(pid {worker.pid}\) of {MODEL}_{TASK}_lr03 was stopped",
                     err), err  # fmt: skip
    assert re.search(rf"FAILED {MODEL}_{TASK}_lr03 \(exit 137, 0 of 1 cells written\)", err), err
    stopped, ran = (result_filename(MODEL, TASK, LR_GRID[k], 42) for k in ("lr03", "lr06"))
    assert _written(results) == {ran}
    last = err.strip().splitlines()[-1]
    assert last == f"not done: 1 of 2 cells: {stopped.removesuffix('.json')}", err


def test_stopped_timeout_is_checked(tmp_path, tiny_models, small_mirror):
    runs, _ = _sweep(tmp_path, tiny_models, small_mirror)
    for bad in ("-1", "x", "1.5"):
        proc = sh(["bash", str(runs / "run_all.sh"), "--warm", "--stopped-timeout", bad],
                  tmp_path, ok=(EXIT_INPUT_ERROR,))  # fmt: skip
        assert proc.stderr.startswith("error: --stopped-timeout") and proc.stderr.count("\n") == 1


def _path_without_slurm(tmp_path: Path) -> str:
    """A PATH holding every command of this one but Slurm's: a machine without Slurm."""
    bindir = tmp_path / "bin-no-slurm"
    bindir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = Path(folder, name)
            if name in SLURM_TOOLS or (bindir / name).exists() or not os.access(target, os.X_OK):
                continue
            (bindir / name).symlink_to(target)
    assert shutil.which("sbatch", path=str(bindir)) is None
    return str(bindir)


@pytest.mark.parametrize("mode", ["slurm", "slurm-array"])
def test_launch_without_slurm_names_what_is_missing(tmp_path, mode):
    """`launch.sh` on a machine without sbatch: one `error:` line naming it, exit 2, nothing
    submitted or written (not bash's `sbatch: command not found`, 127)."""
    template = tmp_path / "template.sh"
    template.write_text('#!/bin/bash\n#SBATCH --time=00:10:00\npython -m encoder_eval.run "$@"\n')
    out = tmp_path / "runs"
    assert sweep.main(["--phase", "select", "--model", "a=org/a", "--tasks", TASK,
                       "--lr-keys", "lr03", "--seeds", "42", "--mode", mode,
                       "--slurm-template", str(template), "--out-dir", str(out),
                       "--results-dir", str(tmp_path / "res")]) == 0  # fmt: skip
    before = sorted(p.name for p in out.rglob("*"))
    proc = subprocess.run(["bash", str(out / "launch.sh")], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120,
                          env=env(PATH=_path_without_slurm(tmp_path)))  # fmt: skip
    assert proc.returncode == EXIT_INPUT_ERROR, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: sbatch is not on PATH"), proc.stderr
    assert "command not found" not in proc.stderr
    assert sorted(p.name for p in out.rglob("*")) == before


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
