"""What a file meant to be shared may not carry (local paths, private links): `redact_text`
for any string, `redact_data` for plain JSON; `REDACTED` stands in their place. One rule for
`select --redact-paths`, `push` and `export` (the experiment file reads `REDACTED` back as
"ask the receiver": `plans/experiment.py`)."""

from __future__ import annotations

import re
from typing import Any

# What a selection shared with `select --redact-paths` holds instead of a local path; the
# report sweep of whoever receives it asks for their own (`--model NAME=PATH`, `--data-dir`).
REDACTED = "<redacted>"

# What `redact_text` replaces inside any string written to a shared file:
# - a link (`scheme://...`: file://, sqlite:///, http://a-host:5000 ...) unless it points at
#   one of `PUBLIC_HOSTS`;
# - an absolute path, a home path (`~/x`, `~alice/x`) or an explicitly relative one
#   (`./x`, `../x`), wherever it stands (`--flag=/x`, `mirror:/x`, "cannot open /x: ...");
# - `user@host:path` (scp's spelling), a relative path of three or more parts
#   (`results/select/x.json`: a Hub id has two).
PUBLIC_HOSTS = ("huggingface.co", "hf.co")
_C = r"[^\s\"'<>,;()\[\]{}]"  # a character of a path
_END = r"[^\s\"'<>,;()\[\]{}.:]"  # its last one (a sentence's '.' or ':' is not)
_PRIVATE = re.compile(
    r"(?P<link>(?<![\w+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*)"  # scheme://...
    rf"|(?<![\w.-])[\w.-]+@[\w.-]+:(?:{_C}*{_END})?"  # user@host:path
    rf"|(?<![\w.~/-])(?:~[\w.-]*|\.\.?)?/{_C}*{_END}"  # /x, ~/x, ~u/x, ./x, ../x
    r"|(?<![\w.~/-])~[\w.-]*(?![\w/])"  # ~ or ~user alone
    r"|(?<![\w.~/:@-])[\w.-]+(?:/[\w.-]+){2,}/?"  # a/b/c
)


def _keep_public(match: re.Match) -> str:
    link = match.group("link")
    if link and link.lower().startswith("https://"):
        host = link.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1].split(":", 1)[0]
        if host.lower() in PUBLIC_HOSTS:
            return link
    return REDACTED


def redact_text(text: str) -> str:
    """`text` with every local path and private link in it replaced by `REDACTED` (the
    rules above `PUBLIC_HOSTS`); Hub ids (`org/name`), public Hub links and plain words
    stay. The one rule for what a shared file may not carry: `select --redact-paths`,
    `push` and `export` all use it."""
    return _PRIVATE.sub(_keep_public, text)


def redact_data(data: Any, fields: tuple[str, ...] = (), where: str = "") -> tuple[Any, list[str]]:
    """`data` (plain JSON) with `redact_text` applied to every string, and the strings of
    the dotted `fields` (`provenance.model_path`, `notes[0]`) replaced whole. Returns the
    copy and the names of the fields changed."""
    changed: list[str] = []

    def walk(value: Any, name: str) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, f"{name}.{k}" if name else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, str) and value != REDACTED:
            clean = REDACTED if name in fields else redact_text(value)
            if clean != value:
                changed.append(name)
            return clean
        return value

    return walk(data, where), changed
