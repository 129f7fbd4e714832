"""models.py and run's model resolution: a registry model named by its path keeps its loader."""

from __future__ import annotations

import pytest

from encoder_eval import models, run
from encoder_eval.errors import HarnessError


def planned(tmp_path, *flags: str):
    args = run.build_parser().parse_args([*flags, "--task", "xnli", "--lr", "3.59e-05",
                                          "--seed", "45", "--out-json", str(tmp_path / "o.json")])  # fmt: skip
    (cell,) = run.plan_cells(args)
    return cell


def test_model_path_alone_keeps_the_registry_loader_of_its_hub_id(tmp_path):
    cell = planned(tmp_path, "--model-path", "LiquidAI/LFM2.5-Encoder-230M")
    assert cell.model_key == "lfm2.5-encoder-230m"
    assert cell.mode == "liquid-bidir" and cell.trust_remote_code is True


def test_a_local_copy_named_like_a_registry_model_keeps_its_loader(tmp_path):
    local = tmp_path / "models" / "LFM2.5-Encoder-230M"
    local.mkdir(parents=True)
    assert models.key_from_path(str(local) + "/") == "lfm2.5-encoder-230m"
    cell = planned(tmp_path, "--model-path", str(local))
    assert cell.model_key == "lfm2.5-encoder-230m" and cell.model_path == str(local)
    assert cell.mode == "liquid-bidir" and cell.trust_remote_code is True


def test_explicit_loader_flags_win_over_the_registry(tmp_path):
    cell = planned(tmp_path, "--model-path", "LiquidAI/LFM2.5-Encoder-230M", "--mode", "auto",
                   "--no-trust-remote-code")  # fmt: skip
    assert cell.mode == "auto" and cell.trust_remote_code is False


def test_another_hub_repo_of_the_same_name_is_not_the_registry_model(tmp_path):
    cell = planned(tmp_path, "--model-path", "someone/LFM2.5-Encoder-230M")
    assert cell.model_key == "LFM2.5-Encoder-230M"
    assert cell.mode == "auto" and cell.trust_remote_code is False


@pytest.mark.parametrize(
    "spec, expected",
    [("mine=org/m", ("mine", "org/m", "auto")),
     ("mine=org/m:liquid-bidir", ("mine", "org/m", "liquid-bidir")),
     ("mine=/data/run:3/ckpt", ("mine", "/data/run:3/ckpt", "auto"))],
)  # fmt: skip
def test_parse_model_spec(spec, expected):
    name, entry = models.parse_model_spec(spec)
    assert (name, entry.path, entry.mode) == expected


@pytest.mark.parametrize("spec", ["mine=org/m:bidir", "mine=/models/m:Auto", "mine=org/m:"])
def test_parse_model_spec_refuses_an_unknown_mode(spec):
    with pytest.raises(HarnessError, match=r"unknown mode .*Valid modes: auto, liquid-bidir"):
        models.parse_model_spec(spec)
