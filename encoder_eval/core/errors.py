"""The one exception type every command-line entry point turns into a one-line message."""

from __future__ import annotations

import argparse
import difflib
import functools
import re
import reprlib
import socket
import sys
from collections.abc import Callable, Iterable

# Exit statuses, the same for every command (docs/protocol.md, "Exit codes").
EXIT_OK = 0
EXIT_INCOMPLETE = 1  # refused, incomplete, not done, or some cells crashed (reasons printed)
EXIT_REGRESSED = EXIT_INCOMPLETE  # `track`: a checkpoint regressed (the flags are printed)
EXIT_INPUT_ERROR = 2  # bad input: one `error:` line naming the problem and the fix
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: SIGTERM stopped a cell after it saved its state
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C stopped a cell after it saved its state


# The most characters of one message (an `error:` or `warning:` line); longer ones are cut,
# saying how much was cut, so a hostile file never floods a terminal or a log.
MESSAGE_LIMIT = 2000
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = 200
_QUOTE.maxlist = _QUOTE.maxdict = _QUOTE.maxtuple = _QUOTE.maxset = 6
_QUOTE.maxlevel = 3


class Terminated(BaseException):
    """SIGTERM outside a training loop (where nothing is lost), raised like
    KeyboardInterrupt for Ctrl-C, so no `except Exception` takes it for a crash."""


def raise_on_sigterm(signum: int, frame) -> None:
    """A SIGTERM handler for a command's main thread: raise Terminated."""
    raise Terminated()


class Preempted(Exception):
    """Raised when SIGTERM stopped a cell after it saved a resumable state."""


class Interrupted(Preempted):
    """Raised when Ctrl-C (SIGINT) stopped a cell after it saved a resumable state."""


# What a stop signal ends a command with: SIGTERM (inside a cell, Preempted; outside one,
# Terminated) exits EXIT_PREEMPTED, Ctrl-C (Interrupted; KeyboardInterrupt) exits
# EXIT_INTERRUPTED. The first row whose type the exception is wins (Interrupted is a
# Preempted). The one table; `exit_code_for` reads it.
STOP_EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (Interrupted, EXIT_INTERRUPTED),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
    (Preempted, EXIT_PREEMPTED),
    (Terminated, EXIT_PREEMPTED),
)
STOPS = tuple(kind for kind, _ in STOP_EXIT_CODES)  # for `except STOPS as exc`
STOP_WORDS = {EXIT_PREEMPTED: "preempted", EXIT_INTERRUPTED: "interrupted"}  # a stop's line


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of a command stopped by `exc` (`STOP_EXIT_CODES`); None when `exc` is no
    stop signal."""
    for kind, code in STOP_EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return None


class HarnessError(Exception):
    """A problem with the user's input or files; the message names the problem and the fix."""


def quote(value: object) -> str:
    """`repr(value)` cut short (strings to 200 characters, containers to 6 items and 3 levels):
    how a message quotes a value read from a user's file, at a bounded cost."""
    return _QUOTE.repr(value)


def brief(value: object, limit: int = 120) -> str:
    """A value read from a file, as a message shows it: a string as itself on one line, cut
    to `limit` characters; anything else by `quote`."""
    if isinstance(value, str):
        text = " ".join(value.splitlines())
        return text if len(text) <= limit else f"{text[: limit - 3]}..."
    return quote(value)


def one_line(message: object, limit: int = MESSAGE_LIMIT) -> str:
    """`message` as one line (line breaks become spaces) of at most `limit` characters."""
    text = " ".join(str(message).splitlines())
    if len(text) > limit:
        text = f"{text[: limit - 40]}... ({len(text) - limit + 40} more characters cut)"
    return text


def _network_errors() -> tuple[type[BaseException], ...]:
    """The exception types of a network that cannot be reached: the standard library's,
    and those of the HTTP clients `huggingface_hub` uses (requests; httpx from 1.0)."""
    kinds: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    try:
        import requests

        kinds += [requests.exceptions.ConnectionError, requests.exceptions.Timeout]
    except ImportError:
        pass
    try:
        import httpx

        kinds.append(httpx.TransportError)
    except ImportError:
        pass
    return tuple(kinds)


_ERRNO_TEXT = re.compile(r"\[Errno -?\d+\] ([^'\"()\]\[]+)")


def network_problem(exc: BaseException) -> str | None:
    """Why the network could not be reached, in a few words ("Connection refused", "Name or
    service not known", "timed out"), when `exc` (or an exception it was raised from) is a
    network error; None for any other error (an HTTP answer such as 401 or 404 included)."""
    kinds = _network_errors()
    chain, seen, cur = [], set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    if not any(isinstance(e, kinds) for e in chain):
        return None
    for e in chain:
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
    found = _ERRNO_TEXT.search(" ".join(str(e) for e in chain))
    if found:
        return found.group(1).strip()
    if any("timeout" in type(e).__name__.lower() or isinstance(e, TimeoutError) for e in chain):
        return "timed out"
    return type(exc).__name__


def unknown_name(kind: str, name: str, valid: Iterable[str], fix: str = "") -> HarnessError:
    """Build the error for an unknown registry name: a close match if there is one, then
    `fix` (how to add a name of this kind), then the valid names."""
    valid = sorted(valid)
    close = closest_name(name, valid) if len(name) <= 200 else None
    hint = f" Did you mean {close!r}?" if close else ""
    fix = f" {fix.rstrip('.')}." if fix else ""
    return HarnessError(
        f"unknown {kind} {quote(name)}.{hint}{fix} Valid {kind}s: {', '.join(valid)}"
    )


def _normal(text: str) -> str:
    return text.strip().lower().replace("-", "_")


def closest_name(name: str, valid: Iterable[str]) -> str | None:
    """The valid name `name` most likely meant, or None.

    Case and `-`/`_` are ignored; a name equal to a valid one without its prefix (`rte` for
    `glue_rte`, `cb` for `sg_cb`) matches it when no other valid name has that ending; else
    the closest spelling within a small edit (difflib ratio 0.8), strict enough that short
    names of different datasets (`wnli`, `xnli`) are not offered for each other.
    """
    valid = list(valid)
    forms: dict[str, str] = {}
    for v in valid:
        forms.setdefault(_normal(v), v)
    endings: dict[str, list[str]] = {}
    for v in valid:
        _, sep, rest = _normal(v).partition("_")
        if sep and len(rest) > 1:  # a one-letter ending (paws_x) says too little
            endings.setdefault(rest, []).append(v)
    for rest, owners in endings.items():
        if len(owners) == 1 and rest not in forms:
            forms[rest] = owners[0]
    target = _normal(name)
    if target in forms:
        return forms[target]
    close = difflib.get_close_matches(target, [_normal(v) for v in valid], n=1, cutoff=0.8)
    return forms[close[0]] if close else None


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after each flag's help, but only where it says something:
    not when the help already states the default in words, nor for a default of None."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text.lower():
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the harness's one-line errors: `error: ...` and a pointer to --help
    (exit 2), instead of the whole usage block before the message. Abbreviated flags are
    refused (`allow_abbrev=False`): `--trust-r` must not pass for `--trust-remote-code`
    where a list of reserved flags is checked. A parser asking for argparse's
    ArgumentDefaultsHelpFormatter gets DefaultsHelpFormatter (no default said twice)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        if kwargs.get("formatter_class") is argparse.ArgumentDefaultsHelpFormatter:
            kwargs["formatter_class"] = DefaultsHelpFormatter
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def flag_hints(self, argv: Iterable[object]) -> list[str]:
        """`--seeds: did you mean --seed?` for each flag of `argv` this parser does not
        know and has a close match for (`closest_name`, as for models and tasks)."""
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hints = []
        for token in argv:
            if not isinstance(token, str) or not token.startswith("--") or token == "--":
                continue
            flag = token.split("=", 1)[0]
            if flag in known or len(flag) > 200:
                continue
            close = closest_name(flag[2:], [k[2:] for k in known])
            if close and f"{flag}: did you mean --{close}?" not in hints:
                hints.append(f"{flag}: did you mean --{close}?")
        return hints

    def error(self, message: str):
        hints = "".join(f"; {h}" for h in self.flag_hints(getattr(self, "_given", ())))
        self.exit(
            2,
            f"error: {one_line(message)}{hints}; run {self.prog} --help for the valid flags\n",
        )


def report_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's `main` so bad input ends as one `error:` line and EXIT_INPUT_ERROR,
    and Ctrl-C outside a training loop (where nothing is lost) as EXIT_INTERRUPTED; the one
    error wrapper every command uses."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except HarnessError as exc:
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return EXIT_INPUT_ERROR
        except KeyboardInterrupt as exc:
            print("interrupted: Ctrl-C; run the same command again to continue", file=sys.stderr)
            return exit_code_for(exc)

    return wrapped


def warn_once() -> Callable[[str], None]:
    """A `warn(message)` for readers of results directories: prints `warning: message` on
    stderr once per distinct message (a file read twice is reported once)."""
    seen: set[str] = set()

    def warn(message: str) -> None:
        if message not in seen:
            seen.add(message)
            print(f"warning: {one_line(message)}", file=sys.stderr)

    return warn
