"""Killed jobs: SIGKILL at random moments, inside the result write too, never publishes a
partial result; temporaries a kill leaves are ignored by readers and removed by the next run;
re-running the launch script completes exactly the missing cells.

The faults are real: a sweep's `run_all.sh` runs in its own session and the whole process
group gets SIGKILL (what the OOM killer or `scancel --signal=KILL` does), and a writer is
killed while it is inside `write_json_atomic`.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import statistics
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
    cells_run,
    env,
    hooked_python,
    logs_text,
    py,
    result_files,
    sh,
)
from result_helpers import make_result, write_result

from encoder_eval.core.results import (
    TMP_PREFIX,
    clean_stale_temporaries,
    load_results,
    read_result,
    result_filename,
)

# A writer that announces when it is inside write_json_atomic (the data is written and
# flushed, the rename has not happened) and then blocks there until it is killed.
BLOCKED_WRITER = textwrap.dedent(
    """
    import json, os, sys, time
    from encoder_eval.core import results
    real_fsync = os.fsync
    def fsync_then_block(fd):
        real_fsync(fd)
        if "/" + results.TMP_PREFIX in os.readlink(f"/proc/self/fd/{fd}"):
            print("IN_WRITE", flush=True)
            time.sleep(600)
    os.fsync = fsync_then_block
    results.write_json_atomic(sys.argv[1], json.loads(sys.argv[2]))
    print("WROTE", flush=True)
    """
)


def _tmp_files(directory: Path) -> list[Path]:
    return sorted(Path(directory).glob(TMP_PREFIX + "*"))


def _age(paths, seconds: float = 180.0) -> None:
    """Make files look `seconds` old (a stale temporary is one no live writer can own)."""
    past = time.time() - seconds
    for p in paths:
        os.utime(p, (past, past))


@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "overwrite"])
def test_sigkill_inside_write_json_atomic_publishes_old_or_nothing(tmp_path, existing):
    rdir = tmp_path / "res"
    new = make_result("m", "glue_rte", "lr06", 42, "select", 0.75)
    target = rdir / result_filename("m", "glue_rte", new["cell"]["lr"], 42)
    old_bytes = None
    if existing:
        write_result(rdir, make_result("m", "glue_rte", "lr06", 42, "select", 0.25))
        old_bytes = target.read_bytes()
    rdir.mkdir(exist_ok=True)
    import json

    proc = subprocess.Popen([sys.executable, "-c", BLOCKED_WRITER, str(target), json.dumps(new)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env=env())  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "IN_WRITE"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    tmps = _tmp_files(rdir)
    assert len(tmps) == 1, "the kill landed inside the write: its temporary is left behind"
    if existing:
        assert target.read_bytes() == old_bytes  # the old result, whole
        assert read_result(target)[0]["dev"]["mean"] == 0.25
    else:
        assert not target.exists()  # nothing published
    warnings: list[str] = []
    loaded = load_results(rdir, warn=warnings.append)
    assert warnings == [] and len(loaded) == int(existing)
    assert clean_stale_temporaries(rdir) == 0  # young: could belong to a live writer
    _age(tmps)
    assert clean_stale_temporaries(rdir) == 1 and _tmp_files(rdir) == []


def test_a_left_temporary_is_ignored_by_every_reader_and_removed_by_the_next_run(
    tmp_path, tiny_models, small_mirror
):
    rdir = tmp_path / "results"
    for seed in (42, 43):
        write_result(rdir, make_result("tiny", "glue_rte", "lr06", seed, "select", 0.5))
    name = result_filename("tiny", "glue_rte", 1.67e-05, 42)  # lr03, not written yet
    half = (rdir / result_filename("tiny", "glue_rte", 3.59e-05, 42)).read_text()
    stale = rdir / f"{TMP_PREFIX}{name}.k1ll3d"
    stale.write_text(half[: len(half) // 2])  # a torn write
    young = rdir / f"{TMP_PREFIX}{name}.l1v3w"
    young.write_text(half[:10])  # as if another writer were writing it right now
    _age([stale])
    common = ["--lr-keys", "lr03,lr06", "--seeds", "42,43"]
    for cmd in (
        py("encoder_eval.select", "--results-dir", rdir, "--out", tmp_path / "sel.json", *common),
        py("encoder_eval.status", "--phase", "select", "--model", "tiny=org/tiny",
           "--tasks", "glue_rte", "--results-dir", rdir, *common),
    ):  # fmt: skip
        proc = sh(cmd, tmp_path, ok=(1,))  # lr03 is missing: refused / incomplete
        assert TMP_PREFIX not in proc.stdout + proc.stderr
        assert "warning" not in proc.stderr
    warnings: list[str] = []
    assert len(load_results(rdir, warn=warnings.append)) == 2 and warnings == []
    # The next run of a cell in this directory removes the stale temporary, keeps the young one.
    sh(py("encoder_eval.run", "--model-path", tiny_models["bert"], "--model-key", "tiny",
          "--task", "glue_rte", "--lr", "1.67e-05", "--seed", "42", "--phase", "select",
          "--data-dir", small_mirror, "--results-dir", rdir, "--progress", "quiet", *SHRINK),
       tmp_path)  # fmt: skip
    assert not stale.exists() and young.exists()
    assert read_result(rdir / name)[0] is not None


# ----------------------------------------------------------------------------- the kill storm

# 15 kills with --storm (make test, so CI; about 110 CPU s here), QUICK_KILLS without: the
# calibration rounds and two at random moments. Each run draws a new seed; EE_KILLS=60
# storms longer.
KILLS, QUICK_KILLS = 15, 5
MODEL, TASKS, LR_KEYS, SEEDS = "tiny", ("glue_rte", "sg_cb"), ("lr03", "lr10"), (42, 43)
N_CELLS = len(TASKS) * len(LR_KEYS) * len(SEEDS)
KEEP_MISSING = 3  # cells the storm leaves unfinished, for the final re-run to complete
MAX_NTH = 3  # a round blocks at its 1st, 2nd or 3rd result write at the latest
CALIBRATION = (1, 2, 3)  # the first rounds: killed inside these writes, which are timed
AT_WRITE = 0.25  # later rounds: the share killed inside a write rather than by a timer
ROUND_LIMIT_S = 600.0  # no write reached in this long: the harness hangs


def _killpg(proc: subprocess.Popen) -> bool:
    """SIGKILL the script's whole process group; False if it had already finished."""
    if proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    proc.wait(timeout=60)
    return True


def _storm_round(script: Path, rdir: Path, python: Path, counter: Path, nth: int,
                 delay: float | None) -> tuple[str, list[tuple[float, str]]]:  # fmt: skip
    """Run `script` with IN_WRITE_HOOK blocking its `nth` result write, and SIGKILL its
    process group `delay` seconds after the start or when it blocks, whichever comes first
    (`delay` None: when it blocks). The script has at least `nth` cells to write, so the
    kill always finds it alive. Returns "timer" or "write" (what timed the kill) and the
    result writes it announced, as (seconds since the start, path)."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            ["bash", str(script)], cwd=script.parent, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(write_fd,),
            env=env(PYTHON=str(python), EE_RESULTS_DIR=str(rdir), EE_WRITE_COUNT=str(counter),
                    EE_BLOCK_AT=str(nth), EE_WRITE_FD=str(write_fd)),
        )  # fmt: skip
    finally:
        os.close(write_fd)  # only the script's processes hold it: EOF means they all exited
    start = time.monotonic()
    writes: list[tuple[float, str]] = []
    pending = b""
    try:
        while not (writes and writes[-1][1].startswith("B ")):
            now = time.monotonic() - start
            if delay is not None and now >= delay:
                break
            assert now < ROUND_LIMIT_S, f"{len(writes)} of {nth} result writes in {now:.0f}s"
            wait = ROUND_LIMIT_S - now if delay is None else min(delay, ROUND_LIMIT_S) - now
            if not select.select([read_fd], [], [], wait)[0]:
                continue
            chunk = os.read(read_fd, 65536)
            assert chunk, (
                f"run_all.sh exited ({proc.wait()}) after {len(writes)} result writes with "
                f"at least {nth} cells to write"
            )
            *lines, pending = (pending + chunk).split(b"\n")
            writes += [(time.monotonic() - start, line.decode()) for line in lines]
        how = "write" if writes and writes[-1][1].startswith("B ") else "timer"
        assert _killpg(proc), "run_all.sh finished although it had a write blocked"
    finally:
        os.close(read_fd)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return how, [(t, line[2:]) for t, line in writes]


def _published_by(write_path: str) -> str:
    """The result name a write publishes: its temporary's name without prefix and suffix
    (mkstemp's `<prefix><name>.<random>`), or the path itself if written in place."""
    name = Path(write_path).name
    if name.startswith(TMP_PREFIX):
        return name[len(TMP_PREFIX) :].rsplit(".", 1)[0]
    return name


@pytest.mark.slow
@pytest.mark.storm
def test_random_sigkills_of_a_sweep_never_publish_a_partial_result(
    tmp_path, tiny_models, small_mirror, request
):
    """SIGKILL a sweep's run_all.sh KILLS times (QUICK_KILLS without --storm), at random
    moments drawn from how long its result writes take on this machine (timed in the same
    run) and, on purpose, inside result writes. Every round kills a live script, whatever
    the machine's speed: a round's script always has more cells to write than the write it
    blocks at. No kill may publish a partial result, and re-running the script completes
    exactly the missing cells."""
    default = KILLS if request.config.getoption("--storm") else QUICK_KILLS
    kills_wanted = int(os.environ.get("EE_KILLS", str(default)))
    seed = int(os.environ.get("EE_KILL_SEED", str(time.time_ns() % 10**6)))
    print(f"\nkill storm seed {seed} (EE_KILL_SEED={seed} repeats the draws)")
    rng = random.Random(seed)
    rdir, runs = tmp_path / "results", tmp_path / "runs"
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", ",".join(TASKS), "--lr-keys", ",".join(LR_KEYS),
          "--seeds", ",".join(map(str, SEEDS)), "--data-dir", small_mirror, *SHRINK,
          "--out-dir", runs, "--results-dir", rdir), tmp_path)  # fmt: skip
    script = runs / "run_all.sh"
    expected = {result_filename(MODEL, t, lr, s) for t in TASKS
                for lr in (1.67e-05, 1e-4) for s in SEEDS}  # fmt: skip
    assert len(expected) == N_CELLS
    python = hooked_python(tmp_path / "hook")

    # seconds from a round's start to its k-th result write, as measured here, per round
    write_times: dict[int, list[float]] = {}
    kills = at_write = timer_in_write = 0
    bad: list[str] = []
    t0 = time.monotonic()
    for round_no in range(kills_wanted):
        missing = N_CELLS - len(result_files(rdir))
        # A round publishes at most nth - 1 results, so KEEP_MISSING cells stay missing.
        top = min(MAX_NTH, missing - KEEP_MISSING + 1)
        if round_no < len(CALIBRATION):
            nth, delay = min(CALIBRATION[round_no], top), None
        else:
            nth = rng.randint(1, top)
            seen = write_times.get(nth) or write_times[max(write_times)]
            typical = statistics.median(seen[-3:])  # the latest, to follow the machine's load
            delay = None if rng.random() < AT_WRITE else rng.uniform(0.0, 1.25 * typical)
        tmp_before = {p.name for p in _tmp_files(rdir)}
        how, writes = _storm_round(script, rdir, python, tmp_path / f"writes{round_no}", nth,
                                   delay)  # fmt: skip
        kills += 1
        for k, (t, _) in enumerate(writes, 1):
            write_times.setdefault(k, []).append(t)
        left = {p.name for p in _tmp_files(rdir)} - tmp_before
        where = f"kill {kills} (seed {seed}, {how}, write {nth})"
        if how == "write":  # killed inside its nth write: a temporary left, nothing published
            at_write += 1
            blocked = writes[-1][1]
            name = _published_by(blocked)
            assert name in expected and not (rdir / name).exists(), f"{where}: published {name}"
            assert Path(blocked).name in left, f"{where}: {blocked} not left behind"
        elif left:
            timer_in_write += 1  # a random moment that fell inside a result write
        # After every kill: each published result is whole and valid.
        for path in result_files(rdir):
            data, why = read_result(path)
            if data is None:
                bad.append(f"after {where}: {path.name}: {why}")
    storm_s = time.monotonic() - t0

    assert bad == [], bad
    assert at_write >= min(kills_wanted, len(CALIBRATION))  # kills inside a result write
    before = {p.name: p.read_bytes() for p in result_files(rdir)}
    assert set(before) <= expected
    missing = expected - set(before)
    assert len(missing) >= KEEP_MISSING, f"{sorted(missing)} (seed {seed})"
    # Readers ignore what the kills left: temporaries and lock files are never read.
    warnings: list[str] = []
    assert len(load_results(rdir, warn=warnings.append)) == len(before) and warnings == []
    leftovers = _tmp_files(rdir)  # the latest kills' (a run removes those over a minute old)
    _age(leftovers)  # the next run happens later; stale temporaries then go

    shutil.rmtree(runs / "logs")
    final = sh(["bash", str(script)], tmp_path)
    assert f"[cells {N_CELLS}/{N_CELLS} done" in final.stdout and "failed 0]" in final.stdout
    log = logs_text(runs / "logs")
    rerun = sorted(Path(p).name for p in cells_run(log))
    assert rerun == sorted(missing), log  # exactly the missing cells, each once
    assert LOCKED not in log  # no lock left by a killed runner blocked a cell
    after = {p.name: p.read_bytes() for p in result_files(rdir)}
    assert set(after) == expected
    assert all(after[n] == b for n, b in before.items())  # finished results untouched
    assert all(read_result(rdir / n)[0] is not None for n in after)
    assert _tmp_files(rdir) == []
    first = statistics.median(write_times[1])
    print(
        f"kill storm (seed {seed}): {kills} SIGKILLs, {at_write} blocked inside a result "
        f"write, {kills - at_write} at random moments ({timer_in_write} of them inside a "
        f"write); median {first:.1f}s to a round's first write; {len(leftovers)} temporaries "
        f"left and then cleaned, 0 corrupt results; {len(before)}/{N_CELLS} cells survived, "
        f"{len(rerun)} re-run; storm {storm_s:.0f}s"
    )
