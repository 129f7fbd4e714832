"""Shared helpers of the fault-injection tests (kills, concurrency, bad input, secrets, ...).

Everything here runs the harness the way a user does: `python -m encoder_eval.<module>`
and the generated `run_all.sh`, as subprocesses, on tiny local models and the small mirror.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Flags that shrink a cell to a few seconds on the CPU (the tiny models have 128 positions).
SHRINK = ["--max-steps", "3", "--max-seq-len", "128", "--device", "cpu"]
# What `run` prints once per finished cell: "<status>: <model> <task> ... -> <out json>".
CELL_DONE = re.compile(r"^(ok|diverged): .* -> (?P<out>.+)$", re.M)
LOCKED = "another runner is running this cell"


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


def py(*args: str) -> list[str]:
    return [sys.executable, "-m", *map(str, args)]


def sh(cmd: list[str], cwd: Path, ok=(0,), timeout: float = 600, **env_extra):
    proc = subprocess.run(cmd, cwd=cwd, env=env(**env_extra), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert proc.returncode in ok, (
        f"{cmd[:4]} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc


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
