"""Concurrent runners: two launchers on one sweep never run a cell twice or at the same time,
never corrupt a result, and a lock whose holder was SIGKILLed is free again.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fault_helpers import (
    LOCKED,
    REPO,
    SHRINK,
    _drop_dac_capabilities,
    cells_run,
    env,
    logs_text,
    py,
    result_files,
    sh,
)

from encoder_eval.core.results import cell_lock, read_result, result_filename

MODEL, TASK, LR_KEYS, SEEDS = "tiny", "glue_rte", ("lr03", "lr10"), (42, 43)


def _sweep(tmp_path, tiny_models, small_mirror, mode: str, *extra: str) -> Path:
    out = tmp_path / f"runs-{mode}"
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", ",".join(LR_KEYS), "--seeds", ",".join(map(str, SEEDS)),
          "--data-dir", small_mirror, *SHRINK, "--out-dir", out,
          "--results-dir", tmp_path / "results", "--mode", mode, *extra), tmp_path)  # fmt: skip
    return out


def _expected() -> set[str]:
    return {result_filename(MODEL, TASK, lr, s) for lr in (1.67e-05, 1e-4) for s in SEEDS}


def _check_once(transcripts: list[str], rdir: Path) -> collections.Counter:
    """Every cell written exactly once over all runners, every result whole and valid."""
    runs = collections.Counter(Path(p).name for t in transcripts for p in cells_run(t))
    assert set(runs) == _expected() and set(runs.values()) == {1}, runs
    files = result_files(rdir)
    assert {p.name for p in files} == _expected()
    assert all(read_result(p)[0] is not None for p in files)
    return runs


@pytest.mark.slow
def test_two_run_all_scripts_at_once_run_each_cell_once(tmp_path, tiny_models, small_mirror):
    runs = _sweep(tmp_path, tiny_models, small_mirror, "shell")
    procs = [
        subprocess.Popen(["bash", str(runs / "run_all.sh")], cwd=tmp_path, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err
        assert f"[cells {len(_expected())}/{len(_expected())} done" in out
    log = logs_text(runs / "logs")
    _check_once([log], tmp_path / "results")
    # The runners really met: one of them found a cell the other one was running, or done.
    assert LOCKED in log or "(done)" in log, log


@pytest.mark.slow
def test_an_array_task_and_a_shell_run_at_once(tmp_path, tiny_models, small_mirror):
    tpl = tmp_path / "job.sh"
    tpl.write_text(f'#!/bin/bash\nexec {sys.executable} -m encoder_eval.run "$@"\n')
    shell = _sweep(tmp_path, tiny_models, small_mirror, "shell")
    # one cell per array task (Slurm plans group by LR and pack 4 units a job by default),
    # as the rows below say
    array = _sweep(tmp_path, tiny_models, small_mirror, "slurm-array", "--slurm-template",
                   str(tpl), "--group", "cell", "--no-warm")  # fmt: skip
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"{i}\n" for i in range(len(_expected()))))
    # The array's tasks, one after another (as a one-slot cluster runs them), each logged.
    tasks = textwrap.dedent(f"""
        for i in 0 1 2 3; do
            SLURM_ARRAY_TASK_ID=$i bash {array / "array.sh"} {array / "manifest.tsv"} {rows} \\
                >"{tmp_path}/task-$i.log" 2>&1 || echo "task $i exited $?"
        done
    """)  # fmt: skip
    both = [
        subprocess.Popen(["bash", "-c", tasks], cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True),
        subprocess.Popen(["bash", str(shell / "run_all.sh")], cwd=tmp_path, env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    ]  # fmt: skip
    outs = [p.communicate(timeout=600)[0] for p in both]
    assert "exited" not in outs[0], outs[0]
    assert both[1].returncode == 0, outs[1]
    task_logs = "".join(p.read_text() for p in sorted(tmp_path.glob("task-*.log")))
    _check_once([task_logs, logs_text(shell / "logs")], tmp_path / "results")


HOLDER = textwrap.dedent(
    """
    import sys, time
    from encoder_eval.core.results import cell_lock
    with cell_lock(sys.argv[1]) as mine:
        print("HELD" if mine else "BUSY", flush=True)
        time.sleep(600)
    """
)


def _hold(out: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=REPO, env=env(),
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "HELD"
    return holder


def _sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_a_lock_held_by_a_sigkilled_runner_is_free(tmp_path):
    out = tmp_path / result_filename(MODEL, TASK, 1.67e-05, 42)
    holder = _hold(out)
    try:
        with cell_lock(out) as mine:
            assert mine is False  # held by a live process: refused
        _sigkill(holder)
    finally:
        holder.kill()
    assert (tmp_path / f".lock-{out.name}").exists()  # what the killed holder left behind...
    with cell_lock(out) as mine:
        assert mine is True  # ...does not block: the kernel released the dead holder's lock
    assert not (tmp_path / f".lock-{out.name}").exists()  # a clean release removes the file


@pytest.mark.slow
def test_a_runner_waits_for_a_held_cell_and_takes_over_when_its_holder_is_killed(
    tmp_path, tiny_models, small_mirror
):
    rdir = tmp_path / "results"
    rdir.mkdir()
    out = rdir / result_filename(MODEL, TASK, 1.67e-05, 42)
    holder = _hold(out)
    waiter = None
    try:
        waiter = subprocess.Popen(
            py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", MODEL,
               "--task", TASK, "--lr", "1.67e-05", "--seed", "42", "--phase", "select",
               "--data-dir", small_mirror, "--results-dir", rdir, "--skip-existing", *SHRINK),
            cwd=tmp_path, env=env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        first = waiter.stdout.readline()
        assert LOCKED in first, first
        time.sleep(1.0)
        assert waiter.poll() is None and not out.exists()  # waiting, not running the cell
        _sigkill(holder)
        rest = waiter.communicate(timeout=300)[0]
        assert waiter.returncode == 0, rest
    finally:
        holder.kill()
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
    assert cells_run(first + rest) == [str(out)]  # the holder died: the waiter ran the cell
    assert read_result(out)[0] is not None


# ----------------------------------------------------------------------------- lock files


def test_lock_files_take_the_results_mode_group_writable_in_a_shared_folder(tmp_path):
    """Issue 23 item 9: in a group-writable results folder a lock file is group-writable, so
    a teammate can take the lock a killed runner of yours left; elsewhere it has the mode
    results get."""
    old = os.umask(0o022)
    try:
        for name, dir_mode, group_write in (("shared", 0o2775, True), ("mine", 0o755, False)):
            folder = tmp_path / name
            folder.mkdir()
            folder.chmod(dir_mode)
            with cell_lock(folder / "x.json") as mine:
                mode = stat.S_IMODE(os.stat(folder / ".lock-x.json").st_mode)
            assert mine and bool(mode & stat.S_IWGRP) == group_write, oct(mode)
            assert mode & 0o644 == 0o644 and not mode & stat.S_IWOTH, oct(mode)
    finally:
        os.umask(old)


def test_another_users_leftover_lock_does_not_stop_the_cell(tmp_path):
    """A lock file another user left (0644, not writable here) is locked read-only: the cell
    runs, and once done the file is gone. Run without root's permission override."""
    target = tmp_path / "x.json"
    lock = tmp_path / ".lock-x.json"
    lock.write_text("")
    os.chown(lock, 65534, 65534)
    lock.chmod(0o644)
    tmp_path.chmod(0o777)
    probe = subprocess.run([sys.executable, "-c", "import os, sys; sys.exit(os.access("
                            f"{str(lock)!r}, os.W_OK))"], preexec_fn=_drop_dac_capabilities)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip("permission bits cannot stop this test's commands (root writes any file)")
    code = ("import sys; from encoder_eval.core.results import cell_lock\n"
            f"with cell_lock({str(target)!r}) as mine:\n    print(mine)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env(), timeout=60, preexec_fn=_drop_dac_capabilities)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "True\n", proc.stderr
    assert not lock.exists()


def test_without_flock_cells_are_locked_by_exclusive_lock_files(tmp_path, monkeypatch, capsys):
    """Lustre `noflock` and friends: flock fails with ENOSYS. Cells are then locked by an
    O_EXCL lock file naming host and process: a held one stops a second runner, a stale one
    of this host (its process gone) is taken over, another host's is left alone; one note
    says so, and what to do."""

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    target = tmp_path / "x.json"
    excl = tmp_path / ".lock-x.json.excl"
    with cell_lock(target) as first:
        owner = excl.read_text().split()
        with cell_lock(target) as second:
            pass
    assert first and not second and not excl.exists()
    assert owner[:2] == [socket.gethostname(), str(os.getpid())]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    excl.write_text(f"{socket.gethostname()} {gone.pid} dead0000\n")
    with cell_lock(target) as taken:
        assert taken and excl.read_text().split()[1] == str(os.getpid())
    excl.write_text("another-host 1 c0ffee\n")
    with cell_lock(target) as elsewhere:
        assert not elsewhere
    assert excl.read_text() == "another-host 1 c0ffee\n"  # never removed
    (note,) = capsys.readouterr().err.splitlines()
    assert note.startswith(f"note: the file system of {tmp_path} has no flock")
    assert "remove it by hand once that host's run is gone" in note
