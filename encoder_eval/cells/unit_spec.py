"""A unit of work as one typed, serialisable object (`UnitSpec`): what one `encoder_eval.run`
(or, for probes, `encoder_eval.probe`) process runs. `sweep` writes one spec file per unit
beside its script (`plans/emit.py`), and the unit runs from it (the `run` module with
`--spec FILE`); a cell run by hand from flags is parsed into the same object
(`UnitSpec.from_args`). `to_json` / `from_json` round-trip it, as run_glue's argument
dataclasses do: the flags' dataclasses keep their metadata (`core/flags.py`; the recipe's
comparability scope, `core/protocol.py`), and the cell planners read the spec's `namespace()`,
the same values a command line of its `argv()` parses to. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from encoder_eval.cells.probe_flags import ProbeFlags, probe_parser
from encoder_eval.cells.run_flags import RunFlags, run_parser
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.fileio import read_bytes, write_atomic
from encoder_eval.core.flags import flag_values, flags_argv
from encoder_eval.core.protocol import (
    SPELLED_OUT,
    Precision,
    Recipe,
    changed_entries,
    recipe_argv,
    recipe_from_args,
)

# The kinds of unit and the module that runs each.
FINETUNE, PROBE = "finetune", "probe"
MODULES = {FINETUNE: "encoder_eval.run", PROBE: "encoder_eval.probe"}
SPEC_VERSION = 1
SPEC_FLAG = "--spec"  # `run --spec FILE`, `probe --spec FILE`: a unit from its spec file

# The order a unit's command line spells its flags in (`UnitSpec.argv`): the `RunFlags`
# entries before and after the recipe's, and a probe unit's `ProbeFlags` entries before and
# after its settings (`PROBE_SETTINGS`); then every other entry that differs from its default.
RUN_HEAD = ("model_key", "model_path", "mode", "task", "lr", "seed", "phase", "results_dir",
            "skip_existing", "trust_remote_code", "model_revision", "model_code_revision")  # fmt: skip
RUN_TAIL = ("device", "data_dir", "tasks_file", "allow_off_protocol", "progress", "report_to")
PROBE_HEAD = ("model", "tasks", "pooling", "results_dir")
PROBE_SETTINGS = ("k_folds", "seed", "max_seq_len", "precision", "limit")
PROBE_TAIL = ("device", "trust_remote_code", "model_revision", "model_code_revision", "data_dir",
              "tasks_file")  # fmt: skip


@dataclass(frozen=True)
class UnitSpec:
    """One unit: its kind (FINETUNE or PROBE), its cells' identity, paths and settings
    (`RunFlags`: model, task, learning rates, seeds, phase, paths; `ProbeFlags` for a probe
    unit, whose settings are its own) and, for a fine-tune unit, its `Recipe` (whole, typed;
    its precision as the result records it)."""

    kind: str
    flags: RunFlags | ProbeFlags
    recipe: Recipe | None = None

    def __post_init__(self) -> None:
        if self.kind not in MODULES:
            raise HarnessError(f"unit spec: kind {self.kind!r} must be finetune or probe")
        want = RunFlags if self.kind == FINETUNE else ProbeFlags
        if not isinstance(self.flags, want) or (self.recipe is None) != (self.kind == PROBE):
            raise HarnessError(f"unit spec: a {self.kind} unit holds {want.__name__}")

    @property
    def module(self) -> str:
        """The module that runs the unit (`python -m MODULE --spec FILE`)."""
        return MODULES[self.kind]

    # ------------------------------------------------------------------ from and to flags

    @classmethod
    def from_args(cls, args: argparse.Namespace, kind: str = FINETUNE) -> UnitSpec:
        """The spec a namespace parsed by `run`'s (or `probe`'s) flags describes."""
        if kind == PROBE:
            return cls(PROBE, ProbeFlags(**flag_values(ProbeFlags, args)))
        return cls(FINETUNE, RunFlags(**flag_values(RunFlags, args)), recipe_from_args(args))

    def namespace(self) -> argparse.Namespace:
        """What the cell planners read (`runner.plan_cells`, `probe_cell.run_from_args`): the
        namespace a command line of `argv()` parses to, made from the values, not from text."""
        values = asdict(self.flags)
        if self.recipe is not None:
            values |= {
                e.name: getattr(self.recipe, e.name)
                for e in fields(Recipe)
                if e.metadata.get("flag")
            }
        return argparse.Namespace(**values)

    def argv(self) -> list[str]:
        """The command line that runs this unit by hand (`python -m MODULE ARGV`): each
        flag once, with its value, the recipe's in full (`SPELLED_OUT`, then what differs
        from the protocol)."""
        f = self.flags
        if self.kind == PROBE:
            head, middle, tail = PROBE_HEAD, flags_argv(f, PROBE_SETTINGS), PROBE_TAIL
        else:
            others = tuple(n for n in changed_entries(self.recipe) if n not in SPELLED_OUT)
            head, middle, tail = RUN_HEAD, recipe_argv(self.recipe, SPELLED_OUT + others), RUN_TAIL
        spelled = set(head) | set(tail) | (set(PROBE_SETTINGS) if self.kind == PROBE else set())
        rest = tuple(n for n in _changed_flags(f) if n not in spelled)
        return [*flags_argv(f, head), *middle, *flags_argv(f, tail), *flags_argv(f, rest)]

    def summary(self) -> str:
        """One line that says what the unit runs: its command line."""
        return f"python -m {self.module} {shlex.join(self.argv())}"

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"spec_version": SPEC_VERSION, "kind": self.kind}
        out["flags"] = asdict(self.flags)
        if self.recipe is not None:
            out["recipe"] = self.recipe.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = "unit spec") -> UnitSpec:
        """The spec `to_dict` wrote; HarnessError naming `source` and the entry otherwise."""
        if not isinstance(data, dict):
            raise HarnessError(f"{source}: not a unit spec (a JSON object)")
        _known(data, ("spec_version", "kind", "flags", "recipe"), source, "")
        if data.get("spec_version") != SPEC_VERSION:
            raise HarnessError(
                f"{source}: spec_version {data.get('spec_version')!r}; this harness reads "
                f"{SPEC_VERSION} (write the specs again with encoder-eval sweep)"
            )
        kind = data.get("kind")
        if kind not in MODULES:
            raise HarnessError(f"{source}: kind {kind!r} must be finetune or probe")
        flags_cls = RunFlags if kind == FINETUNE else ProbeFlags
        flags = _typed(flags_cls, data.get("flags"), source, "flags")
        recipe = None
        if kind == FINETUNE:
            recipe = _typed(Recipe, data.get("recipe", {}), source, "recipe")
        elif "recipe" in data:
            raise HarnessError(f"{source}: a probe unit has no recipe (its settings are flags)")
        return cls(kind, flags, recipe)

    @classmethod
    def from_json(cls, text: str, source: str = "unit spec") -> UnitSpec:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise HarnessError(f"{source}: not JSON ({exc})") from None
        return cls.from_dict(data, source)

    @classmethod
    def read(cls, path: str | os.PathLike) -> UnitSpec:
        """The spec in file `path` (`--spec FILE`)."""
        try:
            text = read_bytes(path).decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise HarnessError(f"--spec {path}: cannot read it ({exc})") from None
        return cls.from_json(text, f"--spec {path}")

    @classmethod
    def read_unit(cls, path: str | os.PathLike, kind: str) -> UnitSpec:
        """The spec in file `path` as a command of `kind` runs it: refused when it holds
        another kind of unit, and its one-line summary printed (the unit's log says what
        runs)."""
        spec = cls.read(path)
        if spec.kind != kind:
            raise HarnessError(f"{SPEC_FLAG} {path} is a {spec.kind} unit; run it with its module")
        print(f"spec {path}: {spec.summary()}", flush=True)
        return spec

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, self.to_json())
        return path

    def with_extra(self, argv: list[str]) -> UnitSpec:
        """This spec with the flags of `argv` set (the cell command's own parser reads them:
        a user's extra run arguments, which set no recipe entry and no identity)."""
        if not argv:
            return self
        given = _given(run_parser() if self.kind == FINETUNE else probe_parser(), argv)
        flag_names = {f.name for f in fields(self.flags)}
        flags = replace(self.flags, **{k: v for k, v in given.items() if k in flag_names})
        recipe = self.recipe
        if recipe is not None:
            names = {f.name for f in fields(Recipe)}
            recipe = replace(recipe, **{k: v for k, v in given.items() if k in names})
        return replace(self, flags=flags, recipe=recipe)


def spec_argv(argv: list[str]) -> str | None:
    """The spec file `argv` names (`--spec FILE` or `--spec=FILE`, alone), else None; a
    `--spec` among other flags is refused (a spec is the whole unit)."""
    paths = spec_paths(argv)
    if paths is not None and len(paths) > 1:
        raise HarnessError(f"give one {SPEC_FLAG} FILE here: this command runs one unit")
    return None if paths is None else paths[0]


def spec_paths(argv: list[str]) -> list[str] | None:
    """The spec files `argv` names (`--spec FILE`, or `--spec=FILE`, repeated: a job of
    several units), else None when it names none; a `--spec` among other flags is refused
    (a spec is the whole unit)."""
    if not any(a == SPEC_FLAG or a.startswith(SPEC_FLAG + "=") for a in argv):
        return None
    paths, rest = [], list(argv)
    while rest:
        word = rest.pop(0)
        if word.startswith(SPEC_FLAG + "="):
            paths.append(word.split("=", 1)[1])
        elif word == SPEC_FLAG and rest:
            paths.append(rest.pop(0))
        else:
            raise HarnessError(f"{SPEC_FLAG} FILE runs a unit as its spec says; give no other flag")
    return paths


def cell_flag_values(
    argv: list[str], kind: str = FINETUNE
) -> tuple[dict[str, Any], str | None, list[str]]:
    """Cell flags given as text (`sweep --extra-run-args`, an older experiment file's
    `extra_run_args`) read by the cell command's own parser, once: the recipe entries they
    set (typed values), their `--report-to` (None: not given), and the flags the harness
    does not model, in one spelling (`flags_argv`, field order). A flag that does not parse
    raises HarnessError. For a probe unit (`kind` PROBE) the probe's flags: its `--limit`
    is the recipe's."""
    if kind == PROBE:
        given = _given(probe_parser(), list(argv)) if argv else {}
        recipe = {"limit": given.pop("limit")} if "limit" in given else {}
        return recipe, None, flags_argv(ProbeFlags(**given), tuple(given))
    given = _given(run_parser(), list(argv)) if argv else {}
    recipe_names = {e.name for e in fields(Recipe) if e.metadata.get("flag")}
    recipe = {k: v for k, v in given.items() if k in recipe_names}
    if "precision" in recipe:
        recipe["precision"] = Precision.of(recipe["precision"])
    report_to = given.get("report_to")
    rest = {k: v for k, v in given.items() if k not in recipe_names and k != "report_to"}
    return recipe, report_to, flags_argv(RunFlags(**rest), tuple(rest))


def _changed_flags(flags: RunFlags | ProbeFlags) -> tuple[str, ...]:
    """The flag entries whose value is not their default, in field order."""
    return tuple(
        f.name
        for f in fields(flags)
        if f.metadata.get("flag") and getattr(flags, f.name) != f.default
    )


def _given(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The entries `argv` sets, parsed by the command's own `parser` (None: not given)."""
    for action in parser._actions:
        action.required = False
        action.default = None

    def fail(message: str):
        raise HarnessError(f"{shlex.join(argv)}: {message}")

    parser.error = fail  # type: ignore[method-assign]
    with contextlib.redirect_stdout(io.StringIO()):
        parsed = parser.parse_args(argv)
    return {k: v for k, v in vars(parsed).items() if v is not None and k != "help"}


def _known(data: dict, valid: tuple[str, ...], source: str, where: str) -> None:
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise HarnessError(
            f"{source}: unknown entr{'y' if len(unknown) == 1 else 'ies'} "
            f"{', '.join(where + u for u in unknown)}; valid: {', '.join(valid)}"
        )


def _typed(cls: type, value: Any, source: str, where: str):
    """An instance of dataclass `cls` from its `asdict` form."""
    if not isinstance(value, dict):
        raise HarnessError(f"{source}: {where} must be a JSON object")
    _known(value, tuple(f.name for f in fields(cls)), source, where + ".")
    return cls(**value)
