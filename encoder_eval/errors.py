"""The one exception type every command-line entry point turns into a one-line message."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable


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
