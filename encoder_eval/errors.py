"""The one exception type every command-line entry point turns into a one-line message."""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from collections.abc import Callable, Iterable

# Exit statuses, the same for every command (README, "Exit codes").
EXIT_OK = 0
EXIT_INCOMPLETE = 1  # refused, incomplete, not done, or some cells crashed (reasons printed)
EXIT_INPUT_ERROR = 2  # bad input: one `error:` line naming the problem and the fix
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: SIGTERM stopped a cell after it saved its state
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C stopped a cell after it saved its state


class HarnessError(Exception):
    """A problem with the user's input or files; the message names the problem and the fix."""


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> HarnessError:
    """Build the error for an unknown registry name, listing the valid ones and a close match."""
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return HarnessError(f"unknown {kind} {name!r}.{hint} Valid {kind}s: {', '.join(valid)}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the harness's one-line errors: `error: ...` and a pointer to --help
    (exit 2), instead of the whole usage block before the message."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; run {self.prog} --help for the valid flags\n")


def report_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's `main` so bad input ends as one `error:` line and EXIT_INPUT_ERROR,
    and Ctrl-C outside a training loop (where nothing is lost) as EXIT_INTERRUPTED; the one
    error wrapper every command uses."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except HarnessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_INPUT_ERROR
        except KeyboardInterrupt:
            print("interrupted: Ctrl-C; run the same command again to continue", file=sys.stderr)
            return EXIT_INTERRUPTED

    return wrapped
