"""A unit of work is one typed object from `sweep` to the cell (issue 51, item 1): the spec a
sweep writes per unit round-trips through JSON, and runs with exactly the values its command
line would have given the cell (the same namespace), so no result changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from encoder_eval import run, sweep
from encoder_eval.cells.probe_flags import probe_parser
from encoder_eval.cells.run_flags import run_parser
from encoder_eval.cells.unit_spec import PROBE, UnitSpec, spec_argv
from encoder_eval.core.errors import HarnessError
from encoder_eval.plans.plan import (
    CellSettings,
    PlanInputs,
    ProbeSettings,
    build_plan,
    build_probe_plan,
)


def _plans(tmp_path):
    select = build_plan(
        "select",
        PlanInputs(tmp_path / "r", models=["a"], extra_models=["a=org/a"], tasks=["glue_rte"]),
        CellSettings.from_argv(
            [
                *"--pad-multiple 32 --no-save-predictions --report-to tensorboard --tracking-dir".split(),
                str(tmp_path / "t"),
            ]
        ).given(max_steps=5, limit=16, precision="fp32"),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    report = build_plan(
        "report",
        PlanInputs(
            tmp_path / "r2", models=["a"], extra_models=["a=org/a"], tasks=["glue_rte", "glue_sst2"]
        ),
        CellSettings().given(precision="auto"),
        seeds=[45],
        selection={
            "pairs": {
                "a": {t: {"lr_key": "lr03", "lr": 1.67e-05} for t in ("glue_rte", "glue_sst2")}
            }
        },
    )
    probe = build_probe_plan(
        PlanInputs(tmp_path / "p", models=["a"], extra_models=["a=org/a"], tasks=["glue_rte"]),
        ProbeSettings(poolings=["mean", "first"], precision="fp32"),
        CellSettings.from_argv(["--batch-size", "8", "--store-probes"], PROBE).given(limit=32),
    )
    return [select, report, probe]


def test_a_spec_runs_the_values_its_command_line_parses_to_and_round_trips(tmp_path):
    for plan in _plans(tmp_path):
        for unit in plan.units():
            spec = plan.unit_spec(unit)
            parser = probe_parser() if spec.kind == PROBE else run_parser()
            assert vars(parser.parse_args(spec.argv())) == vars(spec.namespace())
            again = UnitSpec.from_json(spec.to_json())
            assert again == spec
            assert vars(again.namespace()) == vars(spec.namespace())
            # the command line, parsed, is the same object
            parsed = UnitSpec.from_args(parser.parse_args(spec.argv()), spec.kind)
            assert parsed == spec


def test_sweep_writes_one_spec_per_unit_and_its_lines_run_them(tmp_path):
    out = tmp_path / "runs"
    assert sweep.main(["--phase", "select", "--model", "a=org/a", "--tasks", "glue_rte,glue_sst2",
                       "--lr-keys", "lr03", "--seeds", "42", "--precision", "fp32",
                       "--results-dir", str(tmp_path / "res"), "--out-dir", str(out)]) == 0  # fmt: skip
    lines = [ln for ln in (out / "run_all.sh").read_text().splitlines() if ln.startswith("unit ")]
    assert len(lines) == 2
    for line in lines:
        flag, path = line.split(" -- ", 1)[1].split()
        assert flag == "--spec" and Path(path).parent == out / "specs"
        spec = UnitSpec.read(path)
        assert spec.recipe.precision == "fp32" and spec.flags.model_key == "a"
    assert sorted(p.name for p in (out / "specs").iterdir()) == [
        "a_glue_rte_lr03.json",
        "a_glue_sst2_lr03.json",
    ]


def test_spec_refusals(tmp_path, capsys):
    with pytest.raises(HarnessError, match="give no other flag"):
        spec_argv(["--spec", "x.json", "--task", "glue_rte"])
    assert spec_argv(["--spec=x.json"]) == "x.json"
    assert spec_argv(["--task", "glue_rte"]) is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"spec_version": 1, "kind": "finetune", "flags": {"tsk": "x"}}))
    assert run.main(["--spec", str(bad)]) == 2
    assert "unknown entry flags.tsk" in capsys.readouterr().err


def test_an_experiments_typed_recipe_reaches_the_plans_unit_specs_without_flags(
    tmp_path, monkeypatch
):
    """An entry of the experiment file's `[recipe]` (and its `report_to`) reaches every
    unit's spec of the select sweep, and of the report sweep that inherits it through the
    selection, as a typed value: nothing on the way reads cell flags
    (`cell_flag_values` is not called) and the plan has no extra run arguments."""
    from result_helpers import make_selection

    from encoder_eval.cells import unit_spec
    from encoder_eval.core.protocol import Precision
    from encoder_eval.plans import experiment
    from encoder_eval.plans import plan as plan_module

    exp = tmp_path / "exp.toml"
    exp.write_text('version = 1\ntasks = ["glue_rte"]\nlr_keys = ["lr06"]\nreport_to = "mlflow"\n'
                   '[models.a]\npath = "org/a"\n[seeds]\nselect = [42]\nreport = [45]\n'
                   '[recipe]\nmax_steps = 30\nmicro_batch = 8\nprecision = "fp32"\nlimit = 16\n'
                   'warmup_ratio = 0.2\nbatching = "random"\n')  # fmt: skip

    def no_flags(*args, **kwargs):
        raise AssertionError("the typed recipe went through cell flags")

    monkeypatch.setattr(plan_module, "cell_flag_values", no_flags)
    monkeypatch.setattr(unit_spec, "cell_flag_values", no_flags)

    def plan_of(*argv: str):
        return sweep.plan_from_args(sweep.build_parser().parse_args(list(argv)))

    select = plan_of("--experiment", str(exp), "--phase", "select",
                     "--results-dir", str(tmp_path / "sel"))  # fmt: skip
    doc = make_selection({("a", "glue_rte"): "lr06"})
    doc["experiment"] = experiment.Experiment(
        models={"a": experiment.ModelSpec("org/a")}, tasks=["glue_rte"],
        seeds={"select": [42], "report": [45]}, max_steps=select.max_steps,
        recipe_entries=select.recipe_entries(), report_to=select.report_to, phase="select",
    ).to_dict()  # fmt: skip
    (tmp_path / "selection.json").write_text(json.dumps(doc))
    report = plan_of("--phase", "report", "--selection", str(tmp_path / "selection.json"),
                     "--results-dir", str(tmp_path / "rep"))  # fmt: skip
    for plan in (select, report):
        assert plan.extra_run_args == [] and len(plan.units()) == 1
        spec = plan.unit_spec(plan.units()[0])
        recipe = spec.recipe
        assert (recipe.max_steps, recipe.micro_batch, recipe.limit) == (30, 8, 16)
        assert (recipe.warmup_ratio, recipe.batching) == (0.2, "random")
        assert recipe.precision is Precision.FP32 and spec.flags.report_to == "mlflow"
