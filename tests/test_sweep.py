"""sweep.py: planning, the shell script, and the Slurm scripts against fake sbatch/squeue.

The generated scripts run for real here (bash), with a fake `python` or fake Slurm
commands on PATH that record what they receive; tests/test_slurm.py runs them against a
real cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from result_helpers import make_result, write_result
from spec_helpers import spec_args

from encoder_eval import sweep
from encoder_eval.cells.unit_spec import UnitSpec
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import LR_GRID, PROTOCOL_RECIPE, REPORT_SEEDS, SELECT_SEEDS
from encoder_eval.core.results import result_filename
from encoder_eval.data import models
from encoder_eval.data.tasks import MULTILINGUAL_TASKS
from encoder_eval.plans import emit, selection
from encoder_eval.plans.plan import CellSettings, PlanInputs

INPUT_FIELDS = {f.name for f in dataclasses.fields(PlanInputs)}

RECIPE = ["--weight-decay", "0.1", "--adam-beta2", "0.95", "--early-stop", "--patience", "3",
          "--epoch-cap", "20", "--bsz", "32"]  # fmt: skip


def hostile(canary: Path) -> str:
    """A value that would create `canary` if any shell ever executed it. It holds no `/`
    (so it can name a directory) and no `,` (so it can name a model: `models.MODEL_NAME`);
    scripts run with the canary's directory as cwd."""
    return f'evil $(touch {canary.name}) `touch {canary.name}`; echo \'q"x" {{a..b}} % \\ end'


def has_flags(args: list[str], flags: list[str]) -> bool:
    """True when `flags` (flag, value, ...) appear in `args` with those values."""
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag not in args:
            return False
        nxt = flags[i + 1] if i + 1 < len(flags) else None
        if nxt is not None and not nxt.startswith("--"):
            if args[args.index(flag) + 1] != nxt:
                return False
            i += 2
        else:
            i += 1
    return True


def selection_for(pairs: dict) -> dict:
    return {"schema": "encoder-eval-selection", "version": selection.VERSION,
            "pairs": {m: {t: {"lr_key": k, "lr": LR_GRID[k]} for t, k in by.items()}
                      for m, by in pairs.items()}}  # fmt: skip


# ----------------------------------------------------------------------------- planning


def test_registry_is_the_models_registry():
    assert sweep.MODEL_REGISTRY is models.MODEL_REGISTRY
    assert len(sweep.MODEL_REGISTRY) == 14


def test_select_plan_default_is_the_full_protocol(tmp_path):
    plan = sweep.build_plan("select", PlanInputs(tmp_path))
    assert len(plan.cells) == 14 * len(MULTILINGUAL_TASKS) * 10 * 3
    assert {c.task for c in plan.cells} == set(MULTILINGUAL_TASKS)
    assert {c.seed for c in plan.cells} == set(SELECT_SEEDS)
    assert not plan.shrunk
    units = plan.units()  # default: one per (model, task), every LR and seed in it
    assert len(units) == 14 * len(MULTILINGUAL_TASKS)
    assert all(len(u) == 30 and len({c.pair for c in u}) == 1 for u in units)
    assert sorted(c.label for u in units for c in u) == sorted(c.label for c in plan.cells)
    args = plan.run_args(units[5])
    grid = ",".join(f"{lr:g}" for lr in LR_GRID.values())
    assert has_flags(args, RECIPE + ["--lr", grid, "--seed", "42,43,44", "--phase", "select",
                                     "--skip-existing", "--max-steps", "10000",
                                     "--max-seq-len", "256"])  # fmt: skip
    assert "--allow-off-protocol" not in args
    # The process runs LR by LR, each LR's seeds in order: the unit lists cells that way.
    assert [(c.lr_key, c.seed) for c in units[5][:4]] == [
        ("lr01", 42), ("lr01", 43), ("lr01", 44), ("lr02", 42)]  # fmt: skip
    by_lr = plan.units(group="lr")
    assert len(by_lr) == 14 * len(MULTILINGUAL_TASKS) * 10
    lr06 = next(u for u in by_lr if u[0].lr_key == "lr06")
    assert has_flags(plan.run_args(lr06), ["--lr", "3.59e-05", "--seed", "42,43,44"])
    assert len(plan.units(group="cell")) == len(plan.cells)
    with pytest.raises(HarnessError, match="--group 'seed' must be one of pair, lr, cell"):
        plan.units(group="seed")


def test_units_of_a_subset_that_is_not_a_product_fall_back_to_one_per_lr(tmp_path):
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli"]),
        lr_keys=["lr01", "lr02"],
    )
    missing = [c for c in plan.cells if (c.lr_key, c.seed) != ("lr01", 43)]  # lr01/s43 done
    units = plan.units(missing)
    assert [[(c.lr_key, c.seed) for c in u] for u in units] == [
        [("lr01", 42), ("lr01", 44)], [("lr02", 42), ("lr02", 43), ("lr02", 44)]]  # fmt: skip
    assert has_flags(plan.run_args(units[0]), ["--lr", "1e-05", "--seed", "42,44"])
    whole = plan.units([c for c in plan.cells if c.seed != 43])  # a product: still one unit
    assert len(whole) == 1 and has_flags(plan.run_args(whole[0]),
                                         ["--lr", "1e-05,1.29e-05", "--seed", "42,44"])  # fmt: skip
    with pytest.raises(ValueError, match="one unit"):
        plan.run_args(missing)


def test_report_plan_uses_the_selected_lr_and_report_seeds(tmp_path):
    sel = selection_for({"xlm-r-base": {"xnli": "lr06", "paws_x": "lr02"}})
    plan = sweep.build_plan(
        "report",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli", "paws_x"]),
        selection=sel,
    )
    assert [(c.task, c.lr_key) for c in plan.cells[::5]] == [("xnli", "lr06"), ("paws_x", "lr02")]
    assert [c.seed for c in plan.cells[:5]] == list(REPORT_SEEDS)
    args = plan.run_args(plan.units()[0])
    assert has_flags(args, RECIPE + ["--lr", "3.59e-05", "--seed", "45,46,47,48,49",
                                     "--phase", "report"])  # fmt: skip


def test_the_selection_split_reaches_every_cell_and_a_report_phase_follows_its_selection(
    tmp_path,
):
    from result_helpers import make_selection

    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli"]),
        CellSettings().given(selection_split="holdout"),
    )
    assert has_flags(plan.run_args(plan.units()[0]), ["--selection-split", "holdout"])
    strict = make_selection({("xlm-r-base", "xnli"): "lr06"}, selection_split="holdout")
    plan = sweep.build_plan(
        "report", PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli"]), selection=strict
    )
    assert plan.selection_split == "holdout"
    plain = make_selection({("xlm-r-base", "xnli"): "lr06"})  # its select cells used dev
    with pytest.raises(HarnessError, match="--selection-split holdout contradicts the selection"):
        sweep.build_plan(
            "report",
            PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli"]),
            CellSettings().given(selection_split="holdout"),
            selection=plain,
        )


def test_report_plan_refuses_pairs_without_selection(tmp_path):
    sel = selection_for({"xlm-r-base": {"xnli": "lr06"}})
    with pytest.raises(HarnessError, match="no selected LR for 1 pair.*xlm-r-base/paws_x"):
        sweep.build_plan(
            "report",
            PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli", "paws_x"]),
            selection=sel,
        )
    with pytest.raises(HarnessError, match="needs --selection"):
        sweep.build_plan("report", PlanInputs(tmp_path))
    with pytest.raises(HarnessError, match="--lr-keys is for --phase select"):
        sweep.build_plan("report", PlanInputs(tmp_path), lr_keys=["lr01"], selection=sel)


def test_model_additions_and_shrinking(tmp_path):
    mdir = tmp_path / "my model"
    mdir.mkdir()
    plan = sweep.build_plan(
        "select",
        PlanInputs(
            tmp_path / "r",
            extra_models=[f"mine={mdir}:liquid-bidir"],
            tasks=["glue_rte"],
            device="cpu",
        ),
        CellSettings().given(max_steps=4, max_seq_len=64),
        lr_keys=["lr08", "lr03"],
        seeds=[42, 7],
    )
    assert {c.model for c in plan.cells} == {"mine"}  # additions only, when given
    assert [c.lr_key for c in plan.cells] == ["lr03", "lr03", "lr08", "lr08"]  # grid order
    assert plan.cells[0].mode == "liquid-bidir" and plan.cells[0].model_path == str(mdir)
    assert len(plan.shrunk) == 4
    args = plan.run_args(plan.units()[0])
    assert has_flags(args, ["--seed", "42,7", "--max-steps", "4", "--max-seq-len", "64",
                            "--device", "cpu", "--allow-off-protocol", "--no-trust-remote-code"])  # fmt: skip
    both = sweep.build_plan(
        "select",
        PlanInputs(
            tmp_path, models=["mine", "xlm-r-base"], extra_models=["mine=org/x"], tasks=["xnli"]
        ),
    )
    assert {c.model for c in both.cells} == {"mine", "xlm-r-base"}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"models": ["xlm-r-bse"]}, "Did you mean 'xlm-r-base'"),
        ({"tasks": ["xnlii"]}, "Did you mean 'xnli'"),
        ({"extra_models": ["xlm-r-base=org/x"]}, "shadows the registry"),
        ({"extra_models": ["noequals"]}, "NAME=PATH_OR_HUB_ID"),
        ({"max_steps": 0}, "--max-steps"),
        ({"extra_run_args": ["--seed", "1"]}, "may not set --seed"),
        ({"extra_run_args": ["--limit", "16"]}, "sets --limit 16, which the plan models"),
        ({"data_dir": "/nonexistent/dir"}, "not a directory"),
        ({"selection": {"pairs": {}}}, "--selection is for --phase report"),
    ],
)
def test_bad_inputs_raise_one_line_errors(tmp_path, kwargs, message):
    """Bad inputs, bad settings (a modelled flag among the extra run arguments) and bad
    phase arguments are each refused in one line."""
    inputs = PlanInputs(tmp_path, **{k: v for k, v in kwargs.items() if k in INPUT_FIELDS})
    settings = CellSettings(
        dataclasses.replace(PROTOCOL_RECIPE, max_steps=kwargs.get("max_steps", 10_000)),
        extra_run_args=kwargs.get("extra_run_args", ()),
    )
    with pytest.raises(HarnessError, match=message) as info:
        sweep.build_plan("select", inputs, settings, selection=kwargs.get("selection"))
    assert "\n" not in str(info.value)


def test_cli_errors_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "runs"
    base = ["--out-dir", str(out), "--results-dir", str(tmp_path / "res")]
    assert sweep.main(["--phase", "select", "--models", "nope", *base]) == 2
    assert sweep.main(["--phase", "select", "--lr-keys", "lr11", *base]) == 2
    assert sweep.main(["--phase", "select", "--mode", "slurm", *base]) == 2  # no template
    bad_tpl = tmp_path / "t.sh"
    bad_tpl.write_text('python -m encoder_eval.run "$@"\n')  # no #! line
    assert sweep.main(["--phase", "select", "--mode", "slurm", "--slurm-template", str(bad_tpl),
                       *base]) == 2  # fmt: skip
    sh_tpl = tmp_path / "sh.sh"
    sh_tpl.write_text('#!/bin/sh\npython -m encoder_eval.run "$@"\n')
    assert sweep.main(["--phase", "select", "--mode", "slurm-array", "--slurm-template",
                       str(sh_tpl), *base]) == 2  # fmt: skip
    assert sweep.main(["--phase", "report", *base]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("error: ") for line in lines)
    assert not out.exists() and not (tmp_path / "res").exists()


def test_tasks_takes_group_names(tmp_path, capsys):
    from encoder_eval.data.tasks import TASK_GROUPS, group_tasks

    everything = sweep.build_plan(
        "select",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["all"]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    assert [c.task for c in everything.cells] == group_tasks("all") and len(everything.cells) == 17
    mixed = sweep.build_plan(
        "select",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli", "glue", "xnli"]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    assert [c.task for c in mixed.cells] == ["xnli", *group_tasks("glue")]
    out = tmp_path / "runs"
    rc = sweep.main(["--phase", "select", "--tasks", "all", "--models", "xlm-r-base",
                     "--out-dir", str(out), "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert rc == 0 and f"{17 * 10 * 3} cell(s)" in capsys.readouterr().out
    help_text = sweep.build_parser().format_help()
    assert all(group in help_text for group in TASK_GROUPS)


def test_task_files_reach_every_run(tmp_path):
    """The plan hands its task files to every process (`--tasks-file F`, absolute)."""
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=["xnli"]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    assert plan.tasks_files == [] and "--tasks-file" not in plan.run_args(plan.cells)
    plan.tasks_files = ["/abs/mine.toml", "/abs/more tasks.yaml"]
    args = plan.run_args(plan.cells)
    assert has_flags(args, ["--tasks-file", "/abs/mine.toml"])
    assert args[args.index("--tasks-file", args.index("--tasks-file") + 1) + 1] == (
        "/abs/more tasks.yaml")  # fmt: skip
    with pytest.raises(HarnessError, match="may not set --tasks-file"):
        sweep.build_plan(
            "select", PlanInputs(tmp_path), CellSettings.from_argv(["--tasks-file", "x"])
        )
    parsed = sweep.build_parser().parse_args(["--tasks-file", "a.toml", "--tasks-file", "b.yaml"])
    assert parsed.tasks_file == ["a.toml", "b.yaml"]


def test_show_grid(capsys):
    assert sweep.main(["--show-grid"]) == 0
    out = capsys.readouterr().out
    assert "lr06   3.59e-05" in out and "lr01   1e-05" in out and "lr10   0.0001" in out
    assert "--weight-decay 0.1 --adam-beta2 0.95" in out and "45,46,47,48,49" in out


# ----------------------------------------------------------------------------- fakes


def _exe(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


FAKE_PYTHON = """
#!{python}
# Stands in for `python -m encoder_eval.run` (anything else goes to the real interpreter):
# records its argv, then writes a valid result file per (LR, seed), LR by LR;
# FAKE_FAIL=<lr> makes it exit $FAKE_RC (default 3) when it reaches that LR.
import json, os, sys
if sys.argv[1:3] != ["-m", "encoder_eval.run"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
sys.path.insert(0, {tests!r})
from result_helpers import make_result, write_result
from encoder_eval.core.protocol import lr_key_for
from spec_helpers import spec_args
argv = [*sys.argv[1:3], *spec_args(sys.argv[3:])]  # a unit runs from its spec file
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
args = argv[2:]
get = lambda flag: args[args.index(flag) + 1]
for lr in get("--lr").split(","):
    if os.environ.get("FAKE_FAIL") == lr:
        print("boom: simulated failure", file=sys.stderr)
        sys.exit(int(os.environ.get("FAKE_RC", "3")))
    for seed in get("--seed").split(","):
        write_result(get("--results-dir"), make_result(
            get("--model-key"), get("--task"), lr_key_for(float(lr)), int(seed), get("--phase")))
"""
TESTS = str(Path(__file__).resolve().parent)


@pytest.fixture
def fake_python(tmp_path):
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    exe = _exe(bindir / "python", FAKE_PYTHON.format(python=sys.executable, tests=TESTS))
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHON": str(exe), "FAKE_LOG": str(log)}
    return env, log


def _calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def shell_plan(tmp_path, extra_models: list[str]) -> sweep.Plan:
    inputs = PlanInputs(
        tmp_path / "res", extra_models=extra_models, tasks=["glue_rte", "glue_sst2"]
    )
    return sweep.build_plan("select", inputs, CellSettings().given(max_steps=4),
                            lr_keys=["lr03", "lr06"], seeds=[42, 43])  # fmt: skip


def test_shell_runs_one_process_per_unit_and_skips_done_units(tmp_path, fake_python):
    env, log = fake_python
    plan = shell_plan(tmp_path, extra_models=["a=org/a", "b=org/b"])
    emitted = sweep.emit_shell(plan, tmp_path / "runs")
    assert emitted.n_cells == 16 and emitted.n_units == 4
    assert "in 4 process(es), one per (model, task)" in emitted.describe()
    script = str(emitted.script)
    proc = subprocess.run(["bash", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    calls = _calls(log)
    assert len(calls) == 4
    assert all(c[:2] == ["-m", "encoder_eval.run"]
               and has_flags(c, ["--lr", "1.67e-05,3.59e-05", "--seed", "42,43"])
               for c in calls)  # fmt: skip
    assert "[cells 0/16 done, units 0/4, failed 0] starting a_glue_rte (4 of 4" in proc.stdout
    assert "[cells 4/16 done, units 1/4, failed 0] starting a_glue_sst2" in proc.stdout
    assert "[cells 16/16 done, units 4/4, failed 0] finished: 4 run, 0 skipped" in proc.stdout
    assert len(list((tmp_path / "runs" / "logs").glob("*.log"))) == 4
    # Re-running starts nothing; removing one cell re-runs only its unit.
    (tmp_path / "res" / result_filename("b", "glue_sst2", LR_GRID["lr06"], 43)).unlink()
    proc = subprocess.run(["bash", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0
    calls = _calls(log)[4:]
    assert len(calls) == 1 and has_flags(calls[0], ["--model-key", "b", "--task", "glue_sst2",
                                                    "--lr", "1.67e-05,3.59e-05", "--seed", "42,43"])  # fmt: skip
    assert "skip a_glue_rte (all 4 cells done)" in proc.stdout
    assert "starting b_glue_sst2 (1 of 4 cells to run)" in proc.stdout
    assert "finished: 1 run, 3 skipped" in proc.stdout
    # Resuming with 15 of 16 cells done counts them from the start, the unit's own 3 too.
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[cells ")]
    assert lines[0].startswith("[cells 15/16 done, units 1/4, failed 0] skip a_glue_rte")
    assert "[cells 15/16 done, units 3/4, failed 0] starting b_glue_sst2" in proc.stdout
    assert "[cells 16/16 done, units 4/4, failed 0] finished: 1 run, 3 skipped" in proc.stdout


@pytest.mark.parametrize("group, n_units, label", [("lr", 8, "a_glue_rte_lr03"),
                                                    ("cell", 16, "a_glue_rte_lr03_s42")])  # fmt: skip
def test_shell_group_flag_splits_units(tmp_path, fake_python, group, n_units, label):
    env, log = fake_python
    plan = shell_plan(tmp_path, extra_models=["a=org/a", "b=org/b"])
    emitted = sweep.emit(plan, tmp_path / "runs", "shell", group=group)
    assert emitted.n_units == n_units
    proc = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = _calls(log)
    assert len(calls) == n_units and all("," not in c[c.index("--lr") + 1] for c in calls)
    assert f"starting {label} " in proc.stdout
    assert len(list((tmp_path / "res").glob("*.json"))) == 16


def test_shell_reports_failed_units_and_exits_1(tmp_path, fake_python):
    env, log = fake_python
    plan = shell_plan(tmp_path, extra_models=["a=org/a"])
    script = str(sweep.emit_shell(plan, tmp_path / "runs").script)
    proc = subprocess.run(["bash", script], env={**env, "FAKE_FAIL": "1.67e-05"},
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert "FAILED a_glue_rte (exit 3, 0 of 4 cells written)" in proc.stderr
    assert "boom: simulated failure" in proc.stderr
    assert "failed units: a_glue_rte a_glue_sst2" in proc.stderr
    assert "[cells 8/8 done" not in proc.stdout and "failed 2] finished" in proc.stdout
    assert len(_calls(log)) == 2  # the first failure did not stop the other unit
    proc = subprocess.run(["bash", script], env={**env, "FAKE_FAIL": "3.59e-05"},
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert "FAILED a_glue_rte (exit 3, 2 of 4 cells written)" in proc.stderr


def _corrupt_three(plan: sweep.Plan) -> dict[str, bytes]:
    """Spoil three done cells of `plan` (cells 0, 1, 3) three ways; return name -> bytes."""
    paths = [Path(plan.out_json(c)) for c in plan.cells]
    text = paths[0].read_text()
    paths[0].write_text(text[: len(text) // 2])  # truncated, as by a full disk
    paths[1].write_text(paths[2].read_text())  # another cell's valid result under its name
    other = plan.cells[3]
    other_phase = "report" if plan.phase == "select" else "select"
    paths[3].write_text(json.dumps(make_result(other.model, other.task, other.lr_key,
                                               other.seed, other_phase)))  # fmt: skip
    return {p.name: p.read_bytes() for p in (paths[0], paths[1], paths[3])}


def _assert_kept_aside(plan: sweep.Plan, spoiled: dict[str, bytes], stderr: str) -> None:
    """Each spoiled file sits byte for byte in .corrupt/, named in one line of stderr."""
    qdir = Path(plan.results_dir) / ".corrupt"
    for name, content in spoiled.items():
        (kept,) = qdir.glob(f"{name}.*Z")
        assert kept.read_bytes() == content
        assert stderr.count(f"moved the corrupt result {Path(plan.results_dir) / name} ") == 1
    assert all(plan.cell_state(c) == "ok" for c in plan.cells)


def test_shell_moves_corrupt_results_aside_and_reruns_their_cells(tmp_path, fake_python):
    env, log = fake_python
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    script = str(sweep.emit(plan, tmp_path / "runs", "shell", group="cell").script)
    assert subprocess.run(["bash", script], env=env, capture_output=True).returncode == 0
    spoiled = _corrupt_three(plan)
    assert "3 corrupt result file(s)" in sweep.emit(plan, tmp_path / "runs", "shell",
                                                     group="cell").describe()  # fmt: skip
    proc = subprocess.run(["bash", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rerun = {(c[c.index("--lr") + 1], c[c.index("--seed") + 1]) for c in _calls(log)[4:]}
    assert rerun == {(f"{c.lr:g}", str(c.seed)) for c in (plan.cells[i] for i in (0, 1, 3))}
    assert "finished: 3 run, 1 skipped" in proc.stdout
    _assert_kept_aside(plan, spoiled, proc.stderr)


def test_shell_stops_at_a_unit_that_exits_130_and_says_how_to_resume(tmp_path, fake_python):
    """A unit's process that exits 130 (Ctrl-C, handled) ends the script: no next unit."""
    env, log = fake_python
    plan = shell_plan(tmp_path, extra_models=["a=org/a"])
    script = sweep.emit(plan, tmp_path / "runs", "shell", group="lr").script
    proc = subprocess.run(["bash", str(script)], env={**env, "FAKE_FAIL": "3.59e-05",
                          "FAKE_RC": "130"}, capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 130
    assert [c[c.index("--lr") + 1] for c in _calls(log)] == ["1.67e-05", "3.59e-05"]
    assert "starting a_glue_sst2" not in proc.stdout and "finished" not in proc.stdout
    (last,) = proc.stderr.strip().splitlines()[-1:]
    assert last.startswith("interrupted during a_glue_rte_lr06: ")
    assert f"run bash {script} again" in last
    assert "FAILED" not in proc.stderr


def test_shell_passes_hostile_values_verbatim(tmp_path, fake_python):
    env, log = fake_python
    canary = tmp_path / "canary"
    evil = hostile(canary) + "\nsecond line"
    mdir = tmp_path / evil
    mdir.mkdir()
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / f"res {evil}", extra_models=[f"{evil}={mdir}"], tasks=["glue_rte"]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    emitted = sweep.emit_shell(plan, tmp_path / f"runs {evil}")
    proc = subprocess.run(
        ["bash", str(emitted.script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    (call,) = _calls(log)
    assert has_flags(call, ["--model-key", evil, "--model-path", str(mdir),
                            "--results-dir", str(tmp_path / f"res {evil}")])  # fmt: skip
    assert not canary.exists()
    assert "[cells 1/1 done, units 1/1, failed 0] finished" in proc.stdout


# ----------------------------------------------------------------------------- Slurm (faked)

FAKE_SBATCH = """
#!{python}
# A synchronous sbatch: records the submission, then runs the script like Slurm would
# (with --export=ALL the job's environment is the caller's; arrays get one run per index).
import json, os, subprocess, sys
args = sys.argv[1:]
opts, i = {{}}, 0
while i < len(args) and args[i].startswith("--"):
    k, _, v = args[i][2:].partition("=")
    opts[k] = v
    i += 1
script, script_args = args[i], args[i + 1:]
with open(os.environ["FAKE_SUBMITS"], "a") as f:
    f.write(json.dumps({{"opts": opts, "script": script, "args": script_args}}) + "\\n")
indices = [None]
if "array" in opts:
    lo, hi = opts["array"].split("%")[0].split("-")
    indices = list(range(int(lo), int(hi) + 1))
for idx in indices:
    env = dict(os.environ)
    if idx is not None:
        env["SLURM_ARRAY_TASK_ID"] = str(idx)
    subprocess.run(["bash", script, *script_args], env=env, check=False)
print("Submitted batch job 1")
"""
FAKE_SQUEUE = """
#!/bin/bash
cat "${FAKE_QUEUE:-/dev/null}"
"""
FAKE_SCONTROL = """
#!/bin/bash
echo "MaxArraySize            = ${FAKE_MAX_ARRAY:-1001}"
"""
# The job body: record argv and the contract's variables as one JSON line per job, and
# write a valid result for a one-cell job.
TEMPLATE = """
#!/bin/bash
#SBATCH --time=5
#SBATCH --mem=100M

# a comment before the body
set -euo pipefail
{python} - "$@" <<'PY'
import json, os, sys
names = "OUT_JSON MODEL MODEL_PATH MODE TASK LR LR_KEY SEED PHASE RESULTS_DIR DATA_DIR DEVICE MAX_STEPS RECIPE_ARGS RUN_ARGS N_CELLS".split()
rec = {{"argv": sys.argv[1:], "env": {{n: os.environ.get(n) for n in names}}}}
with open(os.environ["FAKE_JOBS"], "a") as f:
    f.write(json.dumps(rec) + "\\n")
if os.environ["N_CELLS"] == "1":
    sys.path.insert(0, {tests!r})
    from result_helpers import make_result
    e = os.environ
    result = make_result(e["MODEL"], e["TASK"], e["LR_KEY"], int(e["SEED"]), e["PHASE"])
    open(e["OUT_JSON"], "w").write(json.dumps(result))
PY
"""


@pytest.fixture
def fake_slurm(tmp_path):
    bindir = tmp_path / "slurmbin"
    bindir.mkdir()
    _exe(bindir / "sbatch", FAKE_SBATCH.format(python=sys.executable))
    _exe(bindir / "squeue", FAKE_SQUEUE)
    _exe(bindir / "scontrol", FAKE_SCONTROL)
    tpl = _exe(tmp_path / "template.sh", TEMPLATE.format(python=sys.executable, tests=TESTS))
    env = {
        **os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
        "FAKE_SUBMITS": str(tmp_path / "submits.jsonl"), "FAKE_JOBS": str(tmp_path / "jobs.jsonl"),
    }  # fmt: skip
    return env, tpl


def _lines(path) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def mark_done(plan: sweep.Plan, *cells: sweep.Cell) -> None:
    """Write a valid result for each cell, as a finished run would."""
    for c in cells:
        write_result(Path(plan.results_dir), make_result(c.model, c.task, c.lr_key, c.seed,
                                                         plan.phase))  # fmt: skip


def test_slurm_one_sbatch_per_missing_cell_with_the_contract(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    canary = tmp_path / "canary"
    evil = hostile(canary) + "\nline two"
    model_dir = tmp_path / "models" / evil  # a hostile local model path
    model_dir.mkdir(parents=True)
    plan = sweep.build_plan(
        "select",
        PlanInputs(
            tmp_path / "res",
            extra_models=[f"{evil}={model_dir}"],
            tasks=["glue_rte"],
            data_dir=tmp_path,
            device="cpu",
        ),
        CellSettings().given(max_steps=4),
        lr_keys=["lr03", "lr06"],
        seeds=[42],
    )
    emitted = sweep.emit_slurm(
        plan, tmp_path / "runs", sweep.SlurmLaunch(tpl, requeue=True, units_per_job=1)
    )
    assert (tmp_path / "runs" / "template.sh").read_text() == tpl.read_text()
    # One cell is already done: it is not submitted.
    mark_done(plan, plan.cells[0])
    proc = subprocess.run(
        ["bash", str(emitted.script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "submitted 1 job(s); 1 cell(s) already done; 0 cell(s) already queued" in proc.stdout
    (sub,) = _lines(env["FAKE_SUBMITS"])
    assert sub["opts"]["export"] == "ALL" and "requeue" in sub["opts"]
    assert sub["opts"]["job-name"].startswith("ee-select-")
    assert sub["opts"]["output"].endswith("/logs/%x-%j.out")
    (job,) = _lines(env["FAKE_JOBS"])
    cell = plan.cells[1]
    assert spec_args(job["argv"]) == plan.run_args([cell])  # "$@" is exactly the run arguments
    assert job["env"]["MODEL"] == evil and job["env"]["MODEL_PATH"] == str(model_dir)
    assert job["env"]["OUT_JSON"] == plan.out_json(cell)
    assert (job["env"]["LR"], job["env"]["LR_KEY"], job["env"]["SEED"]) == (
        "3.59e-05",
        "lr06",
        "42",
    )
    assert job["env"]["PHASE"] == "select" and job["env"]["MAX_STEPS"] == "4"
    assert job["env"]["N_CELLS"] == "1"
    assert job["env"]["DATA_DIR"] == str(tmp_path) and job["env"]["DEVICE"] == "cpu"
    assert "--weight-decay 0.1 --adam-beta2 0.95" in job["env"]["RECIPE_ARGS"]
    import shlex

    assert shlex.split(job["env"]["RUN_ARGS"]) == spec_args(job["argv"])
    assert not canary.exists()
    # Launching again submits nothing.
    proc = subprocess.run(
        ["bash", str(emitted.script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert "submitted 0 job(s); 2 cell(s) already done" in proc.stdout
    assert len(_lines(env["FAKE_SUBMITS"])) == 1


@pytest.mark.parametrize("mode", ["slurm", "slurm-array"])
def test_slurm_launch_moves_corrupt_results_aside_and_resubmits(tmp_path, fake_slurm, mode):
    env, tpl = fake_slurm
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    emitted = sweep.emit(plan, tmp_path / "runs", mode, template=tpl, group="cell", units_per_job=1)
    mark_done(plan, *plan.cells)
    spoiled = _corrupt_three(plan)
    proc = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    jobs = _lines(env["FAKE_JOBS"])
    assert sorted(j["env"]["OUT_JSON"] for j in jobs) == sorted(
        plan.out_json(plan.cells[i]) for i in (0, 1, 3))  # fmt: skip
    assert "1 cell(s) already done" in proc.stdout
    _assert_kept_aside(plan, spoiled, proc.stderr)
    again = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True,
                           text=True, cwd=tmp_path)  # fmt: skip
    assert "4 cell(s) already done" in again.stdout or "all 4 cells are done" in again.stdout
    assert len(_lines(env["FAKE_JOBS"])) == 3


def test_slurm_does_not_resubmit_queued_cells(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03"],
        seeds=[42, 43],
    )
    emitted = sweep.emit_slurm(
        plan, tmp_path / "runs", sweep.SlurmLaunch(tpl, group="cell", units_per_job=1)
    )
    queue = tmp_path / "queue.txt"
    queue.write_text(emit.slurm_job_name(plan, plan.cells[:1]) + "\n")
    proc = subprocess.run(["bash", str(emitted.script)], env={**env, "FAKE_QUEUE": str(queue)},
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert "submitted 1 job(s); 0 cell(s) already done; 1 cell(s) already queued" in proc.stdout
    (sub,) = _lines(env["FAKE_SUBMITS"])
    assert "requeue" not in sub["opts"]


def test_slurm_array_chunks_to_max_array_size(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    canary = tmp_path / "canary"
    evil = hostile(canary)
    model_dir = tmp_path / "models" / evil  # a hostile local model path
    model_dir.mkdir(parents=True)
    plan = sweep.build_plan(
        "select",
        PlanInputs(
            tmp_path / "res", extra_models=[f"{evil}={model_dir}"], tasks=["glue_rte", "glue_sst2"]
        ),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    emitted = sweep.emit_slurm_array(
        plan, tmp_path / "runs", sweep.SlurmLaunch(tpl, group="cell", units_per_job=1)
    )
    manifest = (tmp_path / "runs" / "manifest.tsv").read_text().splitlines()
    assert len(manifest) == 1 + 8 and manifest[0].startswith("N\tOUT_JSON_1..N\tOUT_JSON\tMODEL\t")
    array = (tmp_path / "runs" / "array.sh").read_text()
    # The inserted block comes after every #SBATCH line and before the template's body.
    assert array.index("#SBATCH --mem") < array.index(">>> inserted") < array.index("set -euo")
    # Two cells done already; MaxArraySize 3 -> 6 pending rows in chunks of 3.
    mark_done(plan, *plan.cells[:2])
    proc = subprocess.run(["bash", str(emitted.script)], env={**env, "FAKE_MAX_ARRAY": "3"},
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ("submitted 6 array task(s) (6 cell(s) to run) in 2 array job(s) of at most 3; "
            "2 cell(s) already done") in proc.stdout  # fmt: skip
    subs = _lines(env["FAKE_SUBMITS"])
    assert [s["opts"]["array"] for s in subs] == ["0-2", "0-2"]
    jobs = _lines(env["FAKE_JOBS"])
    assert len(jobs) == 6
    by_out = {j["env"]["OUT_JSON"]: j for j in jobs}
    for cell in plan.cells[2:]:
        job = by_out[plan.out_json(cell)]
        assert spec_args(job["argv"]) == plan.run_args([cell])
        assert job["env"]["MODEL"] == evil and job["env"]["SEED"] == str(cell.seed)
        assert job["env"]["DATA_DIR"] == ""
    assert not canary.exists()
    # Everything done now: nothing is submitted.
    proc = subprocess.run(
        ["bash", str(emitted.script)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert "submitted 0 array task(s): all 8 cells are done" in proc.stdout
    assert len(_lines(env["FAKE_SUBMITS"])) == 2


def test_slurm_group_pair_runs_one_job_per_pair(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte", "glue_sst2"]),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    emitted = sweep.emit(
        plan, tmp_path / "runs", "slurm", template=tpl, group="pair", units_per_job=1
    )
    assert emitted.n_units == 2 and "in 2 job(s), one per (model, task)" in emitted.describe()
    mark_done(plan, plan.cells[0])  # a glue_rte cell done: still submitted
    mark_done(plan, *plan.cells[4:])  # glue_sst2 all done: not submitted
    proc = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "submitted 1 job(s); 5 cell(s) already done" in proc.stdout
    (job,) = _lines(env["FAKE_JOBS"])
    rte = plan.cells[:4]
    assert spec_args(job["argv"]) == plan.run_args(rte)
    assert has_flags(spec_args(job["argv"]), ["--lr", "1.67e-05,3.59e-05", "--seed", "42,43"])
    assert (job["env"]["LR"], job["env"]["LR_KEY"], job["env"]["SEED"]) == (
        "1.67e-05,3.59e-05", "lr03,lr06", "42,43")  # fmt: skip
    assert job["env"]["N_CELLS"] == "4"
    import shlex

    assert shlex.split(job["env"]["OUT_JSON"]) == [plan.out_json(c) for c in rte]


def test_slurm_array_group_lr_rows_are_units(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    emitted = sweep.emit(
        plan, tmp_path / "runs", "slurm-array", template=tpl, group="lr", units_per_job=1
    )
    assert emitted.n_units == 2
    rows = (tmp_path / "runs" / "manifest.tsv").read_text().splitlines()[1:]
    assert [r.split("\t")[0] for r in rows] == ["2", "2"]
    mark_done(plan, plan.cells[0])  # half of the lr03 unit
    mark_done(plan, *plan.cells[2:])  # the whole lr06 unit
    proc = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ("submitted 1 array task(s) (1 cell(s) to run) in 1 array job(s) of at most 1001; "
            "3 cell(s) already done") in proc.stdout  # fmt: skip
    (job,) = _lines(env["FAKE_JOBS"])
    assert spec_args(job["argv"]) == plan.run_args(plan.cells[:2])
    assert job["env"]["SEED"] == "42,43" and job["env"]["N_CELLS"] == "2"
    # The array task itself exits early once every cell of its unit is done.
    mark_done(plan, plan.cells[1])
    rows_file = tmp_path / "rows.txt"
    rows_file.write_text("0\n")
    proc = subprocess.run(["bash", str(tmp_path / "runs" / "array.sh"),
                           str(tmp_path / "runs" / "manifest.tsv"), str(rows_file)],
                          env={**env, "SLURM_ARRAY_TASK_ID": "0"}, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "all 2 cell(s) of this task are already done" in proc.stdout
    assert len(_lines(env["FAKE_JOBS"])) == 1


def _one_cell_array(tmp_path: Path, tpl: Path) -> tuple[sweep.Plan, Path]:
    """A one-cell select plan emitted as an array job, and a rows file naming its row."""
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03"],
        seeds=[42],
    )
    sweep.emit_slurm_array(plan, tmp_path / "runs", sweep.SlurmLaunch(tpl))
    rows = tmp_path / "rows.txt"
    rows.write_text("0\n")
    return plan, rows


def test_slurm_array_task_skips_a_done_cell(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    plan, rows = _one_cell_array(tmp_path, tpl)
    mark_done(plan, plan.cells[0])
    proc = subprocess.run(
        ["bash", str(tmp_path / "runs" / "array.sh"), str(tmp_path / "runs" / "manifest.tsv"),
         str(rows)], env={**env, "SLURM_ARRAY_TASK_ID": "0"}, capture_output=True, text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0 and "already done, skipping" in proc.stdout
    assert _lines(env["FAKE_JOBS"]) == []


def test_slurm_array_task_runs_a_cell_whose_result_is_corrupt(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    plan, rows = _one_cell_array(tmp_path, tpl)
    out = Path(plan.out_json(plan.cells[0]))
    out.write_text('{"schema": "encoder-eval-result", "cell": {"mod')  # truncated
    proc = subprocess.run(
        ["bash", str(tmp_path / "runs" / "array.sh"), str(tmp_path / "runs" / "manifest.tsv"),
         str(rows)], env={**env, "SLURM_ARRAY_TASK_ID": "0"}, capture_output=True, text=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "already done" not in proc.stdout and len(_lines(env["FAKE_JOBS"])) == 1
    assert plan.cell_state(plan.cells[0]) == "ok"
    (kept,) = (out.parent / ".corrupt").iterdir()
    assert kept.read_text().endswith('"cell": {"mod') and f"to {kept} " in proc.stderr


def test_slurm_array_refuses_while_its_jobs_are_queued(tmp_path, fake_slurm):
    env, tpl = fake_slurm
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03"],
        seeds=[42],
    )
    emitted = sweep.emit_slurm_array(plan, tmp_path / "runs", sweep.SlurmLaunch(tpl))
    queue = tmp_path / "queue.txt"
    queue.write_text("12345\n")  # squeue -n NAME -o %i prints job ids
    proc = subprocess.run(["bash", str(emitted.script)], env={**env, "FAKE_QUEUE": str(queue)},
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 3 and "still queued or running" in proc.stderr
    assert _lines(env["FAKE_SUBMITS"]) == []


def test_slurm_array_refuses_values_with_newlines(tmp_path, fake_slurm):
    _, tpl = fake_slurm
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a\nb=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03"],
        seeds=[42],
    )
    with pytest.raises(HarnessError, match="use --mode slurm"):
        sweep.emit_slurm_array(plan, tmp_path / "runs", sweep.SlurmLaunch(tpl))
    assert not (tmp_path / "runs").exists()


def test_example_template_follows_the_contract():
    text = (Path(__file__).resolve().parents[1] / "examples" / "slurm_template.sh").read_text()
    assert text.startswith("#!/bin/bash") and 'python -m encoder_eval.run "$@"' in text
    head, body = emit.split_template_header(text)
    assert "#SBATCH --gres=gpu:1" in head and body.lstrip().startswith("set -euo pipefail")


@pytest.mark.parametrize("mode", ["shell", "slurm"])  # slurm-array refuses newlines
def test_a_newline_in_the_results_dir_never_becomes_code(tmp_path, fake_python, fake_slurm, mode):
    """The script headers name the results directory in a comment: a newline in it must not
    end the comment and start a command."""
    env, _ = fake_python
    slurm_env, tpl = fake_slurm
    canary = tmp_path / "canary"
    rdir = tmp_path / "res\ntouch canary\n"
    plan = sweep.build_plan(
        "select",
        PlanInputs(rdir, extra_models=["a=org/a"], tasks=["glue_rte"]),
        lr_keys=["lr03"],
        seeds=[42],
    )
    emitted = sweep.emit(plan, tmp_path / "runs", mode, template=None if mode == "shell" else tpl)
    text = emitted.script.read_text()
    assert "\ntouch canary" not in text.split("set -")[0]  # the header stays comments
    # the fake sbatch must come first on PATH: env (a copy of os.environ) must not override it,
    # or with Slurm installed the test would submit a real job (issue 41, item 8)
    environ = {**env, **slurm_env} if mode == "slurm" else env
    proc = subprocess.run(["bash", str(emitted.script)], env=environ, capture_output=True,
                          text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not canary.exists()
    if mode == "slurm":  # the fake sbatch took the job, not a real cluster
        assert len(_lines(slurm_env["FAKE_SUBMITS"])) == 1


def test_slurm_modes_group_by_lr_and_slurm_says_its_cost_past_max_array_size(
    tmp_path, fake_slurm, monkeypatch
):
    """Both Slurm modes run the seeds of one (model, task, LR) per unit by default (one unit
    a job here: --no-warm); --mode
    slurm says, past the cluster's MaxArraySize, how many sbatch calls it makes and the
    array jobs slurm-array would need; a rerun's units hold only the cells not done."""
    env, tpl = fake_slurm
    monkeypatch.setenv("PATH", env["PATH"])  # the fake scontrol: MaxArraySize 3
    monkeypatch.setenv("FAKE_MAX_ARRAY", "3")
    plan = sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=["a=org/a"], tasks=["glue_rte", "glue_sst2"]),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43, 44],
    )
    for mode in ("slurm", "slurm-array"):
        emitted = sweep.emit(plan, tmp_path / f"runs-{mode}", mode, template=tpl, units_per_job=1)
        assert emitted.group == "lr" and emitted.n_units == 4
        units = json.loads((tmp_path / f"runs-{mode}" / "units.json").read_text())
        assert units == [[plan.out_json(c) for c in plan.cells[i : i + 3]] for i in (0, 3, 6, 9)]
    text = sweep.emit(plan, tmp_path / "runs", "slurm", template=tpl, units_per_job=1).describe()
    assert "in 4 job(s), one per (model, task, LR)" in text
    assert ("--mode slurm submits these 4 jobs with 4 sbatch calls, one after another" in text
            and "as 2 array job(s) of at most 3 tasks (MaxArraySize)" in text)  # fmt: skip
    monkeypatch.setenv("FAKE_MAX_ARRAY", "4")
    assert (
        "note:"
        not in sweep.emit(
            plan, tmp_path / "runs", "slurm", template=tpl, units_per_job=1
        ).describe()
    )
    mark_done(plan, plan.cells[0], *plan.cells[3:6])  # glue_rte: lr03 s42 and all of lr06
    rest = [c for c in plan.cells if c not in (plan.cells[0], *plan.cells[3:6])]
    emitted = sweep.emit(
        plan, tmp_path / "rest", "slurm-array", template=tpl, cells=rest, units_per_job=1
    )
    units = json.loads((tmp_path / "rest" / "units.json").read_text())
    assert units == [[plan.out_json(c) for c in cs] for cs in
                     (plan.cells[1:3], plan.cells[6:9], plan.cells[9:12])]  # fmt: skip


@pytest.mark.parametrize("phase", ["select", "probe"])
def test_extra_run_args_that_print_and_exit_are_refused_not_run(tmp_path, capsys, phase):
    """`--extra-run-args=--help` is refused in one line (reading the text into the plan's
    settings never lets the cell command's parser exit the sweep)."""
    rc = sweep.main(["--phase", phase, "--model", "a=org/a", "--tasks", "glue_rte",
                     "--extra-run-args=--help", "--out-dir", str(tmp_path / "runs"),
                     "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert rc == 2 and "prints and exits (--help?)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("mode", ["slurm", "slurm-array"])
def test_warm_slurm_jobs_pack_consecutive_units_of_one_model(tmp_path, fake_slurm, mode):
    """By default a Slurm job (array task) runs up to DEFAULT_UNITS_PER_JOB units of one
    model in one warm process: "$@" and RUN_ARGS are one --spec per unit, the variables
    list the job's values, units.json holds each job's cells; models are never mixed."""
    import shlex

    env, tpl = fake_slurm
    inputs = PlanInputs(tmp_path / "res", extra_models=["a=org/a", "b=org/b"],
                        tasks=["glue_rte", "glue_sst2"])  # fmt: skip
    plan = sweep.build_plan("select", inputs, lr_keys=["lr03", "lr06"], seeds=[42, 43])
    assert emit.DEFAULT_UNITS_PER_JOB == 4
    emitted = sweep.emit(plan, tmp_path / "runs", mode, template=tpl)
    assert (emitted.n_units, emitted.n_jobs, emitted.units_per_job) == (8, 2, 4)
    assert "in 2 job(s), each up to 4 units of one model in one warm process" in (
        emitted.describe()
    )
    jobs = json.loads((tmp_path / "runs" / "units.json").read_text())
    assert jobs == [[plan.out_json(c) for c in plan.cells[i : i + 8]] for i in (0, 8)]
    mark_done(plan, *plan.cells[:4])  # model a's glue_rte units: its job still runs
    proc = subprocess.run(["bash", str(emitted.script)], env=env, capture_output=True,
                          text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ran = sorted(_lines(env["FAKE_JOBS"]), key=lambda j: j["env"]["MODEL"])
    assert [j["env"]["MODEL"] for j in ran] == ["a", "b"]
    for job, cells in zip(ran, (plan.cells[:8], plan.cells[8:]), strict=True):
        argv = job["argv"]
        assert argv[::2] == ["--spec"] * 4 and shlex.split(job["env"]["RUN_ARGS"]) == argv
        units = [UnitSpec.read(p).argv() for p in argv[1::2]]
        assert units == [plan.run_args(cells[i : i + 2]) for i in (0, 2, 4, 6)]
        assert job["env"]["TASK"] == "glue_rte,glue_sst2" and job["env"]["N_CELLS"] == "8"
        assert (job["env"]["LR_KEY"], job["env"]["SEED"]) == ("lr03,lr06", "42,43")
        assert shlex.split(job["env"]["OUT_JSON"]) == [plan.out_json(c) for c in cells]
    # Three units a job: a model's four units make two jobs, never one with the other model.
    smaller = sweep.emit(plan, tmp_path / "runs3", mode, template=tpl, units_per_job=3)
    jobs = json.loads((tmp_path / "runs3" / "units.json").read_text())
    assert smaller.n_jobs == 4 and [len(j) for j in jobs] == [6, 2, 6, 2]


def test_units_per_job_and_no_warm_are_checked(tmp_path, capsys):
    base = ["--phase", "select", "--model", "a=org/a", "--tasks", "glue_rte",
            "--results-dir", str(tmp_path / "res"), "--out-dir", str(tmp_path / "runs")]  # fmt: skip
    tpl = tmp_path / "t.sh"
    tpl.write_text('#!/bin/bash\npython -m encoder_eval.run "$@"\n')
    slurm = ["--mode", "slurm", "--slurm-template", str(tpl)]
    cases = [
        ([*slurm, "--no-warm", "--units-per-job", "3"], "give --no-warm or --units-per-job 3"),
        ([*slurm, "--units-per-job", "0"], "--units-per-job 0: give 1 or more"),
        (["--units-per-job", "2"], "--units-per-job and --no-warm are for --mode slurm"),
        (["--no-warm"], "run_all.sh chooses at run time"),
    ]
    for flags, message in cases:
        capsys.readouterr()
        assert sweep.main([*base, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
        assert not (tmp_path / "runs").exists()
    probe = ["--phase", "probe", *base[2:], *slurm, "--units-per-job", "2"]
    assert sweep.main(probe) == 2
    assert "a probe sweep runs one unit a job" in capsys.readouterr().err
    assert sweep.main([*base, *slurm, "--no-warm"]) == 0
    assert "in 10 job(s), one per (model, task, LR)" in capsys.readouterr().out
