"""The plan flags of a fine-tuning phase merged with the experiment files they point at
(`resolve` -> `SweepConfig`): `--experiment FILE`, the file in a results directory (status),
and for a report phase the experiment its selection records. Flags given win; a report phase
may not contradict its select phase. What the files hold is `experiment.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.protocol import LR_GRID, PHASE_SEEDS, PROBE_PHASE
from encoder_eval.data.models import MODEL_REGISTRY, parse_model_spec, registry_trusts
from encoder_eval.plans.experiment import (
    LR_KEYS_FACT,
    REDACTED,
    SELECT_FACTS,
    Experiment,
    Fact,
    ModelSpec,
    PhaseRecord,
    contradiction,
    from_selection,
    in_results_dir,
    load,
    loads_registry_row,
    manifest_paths,
    register_tasks,
    registry_spec,
    seeds_fact,
    task_keys,
    task_rows_file,
    write,
)
from encoder_eval.plans.plan import CellSettings, parse_lr_keys, parse_seeds, split_csv
from encoder_eval.plans.selection import load_selection


def _typed_draft(draft: argparse.Namespace) -> None:
    """Parse the draft's LR keys, seeds and extra run arguments once: LR keys and seeds
    into lists, `--extra-run-args` into `CellSettings` (None: not given), the value an
    experiment's recipe, report_to and extra_run_args are compared with and filled as. The
    fill and its checks work on values, never on text written back to be parsed again."""
    for name, parse in (("lr_keys", parse_lr_keys), ("seeds", parse_seeds)):
        value = getattr(draft, name, None)
        if isinstance(value, str):
            setattr(draft, name, parse(value) if value else None)
    try:
        argv = shlex.split(draft.extra_run_args or "")
    except ValueError as exc:
        raise HarnessError(f"--extra-run-args is not valid shell quoting ({exc})") from None
    draft.extra_run_args = CellSettings.from_argv(argv) if argv else None


def _models_from_args(args: argparse.Namespace) -> dict[str, ModelSpec | None] | None:
    """The models the flags name (None: neither --models nor --model given); a name with
    no --model spec maps to None (the registry's, or the experiment's)."""
    specs = {}
    trusted = split_csv(args.trust_remote_code)
    pins = getattr(args, "model_pins", None) or {}
    for spec in args.model or []:
        name, entry = parse_model_spec(spec)
        path = os.path.abspath(entry.path) if os.path.exists(entry.path) else entry.path
        specs[name] = ModelSpec(path, entry.mode, name in trusted, *pins.get(name, (None, None)))
    names = split_csv(args.models)
    if not names and not specs:
        return None
    return {name: specs.get(name) for name in (names or specs)}


def _set_models(args: argparse.Namespace, models: dict[str, ModelSpec], source: str) -> None:
    """Spell `models` as --models/--model (registry rows by name) and their pins as
    `args.model_pins`. A model the file marks trust_remote_code runs remote code only when
    the registry grants it (its own Hub id) or the user's `--trust-remote-code` names it:
    a file shared by someone else must not switch code execution on."""
    trusted = split_csv(args.trust_remote_code)
    unconsented = [
        f"{n} ({m.path})"
        for n, m in models.items()
        if m.trust_remote_code and n not in trusted and not registry_trusts(n, m.path)
    ]
    if unconsented:  # refused by `check_consent` where a script would run it
        names = ",".join(
            n
            for n, m in models.items()
            if m.trust_remote_code and n not in trusted and not registry_trusts(n, m.path)
        )
        args.unconsented = (
            f"{source} marks {', '.join(unconsented)} trust_remote_code: running it executes "
            "code from that repository, and a file cannot grant that; if you trust it, pass "
            f"--trust-remote-code {names} (else drop the model)"
        )
    added = {n: m for n, m in models.items() if not loads_registry_row(n, m)}
    args.models = ",".join(models)
    args.model = [f"{n}={m.path}:{m.mode}" for n, m in added.items()]
    args.model_pins = {
        n: (m.revision, m.code_revision) for n, m in models.items() if m.revision or m.code_revision
    }


def check_consent(cfg: SweepConfig) -> None:
    """Refuse to write a script when a file asked for remote code the user did not allow
    (`_set_models`); reading results (status without --emit) needs no consent."""
    if cfg.unconsented:
        raise HarnessError(cfg.unconsented)


def _inherit(
    args: argparse.Namespace,
    exp: Experiment,
    phase: str,
    *,
    where: str,
    fix: str,
    given: dict[str, str],
    facts: tuple[Fact, ...],
) -> None:
    """Fill unset flags from `exp` and refuse given ones that differ (named by `given`)."""
    for fact in facts:
        have, want = fact.from_args(args), fact.get(exp, phase)
        if want == REDACTED:  # shared without the path: the user's own is the one to use
            if have is None:
                raise HarnessError(
                    f"{where} was shared without its {fact.attr.replace('_', ' ')} "
                    f"(select --redact-paths); give {fact.flag} with your own"
                )
            continue
        if have is None:
            if want is not None:
                setattr(args, fact.attr, fact.to_args(want))
            continue
        if (fact.default if want is None else want) != have:
            raise contradiction(
                given.get(fact.attr, f"{fact.flag} {fact.show(have)}"), fact.show(want), where, fix
            )


def _check_redacted(args: argparse.Namespace, exp: Experiment) -> None:
    """Refuse, in one line naming every flag needed, a report phase from a selection shared
    without its local paths (`select --redact-paths`) unless the user gives their own."""
    requested = _models_from_args(args) or {}
    wanted = split_csv(args.models) or list(requested) or list(exp.models)
    need = [
        f"--model {n}=PATH:{m.mode}"
        for n, m in exp.models.items()
        if m.path == REDACTED and n in wanted and requested.get(n) is None
    ]
    if exp.data_dir == REDACTED and not args.data_dir:
        need.append("--data-dir DIR")
    if REDACTED in exp.tasks_files and not getattr(args, "tasks_file", None):
        need.append("--tasks-file FILE")
    if need:
        raise HarnessError(
            "the select phase was shared without its local paths (select "
            f"--redact-paths); give your own: {', '.join(need)}"
        )


def _inherit_pairs(
    args: argparse.Namespace, exp: Experiment, *, where: str, fix: str, given: dict[str, str]
) -> None:
    """Take `exp`'s models and tasks, or the subset the flags name; refuse any other."""
    requested = _models_from_args(args)
    if exp.models:
        chosen = dict(exp.models)
        hidden = [
            n
            for n, m in exp.models.items()
            if m.path == REDACTED and (requested or {}).get(n) is None
        ]
        if hidden and (requested is None or any(n in requested for n in hidden)):
            raise HarnessError(
                f"{where} was shared without its local model paths (select --redact-paths): "
                "give your own copy of each with "
                + ", ".join(f"--model {n}=PATH:{exp.models[n].mode}" for n in hidden)
            )
        if requested is not None:
            chosen = {}
            for name, spec in requested.items():
                if name not in exp.models:
                    flag = f"--model {name}=..." if spec is not None else f"--models {args.models}"
                    raise contradiction(
                        given.get("models", flag),
                        f"its models: {', '.join(exp.models)}",
                        where,
                        fix,
                    )
                m = exp.models[name]
                if spec is not None and m.path == REDACTED and spec.mode == m.mode:
                    chosen[name] = dataclasses.replace(m, path=spec.path)
                    continue
                if spec is not None and (spec.path, spec.mode) != (m.path, m.mode):
                    raise contradiction(
                        f"--model {name}={spec.path}:{spec.mode}",
                        f"{name}={m.path}:{m.mode}",
                        where,
                        fix,
                    )
                chosen[name] = exp.models[name]
        _set_models(args, chosen, where)
    if exp.tasks:
        known = task_keys(exp.tasks, where)
        asked = split_csv(args.tasks)
        for name in task_keys(asked):
            if name not in known:
                raise contradiction(
                    given.get("tasks", f"--tasks {args.tasks}"),
                    f"its tasks: {', '.join(known)}",
                    where,
                    fix,
                )
        if not asked:
            args.tasks = ",".join(known)


def _fill(
    args: argparse.Namespace,
    exp: Experiment,
    phase: str | None,
    source: str,
    given: dict[str, str],
    facts: tuple[Fact, ...],
) -> None:
    """Fill the flags the user left unset (`facts`, and the cells: LR keys, seeds, models,
    tasks) from `exp`; flags given win. `given` learns where each filled value came from."""
    cells = [
        *([LR_KEYS_FACT] if phase == "select" else []),
        *([seeds_fact(phase)] if phase in PHASE_SEEDS else []),
    ]
    for fact in (*facts, *cells):
        want, have = fact.get(exp, phase), fact.from_args(args)
        if have is None and want is not None:
            setattr(args, fact.attr, fact.to_args(want))
            given[fact.attr] = f"{fact.attr} = {fact.show(want)} in {source}"
        elif isinstance(have, CellSettings) and isinstance(want, CellSettings):
            # Cell flags given win entry by entry: the file's other recipe entries stay.
            setattr(args, fact.attr, have.over(want))
    requested = _models_from_args(args)
    if exp.models and requested is None:
        _set_models(args, exp.models, source)
        given["models"] = f"the models of {source}"
    elif exp.models and any(n in exp.models for n, m in requested.items() if m is None):
        chosen = {}
        for name, spec in requested.items():  # --models names the file's models too
            spec = spec or exp.models.get(name) or registry_spec(name)
            if spec is None:
                raise unknown_name("model", name, {*exp.models, *MODEL_REGISTRY})
            chosen[name] = spec
        _set_models(args, chosen, source)
    if exp.tasks and not args.tasks:
        args.tasks = ",".join(task_keys(exp.tasks, source))
        given["tasks"] = f"tasks of {source}"


@dataclass(frozen=True)
class SweepConfig:
    """The plan flags of a fine-tuning phase (`arguments.add_plan_arguments`) merged with
    the experiment files they point at (`resolve`): what `sweep` and `status` build their
    plan and record from. Lists are parsed; None or empty means not given (the protocol's).
    `sources`: the experiments read (its own file, the select phase's), for `for_plan`;
    `unconsented`: why a script may not be written (`check_consent`), or None."""

    phase: str | None = None
    results_dir: str | None = None
    out_dir: str | None = None
    selection: str | None = None
    models: tuple[str, ...] = ()  # --models: the names the phase covers
    model: tuple[str, ...] = ()  # --model NAME=PATH:MODE: models beside the registry's
    model_pins: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    trust_remote_code: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    tasks_files: tuple[str, ...] = ()
    lr_keys: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    max_steps: int | None = None
    max_seq_len: int | None = None
    data_dir: str | None = None
    device: str | None = None
    selection_split: str | None = None
    # The experiment's other recipe entries, report_to and extra_run_args, typed, or what
    # --extra-run-args says instead (`_fill`: a flag given wins).
    cell_settings: CellSettings = CellSettings()
    sources: tuple[Experiment | None, Experiment | None] = (None, None)
    unconsented: str | None = None


def resolve(args: argparse.Namespace, *, results_manifest: bool = False) -> SweepConfig:
    """The plan flags of `args` with those the user left unset filled, as a new value
    (`args` is left as parsed).

    From `--experiment FILE` (flags given win), or with `results_manifest` (status) from
    the file in `--results-dir`, whose recipe overrides, data directory, device and
    selection split flags may not contradict; then, for a report phase, from the experiment
    its selection records, which flags may not contradict (models and tasks may narrow it).
    For select/report, `--seed` is `--seeds` (argparse's abbreviation, kept).
    """
    draft = argparse.Namespace(**vars(args))  # the fill below works on its own copy
    if draft.phase != PROBE_PHASE and getattr(draft, "seed", None) is not None:
        if draft.seeds is None:
            draft.seeds = draft.seed
    _typed_draft(draft)
    _fill_draft(draft, results_manifest)
    lr_keys, seeds = draft.lr_keys, draft.seeds
    return SweepConfig(
        phase=draft.phase,
        results_dir=draft.results_dir,
        out_dir=getattr(draft, "out_dir", None),
        selection=draft.selection,
        models=tuple(split_csv(draft.models)),
        model=tuple(draft.model or ()),
        model_pins=dict(getattr(draft, "model_pins", None) or {}),
        trust_remote_code=tuple(split_csv(draft.trust_remote_code)),
        tasks=tuple(split_csv(draft.tasks)),
        tasks_files=tuple(getattr(draft, "tasks_file", None) or ()),
        lr_keys=None if lr_keys is None else tuple(lr_keys),
        seeds=None if seeds is None else tuple(seeds),
        max_steps=draft.max_steps,
        max_seq_len=draft.max_seq_len,
        data_dir=draft.data_dir,
        device=draft.device,
        selection_split=draft.selection_split,
        cell_settings=draft.extra_run_args or CellSettings(),
        sources=draft.experiment_sources,
        unconsented=getattr(draft, "unconsented", None),
    )


def _fill_draft(args: argparse.Namespace, results_manifest: bool) -> None:
    """`resolve`'s work on its private copy of the flags: fill, refuse, and record what it
    read as `args.experiment_sources`."""
    path = getattr(args, "experiment", None)
    own: Experiment | None = load(path) if path is not None else None
    if path is None and results_manifest and args.results_dir:
        own, manifest = in_results_dir(args.results_dir)
        path = str(manifest) if own else None
    given: dict[str, str] = {}
    if own is not None:
        register_tasks(own, str(path))
        if args.phase is None:
            args.phase = own.phase
        elif results_manifest and own.phase not in (None, args.phase):
            raise contradiction(
                f"--phase {args.phase}",
                own.phase,
                str(path),
                f"{args.results_dir} holds {own.phase}-phase results",
            )
        record = own.phases.get(args.phase or "")
        if record is not None:
            if args.results_dir is None and record.results_dir:
                args.results_dir = _own_folder(record.results_dir, "results_dir", args, path)
            if hasattr(args, "out_dir") and args.out_dir is None and record.out_dir:
                args.out_dir = _own_folder(record.out_dir, "out_dir", args, path)
            if args.phase == "report" and args.selection is None and record.selection:
                args.selection = record.selection
        if results_manifest:
            # Which cells status counts may differ from the sweep's (more seeds, fewer
            # models); how they run may not, or a script it emits would mix recipes.
            _inherit(
                args,
                own,
                args.phase,
                where=str(path),
                given=given,
                facts=SELECT_FACTS,
                fix="the cells status emits run as the sweep's did",
            )
            _fill(args, own, args.phase, str(path), given, facts=())
        else:
            _fill(args, own, args.phase, str(path), given, facts=SELECT_FACTS)
    inherited = None
    if args.phase == "report" and args.selection is not None:
        inherited = from_selection(load_selection(args.selection), args.selection)
        if inherited is not None:
            _check_redacted(args, inherited)
            register_tasks(inherited, args.selection)
            fix = "the report phase runs as its select phase did"
            _inherit(
                args,
                inherited,
                "report",
                where="the select phase",
                given=given,
                facts=SELECT_FACTS,
                fix=fix,
            )
            _inherit_pairs(args, inherited, where="the select phase", fix=fix, given=given)
            if args.seeds is None and inherited.seeds.get("report"):
                args.seeds = list(inherited.seeds["report"])
    args.experiment_sources = (own, inherited)
    if hasattr(args, "tasks_file"):  # the runs must know the experiment's user tasks too
        files = [f for exp in (own, inherited) if exp is not None for f in exp.tasks_files]
        if REDACTED in files:
            if not args.tasks_file:
                raise HarnessError(
                    "the select phase was shared without its task files (select "
                    "--redact-paths); give your copy with --tasks-file FILE"
                )
            files = [f for f in files if f != REDACTED]
        rows = {
            k: v for exp in (own, inherited) if exp is not None for k, v in exp.task_rows.items()
        }
        if rows:
            phase_dir = args.results_dir or os.path.join("results", args.phase or "select")
            files.append(str(task_rows_file(rows, phase_dir)))
        args.tasks_file = list(dict.fromkeys([*(args.tasks_file or []), *files]))


def _own_folder(folder: str, key: str, args: argparse.Namespace, source: str | None) -> str:
    """A folder an experiment file's `[phases.*]` names for the sweep to write into, used
    only when it lies inside the file's own folder: a file someone shared may not choose
    where this machine writes (an absolute path elsewhere, `../`); the command line does."""
    home = Path(str(source)).absolute().parent.resolve()
    target = Path(folder).resolve()
    if target != home and home not in target.parents:
        flag = "--" + key.replace("_", "-")
        raise HarnessError(
            f"{source}: phases.{args.phase}.{key} is {folder}, outside the experiment "
            f"file's folder {home}; a file does not choose where a sweep writes outside "
            f"its own folder: give {flag} on the command line"
        )
    return folder


def for_plan(plan, out_dir: str | os.PathLike, cfg: SweepConfig) -> Experiment:
    """What `plan` runs, as the experiment `write_for_plan` records; `cfg` (`resolve`) says
    what it read."""
    own, inherited = cfg.sources
    base = inherited or own or Experiment()
    tasks = list(dict.fromkeys(c.task for c in plan.cells))
    seeds = dict(base.seeds)
    if own is not None:
        seeds.update(own.seeds)
    ran_seeds = list(dict.fromkeys(c.seed for c in plan.cells))
    if ran_seeds:
        seeds[plan.phase] = ran_seeds
    if plan.phase == "select":
        lr_keys = sorted({c.lr_key for c in plan.cells}, key=LR_GRID.__getitem__)
    else:
        lr_keys = base.lr_keys
    phases = dict(base.phases)
    if own is not None and plan.phase == "select":
        phases.pop("report", None)  # a new select phase: the old report record no longer holds
    phases[plan.phase] = PhaseRecord(
        results_dir=plan.results_dir,
        out_dir=os.path.abspath(out_dir),
        selection=os.path.abspath(cfg.selection) if plan.phase == "report" else None,
    )
    tasks_files = [*base.tasks_files, *(own.tasks_files if own else [])]
    tasks_files += [os.path.abspath(f) for f in cfg.tasks_files]
    return Experiment(
        models={
            c.model: ModelSpec(
                c.model_path, c.mode, c.trust_remote_code, c.revision, c.code_revision
            )
            for c in plan.cells
        },
        tasks=tasks,
        tasks_files=list(dict.fromkeys(tasks_files)),
        task_rows={t: base.task_rows[t] for t in tasks if t in base.task_rows},
        lr_keys=lr_keys or None,
        seeds=seeds,
        max_steps=plan.max_steps,
        max_seq_len=plan.max_seq_len,
        data_dir=plan.data_dir,
        device=plan.device,
        selection_split=plan.selection_split,
        recipe_entries=plan.recipe_entries(),
        report_to=plan.report_to or None,
        extra_run_args=list(plan.extra_run_args),
        phases=phases,
        phase=plan.phase,
    )


def write_for_plan(
    plan, out_dir: str | os.PathLike, cfg: SweepConfig, exp: Experiment | None = None
) -> list[Path]:
    """Write what `plan` runs (`for_plan`, or `exp`) as `experiment.toml` into its results
    directory and `out_dir`; returns the files written."""
    exp = for_plan(plan, out_dir, cfg) if exp is None else exp
    for path in manifest_paths(plan, out_dir):
        path.parent.mkdir(parents=True, exist_ok=True)
        write(exp, path)
    return manifest_paths(plan, out_dir)


__all__ = ["SweepConfig", "check_consent", "for_plan", "resolve", "write_for_plan"]
