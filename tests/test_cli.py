"""`encoder-eval` / `python -m encoder_eval`: dispatch, --version, list, one-line errors."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from encoder_eval import __version__
from encoder_eval.cli import COMMANDS, main
from encoder_eval.data.tasks import TASK_KNOBS, group_tasks

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, entry: str = "module") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "encoder_eval", *args]
    if entry == "script":
        cmd = [str(Path(sys.executable).parent / "encoder-eval"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.parametrize("entry", ["module", "script"])
def test_version_from_both_entry_points(entry):
    proc = _cli("--version", entry=entry)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"encoder-eval {__version__}"


def test_every_command_module_has_a_main():
    import importlib

    for name, cmd in COMMANDS.items():
        assert callable(importlib.import_module(cmd.module).main), name


def test_subcommand_is_the_module_command():
    via_cli = _cli("sweep", "--show-grid")
    direct = subprocess.run([sys.executable, "-m", "encoder_eval.sweep", "--show-grid"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert via_cli.returncode == direct.returncode == 0
    assert via_cli.stdout == direct.stdout and "lr01" in via_cli.stdout


def test_unknown_command_is_one_line_with_a_suggestion(capsys):
    assert main(["sumarize"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Did you mean 'summarize'?" in err[0] and "run" in err[0]


def test_bad_input_inside_a_subcommand_is_one_error_line():
    proc = _cli("run", "--task", "no_such_task", "--model-key", "xlm-r-base", "--lr", "3.59e-05",
                "--seed", "45", "--out-json", "x.json")  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown task 'no_such_task'")


def test_no_arguments_prints_the_commands_and_exits_2(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_top_level_help_names_the_hub_exports(capsys):
    # issue 50: nothing in `encoder-eval --help` said a model's scores can go to its Hub page
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    export, push = (next(ln for ln in out.splitlines() if ln.strip().startswith(w + " "))
                    for w in ("export", "push"))  # fmt: skip
    assert "Hub" in export and "--to-model" in push and "Hub page" in push


def test_list_tasks_json_is_the_registry(capsys):
    assert main(["list", "tasks", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["task"] for r in rows] == list(TASK_KNOBS)
    xnli = next(r for r in rows if r["task"] == "xnli")
    assert len(xnli["languages"]) == 15 and len(xnli["euro_languages"]) == 7


def test_list_groups_and_models(capsys):
    assert main(["list", "groups", "--format", "json"]) == 0
    groups = {r["group"]: r["tasks"] for r in json.loads(capsys.readouterr().out)}
    assert len(groups["all"]) == 17 and groups["glue"] == group_tasks("glue")
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert "xlm-r-base" in out and "liquid-bidir" in out


def test_list_does_not_import_torch():
    code = ("import sys; from encoder_eval.cli import main; main(['list', 'tasks']); "
            "main(['list', 'grid']); sys.exit('torch' in sys.modules)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ}, timeout=300)  # fmt: skip
    assert proc.returncode == 0, "encoder-eval list imported torch"


def test_list_tasks_shows_a_task_file(capsys, task_registry):
    wnli = REPO / "examples" / "tasks" / "glue_wnli.toml"
    assert main(["list", "tasks", "--tasks-file", str(wnli), "--format", "json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["task"] == "glue_wnli")
    assert row["bucket"] == "user" and row["metric"] == "accuracy" and row["source"]


def test_help_says_each_default_once():
    """A flag whose help states its default in words gets no second "(default: ...)" from
    argparse, and a default of None is not shown as "(default: None)"."""
    import importlib
    import re

    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        if not hasattr(module, "build_parser"):
            continue
        text = " ".join(module.build_parser().format_help().split())
        assert "(default: None)" not in text, name
        doubled = re.search(r"default[^()]*(\([^()]*\)[^()]*)*\) \(default: [^)]*\)", text)
        assert doubled is None, f"{name}: {doubled.group(0) if doubled else ''}"
    text = " ".join(importlib.import_module("encoder_eval.run").build_parser().format_help()
                    .split())  # fmt: skip
    assert "(default: on; the file is X.predictions.json) --" in text
    assert "(default: 20)" in text  # a default the help does not state is still shown


def _usage_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0, argv
    return capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_help_usage_line_is_encoder_eval_command(capsys, name):
    # Issue 29 item 17: one spelling of each command in what users read, `encoder-eval X`.
    assert _usage_line(capsys, [name, "--help"]).startswith(f"usage: encoder-eval {name} ")


def test_probe_neuco_mode_and_track_subcommands_help_say_encoder_eval(capsys):
    line = _usage_line(capsys, ["probe", "--annotation-path", "labels", "--help"])
    assert line.startswith("usage: encoder-eval probe ")
    line = _usage_line(capsys, ["track", "run", "--help"])
    assert line.startswith("usage: encoder-eval track run ")


# Where `python -m encoder_eval...` is the right text, not a second spelling of a command:
# the same-command sentence, and what the generated scripts and Slurm templates run with
# their own interpreter ("$PYTHON" -m encoder_eval.run), which these docstrings describe.
PYTHON_M_ALLOWED = {
    "encoder_eval/__main__.py": "`python -m encoder_eval`: the same as the `encoder-eval` command",
    "encoder_eval/cli.py": "both spellings are the same command (usage text, module docstring)",
    "encoder_eval/plans/emit.py": "docstrings of the scripts and the Slurm template contract",
    "encoder_eval/plans/plan.py": "a unit's arguments, as the scripts pass them",
    "encoder_eval/sweep.py": "the run line a probe sweep's Slurm template needs",
    "encoder_eval/core/gpu_share.py": "what run_all.sh --gpus runs to pick K (no console script)",
}


def _string_literals(path: Path) -> list[str]:
    """Every string literal of a module, docstrings and f-strings' literal parts included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = ast.walk(tree)
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_message_says_python_m_encoder_eval():
    """No literal in the package (error and hint messages, usage, docstrings) spells a
    command `python -m encoder_eval...`, except where that is what runs (allowed above)."""
    found = {}
    for path in sorted((REPO / "encoder_eval").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        hits = [s for s in _string_literals(path) if "python -m encoder_eval" in s]
        if hits:
            found[rel] = hits
    assert not {k: v for k, v in found.items() if k not in PYTHON_M_ALLOWED}, found
    assert set(found) == set(PYTHON_M_ALLOWED), "allowed but no longer needed: update the list"
