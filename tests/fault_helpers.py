"""Shared helpers of the fault-injection tests (kills, concurrency, bad input, secrets, ...).

Everything here runs the harness the way a user does: `python -m encoder_eval.<module>`
and the generated `run_all.sh`, as subprocesses, on tiny local models and the small mirror.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Flags that shrink a cell to a few seconds on the CPU (the tiny models have 128 positions).
SHRINK = ["--max-steps", "3", "--max-seq-len", "128", "--device", "cpu"]
# What `run` prints once per finished cell: "<status>: <model> <task> ... -> <out json>".
CELL_DONE = re.compile(r"^(ok|diverged): .* -> (?P<out>.+)$", re.M)
LOCKED = "another runner is running this cell"

# Runs `python -m MODULE ARGS` with os.fsync hooked. Each fsync of a result file in
# $EE_RESULTS_DIR (its temporary, or the final path if a writer wrote there directly) is a
# result write with its data on disk and the rename still to come: the hook counts it in
# the file $EE_WRITE_COUNT (shared by the processes of one run_all.sh), announces it as
# "W <path>" on the inherited descriptor $EE_WRITE_FD, and the $EE_BLOCK_AT-th one says
# "B <path>" instead and then blocks inside the write until the process is killed.
IN_WRITE_HOOK = textwrap.dedent(
    """
    import os, runpy, signal, sys
    from encoder_eval.core.results import TMP_PREFIX
    results_dir = os.path.realpath(os.environ["EE_RESULTS_DIR"])
    real_fsync = os.fsync
    def fsync(fd):
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        name = os.path.basename(path)
        hidden = name.startswith(".") and not name.startswith(TMP_PREFIX)  # locks, resume state
        if os.path.dirname(path) != results_dir or hidden or ".predictions.json" in name:
            return
        count = os.open(os.environ["EE_WRITE_COUNT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(count, b"w")
        nth = os.fstat(count).st_size
        os.close(count)
        block = nth == int(os.environ["EE_BLOCK_AT"])
        os.write(int(os.environ["EE_WRITE_FD"]), f"{'B' if block else 'W'} {path}\\n".encode())
        while block:
            signal.pause()
    os.fsync = fsync
    if sys.argv[1:2] != ["-m"]:
        sys.exit("usage: python-with-write-hook -m MODULE [ARG...]")
    sys.argv = sys.argv[2:]
    sys.path[0] = os.getcwd()
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    """
)


def env(**extra: str) -> dict[str, str]:
    """The environment of every subprocess: offline, one thread, this interpreter."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHON": sys.executable,
        **extra,
    }


def hooked_python(directory: Path) -> Path:
    """Write an executable that stands in for `$PYTHON` in run_all.sh: this interpreter
    with IN_WRITE_HOOK, so a test can see every result write and block one of them."""
    directory.mkdir(parents=True, exist_ok=True)
    hook = directory / "in_write_hook.py"
    hook.write_text(IN_WRITE_HOOK)
    wrapper = directory / "python-with-write-hook"
    wrapper.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(hook))} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def py(*args: str) -> list[str]:
    return [sys.executable, "-m", *map(str, args)]


def sh(cmd: list[str], cwd: Path, ok=(0,), timeout: float = 600, **env_extra):
    proc = subprocess.run(cmd, cwd=cwd, env=env(**env_extra), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert proc.returncode in ok, (
        f"{cmd[:4]} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc


def wait_until_started(log: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until `log` shows a cell's fourth step, while `proc` (the script) still runs:
    the moment the signal tests stop a cell that is really training."""
    deadline = time.monotonic() + timeout
    while '"step": 4' not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, "the cell never started"
        time.sleep(0.05)


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root` (hidden ones too): relative path -> content hash or 'dir'."""
    out = {}
    root = Path(root)
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_dir() and not path.is_symlink():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def result_files(results_dir: Path) -> list[Path]:
    """The published result files: non-hidden `*.json` directly in the directory."""
    return sorted(
        p for p in Path(results_dir).glob("*.json")
        if not p.name.startswith(".") and not p.name.endswith(".predictions.json")
    )  # fmt: skip


def cells_run(log_text: str) -> list[str]:
    """The result paths of the cells a `run` log says it finished."""
    return [m.group("out") for m in CELL_DONE.finditer(log_text)]


def logs_text(log_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(Path(log_dir).glob("*.log")))


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


# Commands run without root's permission override (the tests run as root, whom permission
# bits do not stop): `preexec_fn=_drop_dac_capabilities`, after `_permissions_problem`.
_PR_CAPBSET_DROP, _CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 24, 1, 2


def _drop_dac_capabilities() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _permissions_problem(locked: Path) -> str | None:
    """None when a command started like the cases can be stopped by permission bits."""
    if os.geteuid() != 0:
        return None
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"import os, sys; sys.exit(os.access({str(locked)!r}, os.R_OK))"],
            preexec_fn=_drop_dac_capabilities, capture_output=True, text=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"dropping CAP_DAC_OVERRIDE failed ({exc})"
    return None if probe.returncode == 0 else "root still reads a mode-000 directory"


# "1" (.ci/run sets it: CI runs as root and can drop the override): a test that needs
# permission bits to stop its commands fails where they cannot, instead of skipping.
REQUIRE_PERMISSIONS_ENV = "ENCODER_EVAL_REQUIRE_PERMISSIONS"


def skip_without_permission_bits(problem: str | None, why: str) -> None:
    """Skip the test (`why: problem`) when `problem` (`_permissions_problem`) is not None;
    a failure instead under ENCODER_EVAL_REQUIRE_PERMISSIONS=1."""
    if problem is None:
        return
    import pytest

    if os.environ.get(REQUIRE_PERMISSIONS_ENV) == "1":
        pytest.fail(f"{REQUIRE_PERMISSIONS_ENV}=1 but {why}: {problem}")
    pytest.skip(f"{why}: {problem}")


def two_long_units_sweep(model_dir, mirror, runs: Path, results: Path, cwd: Path) -> Path:
    """Sweep two units ("tiny" on glue_rte, lr03 and lr06, seed 42) of 40 steps each, long
    enough to stop mid-cell; the script's path."""
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"tiny={model_dir}",
          "--tasks", "glue_rte", "--lr-keys", "lr03,lr06", "--seeds", "42", "--group", "lr",
          "--max-steps", "40", "--max-seq-len", "128", "--device", "cpu", "--precision", "fp32",
          "--data-dir", mirror, "--extra-run-args", "--epoch-cap 100 --no-early-stop",
          "--out-dir", runs, "--results-dir", results), cwd)  # fmt: skip
    return runs / "run_all.sh"
