"""What a command pays in imports before it has parsed its flags (issue 40 item 16), and what
a cell process imports beyond torch before its first step (issue 41 item 6).

Each check runs in a fresh interpreter (imports only accumulate), calls the real dispatcher
`cli.main` (the code behind `encoder-eval` and `python -m encoder_eval`) and reads
`sys.modules` after each call. Heavy libraries are imported by the code that computes, after
parsing: `--help`, `--version` and a usage error must answer without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_helpers import env

from encoder_eval.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]

# What no parser needs: seconds of import on a loaded machine (67 s was measured for
# `summarize --help` when scipy, statsmodels and pandas came in before argparse ran).
HEAVY = (
    "torch",
    "transformers",
    "datasets",
    "scipy",
    "sklearn",
    "statsmodels",
    "pandas",
    "matplotlib",
)

# Per command, argv that stops at a missing argument (a required flag or positional left
# out, or a flag given without its value where the command requires nothing: `demo` and
# `sweep` with no flags would start working; `done` with no files has nothing to check).
MISSING_ARGUMENT = {
    "run": [],
    "sweep": ["--phase"],
    "select": [],
    "summarize": [],
    "leaderboard": [],
    "status": ["--results-dir"],
    "prefetch": [],
    "compare": [],
    "probe": [],
    "track": [],
    "estimate": [],
    "done": ["--phase"],
    "report": [],
    "export": [],
    "push": [],
    "demo": ["--out"],
    "list": [],
}

_PROBE = """
import contextlib, io, json, sys
from encoder_eval import cli
heavy, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for argv in cases:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = cli.main(argv)
        except SystemExit as stop:
            code = stop.code
    out.append({"argv": argv, "code": code, "output": buf.getvalue(),
                "heavy": [m for m in heavy if m in sys.modules]})
print(json.dumps(out))
"""


def _env() -> dict[str, str]:
    """The tests' subprocess environment, with this checkout first on the path."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env(PYTHONPATH=path)


def _run_cases(cases: list[list[str]]) -> list[dict]:
    """Each argv through `cli.main`, in order, in one fresh interpreter; per case its exit
    code, output and the heavy modules loaded so far."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HEAVY), json.dumps(cases)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_command_has_a_missing_argument_case():
    assert set(MISSING_ARGUMENT) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_and_usage_error_import_nothing_heavy(command):
    """`<command> --help` prints its usage and exits 0, then a missing argument is refused
    with one `error:` line and exit 2, and neither has imported a heavy library."""
    help_case, error_case = _run_cases([[command, "--help"], [command, *MISSING_ARGUMENT[command]]])
    assert help_case["code"] in (0, None), help_case["output"]
    assert "usage:" in help_case["output"]
    assert help_case["heavy"] == [], f"{command} --help imported {help_case['heavy']}"
    assert error_case["code"] == 2, error_case["output"]
    assert error_case["output"].startswith("error: "), error_case["output"]
    assert error_case["heavy"] == [], (
        f"{command} {' '.join(MISSING_ARGUMENT[command])} (a usage error) imported "
        f"{error_case['heavy']}"
    )


def test_version_and_top_level_help_import_nothing_heavy():
    version, usage = _run_cases([["--version"], ["--help"]])
    assert version["code"] == 0 and version["output"].startswith("encoder-eval ")
    assert usage["code"] == 0 and "commands:" in usage["output"]
    assert version["heavy"] == usage["heavy"] == []


def test_a_cell_process_imports_only_torch_before_its_model():
    """A cell process (`python -m encoder_eval.run`) imports the run command and the training
    module before it loads a model; of the heavy libraries only torch may come in there
    (transformers comes with the model), and nothing of the harness's reports or plans
    layers: a fine-tune pays for what it uses."""
    code = (
        "import json, sys\n"
        "import encoder_eval.run, encoder_eval.cells.train\n"
        "ours = sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['encoder_eval', 'reports'], ['encoder_eval', 'plans']))\n"
        f"print(json.dumps([[m for m in {HEAVY!r} if m in sys.modules], ours]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    heavy, ours = json.loads(proc.stdout)
    assert heavy == ["torch"]
    assert ours == []
