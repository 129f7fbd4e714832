"""`encoder-eval push`: a results folder staged without local paths and uploaded as a Hugging
Face dataset. No Hub is reachable here, so the one seam mocked is the upload itself
(`HfApi.upload_folder`, and `HfApi.create_repo`): the fakes record their arguments and copy
the staged folder before push deletes it. Everything else runs for real: the results are
written through the result schema, the table is `summarize`'s, the refusals are the
command's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from result_helpers import make_selection, write_cell_with_predictions
from test_cell_kinds_io import probe_record

from encoder_eval import push, summarize
from encoder_eval.cli import main as cli_main
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.core.results import probe_result_filename
from encoder_eval.plans.experiment import Experiment, ModelSpec
from encoder_eval.reports.share import REDACTED, redact_paths, stage_results

MODELS = ("enc-a", "enc-b")
TASKS = ("glue_rte",)
SEEDS = range(45, 50)
N = 40
TOKEN = "hf_canaryTOKEN0123456789abcdefXYZ"  # noqa: S105  # a canary, never a real token


@pytest.fixture
def folder(tmp_path):
    """A report results folder (2 models x 2 tasks x 5 seeds, predictions beside each), one
    result recording its model's local path, a corrupt file, and a selection whose
    experiment and results_dir name local folders."""
    report, models = tmp_path / "results" / "report", tmp_path / "models"
    rng = np.random.default_rng(3)
    labels = {t: rng.integers(0, 2, N).tolist() for t in TASKS}
    for i, model in enumerate(MODELS):
        for task in TASKS:
            for seed in SEEDS:
                right = rng.random(N) < 0.65 + 0.15 * i
                preds = [y if ok else 1 - y for y, ok in zip(labels[task], right, strict=True)]
                path = write_cell_with_predictions(report, model, task, "lr05", seed, preds,
                                                   labels[task])  # fmt: skip
    data = json.loads(path.read_text())  # as `run --record-model-path` records it
    data["provenance"]["model_path"] = str(models / "enc-b")
    path.write_text(json.dumps(data))
    (report / "broken_lr05_s45.json").write_text('{"cell": ')
    sel = make_selection({(m, t): "lr05" for m in MODELS for t in TASKS})
    exp = Experiment(models={"enc-a": ModelSpec(str(models / "enc-a")),
                             "enc-b": ModelSpec("org/enc-b")},
                     tasks=list(TASKS), data_dir=str(tmp_path / "mirror"))  # fmt: skip
    sel["experiment"] = exp.to_dict()
    sel["results_dir"] = str(tmp_path / "results" / "select")
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    return {"report": report, "selection": tmp_path / "selection.json", "path": path}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The fake Hub: records each call and keeps a copy of the folder uploaded."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls: dict[str, list] = {"upload_folder": [], "create_repo": []}
    kept = tmp_path / "uploaded"

    class Commit:
        commit_url = "https://huggingface.co/datasets/org/name/commit/abc123"

    def upload_folder(self, **kw):
        calls["upload_folder"].append(kw)
        shutil.copytree(kw["folder_path"], kept)
        return Commit()

    def create_repo(self, repo_id, **kw):
        calls["create_repo"].append({"repo_id": repo_id, **kw})

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    return calls, kept


def _texts(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def test_push_uploads_the_redacted_folder_once_as_a_dataset(folder, hub, tmp_path, capsys):
    calls, kept = hub
    argv = ["--results-dir", str(folder["report"]), "--selection", str(folder["selection"]),
            "--repo", "org/name", "--path-in-repo", "runs/v1", "--create", "--private",
            "--token", TOKEN, "--revision", "main", "--report"]  # fmt: skip
    assert push.main(argv) == EXIT_OK
    out, err = capsys.readouterr()
    assert "pushed" in err and "datasets/org/name/runs/v1" in err and "commit/abc123" in err
    [call] = calls["upload_folder"]
    assert call["repo_id"] == "org/name" and call["repo_type"] == "dataset"
    assert call["path_in_repo"] == "runs/v1" and call["revision"] == "main"
    assert call["token"] == TOKEN and call["delete_patterns"] == ["results/*"]
    assert not Path(call["folder_path"]).exists()  # the staging folder is gone
    assert calls["create_repo"] == [{"repo_id": "org/name", "repo_type": "dataset",
                                     "exist_ok": True, "private": True, "token": TOKEN}]  # fmt: skip

    texts = _texts(kept)
    results = sorted(n for n in texts if n.startswith("results/") and "predictions" not in n)
    assert len(results) == len(MODELS) * len(TASKS) * len(SEEDS)  # the corrupt one left out
    assert sum("predictions" in n for n in texts) == len(results)
    assert {"selection.json", "table.json", "table.md", "table.csv", "manifest.json",
            "report.html"} <= set(texts)  # fmt: skip
    assert REDACTED.replace("<", "&lt;").replace(">", "&gt;") in texts["report.html"]
    assert "warning: skipping" in err and "broken_lr05_s45.json" in err
    manifest = json.loads(texts["manifest.json"])
    [skipped] = manifest["skipped"]
    assert "broken_lr05_s45.json" in skipped and str(tmp_path) not in skipped
    # The local paths are gone, from every file; the token is in none, nor in the output.
    for name, text in texts.items():
        assert str(tmp_path) not in text, name
        assert call["folder_path"] not in text, name
        assert TOKEN not in text, name
    assert TOKEN not in out + err
    staged = json.loads(texts[f"results/{folder['path'].name}"])
    assert staged["provenance"]["model_path"] == REDACTED
    assert manifest["redacted"][f"results/{folder['path'].name}"] == ["provenance.model_path"]
    assert f"results/{folder['path'].name}  (redacted: provenance.model_path)" in out
    sel = json.loads(texts["selection.json"])
    assert sel["results_dir"] == REDACTED and sel["experiment"]["data_dir"] == REDACTED
    assert sel["experiment"]["models"]["enc-a"]["path"] == REDACTED
    assert sel["experiment"]["models"]["enc-b"]["path"] == "org/enc-b"  # a Hub id stays
    # The other results are the files as written, byte for byte.
    other = sorted(folder["report"].glob("enc-a_*_s45.json"))[0]
    assert texts[f"results/{other.name}"] == other.read_text()

    # The table is summarize's, to the number.
    capsys.readouterr()
    assert summarize.main(["--results-dir", str(folder["report"]), "--selection",
                           str(folder["selection"]), "--format", "json"]) == EXIT_OK  # fmt: skip
    assert json.loads(texts["table.json"]) == json.loads(capsys.readouterr().out)
    assert summarize.main(["--results-dir", str(folder["report"]), "--selection",
                           str(folder["selection"])]) == EXIT_OK  # fmt: skip
    assert texts["table.md"] == capsys.readouterr().out


def test_a_dry_run_stages_lists_and_uploads_nothing(folder, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a dry run needs no Hub

    def no_upload(self, **kw):
        raise AssertionError("a dry run uploaded")

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", no_upload)
    argv = ["push", "--results-dir", str(folder["report"]), "--selection",
            str(folder["selection"]), "--repo", "org/name", "--dry-run"]  # fmt: skip
    assert cli_main(argv) == EXIT_OK
    out, err = capsys.readouterr()
    staging = Path(err.split(" in ", 1)[1].split(" (dry run")[0])
    try:
        assert "nothing uploaded to datasets/org/name" in err
        listed = out.split("\n")
        assert sorted(_texts(staging)) == sorted(line.split("  ")[0] for line in listed if line)
        assert (
            "table.json" in listed
            and "selection.json  (redacted: experiment, results_dir)" in listed
        )
    finally:
        shutil.rmtree(staging)


def test_the_html_report_goes_up_with_report_and_a_probe_folder_too(hub, tmp_path, capsys):
    calls, kept = hub
    probes = tmp_path / "probes"
    probes.mkdir()
    for model in ("m", "n"):
        for task in ("glue_sst2", "glue_rte"):
            record = probe_record(model=model, task=task)
            record["cell"]["model_path"] = str(tmp_path / "models" / model)
            name = probe_result_filename(model, "mean", task)
            (probes / name).write_text(json.dumps(record))
    assert push.main(["--results-dir", str(probes), "--repo", "org/probes", "--report"]) == 0
    texts = _texts(kept)
    assert sum(n.endswith(".probe.json") for n in texts) == 4
    assert "report.html" in texts and "<html" in texts["report.html"]
    assert calls["create_repo"] == []  # no --create: the repository must exist
    for name, text in texts.items():
        assert str(tmp_path) not in text, name
    capsys.readouterr()
    assert summarize.main(["--results-dir", str(probes), "--format", "json"]) == EXIT_OK
    assert json.loads(texts["table.json"]) == json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"--repo": "justaname"},
            "--repo 'justaname' is not a Hub repository id; give it as org/name",
        ),
        ({"--repo": "org/na me"}, "is not a Hub repository id"),
        ({"--repo": "org/a--b"}, "is not a Hub repository id"),
        ({"--results-dir": "no/such/dir"}, "--results-dir no/such/dir is not a directory"),
        ({"--path-in-repo": "../up"}, "--path-in-repo '../up' must be a relative folder"),
        ({"--private": None}, "--private sets the visibility of a repository push creates"),
    ],
)
def test_bad_input_is_one_error_line_before_any_work(folder, hub, capsys, change, message):
    calls, _ = hub
    args = {"--results-dir": str(folder["report"]), "--selection": str(folder["selection"]),
            "--repo": "org/name", **change}  # fmt: skip
    argv = [x for k, v in args.items() for x in ((k,) if v is None else (k, v))]
    assert push.main(argv) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert calls["upload_folder"] == []


def test_offline_refuses_before_staging_unless_dry_run(folder, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    staged = []
    monkeypatch.setattr(push, "stage_results", lambda *a, **k: staged.append(a))
    argv = ["--results-dir", str(folder["report"]), "--repo", "org/name",
            "--selection", str(folder["selection"])]  # fmt: skip
    assert push.main(argv) == EXIT_INPUT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: HF_HUB_OFFLINE is set") and "--dry-run" in err
    assert staged == []


def test_a_folder_without_results_or_with_a_refused_table(folder, hub, tmp_path, capsys):
    calls, _ = hub
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ["--repo", "org/name", "--selection", str(folder["selection"])]
    assert push.main(["--results-dir", str(empty), *argv]) == EXIT_INPUT_ERROR
    assert "holds no result to push" in capsys.readouterr().err
    # A missing report seed: refused as summarize refuses it, unless --allow-partial.
    next(folder["report"].glob("enc-a_glue_rte_*_s49.json")).unlink()
    assert push.main(["--results-dir", str(folder["report"]), *argv]) == EXIT_INCOMPLETE
    assert "push refuses this table" in capsys.readouterr().err
    assert calls["upload_folder"] == []
    assert push.main(["--results-dir", str(folder["report"]), *argv, "--allow-partial"]) == 0
    assert len(calls["upload_folder"]) == 1


def test_a_failed_upload_is_one_line_without_the_token(folder, hub, monkeypatch, capsys):
    def refused(self, **kw):
        raise RuntimeError(f"401 Unauthorized for token {kw['token']}")

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", refused)
    argv = ["--results-dir", str(folder["report"]), "--selection", str(folder["selection"]),
            "--repo", "org/name", "--token", TOKEN]  # fmt: skip
    assert push.main(argv) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "error: the upload to datasets/org/name failed: RuntimeError: 401" in err
    assert TOKEN not in err and "<token>" in err


@pytest.mark.parametrize("target", ["dataset", "model"])
def test_an_unreachable_hub_is_one_line_naming_it(folder, tmp_path, target):
    """No network (the Hub's endpoint refuses connections): one `error:` line saying the
    Hub cannot be reached, where and why, exit 1; not the HTTP client's exception. A real
    `push` process, its real upload call, pointed at a closed port."""
    where = (["--repo", "org/name", "--create"] if target == "dataset" else
             ["--to-model", "org/enc-a", "--model", "enc-a",
              "--source-url", "https://huggingface.co/datasets/org/results"])  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_TOKEN=TOKEN, HF_HUB_ETAG_TIMEOUT="5",
               HF_HUB_DOWNLOAD_TIMEOUT="5")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "encoder_eval", "push", "--results-dir",
                           str(folder["report"]), "--selection", str(folder["selection"]),
                           *where], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == EXIT_INCOMPLETE, proc.stderr
    # the fixture's corrupt result's warning and the leaderboard note first, then one error line
    (line,) = [x for x in proc.stderr.splitlines() if not x.startswith(("warning: ", "note: "))]
    assert line.startswith("error: the ") and " failed: cannot reach the Hub at " in line, line
    assert "http://127.0.0.1:9 (Connection refused)" in line and "HF_ENDPOINT" in line, line
    for raw in ("ConnectionError", "MaxRetryError", "HTTPConnection", "Request ID", TOKEN):
        assert raw not in line, line


def test_redact_paths_names_each_field_it_replaced():
    data = {"cell": {"model": "m", "model_path": "relative/dir"},
            "provenance": {"model": {"path": "~/models/x"}, "data": {"identity": "hub:org/x@1"}},
            "notes": ["/home/someone/file", "plain"]}  # fmt: skip
    clean, fields = redact_paths(data)
    assert fields == ["cell.model_path", "provenance.model.path", "notes[0]"]
    assert clean["provenance"]["data"]["identity"] == "hub:org/x@1"
    assert clean["notes"] == [REDACTED, "plain"] and data["notes"][0] == "/home/someone/file"


def test_stage_results_is_the_library_the_command_calls(folder, tmp_path):
    staged = stage_results(folder["report"], tmp_path / "stage", selection=str(folder["selection"]))
    assert staged.table is not None and not staged.table.problems
    assert staged.files == sorted(staged.files) and "table.csv" in staged.files
    assert len(staged.skipped) == 1
