"""What a running cell prints for the scripts to read, and how the scripts read it.

Three kinds of line reach `run_all.sh` from a unit's stderr: a fine-tune cell's progress
with `--progress json` (`progress_line`: one JSON object whose first key is the cell), a
probe cell's result (`probe_line`: `[i/n] METHOD TASK: ...`), and the acknowledgement of a
stop signal (`stop_line`). Each is written here and matched by the bash patterns
`shell_patterns` gives, which `plans.emit` fills into the script; the two sides cannot
drift apart.
"""

from __future__ import annotations

import json

# The keys of a progress line, the cell first (the pattern that finds a progress line
# anchors on it).
CELL, TOTAL_STEPS, ELAPSED, ETA, STEP, DEV = (
    "cell",
    "total_steps",
    "elapsed_s",
    "eta_s",
    "step",
    "dev",
)
STOP_PREFIX = "stopping: "


def progress_line(
    cell: str, total_steps: int, elapsed_s: float, eta_s: float | None, **fields
) -> str:
    """One progress event as a JSON line: the cell, its step budget, the time spent and
    left, and the event's fields (`step`, `dev`, `loss`, ...)."""
    head = {CELL: cell, TOTAL_STEPS: total_steps, ELAPSED: elapsed_s, ETA: eta_s}
    return json.dumps({**head, **fields})


def probe_line(number: int, total: int, method: str, task: str, rest: str) -> str:
    """A probe cell's line: `[2/6] minilm:mean glue_sst2: accuracy 81.2 ...`."""
    return f"[{number}/{total}] {method} {task}: {rest}"


def stop_line(what: str) -> str:
    """The line a cell prints at once when a stop signal arrives (`what`: `Ctrl-C
    (SIGINT)`, `SIGTERM`)."""
    return (
        f"{STOP_PREFIX}{what} received; saving state at the next step... (the running "
        "step ends first, which may take a while; no need to send it again)"
    )


def shell_patterns() -> str:
    """bash `local` assignments of the patterns `run_all.sh` reads these lines with (bash
    regular expressions over the exact text `progress_line` and `probe_line` write)."""
    number = "-?[0-9][0-9.eE+-]*"
    patterns = {
        "re_cell": f'^\\{{"{CELL}": "(([^"\\\\]|\\\\.)*)"',
        "re_step": f'"{STEP}": ([0-9]+)',
        "re_total": f'"{TOTAL_STEPS}": ([0-9]+)',
        "re_dev": f'"{DEV}": ({number})',
        "re_eta": f'"{ETA}": ([0-9][0-9.]*)',
        "re_probe": "^\\[[0-9]+/[0-9]+\\] (.+)$",
    }
    lines = [f"local {name}='{value}'" for name, value in patterns.items()]
    lines.append(f"local stop_prefix='{STOP_PREFIX}'")
    return "\n    ".join(lines)
