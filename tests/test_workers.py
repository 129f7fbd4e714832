"""`run_all.sh --workers N` / `--gpus LIST`: local parallelism without Slurm.

Real tiny models through the real script: N workers complete a plan with every cell run
exactly once, each unit's process logging to its own file, and the terminal shows a live
line per running cell. A fake `python` (from test_sweep) shows which GPU each process
sees, and how a unit another runner holds waits until the others are done. Bad values
are refused with one `error:` line. No timing assertions.
"""

from __future__ import annotations

import collections
import fcntl
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_helpers import SHRINK, cells_run, env, logs_text, py, result_files, sh
from test_sweep import FAKE_PYTHON, TESTS, _calls, _exe

from encoder_eval import sweep
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import read_result, result_filename
from encoder_eval.plans.plan import PlanInputs

MODEL, TASK, LR_KEYS, SEEDS = "tiny", "glue_rte", ("lr03", "lr06", "lr10"), (42, 43)
PROGRESS = re.compile(
    r"^\[w(?P<w>\d+)\] tiny/glue_rte/(lr03|lr06|lr10)/s4[23] step (?P<step>\d+)/(?P<total>\d+) "
    r"dev \S+ eta \S+$",
    re.M,
)


def _sweep(tmp_path: Path, tiny_models, small_mirror, *extra: str) -> Path:
    """A select sweep of 3 units (one per LR), 2 seeds each, on the tiny BERT."""
    out = tmp_path / "runs"
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", ",".join(LR_KEYS), "--seeds", ",".join(map(str, SEEDS)),
          "--group", "lr", "--data-dir", small_mirror, *SHRINK, "--out-dir", out,
          "--results-dir", tmp_path / "results", *extra), tmp_path)  # fmt: skip
    return out


def _expected() -> set[str]:
    return {result_filename(MODEL, TASK, LR_GRID[k], s) for k in LR_KEYS for s in SEEDS}


@pytest.mark.slow
def test_two_workers_run_every_cell_exactly_once(tmp_path, tiny_models, small_mirror):
    runs = _sweep(tmp_path, tiny_models, small_mirror)
    proc = sh(["bash", str(runs / "run_all.sh"), "--workers", "2"], tmp_path)
    n = len(_expected())
    assert f"[cells {n}/{n} done, units 3/3, failed 0] finished: 3 run, 0 skipped" in proc.stdout
    # Every cell written exactly once ("ok:" lines over all logs), every result valid.
    log = logs_text(runs / "logs")
    runs_per_cell = collections.Counter(Path(p).name for p in cells_run(log))
    assert set(runs_per_cell) == _expected() and set(runs_per_cell.values()) == {1}, log
    files = result_files(tmp_path / "results")
    assert {p.name for p in files} == _expected()
    assert all(read_result(p)[0] is not None for p in files)
    # One log per unit, each holding exactly its own LR's cells.
    logs = sorted(p.name for p in (runs / "logs").glob("*.log"))
    assert logs == [f"{MODEL}_{TASK}_{k}.log" for k in LR_KEYS]
    for key in LR_KEYS:
        unit_log = (runs / "logs" / f"{MODEL}_{TASK}_{key}.log").read_text()
        assert {Path(p).name for p in cells_run(unit_log)} == {
            result_filename(MODEL, TASK, LR_GRID[key], s) for s in SEEDS}  # fmt: skip
        assert '"cell": "tiny/glue_rte/' in unit_log  # the progress lines stay in the log too
    # Each unit started once, by one worker; a live line per evaluation of each cell.
    starts = re.findall(r"^\[w([12])\] \[cells \d+/6 done.*\] starting (\S+) ", proc.stdout, re.M)
    assert sorted(label for _, label in starts) == [f"{MODEL}_{TASK}_{k}" for k in LR_KEYS]
    shown = PROGRESS.findall(proc.stdout)
    assert shown and {w for w, *_ in shown} <= {"1", "2"}
    finals = {m.group(0).split()[1] for m in PROGRESS.finditer(proc.stdout)
              if m.group("step") == m.group("total")}  # fmt: skip
    assert len(finals) == n, proc.stdout  # every cell's last evaluation was shown
    # Running again runs nothing.
    again = sh(["bash", str(runs / "run_all.sh"), "--workers", "2"], tmp_path)
    assert "finished: 0 run, 3 skipped" in again.stdout
    assert collections.Counter(cells_run(logs_text(runs / "logs"))) == collections.Counter(
        cells_run(log))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, rc, said",
    [(signal.SIGINT, 130, "interrupted: "), (signal.SIGTERM, 75, "preempted: ")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_stops_every_worker_after_saving_state(
    tmp_path, tiny_models, small_mirror, signum, rc, said
):
    """Ctrl-C (or SIGTERM, as Slurm sends) to the script's process group: every running
    cell saves its state and says so in its log, no unit starts after it, and the script
    exits 130 (75) with one last line saying how to resume. The cells cannot finish (a
    million steps, no early stop): the signal lands mid-training on any machine, however
    slow or loaded, and the test still takes only as long as two cells need to start."""
    runs = _sweep(tmp_path, tiny_models, small_mirror, "--max-steps", "1000000",
                  "--extra-run-args", "--epoch-cap 1000000 --no-early-stop")  # fmt: skip
    logs = [runs / "logs" / f"{MODEL}_{TASK}_{k}.log" for k in LR_KEYS]
    proc = subprocess.Popen(["bash", str(runs / "run_all.sh"), "--workers", "2"], cwd=tmp_path,
                            env=env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # Wait until two units are training (a dev evaluation at step 4 is in their logs).
        while sum('"step": 4' in (p.read_text() if p.exists() else "") for p in logs) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "two units never ran"
            time.sleep(0.05)
        os.killpg(proc.pid, signum)  # what Ctrl-C does to the foreground group
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == rc, out + err
    assert "finished" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith(said) and "again to " in last, err
    running = [p for p in logs if p.exists()]
    assert len(running) == 2  # the third unit never started
    for p in running:
        assert said in p.read_text()  # each cell saved its state and said so
    assert len(list((tmp_path / "results").glob(".resume-*.pt"))) == 2


@pytest.fixture
def fake(tmp_path):
    """A plan of 4 units (2 models x 2 tasks) and a fake python that records each run."""
    exe = _exe(tmp_path / "python", FAKE_PYTHON.format(python=sys.executable, tests=TESTS))
    log = tmp_path / "calls.jsonl"
    plan = sweep.build_plan(
        "select",
        PlanInputs(
            tmp_path / "res", extra_models=["a=org/a", "b=org/b"], tasks=["glue_rte", "glue_sst2"]
        ),
        lr_keys=["lr03"],
        seeds=[42],
    )
    emitted = sweep.emit_shell(plan, tmp_path / "runs")
    return emitted.script, exe, log


def _run(script: Path, exe: Path, log: Path, *args: str, **extra: str):
    environ = {**os.environ, "PYTHON": str(exe), "FAKE_LOG": str(log), **extra}
    return subprocess.run(["bash", str(script), *args], env=environ, capture_output=True,
                          text=True, cwd=script.parent)  # fmt: skip


def test_gpus_gives_each_worker_its_own_gpu(tmp_path, fake):
    script, exe, log = fake
    # The fake python records its argv; wrap it to record the GPU it sees as well.
    seen = tmp_path / "gpus.jsonl"
    wrapper = _exe(tmp_path / "python-gpu", f"""
        #!/bin/sh
        if [ "$2" = encoder_eval.run ]; then
            printf '%s\\n' "$CUDA_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES" >>{shlex.quote(str(seen))}
        fi
        exec {shlex.quote(str(exe))} "$@"
    """)  # fmt: skip
    # The fake python runs one unit per process: --no-warm (GPU plans run warm by default).
    proc = _run(script, wrapper, log, "--gpus", "2,5", "--no-warm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "finished: 4 run, 0 skipped" in proc.stdout
    pairs = [line.split() for line in seen.read_text().splitlines()]
    assert len(pairs) == 4 and all(cuda == hip and cuda in ("2", "5") for cuda, hip in pairs)
    # A unit's worker and its GPU agree: worker k runs on the k-th listed GPU.
    starts = re.findall(r"^\[w([12])\] .* starting ", proc.stdout, re.M)
    assert len(starts) == 4
    assert collections.Counter(cuda for cuda, _ in pairs) == collections.Counter(
        {"1": "2", "2": "5"}[w] for w in starts)  # fmt: skip
    # One GPU: one worker, in the foreground, seeing that GPU.
    for p in (tmp_path / "res").glob("*.json"):
        p.unlink()
    seen.unlink()
    proc = _run(script, wrapper, log, "--gpus", "GPU-1a2b", "--no-warm")
    assert proc.returncode == 0, proc.stderr
    assert set(seen.read_text().split()) == {"GPU-1a2b"}


@pytest.mark.parametrize("gpus, per_gpu", [("7", 4), ("2,5", 2)])
def test_workers_per_gpu_runs_k_units_at_once_on_each_gpu(tmp_path, fake, gpus, per_gpu):
    """Issue 26 item 6: `--gpus LIST --workers-per-gpu K` runs K units at once on each
    listed GPU, each process seeing only its GPU. Each unit's process waits at a barrier
    until K processes on its GPU have arrived, so the 4 units only finish if K run at once
    there (one at a time, the first would wait alone and give up: exit 9, a failed unit)."""
    script, exe, log = fake
    seen = tmp_path / "gpus.txt"
    wrapper = _barrier_python(tmp_path, exe, seen, per_gpu)
    proc = _run(script, wrapper, log, "--gpus", gpus, "--workers-per-gpu", str(per_gpu),
                "--no-warm")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "finished: 4 run, 0 skipped" in proc.stdout and "alone on GPU" not in proc.stderr
    listed = gpus.split(",")
    pairs = [line.split() for line in seen.read_text().splitlines()]
    assert len(pairs) == 4 and all(cuda == hip and cuda in listed for cuda, hip in pairs)
    # K units per GPU, each on one worker: worker k sees GPU (k-1) mod len(listed).
    assert collections.Counter(cuda for cuda, _ in pairs) == {g: per_gpu for g in listed}
    starts = re.findall(r"^\[w(\d+)\] .* starting ", proc.stdout, re.M)
    assert sorted(map(int, starts)) == [1, 2, 3, 4]
    assert collections.Counter(cuda for cuda, _ in pairs) == collections.Counter(
        listed[(int(w) - 1) % len(listed)] for w in starts)  # fmt: skip


@pytest.mark.parametrize("card_gib, k", [(80, 4), (10, 1)])
def test_gpus_choose_workers_per_gpu_from_the_model_and_the_card(tmp_path, card_gib, k):
    """Issue 48 item 2: without --workers-per-gpu, `--gpus` runs as many workers on each GPU
    as fit its memory: XLM-R base needs about 6.5 GiB a worker (sweep writes it into the
    script), so an 80 GiB card takes 4 at once (the barrier lets the units finish only if
    4 run together on GPU 7) and a 10 GiB card one. The card's memory comes from
    ENCODER_EVAL_GPU_MEMORY_GIB here, from nvidia-smi on a GPU machine."""
    exe = _exe(tmp_path / "python", FAKE_PYTHON.format(python=sys.executable, tests=TESTS))
    log, seen = tmp_path / "calls.jsonl", tmp_path / "gpus.txt"
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", models=["xlm-r-base"], tasks=["glue_rte", "glue_sst2"]),
        lr_keys=["lr03", "lr06"],
        seeds=[42],
    )
    script = sweep.emit_shell(plan, tmp_path / "runs", group="lr").script
    wrapper = _barrier_python(tmp_path, exe, seen, k)
    proc = _run(script, wrapper, log, "--gpus", "7", "--no-warm",
                ENCODER_EVAL_GPU_MEMORY_GIB=str(card_gib))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "finished: 4 run, 0 skipped" in proc.stdout and "alone on GPU" not in proc.stderr
    assert (f"{k} worker(s) per GPU: 6.5 GiB a worker (+ 1 GiB a process) on a {card_gib} GiB "
            "card (GPU 7), at most 4; --workers-per-gpu K overrides") in proc.stderr  # fmt: skip
    assert seen.read_text().split() == ["7"] * 8
    starts = re.findall(r"^\[w(\d+)\] .* starting ", proc.stdout, re.M)
    assert sorted(map(int, starts)) == ([1, 2, 3, 4] if k == 4 else [])  # one: no prefix


def _barrier_python(tmp_path: Path, exe: Path, seen: Path, per_gpu: int) -> Path:
    """A python whose `encoder_eval.run` processes record the GPU they see, then wait until
    `per_gpu` of them have arrived on that GPU (exit 9 after a minute alone)."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    return _exe(tmp_path / "python-gpu", f"""
        #!/bin/bash
        if [ "$2" = encoder_eval.run ]; then
            printf '%s\\n' "$CUDA_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES" >>{shlex.quote(str(seen))}
            : >{shlex.quote(str(barrier))}/"$CUDA_VISIBLE_DEVICES.$$"
            for ((i = 0; i < 1200; i++)); do
                n=$(find {shlex.quote(str(barrier))} -name "$CUDA_VISIBLE_DEVICES.*" | wc -l)
                if [ "$n" -ge {per_gpu} ]; then exec {shlex.quote(str(exe))} "$@"; fi
                sleep 0.05
            done
            echo "alone on GPU $CUDA_VISIBLE_DEVICES" >&2
            exit 9
        fi
        exec {shlex.quote(str(exe))} "$@"
    """)  # fmt: skip


def test_a_unit_another_runner_holds_comes_last(tmp_path, fake):
    script, exe, log = fake
    lock_dir = script.parent / "locks"
    lock_dir.mkdir()
    fd = os.open(lock_dir / "a_glue_sst2_lr03.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another runner of this sweep has it
    try:
        proc = _run(script, exe, log)
    finally:
        os.close(fd)
    assert proc.returncode == 0, proc.stderr
    assert "later: a_glue_sst2_lr03 (another runner of this sweep is running it)" in proc.stdout
    order = [(c[c.index("--model-key") + 1], c[c.index("--task") + 1]) for c in _calls(log)]
    # The held unit still runs (its cells' own locks decide), after the others.
    assert order == [("a", "glue_rte"), ("b", "glue_rte"), ("b", "glue_sst2"),
                     ("a", "glue_sst2")]  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "--workers '0' must be a whole number from 1"),
        (["--workers", "two"], "--workers 'two' must be a whole number from 1"),
        (["--workers"], "--workers needs a value"),
        (["--gpus", ""], "--gpus is empty"),
        (["--gpus", "0,,1"], "'' is not a GPU index"),
        (["--gpus", "0,cuda:1"], "'cuda:1' is not a GPU index"),
        (["--gpus", "1,1"], "lists GPU 1 twice"),
        (["--workers", "2", "--gpus", "0,1"], "give --workers or --gpus, not both"),
        (["--workers-per-gpu", "2"], "--workers-per-gpu needs --gpus"),
        (["--workers", "2", "--workers-per-gpu", "2"], "--workers-per-gpu needs --gpus"),
        (["--gpus", "0", "--workers-per-gpu", "0"], "--workers-per-gpu '0' must be a whole"),
        (["--gpus", "0", "--workers-per-gpu", "two"], "--workers-per-gpu 'two' must be a"),
        (["--gpus", "0", "--workers-per-gpu"], "--workers-per-gpu needs a value"),
        (["--workers", "2", "--gpus", "0", "--workers-per-gpu", "2"], "not both"),
        (["-j", "2"], "unknown argument '-j'"),
    ],
)
def test_bad_worker_flags_are_refused(fake, args, message):
    script, exe, log = fake
    proc = _run(script, exe, log, *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line
    assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    assert _calls(log) == [] and proc.stdout == ""


def test_a_bad_card_memory_is_refused(fake):
    """`--gpus` without `--workers-per-gpu` reads ENCODER_EVAL_GPU_MEMORY_GIB: a value that
    is not a positive number stops the script before any unit, with one error line."""
    script, exe, log = fake
    proc = _run(script, exe, log, "--gpus", "0", ENCODER_EVAL_GPU_MEMORY_GIB="lots")
    assert proc.returncode == 2 and _calls(log) == [] and proc.stdout == ""
    assert proc.stderr == (
        "error: ENCODER_EVAL_GPU_MEMORY_GIB='lots' must be a positive number of GiB\n"
    )


def test_help_lists_the_flags(fake):
    script, exe, log = fake
    proc = _run(script, exe, log, "--help")
    assert proc.returncode == 0 and "--workers N" in proc.stdout and "--gpus 0,1,2,3" in proc.stdout
    assert "--workers-per-gpu K" in proc.stdout
    assert _calls(log) == []


def test_a_failed_unit_among_workers_exits_1(tmp_path, fake):
    script, exe, log = fake
    proc = _run(script, exe, log, "--workers", "3", FAKE_FAIL="1.67e-05")
    assert proc.returncode == 1
    assert "[cells 0/4 done, units 4/4, failed 4] finished: 4 run, 0 skipped" in proc.stdout
    assert proc.stderr.count("FAILED ") == 4 and "failed units: " in proc.stderr
    assert len(_calls(log)) == 4  # each unit ran once, even though each one failed
