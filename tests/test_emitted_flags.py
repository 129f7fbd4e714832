"""Every generated cell command carries each recipe flag once, with the value the cell runs
with (issue 40 item 14): `--precision fp32` given to a sweep used to follow the recipe's
`--precision bf16-autocast` on the same line, so logs and `ps` read as bf16."""

from __future__ import annotations

import shlex

import pytest
from conftest import REPO

from encoder_eval import sweep
from encoder_eval.core.protocol import SPELLED_OUT, recipe_flag
from encoder_eval.plans.plan import build_plan, recipe_flags_in


def _unit_argvs(script: str) -> list[list[str]]:
    """The `encoder_eval.run` arguments of each `unit NAME ... -- ARGS` line of a script."""
    return [
        shlex.split(line.split(" -- ", 1)[1])
        for line in script.splitlines()
        if line.startswith("unit ") and "--model-key" in line
    ]


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
    flags = ["--precision", "fp32", "--mode", "slurm", "--slurm-template", template]
    assert sweep.main(_select(tmp_path, *flags)) == 0
    text = (tmp_path / "runs" / "launch.sh").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("unit ")]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words[: words.index("--")] if "=" in w)
        for argv in (words[words.index("--") + 1 :], shlex.split(env["RUN_ARGS"]),
                     shlex.split(env["RECIPE_ARGS"])):  # fmt: skip
            assert _count(argv, "--precision") == 1, argv
            assert argv[argv.index("--precision") + 1] == "fp32"
    assert "bf16-autocast" not in "\n".join(lines)


def test_recipe_args_take_the_extra_values_and_run_args_keep_the_other_extras(tmp_path):
    plan = build_plan("select", results_dir=tmp_path, extra_models=["a=org/a"],
                      tasks=["glue_rte"], lr_keys=["lr06"], seeds=[42],
                      extra_run_args=["--micro-batch", "8", "--precision", "fp32",
                                      "--precision", "bf16-autocast"])  # fmt: skip
    recipe = plan.recipe_args()
    assert recipe[recipe.index("--precision") + 1] == "bf16-autocast"  # the last one wins
    [unit] = plan.units()
    argv = plan.run_args(unit)
    assert _count(argv, "--precision") == 1
    assert argv[-2:] == ["--micro-batch", "8"]
    given, rest = recipe_flags_in(["--bsz=8", "--report-to", "mlflow", "--early-stop"])
    assert given == {"batch_size": ["--bsz", "8"], "early_stop": ["--early-stop"]}
    assert rest == ["--report-to", "mlflow"]
