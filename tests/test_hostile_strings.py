"""Hostile strings reach the cells verbatim and are never executed.

tests/test_sweep.py already sends a hostile model name and model directory through
`run_all.sh` (to a fake interpreter that records its argv) and a hostile model name through
the per-cell and array Slurm scripts (fake sbatch); tests/test_slurm.py does the same on a
real cluster. This file adds what those do not cover: the real harness behind `run_all.sh`
(the value is used, not just received), hostile data, results and output directories in
every launch mode, hostile `--extra-run-args`, `status --emit`, and hostile task names.
Every string holds `$(touch canary)`, backticks, `;`, quotes, spaces, a brace expansion,
`%` and a backslash; a file named `canary` anywhere means something executed it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from fault_helpers import SHRINK, env, py, read_json, result_files, sh
from spec_helpers import spec_args
from test_sweep import _lines, fake_slurm, hostile  # noqa: F401  (fake_slurm is a fixture)

from encoder_eval import sweep
from encoder_eval.core.results import result_filename
from encoder_eval.plans.plan import PlanInputs

CANARY = "canary"
EVIL = hostile(Path(CANARY))  # no "/": it can name a directory


def no_canary(*roots: Path) -> None:
    for root in roots:
        hits = [p for p in Path(root).rglob(CANARY) if p.name == CANARY]
        assert hits == [] and not (Path(root) / CANARY).exists(), hits


@pytest.mark.slow
def test_real_cells_behind_run_all_get_hostile_values_verbatim(tmp_path, tiny_models, small_mirror):
    name = EVIL + "\nline two"
    model = tmp_path / f"model {name}"
    shutil.copytree(tiny_models["bert"], model)
    data = tmp_path / f"data {EVIL}"
    shutil.copytree(small_mirror, data)
    rdir, runs = tmp_path / f"results {name}", tmp_path / f"runs {name}"
    cache = tmp_path / f"cache {EVIL}"
    common = ["--model", f"{name}={model}", "--tasks", "glue_rte", "--lr-keys", "lr06",
              "--data-dir", str(data), *SHRINK, "--results-dir", str(rdir),
              "--extra-run-args", shlex.join(["--eval-batch", "4"])]  # fmt: skip
    sh(py("encoder_eval.sweep", "--phase", "select", *common, "--seeds", "42",
          "--out-dir", runs), tmp_path)  # fmt: skip
    # --cache-dir is reserved from --extra-run-args (issue 23): the environment sets it.
    run = sh(["bash", str(runs / "run_all.sh")], tmp_path, ENCODER_EVAL_CACHE_DIR=str(cache))
    assert "[cells 1/1 done, units 1/1, failed 0] finished: 1 run" in run.stdout
    (res,) = result_files(rdir)
    assert res.name == result_filename(name, "glue_rte", 3.59e-05, 42)
    assert "\n" not in res.name  # the file name is made safe; the identity is kept verbatim
    data_json = read_json(res)
    assert data_json["cell"]["model"] == name
    assert data_json["provenance"]["data"]["source"] == "mirror"
    assert any(cache.iterdir())  # the cache directory reached the cell verbatim and was used
    # status --emit writes a script for the missing cell (another seed), with the same values.
    emitted = tmp_path / f"rest {EVIL}"
    sh(py("encoder_eval.status", "--phase", "select", *common, "--seeds", "42,43",
          "--emit", emitted), tmp_path, ok=(1,))  # fmt: skip
    rest = sh(["bash", str(emitted / "run_all.sh")], tmp_path, ENCODER_EVAL_CACHE_DIR=str(cache))
    assert "[cells 1/1 done, units 1/1, failed 0] finished: 1 run" in rest.stdout
    assert {read_json(p)["cell"]["seed"] for p in result_files(rdir)} == {42, 43}
    sel = tmp_path / "selection.json"
    sh(py("encoder_eval.select", "--results-dir", rdir, "--out", sel, "--lr-keys", "lr06",
          "--seeds", "42,43"), tmp_path)  # fmt: skip
    assert list(json.loads(sel.read_text())["pairs"]) == [name]
    no_canary(tmp_path)


@pytest.mark.parametrize("mode", ["slurm", "slurm-array"])
def test_slurm_scripts_get_hostile_directories_verbatim(tmp_path, fake_slurm, mode):  # noqa: F811
    env_, tpl = fake_slurm
    data = tmp_path / f"data {EVIL}"
    data.mkdir()
    rdir, out = tmp_path / f"res {EVIL}", tmp_path / f"runs {EVIL}"
    model_dir = tmp_path / f"m {EVIL}"
    model_dir.mkdir()
    plan = sweep.build_plan(
        "select",
        PlanInputs(
            rdir,
            extra_models=[f"{EVIL}={model_dir}"],
            tasks=["glue_rte"],
            pins={EVIL: (f"c {EVIL}", None)},
            data_dir=data,
        ),
        lr_keys=["lr06"],
        seeds=[42],
    )
    emitted = sweep.emit(plan, out, mode, template=tpl)
    proc = subprocess.run(["bash", str(emitted.script)], env=env_, capture_output=True,
                          text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (sub,) = _lines(env_["FAKE_SUBMITS"])
    log_dir = str(out / "logs").replace("%", "%%")  # sbatch expands % in --output
    assert sub["opts"]["output"].startswith(log_dir + "/%x-%")
    (job,) = _lines(env_["FAKE_JOBS"])
    argv = spec_args(job["argv"])  # "$@": the unit's spec file, verbatim
    assert argv == plan.run_args(plan.cells)
    assert job["env"]["DATA_DIR"] == str(data) and job["env"]["RESULTS_DIR"] == str(rdir)
    assert job["env"]["MODEL_PATH"] == str(model_dir) and job["env"]["MODEL"] == EVIL
    assert job["env"]["OUT_JSON"] == str(rdir / plan.cells[0].filename)
    assert shlex.split(job["env"]["RUN_ARGS"]) == argv
    assert argv[argv.index("--model-revision") + 1] == f"c {EVIL}"
    no_canary(tmp_path)


@pytest.mark.parametrize(
    "module, args",
    [
        ("encoder_eval.sweep", ["--phase", "select", "--out-dir", "r", "--tasks", "TASK"]),
        ("encoder_eval.status", ["--phase", "select", "--results-dir", ".", "--tasks", "TASK"]),
        ("encoder_eval.select", ["--results-dir", ".", "--tasks", "TASK"]),
        (
            "encoder_eval.run",
            [
                "--model-path",
                "m",
                "--task",
                "TASK",
                "--lr",
                "3.59e-05",
                "--seed",
                "45",
                "--out-json",
                "o.json",
            ],
        ),  # fmt: skip
    ],
    ids=["sweep", "status", "select", "run"],
)
def test_hostile_task_names_are_refused_in_one_line_and_never_run(tmp_path, module, args):
    task = f"glue_rte{EVIL}\nsecond line"
    argv = [task if a == "TASK" else a for a in args]
    proc = subprocess.run(py(module, *argv), cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()  # the newline is shown escaped, not obeyed
    assert line.startswith("error: unknown task 'glue_rteevil $(touch canary) `touch canary`; ")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, nothing run
