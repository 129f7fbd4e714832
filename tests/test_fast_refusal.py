"""A misspelt task or model, an off-grid learning rate, a missing model directory or data
mirror is refused before torch, transformers, scikit-learn, scipy or matplotlib is
imported (issue 29, item 20; issue 50): those imports cost seconds, so a typo used to wait
9-27 s for its one error line.

Each case runs `run` as a user would, in a subprocess, and reads that process's
`sys.modules` at exit: what was imported, not how long it took (no timed test).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fault_helpers import env

HEAVY = ("torch", "transformers", "sklearn", "scipy", "matplotlib")

# Runs a command module as `python -m` would, then prints its exit code and which heavy
# modules the process imported, as JSON on stdout.
PROBE = """
import json, runpy, sys
module, argv = sys.argv[1], json.loads(sys.argv[2])
sys.argv = [module, *argv]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code
heavy = [m for m in HEAVY if m in sys.modules]
print(json.dumps({"exit": code, "heavy": heavy}))
"""

CELL = ["--model-key", "xlm-r-base", "--task", "glue_rte", "--lr", "3.59e-5", "--seed", "45"]


def _with(**flags: str) -> list[str]:
    argv = list(CELL)
    for flag, value in flags.items():
        argv[argv.index("--" + flag.replace("_", "-")) + 1] = value
    return argv


CASES = {
    "misspelt task": (_with(task="glue_rtee"), "unknown task 'glue_rtee'. Did you mean 'glue_rte'"),
    "misspelt model": (_with(model_key="xlm-r-bse"),
                       "unknown model 'xlm-r-bse'. Did you mean 'xlm-r-base'"),
    "off-grid learning rate": (_with(lr="3.5e-5"), "--lr 3.5e-05 is not on the protocol grid "
                               "(the nearest grid value is 3.59e-05, lr06)"),
    "missing model directory": ([*CELL, "--model-path", "./no-such-model"],
                                "model directory './no-such-model' does not exist; check "
                                "--model-path"),
    "missing data mirror": ([*CELL, "--data-dir", "no-such-mirror"],  # issue 50: was 4-14 s
                            "the data mirror no-such-mirror (--data-dir, or "
                            "ENCODER_EVAL_DATA_DIR) is not a folder"),
}  # fmt: skip


@pytest.mark.parametrize("module", ["encoder_eval.run", "encoder_eval"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_name_is_refused_before_any_heavy_import(case, module, tmp_path):
    argv, message = CASES[case]
    argv = [*argv, "--out-json", str(tmp_path / "cell.json")]
    if module == "encoder_eval":  # the `encoder-eval run ...` entry point
        argv = ["run", *argv]
    proc = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", module, json.dumps(argv)],
        cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = proc.stderr.strip("\n").splitlines()
    assert outcome["exit"] == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert outcome["heavy"] == [], f"imported before refusing: {outcome['heavy']}"
    assert list(tmp_path.iterdir()) == []
