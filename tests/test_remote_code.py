"""Remote code runs only by the word of the user who runs the command, and what runs is pinned.

A shared selection or experiment file cannot switch remote code on or add run flags
(issue 23, item 1); reserved flags are found by parsing with `run`'s own parser, so an
abbreviation cannot slip past (item 2); the registry's trust goes with its row's Hub id, not
the name (item 3); code another repository holds (an `auto_map` entry `repo--module.Class`)
is resolved to a commit, passed to transformers and recorded, and refused unpinned in the
strict mode (item 4). The Hub is mocked at one seam only: `provenance.resolve_commit`.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO
from fault_helpers import SHRINK, py, read_json, sh
from spec_helpers import script_with_units

from encoder_eval import probe as probe_command
from encoder_eval import run as run_command
from encoder_eval import status, sweep
from encoder_eval.cells import probe_cell as probe_model
from encoder_eval.cells import runner
from encoder_eval.core import errors, provenance
from encoder_eval.core.errors import EXIT_INPUT_ERROR, HarnessError
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.data import loaders
from encoder_eval.plans import plan
from encoder_eval.plans.plan import CellSettings, PlanInputs

EVIL = "attacker/evil-model"
TASK = "xnli"


def selection_with(tmp_path: Path, experiment: dict, model: str = "evil") -> Path:
    """A selection.json (the format `select` writes) choosing lr06 for (model, xnli), whose
    experiment section is `experiment`: what a collaborator might share."""
    path = tmp_path / "selection.json"
    entry = {"lr_key": "lr06", "lr": LR_GRID["lr06"]}
    path.write_text(json.dumps({"schema": "encoder-eval-selection", "version": 3,
                                "pairs": {model: {TASK: entry}},
                                "experiment": experiment}), encoding="utf-8")  # fmt: skip
    return path


def sweep_main(capsys, *argv) -> tuple[int, str, str]:
    rc = sweep.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_shared_selection_cannot_turn_on_remote_code(tmp_path, capsys):
    sel = selection_with(tmp_path, {"version": 1, "tasks": [TASK], "models": {
        "evil": {"path": EVIL, "trust_remote_code": True}}})  # fmt: skip
    common = ["--phase", "report", "--selection", sel, "--results-dir", tmp_path / "r",
              "--out-dir", tmp_path / "runs"]  # fmt: skip
    rc, out, err = sweep_main(capsys, *common)
    assert rc == EXIT_INPUT_ERROR and len(err.strip().splitlines()) == 1, err
    assert "a file cannot grant that" in err and "--trust-remote-code evil" in err, err
    assert not (tmp_path / "runs" / "run_all.sh").exists()
    # The user's own word turns it on, and the script's writer says which model runs code.
    rc, out, err = sweep_main(capsys, *common, "--trust-remote-code", "evil")
    assert rc == 0, err
    script = script_with_units(tmp_path / "runs" / "run_all.sh")
    assert "--trust-remote-code" in script and EVIL in script
    assert re.search(r"remote code: 1 model\(s\) will run code from their repositories: evil "
                     rf"\({EVIL}, unpinned\)", out), out  # fmt: skip


def test_files_cannot_add_reserved_run_flags(tmp_path, capsys):
    """extra_run_args from a selection, an experiment file or the results folder's
    experiment.toml (status --emit) may not add remote code, a cache or a revision."""
    for flags in (["--trust-remote-code"], ["--cache-dir", "/tmp/x"], ["--model-revision", "a"],
                  ["--no-trust-remote-code"], ["--trust-r"], ["--model-k", "x"]):  # fmt: skip
        sel = selection_with(tmp_path, {"version": 1, "tasks": [TASK], "models": ["xlm-r-base"],
                                        "extra_run_args": flags}, model="xlm-r-base")  # fmt: skip
        rc, _, err = sweep_main(capsys, "--phase", "report", "--selection", sel, "--results-dir",
                                tmp_path / "r", "--out-dir", tmp_path / "runs")  # fmt: skip
        assert rc == EXIT_INPUT_ERROR, (flags, err)
        assert re.search(r"may not set --|unrecognized arguments", err), (flags, err)
        assert len(err.strip().splitlines()) == 1, err
    results = tmp_path / "status-results"
    results.mkdir()
    (results / "experiment.toml").write_text(
        'version = 1\nphase = "select"\ntasks = ["xnli"]\nmodels = ["xlm-r-base"]\n'
        'lr_keys = ["lr06"]\nextra_run_args = ["--trust-remote-code", "--cache-dir", "/tmp/x"]\n'
        "[seeds]\nselect = [42]\n",
        encoding="utf-8",
    )
    rc = status.main(["--results-dir", str(results), "--emit", str(tmp_path / "rest")])
    err = capsys.readouterr().err
    assert rc == EXIT_INPUT_ERROR and "may not set --trust-remote-code" in err, err
    assert not (tmp_path / "rest").exists()


@pytest.mark.parametrize("extra", ["--trust-r", "--trust-remote-code", "--no-trust-remote-code",
                                   "--cache-d /tmp/x", "--cache-dir=/tmp/x", "--model-rev a",
                                   "--model-code-revision a", "--results-d x", "--model-k y",
                                   "--help"])  # fmt: skip
def test_reserved_flags_are_found_by_parsing_not_by_spelling(tmp_path, extra):
    with pytest.raises(HarnessError, match=r"^--extra-run-args"):
        plan.build_plan(
            "select",
            PlanInputs(tmp_path, models=["xlm-r-base"], tasks=[TASK]),
            CellSettings.from_argv(extra.split()),
            lr_keys=["lr06"],
            seeds=[42],
        )


def test_allowed_extra_run_args_still_pass(tmp_path):
    p = plan.build_plan(
        "select",
        PlanInputs(tmp_path, models=["xlm-r-base"], tasks=[TASK]),
        CellSettings.from_argv(["--micro-batch", "8"]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    argv = p.run_args(p.cells)
    assert p.recipe.micro_batch == 8 and argv.count("--micro-batch") == 1
    assert argv[argv.index("--micro-batch") + 1] == "8"


def test_no_parser_of_the_package_accepts_abbreviations():
    sources = "\n".join(p.read_text() for p in (REPO / "encoder_eval").glob("*.py"))
    assert "argparse.ArgumentParser(" not in sources  # every parser is errors.ArgumentParser
    assert errors.ArgumentParser().allow_abbrev is False
    for argv in (["--model-k", "eurobert-210m"], ["--trust-r"], ["--results-d", "x"]):
        with pytest.raises(SystemExit):
            run_command.build_parser().parse_args(
                ["--task", TASK, "--lr", "1e-5", "--seed", "42", *argv]
            )


@pytest.mark.parametrize("flags, trusted", [
    (["--model-key", "eurobert-210m"], True),
    (["--model-key", "eurobert-210m", "--model-path", "someone/other-model"], False),
    (["--model-key", "eurobert-210m", "--model-path", "EuroBERT/EuroBERT-210m"], True),
    (["--model-path", "EuroBERT/EuroBERT-210m"], True),
    (["--model-key", "eurobert-210m", "--model-path", "someone/other-model",
      "--trust-remote-code"], True),
], ids=["row", "other-hub-id", "row-spelled-out", "row-by-path", "user-says"])  # fmt: skip
def test_trust_follows_the_registry_row_and_its_hub_id(tmp_path, flags, trusted):
    args = run_command.build_parser().parse_args([*flags, "--task", TASK, "--lr", "3.59e-05", "--seed",
                                          "45", "--out-json", str(tmp_path / "o.json")])  # fmt: skip
    (cell,) = runner.plan_cells(args)
    assert cell.trust_remote_code is trusted


def test_a_local_folder_named_like_a_registry_model_gets_no_trust(tmp_path, monkeypatch):
    folder = tmp_path / "EuroBERT-210m"
    folder.mkdir()
    args = run_command.build_parser().parse_args(["--model-path", str(folder), "--task", TASK, "--lr",
                                          "3.59e-05", "--seed", "45", "--out-json",
                                          str(tmp_path / "o.json")])  # fmt: skip
    (cell,) = runner.plan_cells(args)
    assert cell.model_key == "eurobert-210m" and cell.trust_remote_code is False
    # The same in a sweep's plan, where a registry row's Hub id names a local folder.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "EuroBERT" / "EuroBERT-210m").mkdir(parents=True)
    p = plan.build_plan(
        "select",
        PlanInputs(tmp_path / "r", models=["eurobert-210m"], tasks=[TASK]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    assert p.cells[0].model_path == str(tmp_path / "EuroBERT" / "EuroBERT-210m")
    assert p.cells[0].trust_remote_code is False
    assert probe_model.resolve_model("eurobert-210m=someone/other").trust_remote_code is False


# ----------------------------------------------------------------------------- code pins

SHA = "1" * 40  # the commit the mocked Hub resolves the code repository's head to
OTHER = "other/tinyenc-impl"


def cross_repo_model(tiny_models, tmp_path: Path) -> Path:
    """The remote-code tiny model with its auto_map pointing at another repository's code
    (as mGTE's points at Alibaba-NLP/new-impl), its own copy of the code removed."""
    model = tmp_path / "cross"
    shutil.copytree(tiny_models["tinyenc"], model)
    for name in ("configuration_tinyenc.py", "modeling_tinyenc.py"):
        (model / name).unlink()
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {k: f"{OTHER}--{v}" for k, v in config["auto_map"].items()}
    (model / "config.json").write_text(json.dumps(config))
    return model


def hub_cache(tiny_models, root: Path) -> Path:
    """An HF_HOME whose hub cache holds OTHER's code at commit SHA, and at its `main` a
    different commit whose code fails on import: only the pinned commit loads."""
    repo = root / "hub" / f"models--{OTHER.replace('/', '--')}"
    main = "2" * 40
    for commit in (SHA, main):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for name in ("configuration_tinyenc.py", "modeling_tinyenc.py"):
            text = (tiny_models["tinyenc"] / name).read_text()
            if commit == main:
                text = 'raise RuntimeError("unpinned head code ran")\n' + text
            (snap / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(main)
    return root


def test_code_repositories_are_read_from_auto_map():
    assert provenance.code_repositories(
        {"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
         "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
         "AutoModelForMaskedLM": "modeling_own.Masked"},
        {"AutoTokenizer": ["org/tok--tok.Slow", None]}, None,
    ) == ["Alibaba-NLP/new-impl", "org/tok"]  # fmt: skip


def test_the_code_of_another_repository_is_resolved_once_and_pinned(
    tiny_models, tmp_path, monkeypatch
):
    model = cross_repo_model(tiny_models, tmp_path)
    asked = []

    def resolve(repo, revision):
        asked.append((repo, revision))
        return SHA

    monkeypatch.setattr(provenance, "resolve_commit", resolve)
    code = loaders.pin_remote_code(str(model), "x", None, None)
    assert code == {"repositories": {OTHER: SHA}, "code_revision_requested": None,
                    "code_revision": SHA}  # fmt: skip
    assert asked == [(OTHER, None)]
    assert loaders.pin_remote_code(str(model), "x", None, "v1.0")["code_revision"] == SHA
    assert asked[-1] == (OTHER, "v1.0")
    asked.clear()  # a full commit needs no lookup
    assert loaders.pin_remote_code(str(model), "x", None, "a" * 40, require=True)[
        "repositories"] == {OTHER: "a" * 40}  # fmt: skip
    assert asked == []
    with pytest.raises(HarnessError, match="pin it with --model-code-revision"):
        loaders.pin_remote_code(str(model), "x", None, None, require=True)
    # The model's own code (no other repository) needs no pin.
    assert loaders.pin_remote_code(str(tiny_models["tinyenc"]), "x", None, None, True) is None


def test_a_cell_runs_and_records_the_pinned_code(tiny_models, small_mirror, tmp_path):
    """End to end, offline: the code repository's head is resolved (mocked Hub lookup) to a
    commit, transformers loads the code at that commit (its `main` holds code that fails),
    and the result records it; the strict mode refuses the same run unpinned."""
    model = cross_repo_model(tiny_models, tmp_path)
    home = hub_cache(tiny_models, tmp_path / "hf")
    out = tmp_path / "cell.json"
    mock = (f"import sys; import encoder_eval.core.provenance as p; "
            f"p.resolve_commit = lambda repo, rev: {SHA!r}; "
            "from encoder_eval.run import main; sys.exit(main(sys.argv[1:]))")  # fmt: skip
    cell = ["--model-path", model, "--model-key", "cross", "--task", "sg_cb", "--lr", "3.59e-05",
            "--seed", "45", "--trust-remote-code", "--data-dir", small_mirror, *SHRINK,
            "--progress", "quiet", "--no-cache"]  # fmt: skip
    proc = sh([sys.executable, "-c", mock, *map(str, cell), "--out-json", str(out)], tmp_path,
              HF_HOME=str(home))  # fmt: skip
    code = read_json(out)["provenance"]["model_code"]
    assert code == {"repositories": {OTHER: SHA}, "code_revision_requested": None,
                    "code_revision": SHA}, code  # fmt: skip
    assert f"and code from {OTHER} at {SHA}" in proc.stderr
    strict = sh(py("encoder_eval.run", *map(str, cell), "--require-code-revision",
                   "--out-json", str(tmp_path / "strict.json")), tmp_path, ok=(2,),
                HF_HOME=str(home))  # fmt: skip
    assert strict.stderr.strip().splitlines()[-1].startswith("error: cross: its auto_map runs "
                                                             f"code from {OTHER}")  # fmt: skip
    assert not (tmp_path / "strict.json").exists()


def test_pins_reach_every_cell_from_a_file_and_the_registry(tmp_path, capsys, monkeypatch):
    exp = tmp_path / "exp.toml"
    exp.write_text(f'version = 1\ntasks = ["{TASK}"]\nlr_keys = ["lr06"]\n'
                   f'[models.mine]\npath = "{EVIL}"\nrevision = "{"b" * 40}"\n'
                   f'code_revision = "{SHA}"\n[seeds]\nselect = [42]\n', encoding="utf-8")  # fmt: skip
    rc, out, err = sweep_main(capsys, "--experiment", exp, "--phase", "select", "--results-dir",
                              tmp_path / "r", "--out-dir", tmp_path / "runs")  # fmt: skip
    assert rc == 0, err
    script = script_with_units(tmp_path / "runs" / "run_all.sh")
    assert f"--model-revision {'b' * 40} --model-code-revision {SHA}" in script
    recorded = (tmp_path / "r" / "experiment.toml").read_text()
    assert f'code_revision = "{SHA}"' in recorded
    from encoder_eval.data import models

    monkeypatch.setitem(models.MODEL_REGISTRY, "pinned",
                        models.ModelEntry("org/pinned", mode="auto", trust_remote_code=True,
                                          revision="c" * 40, code_revision=SHA))  # fmt: skip
    p = plan.build_plan(
        "select",
        PlanInputs(tmp_path / "r2", models=["pinned"], tasks=[TASK]),
        lr_keys=["lr06"],
        seeds=[42],
    )
    args = p.run_args(p.cells)
    assert "--trust-remote-code" in args and args[args.index("--model-code-revision") + 1] == SHA
    parsed = run_command.build_parser().parse_args(["--model-key", "pinned", "--task", TASK, "--lr",
                                            "3.59e-05", "--seed", "45", "--out-json", "o.json"])  # fmt: skip
    (cell,) = runner.plan_cells(parsed)
    assert (cell.model_revision, cell.model_code_revision) == ("c" * 40, SHA)


def test_probe_takes_the_revision_flags_as_run_does():
    parser = probe_command.build_parser()
    r = probe_model.run_from_args(parser.parse_args(
        ["--model", "m=org/m", "--tasks", "glue_sst2", "--model-revision", "abc",
         "--model-code-revision", SHA, "--require-code-revision"]))  # fmt: skip
    assert (r.models[0].revision, r.models[0].code_revision) == ("abc", SHA)
    assert r.require_code_revision is True
    with pytest.raises(HarnessError, match="pin one model"):
        probe_model.run_from_args(parser.parse_args(
            ["--model", "a=org/a", "--model", "b=org/b", "--tasks", "glue_sst2",
             "--model-revision", "abc"]))  # fmt: skip


def test_status_counts_without_consent_but_emits_only_with_it(tmp_path, capsys):
    results = tmp_path / "r"
    results.mkdir()
    (results / "experiment.toml").write_text(
        f'version = 1\nphase = "select"\ntasks = ["{TASK}"]\nlr_keys = ["lr06"]\n'
        f'[models.evil]\npath = "{EVIL}"\ntrust_remote_code = true\n[seeds]\nselect = [42]\n',
        encoding="utf-8",
    )
    assert status.main(["--results-dir", str(results)]) == 1  # reading needs no consent
    assert "missing" in capsys.readouterr().out
    emit = ["--results-dir", str(results), "--emit", str(tmp_path / "rest")]
    assert status.main(emit) == EXIT_INPUT_ERROR
    assert "--trust-remote-code evil" in capsys.readouterr().err
    assert not (tmp_path / "rest").exists()
    assert status.main([*emit, "--trust-remote-code", "evil"]) == 1
    assert "remote code: 1 model(s)" in capsys.readouterr().out
    assert "--trust-remote-code" in script_with_units(tmp_path / "rest" / "run_all.sh")
