"""Command-line flags declared on dataclass fields: each field that is a flag carries its
spelling, help and argparse settings as field metadata (`flag_field`), `add_flags` adds them
to a parser, and `flags_argv` writes an instance back as the arguments that parse to it.
The recipe (`protocol.Recipe`) and a cell's identity and paths (`cells/run_flags.py`, `cells/probe_flags.py`) are
declared this way, so a flag is spelled in one place and a plan's command lines round-trip.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

# The field metadata keys this module reads (a dataclass may add its own, as Recipe does).
FLAG, HELP, GROUP, ARGPARSE, TO_TEXT = "flag", "help", "group", "argparse", "to_text"


def flag_meta(
    flag: str | None,
    help: str | None = None,
    group: str | None = None,
    to_text: Callable[[Any], str] | None = None,
    **argparse_kwargs: Any,
) -> dict:
    """The metadata that makes a field a flag: its spelling (None: no flag), help, argument
    group title (None: the parser's own), how a value is written on a command line
    (`to_text`; default `str`, floats as `%g`), and any other `add_argument` keyword."""
    return {FLAG: flag, HELP: help, GROUP: group, TO_TEXT: to_text, ARGPARSE: argparse_kwargs}


def flag_field(default: Any = None, flag: str | None = None, **meta: Any) -> Any:
    """A dataclass field declared as a flag (`flag_meta`), with `default` as both the
    field's default and the flag's."""
    return dataclasses.field(default=default, metadata=flag_meta(flag, **meta))


def _flag_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get(FLAG)]


def _annotation(entry: dataclasses.Field) -> str:
    """The field's type as written, without `| None` (`int | None` -> `int`)."""
    return str(entry.type).split(" |")[0]


def _is_bool(entry: dataclasses.Field) -> bool:
    return _annotation(entry) == "bool"


def _argparse_kwargs(entry: dataclasses.Field) -> dict:
    """What `add_argument` gets for a flag field: its declared keywords, and by default a
    bool as `--x/--no-x` and an int or float parsed as such."""
    kwargs = dict(entry.metadata[ARGPARSE])
    if _is_bool(entry):
        kwargs.setdefault("action", argparse.BooleanOptionalAction)
    elif not {"action", "choices", "type"} & set(kwargs):
        kind = {"float": float, "int": int}.get(_annotation(entry))
        if kind is not None:
            kwargs["type"] = kind
    return kwargs


def add_flags(
    parser: Any,
    cls: type,
    fill: dict[str, Callable[[Any], None]] | None = None,
    names: Sequence[str] | None = None,
) -> None:
    """Add a flag for every flag field of dataclass `cls` to `parser` (a parser or an
    argument group), in field order, each under its group (created on first use). `fill`:
    for a group title, a function that adds flags declared elsewhere at that group's start
    (run's recipe group starts with the recipe's flags). `names`: only these fields' flags
    (still in field order; a command that takes some of a dataclass's flags)."""
    groups: dict[str, Any] = {}
    for entry in _flag_fields(cls):
        if names is not None and entry.name not in names:
            continue
        title = entry.metadata[GROUP]
        target = parser
        if title is not None:
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
                if fill and title in fill:
                    fill[title](groups[title])
            target = groups[title]
        default = entry.default
        if default is dataclasses.MISSING:
            default = None
        target.add_argument(
            entry.metadata[FLAG],
            dest=entry.name,
            default=default,
            help=entry.metadata[HELP],
            **_argparse_kwargs(entry),
        )


def flag_values(cls: type, namespace: argparse.Namespace) -> dict[str, Any]:
    """The values of `cls`'s flag fields in a namespace parsed with `add_flags`."""
    return {entry.name: getattr(namespace, entry.name) for entry in _flag_fields(cls)}


def flag_of(cls: type, name: str) -> str:
    """The flag that sets field `name` of dataclass `cls`; ValueError if it has none."""
    entry = next((e for e in dataclasses.fields(cls) if e.name == name), None)
    if entry is None or not entry.metadata.get(FLAG):
        raise ValueError(f"{cls.__name__} entry {name!r} has no flag")
    return entry.metadata[FLAG]


def flags_argv(instance: Any, names: Sequence[str]) -> list[str]:
    """The arguments that set fields `names` of a dataclass instance, in that order: the one
    writer of flag fields back to a command line. A None value (and an unset `store_true`)
    writes nothing; a bool with `--x/--no-x` writes the one it is; a list repeats its flag."""
    by_name = {e.name: e for e in _flag_fields(type(instance))}
    argv: list[str] = []
    for name in names:
        entry = by_name.get(name)
        if entry is None:
            raise ValueError(f"{type(instance).__name__} entry {name!r} has no flag")
        flag, value = entry.metadata[FLAG], getattr(instance, name)
        action = _argparse_kwargs(entry).get("action")
        if value is None:
            continue
        if action == "store_true":
            argv += [flag] if value else []
        elif action is argparse.BooleanOptionalAction:
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            to_text = entry.metadata[TO_TEXT] or _text
            items = value if action == "append" else [value]
            for item in items:
                argv += [flag, to_text(item)]
    return argv


def _text(value: Any) -> str:
    """How a flag's value is written: a float as `%g`, anything else as `str`."""
    return f"{value:g}" if isinstance(value, float) else str(value)
