"""`sweep --phase probe`: probe cells (model, pooling, task) in units of one (model, task),
the scripts that run them (shell with a fake and with the real `encoder_eval.probe`, Slurm
for real), and their done checks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fault_helpers import py, sh
from spec_helpers import spec_args, unit_argvs

from encoder_eval import probe as probe_command
from encoder_eval import sweep
from encoder_eval.cells import probe_cell as probe_model
from encoder_eval.cells.probing import PROBE_SCHEMA, PROBE_SCHEMA_VERSION
from encoder_eval.cells.unit_spec import PROBE
from encoder_eval.core.errors import EXIT_INPUT_ERROR, HarnessError
from encoder_eval.core.results import read_result
from encoder_eval.plans.plan import CellSettings, PlanInputs, ProbeSettings

TESTS = Path(__file__).resolve().parent


def probe_plan(tmp_path, **kw) -> sweep.Plan:
    """A probe plan of models a, b on glue_rte, glue_sst2 with poolings mean, first, but
    for what `kw` says: `PlanInputs` fields, `ProbeSettings` fields, `max_seq_len` and
    `extra_run_args` (the plan's settings)."""
    kw.setdefault("extra_models", ["a=org/a", "b=org/b"])
    kw.setdefault("tasks", ["glue_rte", "glue_sst2"])
    kw.setdefault("poolings", ["mean", "first"])
    fields = {name: {f.name for f in dataclasses.fields(cls)}
              for name, cls in (("inputs", PlanInputs), ("probe", ProbeSettings))}  # fmt: skip
    inputs = PlanInputs(tmp_path / "res", **{k: v for k, v in kw.items() if k in fields["inputs"]})
    probe = ProbeSettings(**{k: v for k, v in kw.items() if k in fields["probe"]})
    settings = CellSettings.from_argv(kw.get("extra_run_args", ()), PROBE)
    return sweep.build_probe_plan(inputs, probe, settings.given(max_seq_len=kw.get("max_seq_len")))


def probe_record(model: str, pooling: str, task: str) -> dict:
    """The least a done probe result holds (`schema.validate_probe_result`)."""
    return {"schema": PROBE_SCHEMA, "schema_version": PROBE_SCHEMA_VERSION,
            "cell": {"model": model, "pooling": pooling, "task": task,
                     "method": f"{model}:{pooling}"},
            "metric": "accuracy", "mean_score": 0.5, "protocol": {"k_folds": 3, "seed": 7}}  # fmt: skip


def mark_done(plan: sweep.Plan, *cells: sweep.Cell) -> None:
    for c in cells:
        Path(plan.out_json(c)).write_text(json.dumps(probe_record(c.model, c.pooling, c.task)))


# ----------------------------------------------------------------------------- planning


def test_probe_plan_has_a_cell_per_model_pooling_task_and_a_unit_per_model_task(tmp_path):
    plan = probe_plan(tmp_path, k_folds=3, seed=7, max_seq_len=64, precision="fp32",
                      device="cpu", data_dir=tmp_path)  # fmt: skip
    assert plan.kind == "probe" and plan.module == "encoder_eval.probe"
    assert [c.label for c in plan.cells] == [
        f"{m}/{t}/{p}" for m in "ab" for t in ("glue_rte", "glue_sst2") for p in ("mean", "first")
    ]
    for c in plan.cells:  # the file the probe writes for that cell
        assert plan.out_json(c) == str(probe_model.result_path(tmp_path / "res", c.model,
                                                               c.pooling, c.task))  # fmt: skip
    units = plan.units()
    assert [[c.label for c in u] for u in units] == [
        [f"{m}/{t}/mean", f"{m}/{t}/first"] for m in "ab" for t in ("glue_rte", "glue_sst2")
    ]
    args = plan.run_args(units[1])
    assert args == [
        "--model", "a=org/a:auto", "--tasks", "glue_sst2", "--pooling", "mean,first",
        "--results-dir", str(tmp_path / "res"), "--k-folds", "3", "--seed", "7",
        "--max-seq-len", "64", "--precision", "fp32", "--device", "cpu",
        "--data-dir", str(tmp_path),
    ]  # fmt: skip
    # The arguments are what `encoder_eval.probe` itself takes, meaning what the plan says.
    run = probe_model.run_from_args(probe_command.build_parser().parse_args(args))
    assert [(m.name, m.path) for m in run.models] == [("a", "org/a")]
    assert run.tasks == ["glue_sst2"] and run.poolings == ("mean", "first")
    assert (run.config.k_folds, run.config.seed, run.max_seq_len, run.precision) == (3, 7, 64,
                                                                                     "fp32")  # fmt: skip
    assert run.results_dir == tmp_path / "res" and run.data_dir == str(tmp_path)


def test_probe_defaults_are_the_probes_and_a_path_with_a_colon_survives(tmp_path):
    mdir = tmp_path / "m:odd"
    mdir.mkdir()
    plan = sweep.build_probe_plan(
        PlanInputs(
            tmp_path / "r",
            extra_models=[f"m={mdir}:auto"],
            tasks=["glue_sst2"],
            trust_remote_code=["m"],
        )
    )
    (cell,) = plan.cells
    assert (cell.pooling, cell.seed) == ("mean", 42)
    args = plan.run_args(plan.cells)
    assert has_pairs(args, {"--k-folds": "10", "--seed": "42", "--max-seq-len": "256",
                            "--precision": "bf16", "--device": "auto"})  # fmt: skip
    assert "--trust-remote-code" in args
    run = probe_model.run_from_args(probe_command.build_parser().parse_args(args))
    assert run.models[0].path == str(mdir) and run.models[0].trust_remote_code


def has_pairs(args: list[str], pairs: dict[str, str]) -> bool:
    return all(args[args.index(flag) + 1] == value for flag, value in pairs.items())


@pytest.mark.parametrize("kwargs, message", [
    ({"poolings": ["avg"]}, "unknown pooling 'avg'"),
    ({"poolings": []}, "--pooling is empty"),
    ({"k_folds": 1}, "--k-folds"),
    ({"seed": -1}, "--seed -1 must be an integer from 0 to 4294967295"),
    ({"seed": 2**32}, "--seed 4294967296 must be an integer from 0"),
    ({"precision": "fp16"}, "unknown precision 'fp16'"),
    ({"max_seq_len": 0}, "--max-seq-len must be at least 1"),
    ({"tasks": ["glue_sst3"]}, "unknown task 'glue_sst3'"),
    ({"extra_run_args": ["--pooling", "last"]}, "may not set --pooling"),
    ({"extra_run_args": ["--trust-r"]}, "unrecognized arguments: --trust-r"),
    ({"extra_run_args": ["--model-revision", "abc"]}, "may not set --model-revision"),
    ({"extra_run_args": ["--annotation-path", "x"]}, "unrecognized arguments"),
])  # fmt: skip
def test_bad_probe_plan_inputs_raise_one_line_errors(tmp_path, kwargs, message):
    with pytest.raises(HarnessError, match=message.replace("(", r"\(")):
        probe_plan(tmp_path, **kwargs)


def test_probe_units_are_per_pair_only(tmp_path):
    plan = probe_plan(tmp_path)
    for group in ("cell", "lr"):
        with pytest.raises(HarnessError, match=f"--group {group}: a probe sweep runs one"):
            sweep.emit(plan, tmp_path / "runs", "shell", group=group)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, message", [
    (["--phase", "probe", "--lr-keys", "lr03"], "--lr-keys is for --phase select/report"),
    (["--phase", "probe", "--seeds", "42"], "--seeds is for --phase select/report"),
    (["--phase", "probe", "--max-steps", "3"], "--max-steps is for --phase select/report"),
    (["--phase", "select", "--pooling", "mean"], "--pooling is for --phase probe"),
    (["--phase", "select", "--k-folds", "3"], "--k-folds is for --phase probe"),
    (["--phase", "probe", "--seed", "4,5"], "--seed '4,5' must be one integer"),
])  # fmt: skip
def test_cli_refuses_flags_of_the_other_kind(tmp_path, capsys, argv, message):
    out = tmp_path / "runs"
    code = sweep.main([*argv, "--model", "a=org/a", "--tasks", "glue_sst2", "--out-dir", str(out),
                       "--results-dir", str(tmp_path / "res")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_INPUT_ERROR and err.startswith(f"error: {message}"), err
    assert not out.exists() and not (tmp_path / "res").exists()


def test_seed_still_abbreviates_seeds_for_the_fine_tuning_phases(tmp_path, capsys):
    out = tmp_path / "runs"
    code = sweep.main(["--phase", "select", "--model", "a=org/a", "--tasks", "glue_sst2",
                       "--lr-keys", "lr03", "--seed", "42,43", "--out-dir", str(out),
                       "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    [argv] = unit_argvs((out / "run_all.sh").read_text())
    assert "--seed 42,43 " in shlex.join(argv)


def test_cli_writes_the_probe_script_and_no_experiment_manifest(tmp_path, capsys):
    out, res = tmp_path / "runs", tmp_path / "res"
    code = sweep.main(["--phase", "probe", "--model", "a=org/a", "--tasks", "glue_rte,glue_sst2",
                       "--pooling", "mean,last", "--k-folds", "4", "--out-dir", str(out),
                       "--results-dir", str(res)])  # fmt: skip
    stdout = capsys.readouterr().out
    assert code == 0
    assert "4 cell(s) (0 already done, 4 to run) in 2 process(es), one per (model, task)" in stdout
    text = (out / "run_all.sh").read_text()
    assert "MODULE=encoder_eval.probe" in text and "PHASE=probe" in text
    units = " ".join(shlex.join(argv) for argv in unit_argvs(text))
    assert "--pooling mean,last" in units and "--k-folds 4" in units
    assert not (res / "experiment.toml").exists() and not (out / "experiment.toml").exists()


# ----------------------------------------------------------------------------- done checks


def test_done_phase_probe_reads_probe_results_and_moves_corrupt_ones_aside(tmp_path):
    plan = probe_plan(tmp_path, extra_models=["a=org/a"], tasks=["glue_sst2"])
    done, torn = (plan.out_json(c) for c in plan.cells)
    Path(plan.results_dir).mkdir()
    mark_done(plan, plan.cells[0])
    text = json.dumps(probe_record("a", "first", "glue_sst2"))
    Path(torn).write_text(text[:20])
    assert [plan.cell_state(c) for c in plan.cells] == ["ok", "corrupt"]
    proc = subprocess.run(py("encoder_eval.done", "--phase", "probe", "--states", done, torn,
                             str(tmp_path / "res" / "none.probe.json")),
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout.split() == ["ok", "moved", "missing"]
    assert f"moved the corrupt result {torn} to " in proc.stderr
    (kept,) = (tmp_path / "res" / ".corrupt").iterdir()
    assert kept.read_text() == text[:20] and not Path(torn).exists()
    # a fine-tune result check is unchanged: a probe file is not a select result
    proc = subprocess.run(py("encoder_eval.done", "--phase", "select", done),
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1


# ----------------------------------------------------------------------------- run_all.sh

FAKE_PROBE = """
#!{python}
# Stands in for `python -m encoder_eval.probe` (anything else goes to the real interpreter):
# records its argv and writes a done result per pooling, logging the probe's progress line.
import json, os, sys
if sys.argv[1:3] != ["-m", "encoder_eval.probe"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
sys.path.insert(0, {tests!r})
from test_probe_sweep import probe_record
from encoder_eval.cells.probe_cell import result_path
from spec_helpers import spec_args
argv = [*sys.argv[1:3], *spec_args(sys.argv[3:])]  # a unit runs from its spec file
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
get = lambda flag: argv[argv.index(flag) + 1]
name = get("--model").split("=", 1)[0]
poolings = get("--pooling").split(",")
for i, pooling in enumerate(poolings):
    path = result_path(get("--results-dir"), name, pooling, get("--tasks"))
    path.write_text(json.dumps(probe_record(name, pooling, get("--tasks"))))
    print(f"[{{i + 1}}/{{len(poolings)}}] {{name}}:{{pooling}} {{get('--tasks')}}: fake",
          file=sys.stderr)
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_run_all_runs_a_probe_per_pair_and_skips_done_units(tmp_path):
    exe = _exe(tmp_path / "python", FAKE_PROBE.format(python=sys.executable, tests=str(TESTS)))
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHON": str(exe), "FAKE_LOG": str(log)}
    plan = probe_plan(tmp_path)
    Path(plan.results_dir).mkdir()
    mark_done(plan, *plan.units()[0])  # a/glue_rte: both poolings done
    mark_done(plan, plan.units()[1][0])  # a/glue_sst2: mean done, first not
    torn = plan.out_json(plan.units()[2][1])  # b/glue_rte first: corrupt
    Path(torn).write_text("{")
    emitted = sweep.emit(plan, tmp_path / "runs", "shell")
    assert (emitted.n_cells, emitted.n_done, emitted.n_units) == (8, 3, 4)
    assert emitted.corrupt == [torn]
    proc = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(c[:2], c[c.index("--model") + 1], c[c.index("--tasks") + 1]) for c in calls] == [
        (["-m", "encoder_eval.probe"], m, t)
        for m, t in (("a=org/a:auto", "glue_sst2"), ("b=org/b:auto", "glue_rte"),
                     ("b=org/b:auto", "glue_sst2"))
    ]  # fmt: skip
    out = proc.stdout
    assert "skip a_glue_rte (all 2 cells done)" in out
    # the 3 cells done before the run count from the start, a/glue_sst2's mean one too
    assert "[cells 3/8 done, units 1/4, failed 0] starting a_glue_sst2 (1 of 2 cells" in out
    assert "[w1] probe b:first glue_rte: fake" in out  # the probe's progress lines
    assert "[cells 8/8 done, units 4/4, failed 0] finished: 3 run, 1 skipped" in out
    assert f"moved the corrupt result {torn} " in proc.stderr
    assert len(list((tmp_path / "res" / ".corrupt").iterdir())) == 1
    again = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "finished: 0 run, 4 skipped" in again.stdout
    assert len(log.read_text().splitlines()) == 3
    # rerunning sweep is safe: it counts the done cells and rewrites the same script
    again = sweep.emit(plan, tmp_path / "runs", "shell")
    assert (again.n_done, again.corrupt) == (8, [])


def test_run_all_probes_for_real_and_the_summaries_cover_every_task(tmp_path, small_mirror,
                                                                   tiny_models):  # fmt: skip
    """The real `encoder_eval.probe` through run_all.sh: a unit per task, a result per
    (pooling, task), and each (model, pooling) summary over both tasks."""
    tasks = ["glue_sst2", "glue_stsb"]
    sh(py("encoder_eval.sweep", "--phase", "probe", "--model", f"tiny={tiny_models['bert']}",
          "--tasks", ",".join(tasks), "--pooling", "mean,first", "--k-folds", "3",
          "--max-seq-len", "64", "--device", "cpu", "--data-dir", str(small_mirror),
          "--out-dir", "runs", "--results-dir", "res"), tmp_path)  # fmt: skip
    proc = sh(["bash", "runs/run_all.sh", "--workers", "1"], tmp_path)
    assert "finished: 2 run, 0 skipped" in proc.stdout, proc.stdout
    for pooling in ("mean", "first"):
        assert f"[w1] probe tiny:{pooling} glue_sst2: accuracy" in proc.stdout, proc.stdout
        for task in tasks:
            path = probe_model.result_path(tmp_path / "res", "tiny", pooling, task)
            record = read_result(path)[0]
            assert record is not None and record["cell"]["task"] == task
            assert record["protocol"]["k_folds"] == 3 and len(record["q_t"]) == 3
        summary = json.loads((tmp_path / "res" / f"tiny_{pooling}.probe-summary.json").read_text())
        assert set(summary["task_q_scores"]) == set(tasks), summary
        assert summary["config"]["missing_tasks"] == []
    logs = sorted(p.name for p in (tmp_path / "runs" / "logs").iterdir())
    assert logs == ["tiny_glue_sst2.log", "tiny_glue_stsb.log"]
    again = sh(["bash", "runs/run_all.sh", "--workers", "1"], tmp_path)
    assert "finished: 0 run, 2 skipped" in again.stdout


# ----------------------------------------------------------------------------- Slurm


def test_a_probe_template_must_run_the_probe(tmp_path):
    plan = probe_plan(tmp_path)
    wrong = tmp_path / "run.sh"
    wrong.write_text('#!/bin/bash\npython -m encoder_eval.run "$@"\n')
    for mode in ("slurm", "slurm-array"):
        with pytest.raises(HarnessError, match="never runs encoder_eval.probe"):
            sweep.emit(plan, tmp_path / "runs", mode, template=wrong)
    right = tmp_path / "probe.sh"
    right.write_text('#!/bin/bash\n#SBATCH --time=5\npython -m encoder_eval.probe "$@"\n')
    emitted = sweep.emit(plan, tmp_path / "runs", "slurm", template=right)
    assert (emitted.n_cells, emitted.n_units, emitted.group) == (8, 4, "pair")
    text = emitted.script.read_text()
    assert "PHASE=probe" in text
    names = re.findall(r"^unit ee-probe-[0-9a-f]{6}-(\S+) ", text, re.M)
    assert names == ["a_glue_rte", "a_glue_sst2", "b_glue_rte", "b_glue_sst2"]


def test_an_array_task_runs_its_probe_unit_and_skips_it_once_done(tmp_path):
    """array.sh outside Slurm (SLURM_ARRAY_TASK_ID set by hand): its manifest row's run
    arguments reach the template as "$@", and a done unit exits before the template."""
    plan = probe_plan(tmp_path)
    seen = tmp_path / "seen"
    tpl = tmp_path / "probe.sh"
    tpl.write_text(f'#!/bin/bash\n: python -m encoder_eval.probe\nprintf "%s\\0" "$@" '
                   f'>{shlex.quote(str(seen))}\n')  # fmt: skip
    emitted = sweep.emit(plan, tmp_path / "runs", "slurm-array", template=tpl)
    rows = tmp_path / "rows.txt"
    rows.write_text("2\n")  # manifest row 2: b/glue_rte
    array = [str(tmp_path / "runs" / "array.sh"), str(tmp_path / "runs" / "manifest.tsv"),
             str(rows)]  # fmt: skip
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", *array], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    unit = plan.units()[2]
    seen_args = [a.decode() for a in seen.read_bytes().split(b"\0")[:-1]]
    assert spec_args(seen_args) == plan.run_args(unit)
    seen.unlink()
    Path(plan.results_dir).mkdir(exist_ok=True)
    mark_done(plan, *unit)
    proc = subprocess.run(["bash", *array], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "all 2 cell(s) of this task are already done" in proc.stdout
    assert not seen.exists() and emitted.n_units == 4


def test_the_emitted_probe_scripts_pass_shellcheck(tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    plan = probe_plan(tmp_path)
    example = TESTS.parent / "examples" / "slurm_template.sh"
    tpl = tmp_path / "probe.sh"
    tpl.write_text(example.read_text().replace("encoder_eval.run", "encoder_eval.probe"))
    scripts = []
    for mode in ("shell", "slurm", "slurm-array"):
        emitted = sweep.emit(plan, tmp_path / mode, mode,
                             template=None if mode == "shell" else tpl)  # fmt: skip
        scripts += [p for p in emitted.files if p.suffix == ".sh"]
    proc = subprocess.run(["shellcheck", "--external-sources", *map(str, scripts)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slurm
def test_a_probe_sweep_through_real_slurm(tmp_path, small_mirror, tiny_models, slurm):
    """One sbatch per (model, task) running the real probe; relaunching submits nothing."""
    from test_slurm import job_ids, template, wait_for

    tpl = template(tmp_path / "job.sh",
                   f'exec {shlex.quote(sys.executable)} -m encoder_eval.probe "$@"\n')  # fmt: skip
    sh(py("encoder_eval.sweep", "--phase", "probe", "--model", f"tiny={tiny_models['bert']}",
          "--tasks", "glue_sst2", "--pooling", "mean,first", "--k-folds", "3",
          "--max-seq-len", "64", "--device", "cpu", "--data-dir", str(small_mirror),
          "--mode", "slurm", "--slurm-template", str(tpl), "--out-dir", "runs",
          "--results-dir", "res"), tmp_path)  # fmt: skip
    launch = sh(["bash", "runs/launch.sh"], tmp_path)
    ids = job_ids(launch.stdout)
    assert len(ids) == 1 and "submitted 1 job(s); 0 cell(s) already done" in launch.stdout
    wait_for(ids, tmp_path / "runs" / "logs")
    logs = "\n".join(p.read_text()[-2000:] for p in (tmp_path / "runs" / "logs").glob("*"))
    for pooling in ("mean", "first"):
        path = probe_model.result_path(tmp_path / "res", "tiny", pooling, "glue_sst2")
        assert read_result(path)[0] is not None, logs
    assert "[2/2] tiny:first glue_sst2: accuracy" in logs  # the job's progress lines
    again = sh(["bash", "runs/launch.sh"], tmp_path)
    assert job_ids(again.stdout) == [] and "submitted 0 job(s); 2 cell(s) already done" in (
        again.stdout
    )
