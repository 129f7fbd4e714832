"""`--precision` taken directly by sweep, demo and track (issue 29 items 2-3): it reaches
every cell, is recorded in experiment.toml, and the shrunken-sweep note names fp32."""

from __future__ import annotations

import pytest
from spec_helpers import unit_argvs

from encoder_eval import demo, sweep, track
from encoder_eval.core import cpu
from encoder_eval.core.errors import EXIT_INPUT_ERROR, HarnessError
from encoder_eval.core.results import EXPERIMENT_NAME
from encoder_eval.plans import experiment


def _cell_precisions(run_all: str) -> list[str]:
    """The --precision each `encoder_eval.run` unit of a run_all.sh (its `unit NAME ... --
    ARGS` lines) ends up with (the last one given wins, as in argparse)."""
    found = []
    for argv in unit_argvs(run_all):
        found.append([argv[i + 1] for i, a in enumerate(argv) if a == "--precision"][-1])
    return found


def _select(tmp_path, *flags: str) -> list[str]:
    return ["--phase", "select", "--model", "a=org/a", "--model", "b=org/b", "--tasks",
            "glue_rte,glue_sst2", "--lr-keys", "lr03,lr06", "--seeds", "42",
            "--results-dir", str(tmp_path / "res"), "--out-dir", str(tmp_path / "runs"),
            "--group", "cell", *flags]  # fmt: skip


@pytest.mark.parametrize("flags", [["--precision", "fp32"],
                                   ["--extra-run-args", "--precision fp32"]])  # fmt: skip
def test_sweep_precision_fp32_reaches_every_cell_is_recorded_and_noted(tmp_path, capsys, flags):
    assert sweep.main(_select(tmp_path, *flags)) == 0
    out = capsys.readouterr().out
    assert "note: shrunken sweep, its results are off-protocol" in out
    assert "precision fp32 (protocol: bf16)" in out
    precisions = _cell_precisions((tmp_path / "runs" / "run_all.sh").read_text())
    assert precisions == ["fp32"] * 8  # 2 models x 2 tasks x 2 LRs x 1 seed, one unit each
    recorded = experiment.load(tmp_path / "res" / EXPERIMENT_NAME)
    assert recorded.recipe_entries == {"precision": "fp32"}  # typed, in [recipe]
    assert recorded.extra_run_args == []
    # the same sweep again is the same experiment (the flag is not doubled)
    assert sweep.main(_select(tmp_path, *flags)) == 0


@pytest.mark.parametrize("value", ["bf16", "bf16-autocast"])
def test_sweep_precision_bf16_is_the_protocol(tmp_path, capsys, value):
    assert sweep.main(_select(tmp_path, "--precision", value)) == 0
    assert "precision fp32" not in capsys.readouterr().out
    precisions = _cell_precisions((tmp_path / "runs" / "run_all.sh").read_text())
    assert precisions == ["bf16"] * 8  # the one word for the protocol's bf16
    # the same experiment as a sweep without the flag
    assert experiment.load(tmp_path / "res" / EXPERIMENT_NAME).extra_run_args == []
    assert sweep.main(_select(tmp_path)) == 0


@pytest.mark.parametrize("flags, message", [
    (["--precision", "fp16"], "unknown precision 'fp16'"),
    (["--precision", "bf16", "--extra-run-args", "--precision fp32"],
     "--precision bf16 contradicts --precision fp32"),
])  # fmt: skip
def test_sweep_precision_refusals(tmp_path, capsys, flags, message):
    try:
        code = sweep.main(_select(tmp_path, *flags))
    except SystemExit as exc:  # the flag's own parser refuses an unknown word
        code = exc.code
    assert code == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_the_demo_runs_fp32_on_a_cpu_without_native_bf16_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: False)
    assert demo.choose_precision("auto", "cpu")[0] == "fp32"
    assert demo.choose_precision("bf16", "cpu") == ("bf16", None)
    assert demo.choose_precision("auto", "cuda") == ("bf16", None)
    commands, logged = [], []

    def record_then_stop(cmd, log):  # the demo's select sweep, then stop
        commands.append(cmd)
        raise HarnessError("stopped by the test")

    monkeypatch.setattr(demo, "_run", record_then_stop)
    args = demo.build_parser().parse_args(["--out", str(tmp_path), "--model-path", "m"])
    with pytest.raises(HarnessError, match="stopped by the test"):
        demo.run_demo(args, log=logged.append)
    [sweep_cmd] = commands
    assert sweep_cmd[sweep_cmd.index("--precision") + 1] == "fp32"
    assert len([m for m in logged if "no native bf16" in m and "fp32" in m]) == 1
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: True)
    commands.clear()
    with pytest.raises(HarnessError):
        demo.run_demo(args, log=logged.append)
    assert "--precision" not in commands[0]


def test_track_finetune_takes_precision(tmp_path):
    setup = track.build_setup("finetune", ["glue_rte"], lr_key="lr06", precision="fp32")
    assert setup.precision == "fp32"
    plan = track.build_track_plan(setup, [track.Checkpoint("c0", "org/c0", 0)], tmp_path)
    [unit] = plan.units()
    argv = plan.run_args(unit)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--precision"][-1] == "fp32"
    assert any("precision fp32" in s for s in plan.shrunk)
    default = track.build_setup("finetune", ["glue_rte"], lr_key="lr06", precision="bf16")
    assert default.precision is None  # the protocol's, as receipts always recorded it
    with pytest.raises(HarnessError, match="unknown precision 'fp16'"):
        track.build_setup("finetune", ["glue_rte"], lr_key="lr06", precision="fp16")
