"""What a shared file records (SECURITY.md, "What each file records"): probe results keep
the model path only with --record-model-path, and `select --redact-paths` writes a selection
with no local path that a collaborator's report sweep completes with their own."""

from __future__ import annotations

import json

import pytest
from result_helpers import make_result, write_many
from spec_helpers import script_with_units

from encoder_eval import probe, select, sweep
from encoder_eval.core.errors import HarnessError


@pytest.mark.parametrize("record", [False, True])
def test_probe_results_record_the_model_path_only_when_asked(record, tiny_models, small_mirror,
                                                              tmp_path):  # fmt: skip
    out = tmp_path / "probes"
    argv = ["--model", f"tiny={tiny_models['bert']}", "--tasks", "glue_rte", "--data-dir",
            str(small_mirror), "--results-dir", str(out), "--k-folds", "2", "--max-seq-len",
            "32", "--device", "cpu", "--limit", "24", "--no-cache"]  # fmt: skip
    assert probe.main(argv + (["--record-model-path"] if record else [])) == 0
    [path] = out.glob("*.probe.json")
    text = path.read_text()
    record_ = json.loads(text)
    assert (str(tiny_models["bert"]) in text) is record
    assert record_["cell"]["model_path"] == (str(tiny_models["bert"]) if record else None)


def _select_phase(tmp_path, model_dir, mirror):
    """A select sweep's experiment.toml (a local model, a data mirror) and its results."""
    res = tmp_path / "select"
    assert sweep.main([
        "--phase", "select", "--model", f"mine={model_dir}", "--tasks", "glue_rte",
        "--lr-keys", "lr06,lr08", "--seeds", "42", "--data-dir", str(mirror),
        "--results-dir", str(res), "--out-dir", str(tmp_path / "runs_select"),
    ]) == 0  # fmt: skip
    write_many(res, [make_result("mine", "glue_rte", key, 42, "select", score,
                                 recipe={"max_steps": 10_000})
                     for key, score in (("lr06", 0.6), ("lr08", 0.7))])  # fmt: skip
    return res


def test_a_redacted_selection_holds_no_local_path_and_the_reader_supplies_theirs(
    tiny_models, small_mirror, tmp_path, capsys
):
    res = _select_phase(tmp_path, tiny_models["bert"], small_mirror)
    plain, shared = tmp_path / "selection.json", tmp_path / "shared.json"
    assert select.main(["--results-dir", str(res), "--out", str(plain)]) == 0
    assert select.main(["--results-dir", str(res), "--out", str(shared), "--redact-paths"]) == 0
    assert str(tmp_path) in plain.read_text()  # without the flag, local paths are recorded
    text = shared.read_text()
    assert str(tmp_path) not in text and str(small_mirror) not in text
    assert str(tiny_models["bert"]) not in text
    data = json.loads(text)
    assert data["pairs"] == json.loads(plain.read_text())["pairs"]  # the choice is the same
    assert data["experiment"]["models"]["mine"]["path"] == "<redacted>"

    report = ["--phase", "report", "--selection", str(shared), "--results-dir",
              str(tmp_path / "report"), "--out-dir", str(tmp_path / "runs_report")]  # fmt: skip
    with pytest.raises(HarnessError, match=r"give your own: --model mine=PATH:auto, --data-dir"):
        sweep.plan_from_args(sweep.build_parser().parse_args(report))
    capsys.readouterr()
    assert sweep.main(report) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: the select phase was shared without its local paths (select "
        "--redact-paths); give your own: --model mine=PATH:auto, --data-dir DIR"
    ]
    mine = ["--model", f"mine={tiny_models['bert']}"]
    assert sweep.main(report + mine) == 2
    assert "give your own: --data-dir DIR" in capsys.readouterr().err
    assert sweep.main(report + mine + ["--data-dir", str(small_mirror)]) == 0
    script = script_with_units(tmp_path / "runs_report" / "run_all.sh")
    assert str(tiny_models["bert"]) in script and str(small_mirror) in script
