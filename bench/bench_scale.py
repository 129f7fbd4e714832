"""What every command a user runs costs at the protocol's own size (issue 37, item 5).

Generates a valid results tree (`tests/scale_grid.py`: every registry model, the suite's
tasks, the grid's 10 LR keys and select seeds, report seeds at each pair's selected LR with
predictions at real test-set sizes) at each `--fractions` size, then runs each command on
it in its own process and prints its CPU seconds (user + system, the process and its own
children: `os.wait4`'s rusage of the child) and its peak resident memory (that rusage's
`ru_maxrss`), the growth between the sizes, the ratio to the reference run made at the same
size (`summarize --no-marks`, the linear tabulation), and the issue's targets.

A command that runs past `--cpu-limit` CPU seconds (RLIMIT_CPU: unaffected by other users'
load), `--timeout` wall seconds or `--memory-limit` GiB resident (its main process, polled) is
stopped and shown as "cpu-limit"/"timeout"/"memory-limit" with what it had used; one that
fails as "crashed (rc, last line)". `--combine` prints earlier runs' JSON lines as one table. The generator is measured the same way
(it runs as a child: `--generate-only`).

    .venv/bin/python bench/bench_scale.py                        # 1/8, then the full grid
    .venv/bin/python bench/bench_scale.py --fractions 0.125 --cpu-limit 120
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

sys.path.insert(0, str(common.REPO / "tests"))  # the generator the test runs too

# The targets (item 4) in CPU seconds, by command label; every peak must stay < 1 GB.
# A command with a target may run to target + 5 s even when --cpu-limit is lower, so that a
# stopped command has missed its target.
TARGETS = {
    "summarize markdown": 60,
    "summarize again (2nd render)": 10,
    "report": 120,
    "compare 2 models": 30,
}
PEAK_TARGET = 1 << 30
REFERENCE = "summarize --no-marks"


def commands(root: Path, scratch: Path, models: list[str], tasks: list[str]) -> list[tuple]:
    """(label, encoder-eval argv) of every command measured, in the order run."""
    sel, rep = str(root / "sel"), str(root / "rep")
    grid = ["--models", ",".join(models), "--tasks", ",".join(tasks)]
    out: list[tuple[str, list[str]]] = [
        (REFERENCE, ["summarize", "--results-dir", rep, "--no-marks"]),
        ("status select", ["status", "--results-dir", sel]),
        ("status report", ["status", "--results-dir", rep]),
        ("select", ["select", "--results-dir", sel, "--out", str(scratch / "selection.json")]),
    ]
    template = ["--slurm-template", str(common.REPO / "examples" / "slurm_template.sh")]
    for mode in ("shell", "slurm", "slurm-array"):
        out.append(
            (
                f"sweep select --mode {mode}",
                ["sweep", "--phase", "select", *grid, "--mode", mode, "--results-dir", sel,
                 "--out-dir", str(scratch / f"runs_{mode}"), *(template if mode != "shell" else [])],
            )
        )  # fmt: skip
    out += [
        ("leaderboard", ["leaderboard", "--results-dir", rep]),
        ("estimate", ["estimate", "--results-dir", rep]),
        ("summarize markdown", ["summarize", "--results-dir", rep]),
        *[
            (f"summarize {fmt}", ["summarize", "--results-dir", rep, "--format", fmt])
            for fmt in ("json", "csv", "latex")
        ],
        ("summarize again (2nd render)", ["summarize", "--results-dir", rep]),
        ("compare 2 models", ["compare", "--results-dir", rep, "--models", ",".join(models[:2])]),
        ("compare all models", ["compare", "--results-dir", rep]),
        ("report", ["report", "--results-dir", rep, "--out", str(scratch / "report.html")]),
    ]
    return out


def rss(pid: int) -> int:
    """The resident memory of process `pid` now, in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(argv: list[str], cpu_limit: int, timeout: float, env: dict, memory: int) -> dict:
    """Run `argv` as a child (output discarded but its last stderr line); its CPU seconds,
    peak RSS, wall seconds and outcome: ok, crashed, cpu-limit, timeout or memory-limit
    (its resident memory passed `memory` bytes: stopped before it takes a shared machine's)."""

    def limit() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 10))

    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=common.REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
            preexec_fn=limit,
        )  # fmt: skip
        outcome = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            over = "memory-limit" if rss(proc.pid) > memory else None
            if over or time.perf_counter() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                outcome = over or "timeout"
                break
            time.sleep(0.05)
        proc.returncode = 0  # reaped here; keep Popen from waiting again
        wall = time.perf_counter() - start
        err.seek(0)
        lines = err.read().decode("utf-8", "replace").strip().splitlines()
    if outcome is None:
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
            outcome = "cpu-limit"
        else:
            rc = os.waitstatus_to_exitcode(status)
            outcome = "ok" if rc == 0 else f"crashed ({rc}, {(lines or [''])[-1][:90]})"
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_bytes": usage.ru_maxrss * 1024,
        "wall_s": wall,
        "outcome": outcome,
    }


def encoder_eval(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "encoder_eval", *argv]


def generate_only(root: Path, fraction: float, max_rows: int | None) -> None:
    """The child that writes one grid (measured like a command); prints its counts as JSON."""
    import scale_grid

    size = scale_grid.GridSize.fraction(fraction, max_rows)
    grid = scale_grid.generate(root, size)
    print(
        json.dumps(
            {
                "models": list(size.models),
                "tasks": list(size.tasks),
                "select_results": grid.select_results,
                "report_results": grid.report_results,
                "prediction_rows": grid.prediction_rows,
                "bytes": grid.bytes_written,
                "seconds": grid.seconds,
            }
        )
    )


def run_size(fraction: float, args, work: Path, env: dict) -> dict:
    """Generate the grid of `fraction` and measure every command on it."""
    root = work / f"grid_{fraction:g}"
    scratch = work / f"scratch_{fraction:g}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    counts_file = scratch / "grid.json"
    gen = [sys.executable, __file__, "--generate-only", str(root), "--fractions", f"{fraction!r}"]
    if args.max_rows:
        gen += ["--max-rows", str(args.max_rows)]
    with open(counts_file, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(gen, cwd=common.REPO, env=env, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the generator failed at fraction {fraction}")
    counts = json.loads(counts_file.read_text().strip().splitlines()[-1])
    figures = {
        "generator": {
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_bytes": usage.ru_maxrss * 1024,
            "wall_s": time.perf_counter() - start,
            "outcome": "ok",
        }
    }
    print(
        f"# fraction {fraction:g}: {len(counts['models'])} models x {len(counts['tasks'])} tasks, "
        f"{counts['select_results']} select + {counts['report_results']} report results, "
        f"{counts['prediction_rows']:,} prediction rows, {counts['bytes'] / 1e6:.0f} MB; "
        f"generator {figures['generator']['cpu_s']:.1f} s CPU",
        flush=True,
    )
    for label, argv in commands(root, scratch, counts["models"], counts["tasks"]):
        if args.only and not any(word in label for word in args.only.split(",")):
            continue
        cap = max(args.cpu_limit, TARGETS.get(label, 0) + 5)
        memory = int(args.memory_limit * 2**30)
        figures[label] = measure(encoder_eval(argv), cap, args.timeout, env, memory)
        f = figures[label]
        print(
            f"  {label:32s} {f['outcome']:10.60s} {f['cpu_s']:8.1f} s CPU "
            f"{f['peak_bytes'] / 2**20:7.0f} MB  {f['wall_s']:7.1f} s wall",
            flush=True,
        )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return {"fraction": fraction, "counts": counts, "figures": figures}


def figure(f: dict | None) -> str:
    if f is None:
        return "-"
    used = f"{f['cpu_s']:.1f} s, {f['peak_bytes'] / 2**20:.0f} MB"
    return used if f["outcome"] == "ok" else f"{f['outcome']} after {used}"


def table(sizes: list[dict]) -> str:
    """The markdown table: per command, its figures at each size, the growth of CPU seconds
    from the first size to the last, the ratio to the reference at each size, the target."""
    labels = list(dict.fromkeys(k for s in sizes for k in s["figures"]))
    head = [f"{s['fraction']:g}" for s in sizes]
    lines = [
        "| command | " + " | ".join(f"CPU, peak at {h}" for h in head)
        + " | growth | " + " | ".join(f"x ref at {h}" for h in head) + " | target |",
        "|---" * (3 + 2 * len(sizes)) + "|",
    ]  # fmt: skip
    for label in labels:
        cells = [figure(s["figures"].get(label)) for s in sizes]
        first, last = sizes[0]["figures"].get(label), sizes[-1]["figures"].get(label)
        growth = "-"
        if len(sizes) > 1 and first and last and first["outcome"] == "ok" and first["cpu_s"] > 0:
            sign = "" if last["outcome"] == "ok" else ">= "
            growth = f"{sign}{last['cpu_s'] / first['cpu_s']:.1f}x"
        refs = []
        for s in sizes:
            f, ref = s["figures"].get(label), s["figures"].get(REFERENCE)
            ok = f and ref and ref["outcome"] == "ok" and ref["cpu_s"] > 0
            refs.append(f"{f['cpu_s'] / ref['cpu_s']:.1f}" if ok else "-")
        peaks = [s["figures"][label]["peak_bytes"] for s in sizes if label in s["figures"]]
        target = f"<= {TARGETS[label]} s; " if label in TARGETS else ""
        target += "peak < 1 GB" if max(peaks) < PEAK_TARGET else "PEAK >= 1 GB"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {growth} | "
                     + " | ".join(refs) + f" | {target} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fractions", default="0.125,1", help="grid sizes, e.g. 0.125,1 (1: full)")
    p.add_argument(
        "--cpu-limit",
        type=int,
        default=65,
        help="CPU seconds per command (a target's + 5 at least)",
    )
    p.add_argument("--timeout", type=float, default=1200, help="wall seconds per command")
    p.add_argument(
        "--memory-limit", type=float, default=3.0, help="GiB of resident memory per command"
    )
    p.add_argument(
        "--combine",
        default=None,
        help="comma-separated outputs of earlier runs: print their sizes as one table",
    )
    p.add_argument("--max-rows", type=int, default=None, help="cap report rows per language")
    p.add_argument(
        "--only", default=None, help="comma-separated words: commands whose label has one"
    )
    p.add_argument("--work", default=None, help="where the grids go (default: a temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the grids")
    p.add_argument("--generate-only", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.generate_only:
        generate_only(Path(args.generate_only), float(args.fractions), args.max_rows)
        return
    if args.combine:  # runs made one size at a time, each ending in its JSON line
        sizes = []
        for path in args.combine.split(","):
            last = Path(path).read_text(encoding="utf-8").strip().splitlines()[-1]
            sizes += json.loads(last)["sizes"]
        print(table(sorted(sizes, key=lambda s: s["fraction"])))
        return
    import scale_grid

    env = scale_grid.command_env()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_scale_"))
    sizes = [run_size(float(f), args, work, env) for f in args.fractions.split(",")]
    print()
    print(table(sizes))
    print(
        f"\nCPU: user + system seconds of the command's process and its children; peak: its "
        f"ru_maxrss. Limits: {args.cpu_limit} CPU s, {args.timeout:g} wall s, "
        f"{args.memory_limit:g} GiB per command. "
        f"growth: CPU at the last size / at the first; x ref: CPU / `{REFERENCE}`'s at that "
        "size. A limited or crashed command's figures are what it used until then."
    )
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    common.print_json(
        common.rounded(
            {
                "sizes": sizes,
                "cpu_limit": args.cpu_limit,
                "timeout": args.timeout,
                "memory_limit_gib": args.memory_limit,
            }
        )
    )


if __name__ == "__main__":
    main()
