"""The sweep's Slurm modes against a real Slurm cluster (see .ci/slurm.sh and .ci/SLURM.md).

Skipped, with the reason, where no cluster answers; failed instead when
ENCODER_EVAL_REQUIRE_SLURM=1 (CI sets it). The jobs run as the submitting user in this
interpreter's environment: the test writes its own template pointing at sys.executable.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_helpers import py, sh
from scipy import stats as sps
from spec_helpers import spec_args

from encoder_eval.core.results import load_results
from encoder_eval.plans.plan import PlanInputs

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 420
pytestmark = pytest.mark.slurm


def _slurm_problem() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "Slurm client commands (sinfo, sbatch) are not installed"
    script = REPO / ".ci" / "slurm.sh"
    if not script.exists():
        return f"{script} is missing"
    try:
        proc = subprocess.run(["bash", str(script), "status"], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "bash .ci/slurm.sh status timed out"
    if proc.returncode != 0:
        return f"no healthy Slurm cluster (bash .ci/slurm.sh status: {proc.stdout}{proc.stderr})"
    return None


@pytest.fixture(scope="module", autouse=True)
def require_slurm():
    problem = _slurm_problem()
    if problem:
        if os.environ.get("ENCODER_EVAL_REQUIRE_SLURM") == "1":
            pytest.fail(f"ENCODER_EVAL_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)


def job_ids(output: str) -> list[str]:
    return re.findall(r"Submitted batch job (\d+)", output)


def wait_for(ids: list[str], logs: Path) -> None:
    """Poll squeue until none of `ids` is pending or running; fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        proc = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-t", "PD,R,CG,CF,S", "-o", "%i %T"],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode == 0 and not proc.stdout.strip():
            return
        time.sleep(2)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*")))
    pytest.fail(f"Slurm jobs {ids} still queued after {WAIT_S}s:\n{proc.stdout}\n{tails}")


def template(path: Path, body: str) -> Path:
    path.write_text(
        "#!/bin/bash\n#SBATCH --time=15\n#SBATCH --cpus-per-task=1\n\n"
        "set -euo pipefail\nexport HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1\n"
        + body
    )
    return path


def test_contract_values_arrive_verbatim_and_are_never_executed(tmp_path):
    """Per-cell and array jobs receive hostile values exactly, as "$@" and variables."""
    canary = tmp_path / "canary"
    evil = f"evil $(touch {canary.name}) `touch {canary.name}`; echo 'q\"x\"' {{a..b}} % \\ end"
    seen = tmp_path / "seen"
    seen.mkdir()
    tpl = template(tmp_path / "record.sh", (
        f"cd {shlex.quote(str(seen))}\n"  # a command run by the shell would touch ./canary here
        'printf "%s\\0" "$@" > "args-$SLURM_JOB_ID"\n'
        'printf "%s" "$MODEL" > "model-$SLURM_JOB_ID"\n'
        'printf "%s" "$MODEL_PATH" > "path-$SLURM_JOB_ID"\n'
        'printf "%s" "$RUN_ARGS" > "runargs-$SLURM_JOB_ID"\n'
    ))  # fmt: skip
    from encoder_eval import sweep

    for mode, name in (("slurm", evil + "\nline two"), ("slurm-array", evil)):
        for p in seen.iterdir():
            p.unlink()
        model_dir = tmp_path / f"models-{mode}" / name  # a hostile local model path
        model_dir.mkdir(parents=True)
        plan = sweep.build_plan(
            "select",
            PlanInputs(
                tmp_path / f"res-{mode}", extra_models=[f"{name}={model_dir}"], tasks=["glue_rte"]
            ),
            lr_keys=["lr06"],
            seeds=[42],
        )
        out = tmp_path / f"runs-{mode}"
        emitted = sweep.emit(plan, out, mode, template=tpl)
        launch = sh(["bash", str(emitted.script)], seen)
        ids = job_ids(launch.stdout)
        assert len(ids) == 1, launch.stdout + launch.stderr
        wait_for(ids, out / "logs")
        jid = ids[0] + ("_0" if mode == "slurm-array" else "")
        files = {p.name.split("-")[0]: p for p in seen.iterdir()}
        assert files, (
            f"the job wrote nothing; logs: {[p.read_text() for p in (out / 'logs').glob('*')]}"
        )
        args = files["args"].read_bytes().split(b"\0")[:-1]
        # "$@" is the unit's spec file, which holds exactly the unit's arguments
        assert spec_args([a.decode() for a in args]) == plan.run_args(plan.cells), jid
        assert files["model"].read_text() == name
        assert files["path"].read_text() == str(model_dir)
        assert shlex.split(files["runargs"].read_text()) == plan.run_args(plan.cells)
        assert not canary.exists() and not (seen / canary.name).exists()
        assert not (tmp_path / canary.name).exists()


@pytest.mark.slow
def test_select_and_report_through_real_slurm(tmp_path, small_mirror):
    """select via one sbatch per cell, report via an array job, then the table; relaunching
    submits nothing. The model's name and directory hold shell metacharacters."""
    from tiny_models import build_tiny_model

    name = "tiny $(touch canary) `touch canary`; 'q'"
    model_dir = build_tiny_model("bert", tmp_path / "models" / name, num_labels=None)
    tpl = template(
        tmp_path / "job.sh", f'exec {shlex.quote(sys.executable)} -m encoder_eval.run "$@"\n'
    )
    common = ["--model", f"{name}={model_dir}", "--tasks", "glue_rte", "--data-dir",
              str(small_mirror), "--max-steps", "3", "--max-seq-len", "64", "--device", "cpu",
              "--slurm-template", str(tpl)]  # fmt: skip

    # select: one sbatch for the (model, task) pair, both LRs in one process
    sh(py("encoder_eval.sweep", "--phase", "select", *common, "--mode", "slurm",
          "--group", "pair", "--lr-keys", "lr03,lr10", "--seeds", "42", "--out-dir",
          "runs/select", "--results-dir", "results/select"), tmp_path)  # fmt: skip
    launch = sh(["bash", "runs/select/launch.sh"], tmp_path)
    ids = job_ids(launch.stdout)
    assert len(ids) == 1 and "submitted 1 job(s)" in launch.stdout
    wait_for(ids, tmp_path / "runs/select/logs")
    logs = "\n".join(p.read_text() for p in (tmp_path / "runs/select/logs").glob("*"))
    assert len(load_results(tmp_path / "results/select")) == 2, logs
    assert logs.count("ok: ") == 2, logs  # one job's process ran both cells
    again = sh(["bash", "runs/select/launch.sh"], tmp_path)
    assert (
        job_ids(again.stdout) == [] and "submitted 0 job(s); 2 cell(s) already done" in again.stdout
    )

    sh(py("encoder_eval.select", "--results-dir", "results/select", "--out", "selection.json",
          "--lr-keys", "lr03,lr10", "--seeds", "42"), tmp_path)  # fmt: skip
    chosen = json.loads((tmp_path / "selection.json").read_text())["pairs"][name]["glue_rte"]

    # report: one array job over the manifest, one task running both seeds (--group lr)
    sh(py("encoder_eval.sweep", "--phase", "report", "--selection", "selection.json", *common,
          "--mode", "slurm-array", "--group", "lr", "--seeds", "45,46", "--out-dir",
          "runs/report", "--results-dir", "results/report"), tmp_path)  # fmt: skip
    launch = sh(["bash", "runs/report/launch.sh"], tmp_path)
    ids = job_ids(launch.stdout)
    assert len(ids) == 1 and (
        "submitted 1 array task(s) (2 cell(s) to run) in 1 array job(s)" in launch.stdout
    )
    wait_for(ids, tmp_path / "runs/report/logs")
    report = load_results(tmp_path / "results/report")
    logs = "\n".join(p.read_text()[-1500:] for p in (tmp_path / "runs/report/logs").glob("*"))
    assert len(report) == 2, logs
    again = sh(["bash", "runs/report/launch.sh"], tmp_path)
    assert job_ids(again.stdout) == [] and "submitted 0 array task(s)" in again.stdout

    status = sh(py("encoder_eval.status", "--phase", "report", "--selection", "selection.json",
                   *common[:-2], "--seeds", "45,46", "--results-dir", "results/report"),
                tmp_path)  # fmt: skip
    assert "done          2" in status.stdout

    table = sh(py("encoder_eval.summarize", "--results-dir", "results/report", "--selection",
                  "selection.json", "--allow-partial"), tmp_path).stdout  # fmt: skip
    scores = [r.data["report"]["mean"] for r in report]
    assert {r.cell["lr_key"] for r in report} == {chosen["lr_key"]}
    mean, std = statistics.mean(scores), statistics.stdev(scores)
    low, high = sps.t.interval(0.95, len(scores) - 1, loc=mean, scale=std / len(scores) ** 0.5)
    low, high = max(low, 0.0), min(high, 1.0)  # cut to accuracy's range (issue 40 item 13)
    expected = f"{100 * mean:.2f} ± {100 * std:.2f} [{100 * low:.2f}, {100 * high:.2f}] †"
    row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    assert row.split("|")[2].strip().replace("**", "").replace(" ≈", "") == expected
    assert not (tmp_path / "canary").exists()


def _trained(result: dict) -> dict:
    """What a result says about training and scores, to the last bit (no timings)."""
    t = result["training"]
    keys = ("steps", "best_step", "final_loss", "dev_history", "stopped_by")
    return {"status": result["status"], "dev": result["dev"], "report": result["report"],
            "recipe": result["recipe"], **{k: t[k] for k in keys}}  # fmt: skip


@pytest.mark.slow
def test_warm_jobs_through_real_slurm_give_each_unit_a_fresh_processs_result(
    tmp_path, small_mirror
):
    """Both Slurm modes run warm by default: one job (array task) runs a model's four units
    one after another in one process (`run --spec A --spec B ...`), and each of its results
    equals, bit for bit, the same sweep's with --no-warm (one job and process a unit)."""
    from tiny_models import build_tiny_model

    model_dir = build_tiny_model("bert", tmp_path / "models" / "tiny", num_labels=None)
    tpl = template(
        tmp_path / "job.sh", f'exec {shlex.quote(sys.executable)} -m encoder_eval.run "$@"\n'
    )
    common = ["--phase", "select", "--model", f"tiny={model_dir}", "--tasks",
              "glue_rte,glue_stsb", "--lr-keys", "lr03,lr10", "--seeds", "42", "--data-dir",
              str(small_mirror), "--max-steps", "3", "--max-seq-len", "64", "--device", "cpu",
              "--precision", "fp32", "--slurm-template", str(tpl)]  # fmt: skip
    runs = {"warm": ("slurm", []), "cold": ("slurm", ["--no-warm"]),
            "warm-array": ("slurm-array", [])}  # fmt: skip
    ids = []
    try:
        for name, (mode, flags) in runs.items():
            wrote = sh(py("encoder_eval.sweep", *common, "--mode", mode, *flags, "--out-dir",
                          f"runs/{name}", "--results-dir", f"results/{name}"), tmp_path)  # fmt: skip
            jobs = 4 if flags else 1
            assert f"4 to run) in {jobs} job(s)" in wrote.stdout, wrote.stdout
            launch = sh(["bash", f"runs/{name}/launch.sh"], tmp_path)
            ids += job_ids(launch.stdout)
        assert len(ids) == 4 + 1 + 1
        wait_for(ids, tmp_path / "runs" / "warm" / "logs")
    finally:
        _cancel_all(ids)
    results = {}
    for name in runs:
        logs = "\n".join(p.read_text() for p in (tmp_path / "runs" / name).rglob("*.out"))
        loaded = load_results(tmp_path / "results" / name)
        assert len(loaded) == 4, (name, logs)
        results[name] = {Path(r.path).name: r.data for r in loaded}
        if name != "cold":
            assert [f"== unit {i} of 4:" in logs for i in (1, 2, 3, 4)] == [True] * 4, logs
    cold = results["cold"]
    for name in ("warm", "warm-array"):
        warm = results[name]
        assert warm.keys() == cold.keys()
        for file in cold:
            assert _trained(warm[file]) == _trained(cold[file]), (name, file)
        training = [r["training"] for r in warm.values()]
        assert len({t["process_id"] for t in training}) == 1, training  # one process ran all
        assert sorted(t["warm_unit"] for t in training) == [1, 2, 3, 4]
    assert all("warm_unit" not in r["training"] for r in cold.values())


def test_a_corrupt_result_is_kept_aside_and_its_cell_run_again_through_real_slurm(tmp_path):
    """A truncated result is not done: launch.sh (one sbatch per cell) and an array task's
    own check on the node each move it into .corrupt/, byte for byte, and the cell runs."""
    from result_helpers import make_result

    from encoder_eval import sweep

    tpl = template(tmp_path / "writer.sh", (  # writes the cell's result directly (no training)
        ': "$@"  # the run arguments: unused here\n'
        f"{shlex.quote(sys.executable)} - <<'PY'\n"
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from result_helpers import make_result\n"
        "e = os.environ\n"
        'r = make_result(e["MODEL"], e["TASK"], e["LR_KEY"], int(e["SEED"]), e["PHASE"])\n'
        'open(e["OUT_JSON"], "w").write(json.dumps(r))\n'
        "PY\n"
    ))  # fmt: skip
    for mode in ("slurm", "slurm-array"):
        plan = sweep.build_plan(
            "select",
            PlanInputs(tmp_path / f"res-{mode}", extra_models=["a=org/a"], tasks=["glue_rte"]),
            lr_keys=["lr03"],
            seeds=[42, 43],
        )
        out = tmp_path / f"runs-{mode}"
        emitted = sweep.emit(plan, out, mode, template=tpl, group="cell", units_per_job=1)
        done, spoiled = (Path(plan.out_json(c)) for c in plan.cells)
        done.write_text(json.dumps(make_result("a", "glue_rte", "lr03", 42, "select")))
        text = json.dumps(make_result("a", "glue_rte", "lr03", 43, "select"))
        spoiled.write_text(text[: len(text) // 2])
        if mode == "slurm":
            launch = sh(["bash", str(emitted.script)], tmp_path)
            assert "submitted 1 job(s); 1 cell(s) already done" in launch.stdout
            assert f"moved the corrupt result {spoiled} " in launch.stderr  # at launch
        else:  # the array task's own check, on the node: submit a task over the row directly
            rows = tmp_path / "rows.txt"
            rows.write_text("1\n")
            launch = sh(["sbatch", "--export=ALL", f"--output={out}/logs/%A_%a.out",
                         "--array=0", str(out / "array.sh"), str(out / "manifest.tsv"),
                         str(rows)], tmp_path)  # fmt: skip
        ids = job_ids(launch.stdout)
        assert len(ids) == 1, launch.stdout + launch.stderr
        wait_for(ids, out / "logs")
        logs = "".join(p.read_text() for p in (out / "logs").glob("*"))
        assert len(load_results(plan.results_dir, phase="select")) == 2, logs
        (kept,) = (Path(plan.results_dir) / ".corrupt").iterdir()
        assert kept.read_text() == text[: len(text) // 2]
        if mode == "slurm-array":
            assert f"moved the corrupt result {spoiled} to {kept}" in logs
        again = sh(["bash", str(emitted.script)], tmp_path)
        assert job_ids(again.stdout) == [] and "submitted 0" in again.stdout


def _cancel_all(ids: list[str]) -> None:
    """scancel every job the test submitted (held ones included), whatever happened."""
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=120)


def _held_template(path: Path, body: str) -> Path:
    """A no-op job template whose jobs are submitted held (`#SBATCH --hold`: sbatch here
    ignores SBATCH_HOLD), with a small memory request: a job without one takes the whole
    node here (DefMemPerNode), and a released task must start beside whatever else runs."""
    path.write_text("#!/bin/bash\n#SBATCH --hold\n#SBATCH --time=15\n#SBATCH --cpus-per-task=1\n"
                    f'#SBATCH --mem=50M\n: "$@"  # the run arguments: unused here\n{body}\n')  # fmt: skip
    return path


def _counts(stdout: str) -> dict[str, int]:
    """status's count lines (`  queued     3058`) as {state: count}."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^  (\w+)\s+(\d+)$", stdout, re.MULTILINE)}


def _squeue_state(job: str) -> str:
    proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True,
                          text=True)  # fmt: skip
    return proc.stdout.strip()


def test_status_tells_thousands_of_queued_array_cells_and_emit_leaves_them(tmp_path):
    """3,060 no-op cells (6 models x 17 tasks x 10 LRs x 3 seeds) held in 4 array jobs:
    status counts them queued, not missing, a released task running, a cancelled task's cell
    missing and a written result done; --emit writes only the cancelled cells, and its
    launch is not refused because the sweep's arrays are still queued."""
    from result_helpers import make_result

    from encoder_eval import sweep

    # A small memory request: a job without one takes the whole node here (DefMemPerNode),
    # and the released task must start beside whatever else the cluster runs.
    tpl = _held_template(tmp_path / "noop.sh", "sleep 300")
    models = [a for m in "abcdef" for a in ("--model", f"{m}=org/{m}")]
    plan_flags = ["--phase", "select", *models, "--tasks", "all", "--results-dir", "res"]
    slurm = ["--slurm-template", str(tpl), "--group", "cell", "--no-warm"]  # a cell a job
    ids: list[str] = []
    try:
        sweep_out = sh(py("encoder_eval.sweep", *plan_flags, *slurm, "--mode", "slurm-array",
                          "--out-dir", "runs"), tmp_path).stdout  # fmt: skip
        assert "3060 cell(s) (0 already done, 3060 to run) in 3060 job(s)" in sweep_out
        launch = subprocess.run(["bash", "runs/launch.sh"], cwd=tmp_path, capture_output=True,
                                text=True)  # fmt: skip
        ids += job_ids(launch.stdout)
        assert launch.returncode == 0, launch.stdout + launch.stderr
        assert len(ids) == 4 and "submitted 3060 array task(s)" in launch.stdout

        plan = sweep.build_plan(
            "select",
            PlanInputs(
                tmp_path / "res", extra_models=[f"{m}=org/{m}" for m in "abcdef"], tasks=["all"]
            ),
        )
        units = json.loads((tmp_path / "runs" / "units.json").read_text())
        assert units == [[plan.out_json(c)] for c in plan.cells]
        rows = sorted((tmp_path / "runs" / "arrays").iterdir())
        assert rows[0].read_text().split()[:3] == ["0", "1", "2"]
        first = plan.cells[0]
        (cancelled,), (running,) = units[5], units[7]
        Path(units[0][0]).write_text(
            json.dumps(make_result(first.model, first.task, first.lr_key, first.seed, "select"))
        )
        sh(["scancel", f"{ids[0]}_5"], tmp_path)
        sh(["scontrol", "release", f"{ids[0]}_7"], tmp_path)
        deadline = time.monotonic() + WAIT_S
        while not (state := _squeue_state(f"{ids[0]}_7")).startswith("RUNNING"):
            assert time.monotonic() < deadline, f"array task {ids[0]}_7 never started: {state}"
            time.sleep(1)

        status = sh(py("encoder_eval.status", *plan_flags, "--emit", "rest", "--mode",
                       "slurm-array", *slurm), tmp_path, ok=(1,))  # fmt: skip
        counts = _counts(status.stdout)
        assert counts == {"done": 1, "diverged": 0, "corrupt": 0, "kept": 0, "queued": 3057,
                          "running": 1, "missing": 1}, status.stdout  # fmt: skip
        listed = status.stdout.split("running:")[1].split("queued:")[0]
        assert f"{plan.cells[7].label}  {running}" in listed
        assert f"{plan.cells[5].label}  {cancelled}" in status.stdout.split("missing:")[1]
        rest = json.loads((tmp_path / "rest" / "units.json").read_text())
        assert rest == [[cancelled]], status.stdout
        again = subprocess.run(["bash", "rest/launch.sh"], cwd=tmp_path, capture_output=True,
                               text=True)  # fmt: skip
        ids += job_ids(again.stdout)
        assert again.returncode == 0 and "submitted 1 array task(s)" in again.stdout, (
            again.stdout + again.stderr
        )
        status = sh(py("encoder_eval.status", *plan_flags), tmp_path, ok=(1,))
        assert _counts(status.stdout)["missing"] == 0
        assert _counts(status.stdout)["queued"] == 3058, status.stdout
        # The sweep's own launch.sh still waits for its jobs: nothing is submitted twice.
        relaunch = subprocess.run(["bash", "runs/launch.sh"], cwd=tmp_path, capture_output=True,
                                  text=True)  # fmt: skip
        assert relaunch.returncode == 3 and job_ids(relaunch.stdout) == []
    finally:
        _cancel_all(ids)


def test_status_tells_queued_per_unit_jobs_and_emit_leaves_them(tmp_path):
    """--mode slurm, default grouping (the seeds of one LR per unit), one unit a job
    (--no-warm): held jobs' cells are queued; a cancelled job's three cells are missing,
    and only they are emitted."""
    tpl = _held_template(tmp_path / "noop.sh", "true")
    plan_flags = ["--phase", "select", "--model", "a=org/a", "--tasks", "glue_rte,sg_cb",
                  "--lr-keys", "lr03,lr06", "--results-dir", "res"]  # fmt: skip
    slurm = ["--slurm-template", str(tpl), "--mode", "slurm", "--no-warm"]
    ids: list[str] = []
    try:
        out = sh(py("encoder_eval.sweep", *plan_flags, *slurm, "--out-dir", "runs"), tmp_path)
        assert "12 cell(s) (0 already done, 12 to run) in 4 job(s), one per (model, task, LR)" in (
            out.stdout
        )
        launch = subprocess.run(["bash", "runs/launch.sh"], cwd=tmp_path, capture_output=True,
                                text=True)  # fmt: skip
        ids += job_ids(launch.stdout)
        assert launch.returncode == 0 and len(ids) == 4, launch.stdout + launch.stderr
        status = sh(py("encoder_eval.status", *plan_flags), tmp_path, ok=(1,))
        assert _counts(status.stdout)["queued"] == 12 and _counts(status.stdout)["missing"] == 0
        sh(["scancel", ids[1]], tmp_path)
        status = sh(py("encoder_eval.status", *plan_flags, *slurm, "--emit", "rest"), tmp_path,
                    ok=(1,))  # fmt: skip
        assert _counts(status.stdout)["queued"] == 9 and _counts(status.stdout)["missing"] == 3
        units = json.loads((tmp_path / "runs" / "units.json").read_text())
        assert json.loads((tmp_path / "rest" / "units.json").read_text()) == [units[1]]
        again = subprocess.run(["bash", "runs/launch.sh"], cwd=tmp_path, capture_output=True,
                               text=True)  # fmt: skip
        ids += job_ids(again.stdout)
        assert "submitted 1 job(s); 0 cell(s) already done; 9 cell(s) already queued" in (
            again.stdout
        )
    finally:
        _cancel_all(ids)
