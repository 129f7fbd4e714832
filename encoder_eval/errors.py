"""The one exception type every command-line entry point turns into a one-line message."""

from __future__ import annotations

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
