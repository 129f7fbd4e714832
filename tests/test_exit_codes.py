"""The one table of stop signals to exit codes (`errors.exit_code_for`): SIGTERM 75, Ctrl-C
130, inside a cell or outside one, read by `run`, `done` and every command's error wrapper.
The real signals to real cells are in test_interrupt.py and test_preemption.py."""

from __future__ import annotations

import pytest

from encoder_eval.cells import runner, train
from encoder_eval.core import errors
from encoder_eval.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    STOPS,
    HarnessError,
    Interrupted,
    Preempted,
    Terminated,
    exit_code_for,
    report_errors,
)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (Preempted("SIGTERM, state saved"), EXIT_PREEMPTED),
        (Terminated(), EXIT_PREEMPTED),
        (Interrupted("Ctrl-C, state saved"), EXIT_INTERRUPTED),  # a Preempted, yet 130
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (HarnessError("bad input"), None),
        (RuntimeError("a crash"), None),
    ],
    ids=["preempted", "terminated", "interrupted", "keyboard", "input-error", "crash"],
)
def test_each_stop_has_one_exit_code_and_nothing_else_has_one(exc, code):
    assert exit_code_for(exc) == code
    assert isinstance(exc, STOPS) == (code is not None)
    assert (EXIT_PREEMPTED, EXIT_INTERRUPTED) == (75, 130)  # the scripts' documented codes


def test_the_cell_stops_are_the_core_ones():
    """`train` raises the classes the table names (older imports from train still work)."""
    assert train.Preempted is errors.Preempted and train.Interrupted is errors.Interrupted
    assert runner.Preempted is errors.Preempted


def test_a_command_stopped_by_ctrl_c_exits_by_the_table(capsys):
    @report_errors
    def main() -> int:
        raise KeyboardInterrupt

    assert main() == EXIT_INTERRUPTED
    assert capsys.readouterr().err == (
        "interrupted: Ctrl-C; run the same command again to continue\n"
    )
