"""A cell's flags are declared once, as dataclass fields (`cells/run_flags.py`, `cells/probe_flags.py`, `core/flags.py`):
each command's parser is made from them, and an instance written back with `flags_argv`
parses to the same values, so a plan's unit lines and the cell's parser cannot drift."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from encoder_eval import probe as probe_command
from encoder_eval import run as run_command
from encoder_eval.cells.probe_flags import ProbeFlags, probe_parser
from encoder_eval.cells.run_flags import RunFlags, run_parser
from encoder_eval.core.flags import flag_field, flag_values, flags_argv
from encoder_eval.core.protocol import Recipe, recipe_argv, recipe_from_args
from encoder_eval.plans.plan import (
    _RESERVED_PROBE_FLAGS,
    _RESERVED_RUN_FLAGS,
    CellSettings,
    PlanInputs,
    build_plan,
)

FLAGGED_RECIPE = tuple(f.name for f in dataclasses.fields(Recipe) if f.metadata["flag"])


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("flag"))


def _dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.dest != "help"}


def test_every_flag_of_run_and_probe_is_a_declared_field():
    """`run`'s parser holds exactly RunFlags' and the Recipe's flags, `probe`'s exactly
    ProbeFlags'; the plan's parsers hold the same as the commands'."""
    # `--spec FILE` is the one flag that is not a field: the whole unit (`UnitSpec`), alone.
    run_dests = _dests(run_command.build_parser()) - {"spec"}
    probe_dests = _dests(probe_command.build_parser()) - {"spec"}
    assert run_dests == set(_names(RunFlags)) | set(FLAGGED_RECIPE)
    assert probe_dests == set(_names(ProbeFlags))
    assert _dests(run_parser()) == run_dests
    assert _dests(probe_parser()) == probe_dests


def test_the_flags_a_plan_reserves_are_its_cell_commands_own():
    """Every flag a plan refuses in extra run arguments is spelled as its cell command spells
    it, so a renamed flag cannot slip past the refusal."""
    for parser, reserved in ((run_parser(), _RESERVED_RUN_FLAGS),
                             (probe_parser(), _RESERVED_PROBE_FLAGS)):  # fmt: skip
        options = {o for action in parser._actions for o in action.option_strings}
        assert set(reserved) <= options, set(reserved) - options


def test_run_flags_written_back_parse_to_the_same_values():
    flags = RunFlags(model_path="org/m", model_key="m", task="glue_rte", tasks_file=["a.toml",
                     "b.yaml"], mode="decoder-adapted", attention="causal", pooling="last",
                     head_dropout=0.25, body_dropout=0.0, lr="1e-05,3.59e-05", seed="42,43",
                     phase="select", allow_off_protocol=True, out_json=None, results_dir="r",
                     skip_existing=True, data_dir="d", device="cpu", model_revision="abc",
                     trust_remote_code=False, model_code_revision="def",
                     require_code_revision=True, record_model_path=True,
                     save_predictions=False, cache_dir="c", no_cache=True, progress="json",
                     report_to="tensorboard", tracking_dir="t")  # fmt: skip
    recipe = Recipe(batch_size=16, early_stop=False, precision="fp32", limit=8, compile=True)
    argv = [*flags_argv(flags, _names(RunFlags)), *recipe_argv(recipe, FLAGGED_RECIPE)]
    assert "--no-trust-remote-code" in argv and "--no-save-predictions" in argv
    assert argv.count("--tasks-file") == 2 and "--out-json" not in argv
    parsed = run_command.build_parser().parse_args(argv)
    assert RunFlags(**flag_values(RunFlags, parsed)) == flags
    assert recipe_from_args(parsed) == recipe


def test_probe_flags_written_back_parse_to_the_same_values():
    flags = ProbeFlags(model=["a=org/a", "b"], pooling="mean,first", tasks="glue_rte",
                       tasks_file=["t.toml"], data_dir="d", results_dir="r", k_folds=5, seed=7,
                       max_seq_len=64, precision="fp32", batch_size=4, device="cpu",
                       trust_remote_code=True, model_revision="abc", model_code_revision="def",
                       require_code_revision=True, no_cache=True, store_probes=True, force=True,
                       record_model_path=True, limit=12)  # fmt: skip
    parsed = probe_command.build_parser().parse_args(flags_argv(flags, _names(ProbeFlags)))
    assert ProbeFlags(**flag_values(ProbeFlags, parsed)) == flags


def test_a_plans_unit_line_parses_back_to_its_cells(tmp_path):
    plan = build_plan(
        "select",
        PlanInputs(
            tmp_path,
            extra_models=["a=org/a"],
            tasks=["glue_rte"],
            trust_remote_code=["a"],
            pins={"a": ("abc", None)},
        ),
        CellSettings.from_argv(["--no-cache"]).given(precision="fp32", report_to="mlflow"),
        lr_keys=["lr03", "lr06"],
        seeds=[42, 99],
    )
    [unit] = plan.units()
    parsed = run_parser().parse_args(plan.run_args(unit))
    flags = RunFlags(**flag_values(RunFlags, parsed))
    assert (flags.model_key, flags.model_path, flags.task, flags.seed) == (
        "a",
        "org/a",
        "glue_rte",
        "42,99",
    )
    assert flags.lr == "1.67e-05,3.59e-05" and flags.phase == "select"
    assert flags.trust_remote_code is True and flags.model_revision == "abc"
    assert flags.model_code_revision is None and flags.allow_off_protocol  # seed 99
    assert (flags.progress, flags.report_to, flags.no_cache) == ("json", "mlflow", True)
    assert recipe_from_args(parsed, mode="auto") == plan.recipe


def test_the_writer_refuses_a_field_that_is_no_flag():
    @dataclasses.dataclass
    class Two:
        on: bool = flag_field(True, "--on", help="a switch")
        plain: int = 3

    assert flags_argv(Two(on=False), ("on",)) == ["--no-on"]
    with pytest.raises(ValueError, match="'plain' has no flag"):
        flags_argv(Two(), ("plain",))
