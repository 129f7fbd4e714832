"""Every generated cell command carries each recipe flag once, with the value the cell runs
with (issue 40 item 14): `--precision fp32` given to a sweep used to follow the recipe's
`--precision bf16-autocast` on the same line, so logs and `ps` read as bf16."""

from __future__ import annotations

import shlex

import pytest
from conftest import REPO
from spec_helpers import spec_args, unit_argvs

from encoder_eval import sweep
from encoder_eval.cells.unit_spec import cell_flag_values
from encoder_eval.core.protocol import PROTOCOL_RECIPE, SPELLED_OUT, recipe_flag
from encoder_eval.core.results import EXPERIMENT_NAME
from encoder_eval.plans import experiment
from encoder_eval.plans.plan import CellSettings, PlanInputs, build_plan


def _unit_argvs(script: str) -> list[list[str]]:
    """The `encoder_eval.run` arguments of each `unit NAME ... -- --spec FILE` line."""
    return unit_argvs(script)


def _count(argv: list[str], flag: str) -> int:
    return sum(a == flag or a.startswith(flag + "=") for a in argv)


def _select(tmp_path, *flags: str) -> list[str]:
    return ["--phase", "select", "--model", "a=org/a", "--tasks", "glue_rte", "--lr-keys",
            "lr03,lr06", "--seeds", "42", "--results-dir", str(tmp_path / "res"),
            "--out-dir", str(tmp_path / "runs"), *flags]  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [["--precision", "fp32"], ["--extra-run-args=--precision fp32 --bsz 16 --no-early-stop"],
     ["--extra-run-args=--precision=fp32 --bsz=16 --no-early-stop"]],
)  # fmt: skip
def test_run_all_units_carry_each_recipe_flag_once_with_its_real_value(tmp_path, flags):
    assert sweep.main(_select(tmp_path, *flags)) == 0
    [argv] = _unit_argvs((tmp_path / "runs" / "run_all.sh").read_text())
    for name in SPELLED_OUT:
        flag = recipe_flag(name)
        assert _count(argv, flag) + _count(argv, "--no-" + flag[2:]) == 1, (flag, argv)
    assert argv[argv.index("--precision") + 1] == "fp32"
    assert "bf16-autocast" not in argv
    if flags[0].startswith("--extra-run-args"):
        assert argv[argv.index("--bsz") + 1] == "16"
        assert "--no-early-stop" in argv and "--early-stop" not in argv


def test_launch_sh_units_and_their_template_variables_carry_one_precision(tmp_path):
    """launch.sh's unit lines, and the RECIPE_ARGS and RUN_ARGS a Slurm template receives,
    say fp32 once, and never the protocol's bf16."""
    template = str(REPO / "examples" / "slurm_template.sh")
    flags = ["--precision", "fp32", "--mode", "slurm", "--slurm-template", template, "--no-warm"]
    assert sweep.main(_select(tmp_path, *flags)) == 0
    text = (tmp_path / "runs" / "launch.sh").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("unit ")]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words[: words.index("--")] if "=" in w)
        for argv in (spec_args(words[words.index("--") + 1 :]), shlex.split(env["RUN_ARGS"]),
                     shlex.split(env["RECIPE_ARGS"])):  # fmt: skip
            assert _count(argv, "--precision") == 1, argv
            assert argv[argv.index("--precision") + 1] == "fp32"
    assert "bf16-autocast" not in "\n".join(lines)


def test_recipe_args_take_the_extra_values_and_run_args_keep_the_other_extras(tmp_path):
    plan = build_plan(
        "select",
        PlanInputs(tmp_path, extra_models=["a=org/a"], tasks=["glue_rte"]),
        CellSettings.from_argv(
            "--micro-batch 8 --precision fp32 --precision bf16-autocast --no-cache".split()
        ),
        lr_keys=["lr06"],
        seeds=[42],
    )
    assert plan.recipe.precision == PROTOCOL_RECIPE.precision  # the last one wins
    assert plan.recipe.micro_batch == 8
    assert plan.extra_run_args == ["--no-cache"]  # only what the plan does not model
    recipe = plan.recipe_args()
    assert recipe[recipe.index("--precision") + 1] == "bf16"
    [unit] = plan.units()
    argv = plan.run_args(unit)
    assert _count(argv, "--precision") == 1 and _count(argv, "--micro-batch") == 1
    assert argv[-1] == "--no-cache"
    recipe, report_to, rest = cell_flag_values(
        ["--bsz=8", "--report-to", "mlflow", "--early-stop", "--tracking-dir", "t"]
    )
    assert (recipe["batch_size"], recipe["early_stop"], report_to) == (8, True, "mlflow")
    assert rest == ["--tracking-dir", "t"]


def _unit_lines(script: str) -> list[list[str]]:
    """Each `unit ...` line of a script as words (launch.sh's carry the template's
    variables before `--`)."""
    return [shlex.split(ln) for ln in script.splitlines() if ln.startswith("unit ")]


@pytest.mark.parametrize("mode", ["shell", "slurm"])
def test_precision_and_limit_given_to_a_sweep_are_on_every_line_once_with_their_value(
    tmp_path, mode
):
    """`sweep --precision fp32 --limit 16`: every unit line, the RECIPE_ARGS a Slurm
    template receives, and the experiment file carry each flag once, with its value (the
    limit used to cross the plan as a string, outside the recipe a template receives)."""
    template = str(REPO / "examples" / "slurm_template.sh")
    emit = ["--mode", "slurm", "--slurm-template", template, "--no-warm"] if mode == "slurm" else []
    flags = ["--precision", "fp32", "--limit", "16", "--report-to", "tensorboard", "--group", "lr",
             *emit]  # fmt: skip
    assert sweep.main(_select(tmp_path, *flags)) == 0
    script = "launch.sh" if mode == "slurm" else "run_all.sh"
    lines = [w for w in _unit_lines((tmp_path / "runs" / script).read_text()) if "--" in w]
    assert len(lines) == 2  # one unit per LR
    argvs = [spec_args(w[w.index("--") + 1 :]) for w in lines]
    if mode == "slurm":
        for words in lines:
            env = dict(w.split("=", 1) for w in words[: words.index("--")] if "=" in w)
            argvs += [shlex.split(env["RUN_ARGS"]), shlex.split(env["RECIPE_ARGS"])]
    for argv in argvs:
        for flag, value in (("--precision", "fp32"), ("--limit", "16")):
            assert _count(argv, flag) == 1, (flag, argv)
            assert argv[argv.index(flag) + 1] == value
    for argv in argvs[: len(lines)]:
        assert _count(argv, "--report-to") == 1
    recorded = experiment.load(tmp_path / "res" / EXPERIMENT_NAME)
    assert recorded.extra_run_args == []  # no recipe entry as an argv string
    assert recorded.recipe_entries == {"precision": "fp32", "limit": 16}
    assert recorded.report_to == "tensorboard"


def test_an_experiment_recorded_in_another_flag_order_is_the_same_experiment(tmp_path, capsys):
    """An experiment.toml written before the recipe was typed, its recipe entries in
    extra_run_args in another order, is the same experiment; another value is still
    refused."""
    flags = ["--precision", "fp32", "--limit", "16"]
    assert sweep.main(_select(tmp_path, *flags)) == 0
    for path in (tmp_path / "res" / EXPERIMENT_NAME, tmp_path / "runs" / EXPERIMENT_NAME):
        exp = experiment.load(path)
        exp.recipe_entries = {}
        exp.extra_run_args = ["--limit", "16", "--precision", "fp32"]
        experiment.write(exp, path)
        assert experiment.load(path).recipe_entries == {"limit": 16, "precision": "fp32"}
    assert sweep.main(_select(tmp_path, *flags)) == 0
    capsys.readouterr()
    assert sweep.main(_select(tmp_path, "--precision", "fp32", "--limit", "8")) != 0
    assert "records another experiment (recipe.limit: 16 -> 8" in capsys.readouterr().err
