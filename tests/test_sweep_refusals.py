"""What a sweep refuses up front (issue 23, items 14 and 15; issue 29, item 6).

A second sweep into a results folder that records another experiment is refused, naming
the differences, unless `--force`: its results would mix with, and be counted as done for,
the other recipe. A path that is not valid UTF-8 is one `error:` line, not a traceback;
a seed outside 0 .. 2**32 - 1 is refused where it is parsed, by every command.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from encoder_eval import compare, leaderboard, status, summarize, sweep, track
from encoder_eval import probe as probe_command
from encoder_eval import run as run_command
from encoder_eval.cells import runner
from encoder_eval.core.errors import EXIT_INPUT_ERROR, HarnessError

BASE = ["--phase", "select", "--models", "xlm-r-base", "--tasks", "xnli", "--lr-keys", "lr06"]


def sweep_main(capsys, tmp_path, *extra) -> tuple[int, str]:
    rc = sweep.main([*BASE, "--results-dir", str(tmp_path / "r"), "--out-dir",
                     str(tmp_path / "runs"), *map(str, extra)])  # fmt: skip
    return rc, capsys.readouterr().err


def test_a_second_sweep_of_another_recipe_is_refused_naming_the_differences(tmp_path, capsys):
    rc, err = sweep_main(capsys, tmp_path, "--seeds", "42", "--max-steps", "3")
    assert rc == 0, err
    record = (tmp_path / "r" / "experiment.toml").read_bytes()
    script = (tmp_path / "runs" / "run_all.sh").read_bytes()
    rc, err = sweep_main(capsys, tmp_path, "--seeds", "42", "--max-steps", "3")
    assert rc == 0, err  # the same sweep again: nothing differs
    # issue 29, item 6: another --max-steps must not reuse the old results as done ones
    rc, err = sweep_main(capsys, tmp_path, "--seeds", "42,43", "--max-steps", "4")
    assert rc == EXIT_INPUT_ERROR and len(err.strip().splitlines()) == 1, err
    assert "recipe.max_steps: 3 -> 4" in err and "seeds.select: [42] -> [42, 43]" in err, err
    assert "--force" in err and "would count as done" in err, err
    assert (tmp_path / "r" / "experiment.toml").read_bytes() == record
    assert (tmp_path / "runs" / "run_all.sh").read_bytes() == script
    rc, err = sweep_main(capsys, tmp_path, "--seeds", "42,43", "--max-steps", "4", "--force")
    assert rc == 0, err
    assert "max_steps = 4" in (tmp_path / "r" / "experiment.toml").read_text()


def test_a_path_that_is_not_utf8_is_one_error_line(tmp_path):
    bad = os.fsencode(tmp_path) + b"/results-\xff"
    for module, args in (("encoder_eval.sweep", [*BASE, "--seeds", "42", "--results-dir", bad,
                                                 "--out-dir", b"runs"]),
                         ("encoder_eval.sweep", [*BASE, "--seeds", "42", "--results-dir", b"r",
                                                 "--out-dir", bad]),
                         ("encoder_eval.status", [*BASE, "--results-dir", b"r", "--emit", bad])):  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
        assert proc.returncode == EXIT_INPUT_ERROR, proc.stderr
        assert proc.stderr.startswith("error: --") and "results-\\xff is not valid UTF-8" in (
            proc.stderr), proc.stderr  # fmt: skip
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(os.listdir(tmp_path)) == []  # nothing written


TOO_BIG = str(2**32)


@pytest.mark.parametrize("argv", [
    [*BASE, "--seeds", TOO_BIG], [*BASE, "--seeds", "42,-1"],
    ["--phase", "probe", "--models", "xlm-r-base", "--tasks", "xnli", "--seed", TOO_BIG],
])  # fmt: skip
def test_sweep_refuses_a_seed_outside_32_bits(tmp_path, capsys, argv):
    assert sweep.main([*argv, "--results-dir", str(tmp_path / "r"), "--out-dir",
                       str(tmp_path / "o")]) == EXIT_INPUT_ERROR  # fmt: skip
    assert "must be an integer from 0 to 4294967295" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_run_and_status_refuse_a_seed_outside_32_bits(tmp_path, capsys):
    args = run_command.build_parser().parse_args(["--model-key", "xlm-r-base", "--task", "xnli", "--lr",
                                          "1e-05", "--seed", TOO_BIG, "--allow-off-protocol",
                                          "--out-json", str(tmp_path / "o.json")])  # fmt: skip
    with pytest.raises(HarnessError, match=f"--seed {TOO_BIG} must be an integer from 0"):
        runner.plan_cells(args)
    assert status.main([*BASE, "--seeds", TOO_BIG, "--results-dir", str(tmp_path)]) == 2
    assert "must be an integer from 0 to 4294967295" in capsys.readouterr().err


@pytest.mark.parametrize("parser", [
    probe_command.build_parser, compare.build_parser, leaderboard.build_parser,
    summarize.build_parser, track.build_parser,
])  # fmt: skip
@pytest.mark.parametrize("seed", ["-1", TOO_BIG])
def test_every_seed_flag_is_checked_when_parsed(parser, seed, capsys):
    argv = ["receipt"] if parser is track.build_parser else []
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args([*argv, "--seed", seed])
    assert exit_.value.code == EXIT_INPUT_ERROR
    assert f"{seed!r} is not a seed" in capsys.readouterr().err
