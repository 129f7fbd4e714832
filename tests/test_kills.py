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
import shutil
import signal
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
    logs_text,
    py,
    result_files,
    sh,
)
from result_helpers import make_result, write_result

from encoder_eval.results import (
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
    from encoder_eval import results
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

KILLS = int(os.environ.get("EE_KILLS", "30"))
MODEL, TASKS, LR_KEYS, SEEDS = "tiny", ("glue_rte", "sg_cb"), ("lr03", "lr10"), (42, 43)
N_CELLS = len(TASKS) * len(LR_KEYS) * len(SEEDS)


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


def _wait_for_tmp(proc: subprocess.Popen, rdir: Path, nth: int, timeout: float = 120) -> bool:
    """Poll until the `nth` new result temporary appears (a writer is inside the write)."""
    before = {p.name for p in _tmp_files(rdir)}
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with os.scandir(rdir) as it:
            for entry in it:
                if entry.name.startswith(TMP_PREFIX) and entry.name not in before:
                    seen.add(entry.name)
        if len(seen) >= nth:
            return True
        time.sleep(0.0002)
    return False


@pytest.mark.slow
def test_random_sigkills_of_a_sweep_never_publish_a_partial_result(
    tmp_path, tiny_models, small_mirror
):
    seed = int(os.environ.get("EE_KILL_SEED", str(time.time_ns() % 10**6)))
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

    kills = in_write = rounds = 0
    bad: list[str] = []
    t0 = time.monotonic()
    while kills < KILLS:
        rounds += 1
        assert rounds < 4 * KILLS, f"only {kills} kills in {rounds} rounds (seed {seed})"
        done = len(result_files(rdir))
        tmp_before = {p.name for p in _tmp_files(rdir)}
        proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        try:
            if done >= N_CELLS - 3:  # keep cells missing: kill before anything new is published
                kind = rng.choice(["early", "early", "early", "write1"])
            else:
                kind = rng.choice(["random", "random", "write1", "write2"])
            if kind == "early":
                time.sleep(rng.uniform(0.0, 1.5))
            elif kind == "random":
                time.sleep(rng.uniform(0.0, 4.0))
            else:
                _wait_for_tmp(proc, rdir, nth=int(kind[-1]))
            killed = _killpg(proc)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        kills += killed
        if killed and {p.name for p in _tmp_files(rdir)} - tmp_before:
            in_write += 1  # died between writing its temporary and renaming it
        # After every kill: each published result is whole and valid.
        for path in result_files(rdir):
            data, why = read_result(path)
            if data is None:
                bad.append(f"after kill {kills}: {path.name}: {why}")
    storm_s = time.monotonic() - t0

    assert bad == [], bad
    before = {p.name: p.read_bytes() for p in result_files(rdir)}
    assert set(before) <= expected
    missing = expected - set(before)
    assert missing, f"the storm finished every cell (seed {seed}); nothing left to re-run"
    assert in_write >= 3, f"only {in_write} kills landed inside a result write (seed {seed})"
    # Readers ignore what the kills left: temporaries and lock files are never read.
    warnings: list[str] = []
    assert len(load_results(rdir, warn=warnings.append)) == len(before) and warnings == []
    leftovers = _tmp_files(rdir)
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
    print(
        f"\nkill storm (seed {seed}): {kills} SIGKILLs in {rounds} rounds, {in_write} inside a "
        f"result write, {len(leftovers)} temporaries left and then cleaned, 0 corrupt results; "
        f"{len(before)}/{N_CELLS} cells survived, {len(rerun)} re-run; storm {storm_s:.0f}s"
    )
