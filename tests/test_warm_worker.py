"""`run_all.sh --warm`: each worker runs its units in one long-lived `encoder_eval.run
--warm-worker` process, with the same result files, skips and failures as one process per
unit (tiny BERT, 3-step cells, `--group cell`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_helpers import SHRINK, env, py, sh, two_long_units_sweep, wait_until_started

from encoder_eval.core.results import result_filename

MODEL, TASK, SEEDS = "tiny", "glue_rte", (42, 43)
LRS = (1.67e-05, 1e-4)  # lr03, lr10


def _sweep(tmp_path: Path, tiny_models, small_mirror, name: str) -> tuple[Path, Path]:
    """A select sweep of 4 one-cell units; its run_all.sh and results folder."""
    out, results = tmp_path / f"runs-{name}", tmp_path / f"results-{name}"
    sh(py("encoder_eval.sweep", "--phase", "select", "--model", f"{MODEL}={tiny_models['bert']}",
          "--tasks", TASK, "--lr-keys", "lr03,lr10", "--seeds", ",".join(map(str, SEEDS)),
          "--data-dir", small_mirror, *SHRINK, "--precision", "fp32", "--out-dir", out,
          "--results-dir", results, "--mode", "shell", "--group", "cell"), tmp_path)  # fmt: skip
    return out / "run_all.sh", results


def _scores(results: Path) -> dict[str, tuple]:
    """Per result file: what training and scoring produced (no timings)."""
    out = {}
    for lr in LRS:
        for seed in SEEDS:
            name = result_filename(MODEL, TASK, lr, seed)
            r = json.loads((results / name).read_text())
            t = r["training"]
            out[name] = (r["status"], r["dev"], r["report"], t["steps"], t["final_loss"],
                         t["dev_history"], t["best_step"])  # fmt: skip
    return out


def _workers(results: Path) -> tuple[set[int], list[int | None]]:
    """The process ids that wrote the results, and each result's unit number in its warm
    worker (None: a fresh process), in file order."""
    records = [json.loads(p.read_text())["training"] for p in sorted(results.glob("*.json"))]
    return {r["process_id"] for r in records}, [r.get("warm_unit") for r in records]


def test_warm_worker_matches_one_process_per_unit_and_skips_done_cells(
    tmp_path, tiny_models, small_mirror
):
    cold, cold_results = _sweep(tmp_path, tiny_models, small_mirror, "cold")
    warm, warm_results = _sweep(tmp_path, tiny_models, small_mirror, "warm")
    sh(["bash", str(cold)], tmp_path)
    started = time.monotonic()
    ran = sh(["bash", str(warm), "--warm"], tmp_path)
    took = time.monotonic() - started
    assert "finished: 4 run, 0 skipped" in ran.stdout, ran.stdout
    assert _scores(warm_results) == _scores(cold_results)  # bit for bit on the CPU
    # One warm process ran the four units, one after another; one process per unit without.
    pids, units = _workers(warm_results)
    assert len(pids) == 1 and sorted(units) == [1, 2, 3, 4], (pids, units)
    pids, units = _workers(cold_results)
    assert len(pids) == 4 and units == [None] * 4, (pids, units)
    # One worker runs the units one after another, and each unit's start-up figure counts
    # from that unit's arrival: disjoint spans inside the run. Counted from the worker's
    # start, the later units would each carry the imports and the earlier units again.
    startups = [json.loads((warm_results / name).read_text())["training"]
                ["process_start_to_first_step_s"] for name in _scores(warm_results)]  # fmt: skip
    assert len(startups) == 4 and all(s is not None and s > 0 for s in startups), startups
    assert sum(startups) <= took, (startups, took)
    logs = sorted((warm.parent / "logs").glob("*.log"))
    assert len(logs) == 4 and all(re.search(r"^ok: ", p.read_text(), re.M) for p in logs)

    # Done cells are skipped; a missing one runs again, alone, in a warm process.
    gone = warm_results / result_filename(MODEL, TASK, LRS[1], SEEDS[1])
    kept = {p: p.stat().st_mtime_ns for p in warm_results.glob("*.json") if p != gone}
    gone.unlink()
    again = sh(["bash", str(warm), "--warm"], tmp_path)
    assert "finished: 1 run, 3 skipped" in again.stdout, again.stdout
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    assert _scores(warm_results) == _scores(cold_results)


def test_gpu_plans_run_warm_by_default_and_no_warm_opts_out(tmp_path, tiny_models, small_mirror):
    """`--gpus` runs each worker's units in one warm process unless `--no-warm` (the cells
    here run on the CPU: `--gpus` only sets the GPU each worker sees)."""
    script, results = _sweep(tmp_path, tiny_models, small_mirror, "gpus")
    ran = sh(["bash", str(script), "--gpus", "0"], tmp_path)
    assert "finished: 4 run, 0 skipped" in ran.stdout, ran.stdout
    pids, units = _workers(results)
    assert len(pids) == 1 and sorted(units) == [1, 2, 3, 4], (pids, units)
    for p in results.glob("*.json"):
        p.unlink()
    sh(["bash", str(script), "--gpus", "0", "--no-warm"], tmp_path)
    pids, units = _workers(results)
    assert len(pids) == 4 and units == [None] * 4, (pids, units)
    both = sh(["bash", str(script), "--warm", "--no-warm"], tmp_path, ok=(2,))
    assert "give --warm or --no-warm, not both" in both.stderr


def test_a_failing_unit_does_not_stop_the_warm_worker(tmp_path, tiny_models, small_mirror):
    script, results = _sweep(tmp_path, tiny_models, small_mirror, "fail")
    # The first unit asks for an off-grid learning rate: `run` refuses it (exit 2).
    spec_file = Path(re.search(r"--spec (\S+)", script.read_text()).group(1))
    spec = json.loads(spec_file.read_text())
    spec["flags"]["lr"] = "0.5"
    spec_file.write_text(json.dumps(spec))
    proc = sh(["bash", str(script), "--warm"], tmp_path, ok=(1,))
    assert "failed 1]" in proc.stdout and "finished: 4 run" in proc.stdout, proc.stdout
    assert re.search(r"FAILED \S+ \(exit 2, 0 of 1 cells written\)", proc.stderr), proc.stderr
    assert "--lr 0.5 is not on the protocol grid" in proc.stderr  # the log tail
    assert len(list(results.glob("*.json"))) == 3


def test_warm_is_refused_for_probe_scripts(tmp_path, tiny_models, small_mirror):
    script, _ = _sweep(tmp_path, tiny_models, small_mirror, "probe")
    script.write_text(
        script.read_text().replace("MODULE=encoder_eval.run", "MODULE=encoder_eval.probe")
    )
    proc = sh(["bash", str(script), "--warm"], tmp_path, ok=(2,))
    assert proc.stderr.startswith("error: --warm runs encoder_eval.run units"), proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_saves_the_warm_workers_cell_and_stops_the_script(
    tmp_path, tiny_models, small_mirror, sig
):
    """Ctrl-C (SIGINT to the foreground group) or Slurm's SIGTERM to every process: the
    running cell saves its state, no next unit starts, and a rerun with --warm finishes."""
    rdir, runs = tmp_path / "results", tmp_path / "runs"
    script = two_long_units_sweep(tiny_models["bert"], small_mirror, runs, rdir, tmp_path)
    first, second = (runs / "logs" / f"{MODEL}_{TASK}_{key}.log" for key in ("lr03", "lr06"))
    proc = subprocess.Popen(["bash", str(script), "--warm"], cwd=tmp_path, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        wait_until_started(first, proc)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
        deadline = time.monotonic() + 120  # the worker may outlive a SIGTERMed script briefly
        word = "interrupted: " if sig == signal.SIGINT else "preempted: "
        while word not in first.read_text():
            assert time.monotonic() < deadline, first.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, out + err
        assert err.strip().splitlines()[-1].startswith(f"interrupted during {MODEL}_{TASK}_lr03")
    assert not second.exists() and "finished" not in out  # no next unit
    name = result_filename(MODEL, TASK, LRS[0], 42)
    assert (rdir / f".resume-{name}.pt").exists() and not (rdir / name).exists()
    rerun = sh(["bash", str(script), "--warm"], tmp_path)
    assert "finished: 2 run" in rerun.stdout, rerun.stdout
    assert json.loads((rdir / name).read_text())["training"]["steps"] == 40
