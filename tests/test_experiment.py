"""experiment.py: the experiment file a sweep writes and every later command reads.

Real files and the real CLIs (`main(argv)`): a select sweep writes the file, `select`,
the report sweep, `status` and `summarize` take what they need from it, and a flag that
contradicts it is refused naming both values. Results are built with `result_helpers`
(valid result JSONs), except in the one end-to-end chain, which trains tiny models.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
from fault_helpers import sh
from result_helpers import make_result, make_selection, write_result
from spec_helpers import spec_args, unit_argvs

from encoder_eval import select, status, summarize, sweep
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK, HarnessError
from encoder_eval.core.results import EXPERIMENT_NAME, load_results
from encoder_eval.plans import experiment, selection, sweep_config
from encoder_eval.plans.experiment import Experiment, ModelSpec, PhaseRecord

REPO = Path(__file__).resolve().parents[1]
SHRINK = ["--lr-keys", "lr03,lr06", "--seeds", "42,43", "--max-steps", "4",
          "--max-seq-len", "64", "--device", "cpu"]  # fmt: skip


def unit_args(script: Path) -> list[list[str]]:
    """The `encoder_eval.run` arguments of every unit line of a run_all.sh."""
    units = []
    for line in script.read_text().splitlines():
        if line.startswith("unit "):
            words = shlex.split(line)
            units.append(spec_args(words[words.index("--") + 1 :]))
    assert units, f"no unit lines in {script}"
    return units


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.fixture
def chdir(tmp_path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(cwd)


def select_sweep(tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    """A shrunken select sweep of two models (one added, one liquid-bidir) on glue_rte, with
    a data directory; returns (results dir, out dir)."""
    (tmp_path / "mirror").mkdir(exist_ok=True)
    rdir, out = tmp_path / "results/select", tmp_path / "runs/select"
    argv = ["--phase", "select", "--model", "m=org/m", "--model", "lfm.x=org/lfm:liquid-bidir",
            "--tasks", "glue_rte", *SHRINK, "--data-dir", str(tmp_path / "mirror"),
            "--out-dir", str(out), "--results-dir", str(rdir), *extra]  # fmt: skip
    assert sweep.main(argv) == EXIT_OK
    return rdir, out


def fill_select(rdir: Path, seeds=(42, 43), keys=("lr03", "lr06")) -> None:
    """Select results as the sweep's cells write them (max_steps 4, max_seq_len 64)."""
    for model, mode in (("m", "auto"), ("lfm.x", "liquid-bidir")):
        for key in keys:
            for seed in seeds:
                score = 0.3 + 0.1 * (key == "lr06") + 0.01 * seed
                write_result(rdir, make_result(model, "glue_rte", key, seed, "select", score,
                                               recipe={"max_steps": 4, "max_seq_len": 64},
                                               mode=mode))  # fmt: skip


def run_select(tmp_path: Path, rdir: Path, *extra: str) -> Path:
    out = tmp_path / "selection.json"
    assert select.main(["--results-dir", str(rdir), "--out", str(out), *extra]) == EXIT_OK
    return out


# ----------------------------------------------------------------------------- the file


def full_experiment() -> Experiment:
    return Experiment(
        models={
            "m": ModelSpec("org/m"),
            "lfm2.5-x": ModelSpec('/odd "dir"\\ünï\x7fcode\n', "liquid-bidir", True),
        },
        tasks=["glue_rte", "glue_sst2"],
        tasks_files=["/tasks/a.toml"],
        task_rows={"glue_rte": {"labels": ["a", "b"], "nested": {"x": 1.5, "y": [{"z": True}]}}},
        lr_keys=["lr03", "lr06"],
        seeds={"select": [42, 43], "report": [45]},
        max_steps=4,
        max_seq_len=64,
        data_dir="/data/mirror",
        device="cpu",
        selection_split="holdout",
        recipe_entries={"micro_batch": 8, "precision": "fp32", "compile": True},
        report_to="mlflow",
        extra_run_args=["--tracking-dir", "/t"],
        phases={
            "select": PhaseRecord("/r/select", "/runs/select"),
            "report": PhaseRecord("/r/report", "/runs/report", "/sel.json"),
        },  # fmt: skip
        phase="report",
    )


def test_round_trip_through_the_toml_file(tmp_path):
    exp = full_experiment()
    path = tmp_path / EXPERIMENT_NAME
    experiment.write(exp, path)
    assert tomllib.loads(path.read_text()) == exp.to_dict()
    back = experiment.load(path)
    assert back == exp
    # An experiment without task rows writes its tasks as a list, and reads back the same.
    plain = Experiment(tasks=["glue_rte"], models={"xlm-r-base": ModelSpec(
        "FacebookAI/xlm-roberta-base")})  # fmt: skip
    experiment.write(plain, path)
    assert tomllib.loads(path.read_text())["tasks"] == ["glue_rte"]
    assert experiment.load(path) == plain


def test_the_serializer_writes_what_tomllib_reads_for_hostile_keys_and_values():
    data = {"a.b": {"k y": "v\t\"\\", "": 1}, "ok_key": [1.0e-5, float("inf"), -0.0, False],
            "e": {}, "inline": [{"x": "y"}], "nested": {"deeper": {"deepest": {"n": 3}}}}  # fmt: skip
    assert tomllib.loads(experiment.dumps(data)) == data


def write_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        ("max_step = 4\n", r"exp\.toml: unknown field 'max_step'\. Valid fields: .*recipe"),
        (
            "[recipe]\nmax_step = 4\n",
            r"recipe: unknown field 'max_step'\. Did you mean "
            r"'max_steps'\? Valid fields: adam_beta2, batch_size, ",
        ),
        (
            "[recipe]\nmax_steps = 'four'\n",
            r"recipe\.max_steps must be an integer >= 1, got "
            r"'four'",
        ),
        ("device = 'gpu'\n", r"device is 'gpu'; valid values: auto, cuda, cpu"),
        ("lr_keys = ['lr99']\n", r"lr_keys holds 'lr99'; valid keys: lr01, "),
        (
            "[models.x]\npath = 'org/x'\nmode = 'bidir'\n",
            r"models\.x\.mode is 'bidir'; valid "
            r"values: auto, liquid-bidir",
        ),
        ("[models.x]\nmode = 'auto'\n", r"models\.x has no path and is not a registry model"),
        (
            "[models.xlm-r-base]\nmode = 'liquid-bidir'\n",
            r"contradicts the registry model "
            r"'xlm-r-base': mode 'liquid-bidir'",
        ),
        (
            "[seeds]\nselect = [-1]\n",
            r"seeds\.select must be an integer >= 0 and <= 4294967295, "
            "got -1",
        ),
        (
            "[seeds]\nselect = [4294967296]\n",
            r"seeds\.select must be an integer >= 0 and <= "
            "4294967295, got 4294967296",
        ),
        ("[seeds]\nreprt = [45]\n", r"seeds: unknown field 'reprt'\. Did you mean 'report'\?"),
        ("version = 9\n", r"version is 9; this harness reads version 1"),
        ("tasks = [\n", r"is not valid TOML"),
    ],
)
def test_a_malformed_file_names_the_file_the_field_and_the_valid_values(tmp_path, text, expected):
    path = write_file(tmp_path, text)
    with pytest.raises(HarnessError, match=expected):
        experiment.load(path)


def test_an_unknown_field_in_a_user_file_stops_the_sweep_with_one_line(tmp_path, capsys):
    path = write_file(tmp_path, "version = 1\ntasks = ['glue_rte']\nmax_steps = 4\n")
    argv = ["--experiment", str(path), "--phase", "select", "--out-dir", str(tmp_path / "o"),
            "--results-dir", str(tmp_path / "r")]  # fmt: skip
    assert sweep.main(argv) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "unknown field 'max_steps'" in err and "Valid fields:" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()


def test_an_unknown_task_in_a_user_file_names_the_file(tmp_path, capsys):
    path = write_file(tmp_path, "version = 1\ntasks = ['glue_rte', 'rtee']\n")
    argv = ["--experiment", str(path), "--phase", "select", "--out-dir", str(tmp_path / "o"),
            "--results-dir", str(tmp_path / "r")]  # fmt: skip
    assert sweep.main(argv) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: tasks: unknown task 'rtee'.")
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_relative_paths_are_read_from_the_files_folder(tmp_path, chdir):
    (tmp_path / "cfg" / "mirror").mkdir(parents=True)
    (tmp_path / "cfg" / "model").mkdir()
    path = tmp_path / "cfg" / "exp.toml"
    path.write_text("data_dir = 'mirror'\n[models.mine]\npath = 'model'\n"
                    "[models.hub]\npath = 'org/hub-model'\n")  # fmt: skip
    exp = experiment.load(path)
    assert exp.data_dir == str(tmp_path / "cfg" / "mirror")
    assert exp.models["mine"].path == str(tmp_path / "cfg" / "model")
    assert exp.models["hub"].path == "org/hub-model"  # no such directory: a Hub id


# ----------------------------------------------------------------------------- the chain


def test_the_sweep_writes_the_experiment_beside_its_scripts_and_into_its_results(tmp_path):
    rdir, out = select_sweep(tmp_path)
    for where in (rdir, out):
        exp = experiment.load(where / EXPERIMENT_NAME)
        assert exp.phase == "select"
        assert exp.models == {"m": ModelSpec("org/m"), "lfm.x": ModelSpec("org/lfm",
                                                                          "liquid-bidir")}  # fmt: skip
        assert exp.tasks == ["glue_rte"] and exp.lr_keys == ["lr03", "lr06"]
        assert exp.seeds == {"select": [42, 43]}
        assert (exp.max_steps, exp.max_seq_len, exp.device) == (4, 64, "cpu")
        assert exp.data_dir == str(tmp_path / "mirror") and exp.selection_split == "dev"
        assert exp.phases == {"select": PhaseRecord(str(rdir), str(out))}
    # The results readers pass over the file without a word.
    assert load_results(rdir) == []


def test_select_reads_lr_keys_and_seeds_from_the_file_and_records_the_experiment(tmp_path):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel_path = run_select(tmp_path, rdir)  # no --lr-keys, no --seeds
    sel = selection.load_selection(sel_path)
    assert sel["version"] == 3
    assert sel["policy"]["lr_keys"] == ["lr03", "lr06"] and sel["policy"]["seeds"] == [42, 43]
    assert sel["pairs"]["m"]["glue_rte"]["lr_key"] == "lr06"
    assert experiment.from_selection(sel, str(sel_path)) == experiment.load(rdir / EXPERIMENT_NAME)
    # Flags that agree or narrow the pairs are accepted.
    run_select(tmp_path, rdir, "--lr-keys", "lr03,lr06", "--seeds", "42,43", "--models", "m")
    # Seeds beyond the file's (as `status --seeds 42,43,44 --emit` adds) are expected too.
    out = tmp_path / "more.json"
    assert select.main(["--results-dir", str(rdir), "--out", str(out), "--seeds", "42,43,44"]) == 1
    fill_select(rdir, seeds=(44,))
    assert selection.load_selection(run_select(tmp_path, rdir, "--seeds", "42,43,44"))["policy"][
        "seeds"
    ] == [42, 43, 44]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seeds", "42"], "--seeds 42 contradicts {R} (seeds 42,43)"),
        (["--seeds", "42,44"], "--seeds 42,44 contradicts {R} (seeds 42,43)"),
        (["--lr-keys", "lr03"], "--lr-keys lr03 contradicts {R} (lr_keys lr03,lr06)"),
        (["--models", "other"], "--models other contradicts {R} (its models: m, lfm.x)"),
    ],
)
def test_select_refuses_a_flag_that_contradicts_the_file(tmp_path, capsys, extra, message):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    out = tmp_path / "selection.json"
    assert select.main(["--results-dir", str(rdir), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message.format(R=rdir / EXPERIMENT_NAME) in err
    assert "drop it: select reads what the sweep ran from its experiment file" in err
    assert not out.exists()


def test_select_names_how_to_finish_a_sweep_its_file_describes(tmp_path, capsys):
    rdir, out = select_sweep(tmp_path)
    fill_select(rdir)
    (rdir / "m_glue_rte_lr06_s43.json").unlink()
    assert select.main(["--results-dir", str(rdir), "--out", str(tmp_path / "s.json")]) == 1
    err = capsys.readouterr().err
    assert f"re-run the script in {out}" in err
    assert f"encoder-eval status --results-dir {rdir} --emit DIR" in err
    assert "shrunken" not in err and "m/glue_rte/lr06/s43: missing" in err


def report_sweep(tmp_path: Path, sel: Path, *extra: str) -> int:
    return sweep.main(["--phase", "report", "--selection", str(sel), "--out-dir",
                       str(tmp_path / "runs/report"), "--results-dir",
                       str(tmp_path / "results/report"), *extra])  # fmt: skip


def test_the_report_sweep_runs_as_its_select_phase_did(tmp_path):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel = run_select(tmp_path, rdir)
    assert report_sweep(tmp_path, sel, "--seeds", "45,46") == EXIT_OK  # no shrinking flags
    units = unit_args(tmp_path / "runs/report/run_all.sh")
    assert {(flag(u, "--model-key"), flag(u, "--model-path"), flag(u, "--mode")) for u in units} \
        == {("m", "org/m", "auto"), ("lfm.x", "org/lfm", "liquid-bidir")}  # fmt: skip
    for u in units:
        assert flag(u, "--max-steps") == "4" and flag(u, "--max-seq-len") == "64"
        assert flag(u, "--device") == "cpu" and flag(u, "--data-dir") == str(tmp_path / "mirror")
        assert flag(u, "--task") == "glue_rte" and flag(u, "--seed") == "45,46"
        assert flag(u, "--selection-split") == "dev" and flag(u, "--lr") == "3.59e-05"
    exp = experiment.load(tmp_path / "results/report" / EXPERIMENT_NAME)
    assert exp.phase == "report" and exp.seeds == {"select": [42, 43], "report": [45, 46]}
    assert exp.phases["report"].selection == str(sel)
    assert exp.phases["select"].results_dir == str(rdir)
    assert (exp.max_steps, exp.device, exp.data_dir) == (4, "cpu", str(tmp_path / "mirror"))


def test_resolve_returns_the_merged_flags_and_leaves_the_namespace_as_parsed(tmp_path):
    """The report phase's flags, filled from the select phase's experiment, come back as a
    frozen `SweepConfig`; the parsed Namespace is not written to."""
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel = run_select(tmp_path, rdir)
    args = sweep.build_parser().parse_args(["--phase", "report", "--selection", str(sel),
                                            "--seed", "45,46"])  # fmt: skip
    before = dict(vars(args))
    cfg = sweep_config.resolve(args)
    assert vars(args) == before
    assert (cfg.phase, cfg.seeds, cfg.max_steps, cfg.max_seq_len, cfg.device) == (
        "report", (45, 46), 4, 64, "cpu")  # fmt: skip
    assert cfg.models == ("m", "lfm.x") and cfg.tasks == ("glue_rte",)
    assert cfg.data_dir == str(tmp_path / "mirror") and cfg.selection == str(sel)
    assert cfg.sources[1] is not None and cfg.unconsented is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_steps = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-steps", "8"], "--max-steps 8 contradicts the select phase (4)"),
        (["--max-seq-len", "256"], "--max-seq-len 256 contradicts the select phase (64)"),
        (["--device", "cuda"], "--device cuda contradicts the select phase (cpu)"),
        (["--data-dir", "."], "--data-dir {cwd} contradicts the select phase ({mirror})"),
        (
            ["--model", "m=org/other"],
            "--model m=org/other:auto contradicts the select phase (m=org/m:auto)",
        ),
        (["--models", "x"], "--models x contradicts the select phase (its models: m, lfm.x)"),
        (
            ["--tasks", "glue_sst2"],
            "--tasks glue_sst2 contradicts the select phase (its tasks: glue_rte)",
        ),
    ],
)
def test_a_report_flag_that_contradicts_the_select_phase_is_refused(tmp_path, capsys, extra,
                                                                     message):  # fmt: skip
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel = run_select(tmp_path, rdir)
    capsys.readouterr()
    assert report_sweep(tmp_path, sel, *extra) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    expected = message.format(cwd=os.getcwd(), mirror=tmp_path / "mirror")
    assert err == f"error: {expected}; drop it: the report phase runs as its select phase did\n"
    assert not (tmp_path / "runs/report").exists()
    assert not (tmp_path / "results/report").exists()


def test_a_report_flag_that_agrees_or_narrows_is_accepted(tmp_path):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel = run_select(tmp_path, rdir)
    assert report_sweep(tmp_path, sel, "--max-steps", "4", "--device", "cpu",
                        "--models", "lfm.x") == EXIT_OK  # fmt: skip
    units = unit_args(tmp_path / "runs/report/run_all.sh")
    assert [flag(u, "--model-key") for u in units] == ["lfm.x"]
    assert flag(units[0], "--mode") == "liquid-bidir" and flag(units[0], "--max-steps") == "4"


def test_status_rebuilds_its_plan_from_the_file_and_emits_the_shrunk_flags(tmp_path, capsys):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    (rdir / "m_glue_rte_lr06_s43.json").unlink()
    rest = tmp_path / "rest"
    assert status.main(["--results-dir", str(rdir), "--emit", str(rest)]) == EXIT_INCOMPLETE
    out = capsys.readouterr().out
    assert "select phase" in out and "8 cells planned" in out and "missing       1" in out
    (unit,) = unit_args(rest / "run_all.sh")
    assert flag(unit, "--model-key") == "m" and flag(unit, "--seed") == "43"
    assert flag(unit, "--lr") == "3.59e-05" and flag(unit, "--max-steps") == "4"
    assert flag(unit, "--max-seq-len") == "64" and flag(unit, "--device") == "cpu"
    assert flag(unit, "--data-dir") == str(tmp_path / "mirror")
    # How cells run may not contradict the file; which cells status counts may differ.
    assert status.main(["--results-dir", str(rdir), "--max-steps", "10000"]) == EXIT_INPUT_ERROR
    assert capsys.readouterr().err == (
        f"error: --max-steps 10000 contradicts {rdir / EXPERIMENT_NAME} (4); drop it: the "
        "cells status emits run as the sweep's did\n"
    )
    assert status.main(["--results-dir", str(rdir), "--models", "lfm.x"]) == EXIT_OK
    assert "4 cells planned" in capsys.readouterr().out
    more = tmp_path / "more"
    argv = ["--results-dir", str(rdir), "--seeds", "42,43,44", "--emit", str(more)]
    assert status.main(argv) == EXIT_INCOMPLETE
    assert "12 cells planned" in capsys.readouterr().out
    assert {flag(u, "--seed") for u in unit_args(more / "run_all.sh")} == {"43,44", "44"}
    assert {flag(u, "--max-steps") for u in unit_args(more / "run_all.sh")} == {"4"}
    assert status.main(["--results-dir", str(rdir), "--phase", "report"]) == EXIT_INPUT_ERROR
    assert "--phase report contradicts" in capsys.readouterr().err


def test_status_and_summarize_of_the_report_phase_need_only_the_results_dir(tmp_path, capsys):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel = run_select(tmp_path, rdir)
    assert report_sweep(tmp_path, sel, "--seeds", "45,46") == EXIT_OK
    report = tmp_path / "results/report"
    capsys.readouterr()
    assert status.main(["--results-dir", str(report)]) == EXIT_INCOMPLETE
    assert "report phase" in capsys.readouterr().out
    for model, mode in (("m", "auto"), ("lfm.x", "liquid-bidir")):
        for seed in (45, 46):
            write_result(report, make_result(model, "glue_rte", "lr06", seed, "report",
                                             0.3 + 0.01 * seed, mode=mode,
                                             recipe={"max_steps": 4, "max_seq_len": 64}))  # fmt: skip
    assert status.main(["--results-dir", str(report)]) == EXIT_OK
    assert "done          4" in capsys.readouterr().out
    # summarize finds the selection in the file; a shrunken table is still refused...
    assert summarize.main(["--results-dir", str(report)]) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "[off_protocol]" in err and "[missing_seeds]" in err
    assert "note: the report sweep ran seeds 45,46 (its experiment file)" in err
    # ... and printed with --allow-partial, over the seeds it has.
    assert summarize.main(["--results-dir", str(report), "--allow-partial",
                           "--format", "json"]) == EXIT_OK  # fmt: skip
    table = json.loads(capsys.readouterr().out)
    cell = table["rows"][0]["cells"]["glue_rte"]
    assert cell["n"] == 2 and cell["seeds"] == [45, 46] and cell["lr_key"] == "lr06"
    # Another selection than the one the report sweep ran from is refused.
    other = tmp_path / "other.json"
    other.write_text(sel.read_text())
    assert summarize.main(["--results-dir", str(report), "--selection", str(other)]) == 2
    assert f"--selection {other} contradicts" in capsys.readouterr().err


def test_summarize_without_a_file_still_needs_the_selection(tmp_path, capsys):
    rdir = tmp_path / "r"
    write_result(rdir, make_result("m", "glue_rte", "lr06", 45, "report", 0.7))
    assert summarize.main(["--results-dir", str(rdir)]) == EXIT_INPUT_ERROR
    assert "give --selection selection.json (" in capsys.readouterr().err


def test_summarize_names_an_empty_folder_and_a_select_folder(tmp_path, capsys):
    # a new user's two mistakes: the folder is empty, or it is the select sweep's
    (tmp_path / "empty").mkdir()
    assert summarize.main(["--results-dir", str(tmp_path / "empty")]) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    assert "holds no results and no experiment file" in err and "--selection" not in err
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    for extra in ([], ["--selection", str(run_select(tmp_path, rdir))]):
        capsys.readouterr()
        assert summarize.main(["--results-dir", str(rdir), *extra]) == EXIT_INPUT_ERROR
        err = capsys.readouterr().err
        assert f"says {rdir} holds select-phase results" in err
        assert f"encoder-eval select --results-dir {rdir}" in err and "--phase report" in err


# ----------------------------------------------------------------------------- a user's file


def test_a_user_written_file_starts_the_protocol(tmp_path, capsys):
    """examples/experiment.toml, with the demo model given by --model, as docs/protocol.md shows."""
    argv = ["--experiment", str(REPO / "examples/experiment.toml"), "--phase", "select",
            "--model", "all-minilm-l6-v2=org/all-minilm", "--out-dir", str(tmp_path / "runs/select"),
            "--results-dir", str(tmp_path / "results/select")]  # fmt: skip
    assert sweep.main(argv) == EXIT_OK
    units = unit_args(tmp_path / "runs/select/run_all.sh")
    assert [flag(u, "--task") for u in units] == ["synthetic_sentiment", "synthetic_nli",
                                                  "synthetic_rating"]  # fmt: skip
    for u in units:
        assert flag(u, "--lr") == "3.59e-05,0.0001" and flag(u, "--seed") == "42,43"
        assert flag(u, "--max-steps") == "40" and flag(u, "--max-seq-len") == "128"
        assert flag(u, "--device") == "cpu" and "--data-dir" not in u
    exp = experiment.load(tmp_path / "results/select" / EXPERIMENT_NAME)
    # The report seeds the user wrote travel with the select phase to the report sweep.
    assert exp.seeds == {"select": [42, 43], "report": [45, 46, 47]}
    rdir = tmp_path / "results/select"
    for task in exp.tasks:
        for key in ("lr06", "lr10"):
            for seed in (42, 43):
                write_result(rdir, make_result("all-minilm-l6-v2", task, key, seed, "select",
                                               0.5, recipe={"max_steps": 40,
                                                            "max_seq_len": 128}))  # fmt: skip
    sel = run_select(tmp_path, rdir)
    assert report_sweep(tmp_path, sel) == EXIT_OK
    for u in unit_args(tmp_path / "runs/report/run_all.sh"):
        assert flag(u, "--seed") == "45,46,47" and flag(u, "--max-steps") == "40"
        assert flag(u, "--model-path") == "org/all-minilm"


def test_flags_win_over_a_user_file_in_the_select_phase(tmp_path):
    path = write_file(tmp_path, "tasks = ['glue_rte']\nlr_keys = ['lr03']\n"
                      "[models.m]\npath = 'org/m'\n[recipe]\nmax_steps = 40\n")  # fmt: skip
    argv = ["--experiment", str(path), "--phase", "select", "--max-steps", "8", "--out-dir",
            str(tmp_path / "o"), "--results-dir", str(tmp_path / "r")]  # fmt: skip
    assert sweep.main(argv) == EXIT_OK
    (unit,) = unit_args(tmp_path / "o/run_all.sh")
    assert flag(unit, "--max-steps") == "8" and flag(unit, "--model-path") == "org/m"
    assert experiment.load(tmp_path / "r" / EXPERIMENT_NAME).max_steps == 8


def test_extra_run_args_add_to_a_user_files_recipe_entry_by_entry(tmp_path):
    """--extra-run-args given with an experiment file wins for the entries it names; the
    file's other [recipe] entries (precision, limit) stay, in the units and the record."""
    path = write_file(tmp_path, "tasks = ['glue_rte']\nlr_keys = ['lr03']\n"
                      "[models.m]\npath = 'org/m'\n"
                      "[recipe]\nlimit = 16\nprecision = 'fp32'\nwarmup_ratio = 0.2\n")  # fmt: skip
    for extra, want in (
        ("--pad-multiple 32", {"--limit": "16", "--precision": "fp32", "--pad-multiple": "32"}),
        ("--limit 8 --precision bf16", {"--limit": "8", "--precision": "bf16"}),
    ):
        out, res = tmp_path / f"o{len(extra)}", tmp_path / f"r{len(extra)}"
        argv = ["--experiment", str(path), "--phase", "select", "--extra-run-args", extra,
                "--out-dir", str(out), "--results-dir", str(res)]  # fmt: skip
        assert sweep.main(argv) == EXIT_OK
        (unit,) = unit_args(out / "run_all.sh")
        assert {f: flag(unit, f) for f in want} == want, (extra, unit)
        assert flag(unit, "--warmup-ratio") == "0.2", (extra, unit)
        entries = experiment.load(res / EXPERIMENT_NAME).recipe_entries
        assert entries["warmup_ratio"] == 0.2 and entries["limit"] == int(want["--limit"])


def test_a_user_files_value_that_contradicts_the_select_phase_is_named_as_such(tmp_path, capsys):
    rdir, _ = select_sweep(tmp_path)
    fill_select(rdir)
    sel = run_select(tmp_path, rdir)
    path = write_file(tmp_path, "[recipe]\nmax_steps = 8\n")
    assert report_sweep(tmp_path, sel, "--experiment", str(path)) == EXIT_INPUT_ERROR
    assert f"max_steps = 8 in {path} contradicts the select phase (4)" in capsys.readouterr().err


def test_inline_task_definitions_are_registered_and_planned(tmp_path, task_registry):
    from encoder_eval.data.tasks import TASK_KNOBS

    wnli = (REPO / "examples" / "tasks" / "glue_wnli.toml").read_text(encoding="utf-8")
    row = wnli[wnli.index("[tasks.glue_wnli]") :]  # the example's task table, inline
    path = write_file(tmp_path, "[tasks.glue_rte]\n" + row)
    exp = experiment.load(path)
    assert exp.tasks == ["glue_rte", "glue_wnli"]
    assert exp.task_rows["glue_wnli"]["hf_config"] == "wnli"
    argv = ["--experiment", str(path), "--phase", "select", "--model", "m=org/m",
            "--lr-keys", "lr03", "--seeds", "42", "--out-dir", str(tmp_path / "o"),
            "--results-dir", str(tmp_path / "r"), "--mode", "shell"]  # fmt: skip
    assert sweep.main(argv) == 0
    assert TASK_KNOBS["glue_wnli"].metric == "accuracy"
    script = (tmp_path / "o" / "run_all.sh").read_text(encoding="utf-8")
    units = "\n".join(shlex.join(argv) for argv in unit_argvs(script))
    assert "glue_wnli" in units and "glue_rte" in units
    # every cell process gets the inline definition as a task file in the results directory
    (rows_file,) = (tmp_path / "r").glob(".tasks-*.toml")
    assert str(rows_file) in units
    from encoder_eval.data.taskfile import read_task_file

    assert read_task_file(rows_file)["glue_wnli"]["hf_config"] == "wnli"
    warnings = []
    assert load_results(tmp_path / "r", warn=warnings.append) == [] and warnings == []


# ----------------------------------------------------------------------------- without a file


def test_old_selection_files_and_results_without_a_file_read_as_before(tmp_path, capsys):
    """A version-2 selection (no experiment) drives a report sweep from flags alone."""
    sel = make_selection({("m", "glue_rte"): "lr06"})
    sel["version"] = 2
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(sel))
    assert selection.load_selection(path)["version"] == 2
    assert report_sweep(tmp_path, path, "--model", "m=org/m", "--tasks", "glue_rte",
                        "--max-steps", "8") == EXIT_OK  # fmt: skip
    (unit,) = unit_args(tmp_path / "runs/report/run_all.sh")
    assert flag(unit, "--max-steps") == "8" and flag(unit, "--device") == "auto"
    assert "--data-dir" not in unit
    # status without a file needs --phase, as before
    rdir = tmp_path / "plain"
    rdir.mkdir()
    assert status.main(["--results-dir", str(rdir)]) == EXIT_INPUT_ERROR
    assert "give --phase select or --phase report" in capsys.readouterr().err


# ----------------------------------------------------------------------------- for real


@pytest.mark.slow
def test_the_whole_chain_needs_the_shrinking_flags_once(tmp_path, tiny_models, small_mirror):
    """select sweep -> run_all.sh -> select -> report sweep -> run_all.sh -> summarize ->
    status, training a tiny model for real; only the first command carries the flags."""
    py = [sys.executable, "-m"]
    sh([*py, "encoder_eval.sweep", "--phase", "select", "--model",
        f"tiny-bert={tiny_models['bert']}", "--tasks", "glue_rte", "--lr-keys", "lr10",
        "--seeds", "42", "--max-steps", "2", "--max-seq-len", "32", "--device", "cpu",
        "--data-dir", str(small_mirror), "--out-dir", "runs/select", "--results-dir",
        "results/select"], tmp_path)  # fmt: skip
    sh(["bash", "runs/select/run_all.sh"], tmp_path)
    sh([*py, "encoder_eval.select", "--results-dir", "results/select", "--out", "sel.json"],
       tmp_path)  # fmt: skip
    sh([*py, "encoder_eval.sweep", "--phase", "report", "--selection", "sel.json", "--seeds",
        "45,46", "--out-dir", "runs/report", "--results-dir", "results/report"], tmp_path)  # fmt: skip
    sh(["bash", "runs/report/run_all.sh"], tmp_path)
    table = sh([*py, "encoder_eval.summarize", "--results-dir", "results/report",
                "--allow-partial"], tmp_path).stdout  # fmt: skip
    assert "tiny-bert" in table and "±" in table
    done = sh([*py, "encoder_eval.status", "--results-dir", "results/report"], tmp_path).stdout
    assert "2 cells planned" in done and "done          2" in done
    for r in load_results(tmp_path / "results/report"):
        assert r.data["recipe"]["max_steps"] == 2 and r.data["recipe"]["max_seq_len"] == 32
        assert r.data["training"]["steps"] <= 2
        assert r.data["provenance"]["data"]["identity"].startswith("mirror:")
