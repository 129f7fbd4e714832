"""One precision vocabulary (issue 41 item 2): every command takes auto, bf16 and fp32 (with
bf16-autocast as bf16's alias), and one resolver turns auto into fp32 on a CPU without native
bf16 (`cpu.resolve_precision`; the capability is injected at `cpu.cpu_native_bf16`)."""

from __future__ import annotations

import pytest
from spec_helpers import unit_argvs

from encoder_eval import demo, sweep, track
from encoder_eval import probe as probe_command
from encoder_eval import run as run_command
from encoder_eval.cells import probe_cell, runner
from encoder_eval.core import cpu
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import PRECISIONS, recipe_from_args

WORDS = {"auto": "auto", "bf16": "bf16", "bf16-autocast": "bf16", "fp32": "fp32"}
RUN = ["--model-path", "org/a", "--task", "glue_rte", "--lr", "3.59e-05", "--seed", "45"]


@pytest.fixture
def no_native_bf16(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: False)


def test_the_resolver_picks_fp32_for_auto_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: False)
    precision, note = cpu.resolve_precision("auto", "cpu")
    assert precision == "fp32" and "no native bf16" in note
    assert cpu.resolve_precision("auto", "cuda") == ("bf16", None)
    assert cpu.resolve_precision("bf16-autocast", "cpu") == ("bf16", None)  # asked: kept
    assert cpu.resolve_precision("fp32", "cuda") == ("fp32", None)
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: True)
    assert cpu.resolve_precision("auto", "cpu") == ("bf16", None)
    with pytest.raises(HarnessError, match="unknown precision 'fp16'"):
        cpu.resolve_precision("fp16", "cpu")


@pytest.mark.parametrize("given, word", WORDS.items())
def test_every_command_takes_the_same_words(tmp_path, given, word, no_native_bf16):
    assert set(WORDS.values()) == set(PRECISIONS)
    # run: the recipe records bf16 as results always have, auto until the cell resolves it
    args = run_command.build_parser().parse_args([*RUN, "--precision", given])
    recorded = {"bf16": "bf16-autocast"}.get(word, word)
    assert recipe_from_args(args).precision == word  # one type (`Precision`)
    assert recipe_from_args(args).to_dict()["precision"] == recorded
    # probe: the word, resolved on its device when auto
    args = probe_command.build_parser().parse_args(
        ["--model", "m=org/m", "--tasks", "glue_rte", "--precision", given, "--device", "cpu"]
    )
    assert args.precision == word
    assert probe_cell.resolved_precision(args.precision, "cpu") == {"auto": "fp32"}.get(word, word)
    # sweep: every cell's command line carries the word (auto is resolved by each cell)
    out = tmp_path / "runs"
    assert sweep.main(["--phase", "select", "--model", "a=org/a", "--tasks", "glue_rte",
                       "--lr-keys", "lr06", "--seeds", "42", "--precision", given,
                       "--results-dir", str(tmp_path / "res"), "--out-dir", str(out)]) == 0  # fmt: skip
    [argv] = unit_argvs((out / "run_all.sh").read_text())
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--precision"] == [word]
    # track: a receipt records what ran (auto resolved; bf16 recorded as None, as always)
    setup = track.build_setup("finetune", ["glue_rte"], lr_key="lr06", precision=given)
    assert setup.precision == {"bf16": None, "auto": "fp32"}.get(word, word)
    # demo: its choice through the same resolver
    args = demo.build_parser().parse_args(["--out", str(tmp_path), "--precision", given])
    assert demo.choose_precision(args.precision, "cpu")[0] == {"auto": "fp32"}.get(word, word)


def test_every_command_refuses_another_word(tmp_path, capsys):
    for parse in (
        lambda: run_command.build_parser().parse_args([*RUN, "--precision", "fp16"]),
        lambda: probe_command.build_parser().parse_args(
            ["--model", "m", "--tasks", "glue_rte", "--precision", "fp16"]
        ),
        lambda: demo.build_parser().parse_args(["--out", str(tmp_path), "--precision", "fp16"]),
    ):
        with pytest.raises(SystemExit):
            parse()
        assert "unknown precision 'fp16'" in capsys.readouterr().err
    with pytest.raises(HarnessError, match="unknown precision 'fp16'"):
        track.build_setup("finetune", ["glue_rte"], lr_key="lr06", precision="fp16")


def test_a_run_cell_resolves_auto_on_its_device(tmp_path, no_native_bf16, capsys):
    """`run --precision auto` on a CPU without native bf16 runs, and records, fp32."""
    args = run_command.build_parser().parse_args(
        [*RUN, "--precision", "auto", "--device", "cpu", "--out-json", str(tmp_path / "c.json")]
    )
    [cell] = runner.plan_cells(args)
    assert cell.recipe.precision == "fp32"
    assert "--precision auto runs fp32" in capsys.readouterr().err
    args = run_command.build_parser().parse_args(
        [*RUN, "--device", "cpu", "--out-json", str(tmp_path / "c.json")]
    )
    [cell] = runner.plan_cells(args)
    assert cell.recipe.to_dict()["precision"] == "bf16-autocast"  # the protocol's, recorded
