"""The warm worker's reset contract: process state a unit may change, and how to put it back.

A warm worker (`run_all.sh --warm`, `encoder_eval.run --warm-worker`) runs unit after unit in
one process; each unit must get a fresh process's result, bit for bit, and a fresh process's
log. Whatever a unit can leave behind for the next one is registered here by the module
that owns it (`register`), with a public reset and, where a reset can fail to take, a check
that says what still differs. The worker calls `reset_all` before every unit; a reset that
fails or a check that still finds a difference makes the worker start over as a fresh
process (`encoder_eval.run`), never run the unit on top of it.

Not registered, on purpose (the same in every unit of a worker, or per cell already):
- the random generators: `devices.seed_everything` seeds them at every cell;
- the model, optimizer and device memory: `train.run_cell` frees them at every cell;
- imported code: a unit whose trusted remote code (or deterministic setting) differs from
  what the worker already ran runs in a fresh process (`run.unit_identity`);
- the count of cells a process has started (`devices.count_cell`): what a process has met
  (batch widths, kernels) is the process's, and results record it as such;
- facts about the machine and the installation read once per process (`cpu.cpu_native_bf16`,
  `heap`'s allocator knobs, `provenance.harness_git`: the worker runs the code it imported).

This module imports nothing heavy: `run --help` loads it.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reset:
    """One piece of process state: its owner's name for it, how to put it back, and (for
    state a reset cannot be sure of) a check returning what still differs, or None."""

    name: str
    reset: Callable[[], None]
    check: Callable[[], str | None] | None = None


_REGISTRY: dict[str, Reset] = {}


def register(name: str, reset: Callable[[], None], check: Callable[[], str | None] | None = None):
    """Register process state a unit may change (`name`: what it is, as a log line names it).
    Called by the owning module at import: a module never imported has nothing to reset.
    Registering a name again replaces it (a module reloaded)."""
    _REGISTRY[name] = Reset(name, reset, check)


def registered() -> tuple[str, ...]:
    """The names of the registered resets, in registration order."""
    return tuple(_REGISTRY)


def reset_all() -> list[str]:
    """Call every registered reset, then every check; the problems, one line each (empty:
    the process is as a fresh one would be at a unit's start, for everything registered)."""
    problems = []
    for item in list(_REGISTRY.values()):
        try:
            item.reset()
        except Exception as exc:  # noqa: BLE001 - any failure means: start a fresh process
            problems.append(f"{item.name}: reset failed ({type(exc).__name__}: {exc})")
    for item in list(_REGISTRY.values()):
        if item.check is None:
            continue
        try:
            diff = item.check()
        except Exception as exc:  # noqa: BLE001
            diff = f"check failed ({type(exc).__name__}: {exc})"
        if diff:
            problems.append(f"{item.name}: {diff}")
    return problems


def set_clearer(name: str, values: set | dict) -> None:
    """Register a set or dict this process fills as it goes (warned-once sets, dropped
    trackers): each unit starts with it empty, as a fresh process does."""
    register(name, values.clear)


# ------------------------------------------------------------------ what this module owns
# The environment and Python's warning filters and once-registries: a unit or a library may
# set a variable (CUBLAS_WORKSPACE_CONFIG, TOKENIZERS_PARALLELISM) or a warnings filter, and
# a warning shown once in one unit's log must show in the next unit's log too.

_ENVIRON = dict(os.environ)
_FILTERS = list(warnings.filters)


def snapshot_environment() -> None:
    """Take the environment and warning filters every unit starts from: the warm worker's,
    as it stands when the worker starts (before its first unit)."""
    global _ENVIRON, _FILTERS
    _ENVIRON = dict(os.environ)
    _FILTERS = list(warnings.filters)


def _reset_environment() -> None:
    for key in [k for k in os.environ if k not in _ENVIRON]:
        del os.environ[key]
    for key, value in _ENVIRON.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _check_environment() -> str | None:
    names = set(os.environ) | set(_ENVIRON)
    differ = sorted(k for k in names if os.environ.get(k) != _ENVIRON.get(k))
    return f"variables differ: {', '.join(differ)}" if differ else None


def _reset_warnings() -> None:
    warnings.filters[:] = _FILTERS
    mutated = getattr(warnings, "_filters_mutated", None)  # drops the per-module caches
    if mutated is not None:
        mutated()
    for module in list(sys.modules.values()):
        registry = getattr(module, "__warningregistry__", None)
        if isinstance(registry, dict):
            registry.clear()


register("environment variables", _reset_environment, _check_environment)
register("Python warning filters and once-registries", _reset_warnings)
