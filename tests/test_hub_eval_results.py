"""`export --format hub-eval-results` and `push --to-model`: a model's row of the table as
the Hub's model-page evaluation results, checked against the Hub's documented format.

The format is the Hub's "Evaluation Results" documentation (docs/hub/eval-results.md of
huggingface/hub-docs) and the specification it links, `eval_results.yaml` of
huggingface/hub-docs at commit 242f4a1eeb867daf4ac3f44026a5df4a68908a3d, vendored in
tests/fixtures/hub/: its first entry lists every field, its second the required ones.
The fields allowed and required are read from that file, not restated here. The numbers
are `summarize --format json`'s. No Hub is reachable: the one seam mocked is
`HfApi.create_commit`, whose fake records its arguments."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import yaml
from result_helpers import make_selection, write_cell_with_predictions

from encoder_eval import export, push, summarize
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import result_filename

SPEC_FULL, SPEC_REQUIRED = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "hub" / "eval_results.yaml").read_text()
)
MODELS = ("enc-a", "enc-b")
TASKS = ("glue_cola", "xnli", "synthetic_sentiment")  # one config, several, no Hub dataset
SEEDS = range(45, 50)
N = 40
URL = "https://huggingface.co/datasets/org/encoder-results"
TOKEN = "hf_canaryTOKEN0123456789abcdefXYZ"  # noqa: S105  # a canary, never a real token


@pytest.fixture
def report_dir(tmp_path):
    rng = np.random.default_rng(5)
    labels = {t: rng.integers(0, 2, N).tolist() for t in TASKS}
    for i, model in enumerate(MODELS):
        for task in TASKS:
            for seed in SEEDS:
                right = rng.random(N) < 0.6 + 0.2 * i
                preds = [y if ok else 1 - y for y, ok in zip(labels[task], right, strict=True)]
                write_cell_with_predictions(tmp_path / "report", model, task, "lr05", seed,
                                            preds, labels[task])  # fmt: skip
    sel = make_selection({(m, t): "lr05" for m in MODELS for t in TASKS})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    return tmp_path


def _common(report_dir) -> list[str]:
    return ["--results-dir", str(report_dir / "report"), "--selection",
            str(report_dir / "selection.json")]  # fmt: skip


def _cells(capsys, report_dir) -> dict:
    code = summarize.main([*_common(report_dir), "--format", "json", "--allow-partial"])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    return {(r["model"], t): c for r in json.loads(out)["rows"] for t, c in r["cells"].items()}


def _check_entry(entry: dict) -> None:
    """One entry against the vendored specification: only its fields, its required ones,
    and the types its examples and comments give (value a number, date an ISO-8601
    string, source.url required when source is given)."""
    assert set(entry) <= set(SPEC_FULL), set(entry) - set(SPEC_FULL)
    assert set(SPEC_REQUIRED) <= set(entry)
    assert set(entry["dataset"]) <= set(SPEC_FULL["dataset"])
    assert set(SPEC_REQUIRED["dataset"]) <= set(entry["dataset"])
    assert all(isinstance(v, str) and v for v in entry["dataset"].values())
    assert isinstance(entry["value"], float)
    assert isinstance(entry["date"], str)
    datetime.date.fromisoformat(entry["date"])
    assert set(entry["source"]) <= set(SPEC_FULL["source"]) and "url" in entry["source"]
    assert isinstance(entry["notes"], str)


def test_one_file_per_task_in_the_hubs_format_with_the_tables_numbers(report_dir, capsys):
    out = report_dir / "eval_results"
    code = export.main(["--format", "hub-eval-results", *_common(report_dir), "--models",
                        "enc-b", "--source-url", URL, "--out", str(out)])  # fmt: skip
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    # The synthetic task has no Hub dataset: left out, with a warning.
    assert sorted(p.name for p in out.iterdir()) == ["glue_cola.yaml", "xnli.yaml"]
    assert "synthetic_sentiment has no Hub dataset" in err
    assert sorted(stdout.split()) == [str(out / "glue_cola.yaml"), str(out / "xnli.yaml")]
    cells = _cells(capsys, report_dir)
    for task, (hub_id, task_id) in {"glue_cola": ("nyu-mll/glue", "cola"),
                                    "xnli": ("facebook/xnli", "xnli")}.items():  # fmt: skip
        entries = yaml.safe_load((out / f"{task}.yaml").read_text())
        assert isinstance(entries, list) and len(entries) == 1
        (entry,) = entries
        _check_entry(entry)
        want = cells[("enc-b", task)]
        assert entry["dataset"] == {"id": hub_id, "task_id": task_id, "revision": "sha-a"}
        assert entry["value"] == round(100 * want["mean"], 2)
        assert entry["date"] == "2026-01-01"  # the cells' created_at
        assert entry["source"] == {"url": URL, "name": "encoder-eval protocol "
                                   "(encoder-eval-harness unknown version)"}  # fmt: skip
        notes = entry["notes"]
        assert f"std {100 * want['std']:.2f}" in notes
        assert "(45, 46, 47, 48, 49)" in notes and f"learning rate {LR_GRID['lr05']:g}" in notes
        assert "PARTIAL" not in notes and "NOT A PROTOCOL" not in notes
        assert "model revision rev-a" in notes


def test_a_table_with_problems_is_refused_unless_allow_partial_and_then_says_so(report_dir, capsys):
    (report_dir / "report" / result_filename("enc-a", "xnli", LR_GRID["lr05"], 49)).unlink()
    out = report_dir / "eval_results"
    args = ["--format", "hub-eval-results", *_common(report_dir), "--models", "enc-a",
            "--source-url", URL, "--out", str(out)]  # fmt: skip
    code = export.main(args)
    err = capsys.readouterr().err
    assert code == EXIT_INCOMPLETE and "export refuses this table" in err
    assert not out.exists()
    assert export.main([*args, "--allow-partial"]) == EXIT_OK
    capsys.readouterr()
    for path in out.iterdir():  # every entry says so, the complete task's too
        (entry,) = yaml.safe_load(path.read_text())
        _check_entry(entry)
        assert "NOT A PROTOCOL TABLE (exported with --allow-partial)" in entry["notes"]
        assert "[missing_seeds]" in entry["notes"]
    (xnli,) = yaml.safe_load((out / "xnli.yaml").read_text())
    assert "PARTIAL: 4 of 5 seeds" in xnli["notes"]


def test_refusals_before_any_work(report_dir, capsys):
    base = ["--format", "hub-eval-results", *_common(report_dir)]
    cases = [
        ([*base, "--source-url", URL, "--out", str(report_dir / "o")], "has 2 (enc-a, enc-b)"),
        (
            [*base, "--models", "enc-a", "--out", str(report_dir / "o")],
            "give --source-url https://...: the link each entry names as its source",
        ),  # fmt: skip
        (
            [
                *base,
                "--models",
                "enc-a",
                "--source-url",
                "file:///home/me/results",
                "--out",
                str(report_dir / "o"),
            ],
            "must be an https:// link",
        ),  # fmt: skip
        ([*base, "--models", "enc-a", "--source-url", URL], "give --out DIR"),
        (
            [
                *base,
                "--models",
                "enc-a",
                "--source-url",
                URL,
                "--out",
                str(report_dir / "report" / "x"),
            ],
            "lies in --results-dir",
        ),  # fmt: skip
    ]
    for args, message in cases:
        assert export.main(args) == EXIT_INPUT_ERROR, args
        err = capsys.readouterr().err
        assert message in err and err.startswith("error: "), err
        assert "None" not in err  # issue 50: a missing link read `--source-url None`
    assert not (report_dir / "o").exists()


# ----------------------------------------------------------------------------- push


@pytest.fixture
def hub(monkeypatch):
    """The fake Hub: records each `create_commit` call with the files' contents."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls: list[dict] = []

    class Info:
        pr_url = "https://huggingface.co/org/enc/discussions/7"
        commit_url = "https://huggingface.co/org/enc/commit/abc"

    def create_commit(self, repo_id, operations, **kw):
        files = {op.path_in_repo: op.path_or_fileobj.decode() for op in operations}
        calls.append({"repo_id": repo_id, "files": files, **kw})
        return Info()

    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    return calls


def test_push_to_model_opens_one_pull_request_with_the_exported_files(report_dir, capsys, hub):
    out = report_dir / "eval_results"
    assert export.main(["--format", "hub-eval-results", *_common(report_dir), "--models",
                        "enc-a", "--source-url", URL, "--out", str(out)]) == EXIT_OK  # fmt: skip
    capsys.readouterr()
    code = push.main([*_common(report_dir), "--to-model", "org/enc-a", "--model", "enc-a",
                      "--source-url", URL, "--token", TOKEN])  # fmt: skip
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    (call,) = hub
    assert call["repo_id"] == "org/enc-a" and call["create_pr"] is True
    assert call["repo_type"] == "model" and call["token"] == TOKEN
    assert call["files"] == {f".eval_results/{p.name}": p.read_text() for p in out.iterdir()}
    assert "discussions/7" in err and TOKEN not in stdout + err
    assert sorted(stdout.split()) == [".eval_results/glue_cola.yaml", ".eval_results/xnli.yaml"]


def test_push_to_model_dry_run_needs_no_token_nor_network(report_dir, capsys, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = push.main([*_common(report_dir), "--to-model", "org/enc-a", "--model", "enc-a",
                      "--source-url", URL, "--dry-run"])  # fmt: skip
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert hub == []
    assert ".eval_results/glue_cola.yaml" in stdout and "    - dataset:" in stdout
    assert "nothing uploaded" in err


def test_push_to_model_refusals_and_no_local_path(report_dir, capsys, hub):
    base = [*_common(report_dir), "--to-model", "org/enc-a", "--source-url", URL]
    for more, message in [([], "has 2 (enc-a, enc-b)"),
                          (["--model", "enc-a", "--create"], "--create: for --repo"),
                          (["--model", "nope"], "nope")]:  # fmt: skip
        assert push.main([*base, *more]) == EXIT_INPUT_ERROR
        assert message in capsys.readouterr().err
    assert push.main([*base[:-2], "--model", "enc-a"]) == EXIT_INPUT_ERROR  # no --source-url
    err = capsys.readouterr().err
    assert "give --source-url https://..." in err and "None" not in err
    # Cells that recorded another Hub model: their scores are not this model's.
    xnli = [report_dir / "report" / result_filename("enc-a", "xnli", LR_GRID["lr05"], seed)
            for seed in SEEDS]  # fmt: skip
    originals = [p.read_text() for p in xnli]
    for p, text in zip(xnli, originals, strict=True):
        data = json.loads(text)
        data["provenance"]["model_path"] = "org/other"  # as `run --record-model-path` records
        p.write_text(json.dumps(data))
    assert push.main([*base, "--model", "enc-a"]) == EXIT_INPUT_ERROR
    assert "ran the Hub model org/other, not org/enc-a" in capsys.readouterr().err
    for p, text in zip(xnli, originals, strict=True):
        p.write_text(text)
    # A problem naming a local path: refused, then with --allow-partial pushed without it.
    path = report_dir / "report" / result_filename("enc-a", "glue_cola", LR_GRID["lr05"], 45)
    data = json.loads(path.read_text())
    data["protocol"] = {"on_protocol": False,
                        "off_protocol_reasons": [f"--data-dir {report_dir}/mirror"]}  # fmt: skip
    path.write_text(json.dumps(data))
    assert push.main([*base, "--model", "enc-a"]) == EXIT_INCOMPLETE
    assert "push refuses this table" in capsys.readouterr().err and hub == []
    assert push.main([*base, "--model", "enc-a", "--allow-partial"]) == EXIT_OK
    capsys.readouterr()
    (call,) = hub
    for text in call["files"].values():
        assert str(report_dir) not in text and "[off_protocol]" in text
        (entry,) = yaml.safe_load(text)
        _check_entry(entry)
