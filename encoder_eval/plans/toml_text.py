"""TOML text for plain data: what `sweep` writes as an experiment file (`experiment.write`)
and a task-rows file, readable by any TOML reader (tomllib reads it back in the tests)."""

from __future__ import annotations

import json
import re
from typing import Any


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # inf, -inf and nan are TOML too
    if isinstance(value, str):
        # JSON's escapes are TOML's; DEL must be escaped in TOML, not in JSON.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(
                f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
            )
            + "}"
        )
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def dumps(data: dict) -> str:
    """TOML text for plain data (str, int, float, bool, lists, nested tables; None left out)."""
    lines: list[str] = []

    def table(prefix: list[str], content: dict) -> None:
        scalars = {k: v for k, v in content.items() if v is not None and not isinstance(v, dict)}
        subtables = {k: v for k, v in content.items() if isinstance(v, dict)}
        if prefix and (scalars or not subtables):
            lines.extend(["", "[" + ".".join(map(_toml_key, prefix)) + "]"])
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars.items())
        for key, sub in subtables.items():
            table([*prefix, key], sub)

    table([], data)
    return "\n".join(lines).lstrip("\n") + "\n"
