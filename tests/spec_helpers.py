"""A generated script's unit lines run units from spec files (`-- --spec FILE`): the command
line each spec stands for (`UnitSpec.argv`), for tests that check what a unit runs."""

from __future__ import annotations

import shlex

from encoder_eval.cells.unit_spec import UnitSpec


def spec_args(args: list[str]) -> list[str]:
    """`args` (a unit's arguments after `--`) as the command line its spec stands for."""
    if args[:1] == ["--spec"] and len(args) == 2:
        return UnitSpec.read(args[1]).argv()
    return args


def unit_argvs(script: str) -> list[list[str]]:
    """The command line of each `unit ... -- --spec FILE` line of a script, in order."""
    return [
        spec_args(shlex.split(line.split(" -- ", 1)[1]))
        for line in script.splitlines()
        if line.startswith("unit ") and " -- " in line
    ]


def script_with_units(path) -> str:
    """A generated script's text followed by each unit's command line (one per line), for
    tests that check what the script runs by searching its text."""
    from pathlib import Path

    text = Path(path).read_text()
    return text + "\n" + "\n".join(shlex.join(argv) for argv in unit_argvs(text)) + "\n"
