"""shellcheck on every script the harness writes or ships: the template files in
encoder_eval/plans/templates/, the example Slurm template, the CI scripts, and the scripts a small plan emits in
each mode (run_all.sh; launch.sh, template.sh and array.sh for slurm and slurm-array).

Skipped when shellcheck is not installed, unless ENCODER_EVAL_REQUIRE_SHELLCHECK=1 (CI sets
it; .ci/run installs Debian's shellcheck), which makes a missing shellcheck fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from encoder_eval import sweep
from encoder_eval.plans.plan import CellSettings, PlanInputs

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((REPO / "encoder_eval" / "plans" / "templates").glob("*.sh"))
EXAMPLE = REPO / "examples" / "slurm_template.sh"


@pytest.fixture(scope="module", autouse=True)
def require_shellcheck():
    if shutil.which("shellcheck") is None:
        problem = "shellcheck is not installed (Debian: apt-get install shellcheck)"
        if os.environ.get("ENCODER_EVAL_REQUIRE_SHELLCHECK") == "1":
            pytest.fail(f"ENCODER_EVAL_REQUIRE_SHELLCHECK=1 but {problem}")
        pytest.skip(problem)


def shellcheck(*paths: Path) -> None:
    """shellcheck PATHS at its default severity (style notes included): no finding at all."""
    proc = subprocess.run(["shellcheck", "--external-sources", *map(str, paths)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_shipped_templates_pass():
    assert {p.name for p in TEMPLATES} >= {"run_all.sh", "launch_slurm.sh", "launch_array.sh",
                                           "array_preamble.sh", "common.sh"}  # fmt: skip
    shellcheck(*TEMPLATES, EXAMPLE, REPO / ".ci" / "run", REPO / ".ci" / "slurm.sh")


@pytest.mark.parametrize("mode", ["shell", "slurm", "slurm-array"])
@pytest.mark.parametrize("group", [None, "lr"])
def test_the_emitted_scripts_pass(tmp_path, mode, group):
    mdir = tmp_path / "a model"
    mdir.mkdir()
    plan = sweep.build_plan(
        "select",
        PlanInputs(
            tmp_path / "res",
            extra_models=["a=org/a", f"b={mdir}"],
            tasks=["glue_rte", "glue_sst2"],
            data_dir=tmp_path,
        ),
        CellSettings().given(max_steps=4),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 43],
    )
    template = None if mode == "shell" else EXAMPLE
    emitted = sweep.emit(plan, tmp_path / "runs", mode, template=template, group=group,
                         requeue=mode != "shell")  # fmt: skip
    scripts = [p for p in emitted.files if p.suffix == ".sh"]
    assert emitted.script in scripts and len(scripts) == {"shell": 1, "slurm": 2}.get(mode, 2)
    shellcheck(*scripts)
