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
import os
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
from encoder_eval.data.tasks import group_tasks

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

    def create_repo(self, repo_id, repo_type=None, **kw):
        hub_created.append((repo_id, repo_type))

    hub_created.clear()
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    return calls


hub_created: list[tuple] = []  # the fake Hub's create_repo calls (the `hub` fixture)


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


# ----------------------------------------------------------------------------- benchmarks
# The Hub links an entry to a leaderboard only when `dataset.id` is a Benchmark dataset and
# `task_id` an id of its eval.yaml (the vendored spec's comments). Our tasks' own datasets
# are not known to be Benchmarks: `--benchmark` points entries at a benchmark table's rows
# (MTEB's), or at the protocol's own benchmark dataset (`push --benchmark-repo`).

BENCH_TASKS = ("glue_cola", "amazon_reviews_multi", "xnli", "glue_stsb")


@pytest.fixture
def bench_dir(tmp_path):
    """One model, four tasks: MCC below 0 on CoLA (predictions against the labels), an
    MTEB row (Amazon reviews), MTEB rows that say why not (XNLI, STS-B)."""
    rng = np.random.default_rng(9)
    for task in BENCH_TASKS:
        labels = rng.integers(0, 2, N).tolist()
        if task == "glue_stsb":
            labels = rng.uniform(0, 5, N).round(2).tolist()
        for seed in SEEDS:
            if task == "glue_cola":  # mostly wrong: MCC < 0
                preds = [1 - y if rng.random() < 0.8 else y for y in labels]
            elif task == "glue_stsb":
                preds = [y + rng.normal(0, 1) for y in labels]
            else:
                preds = [y if rng.random() < 0.7 else 1 - y for y in labels]
            write_cell_with_predictions(tmp_path / "report", "enc-a", task, "lr05", seed,
                                        preds, labels)  # fmt: skip
    sel = make_selection({("enc-a", t): "lr05" for t in BENCH_TASKS})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    return tmp_path


def _export_hub(capsys, bench_dir, *more: str) -> tuple[dict[str, dict], str]:
    out = bench_dir / "eval_results"
    code = export.main(["--format", "hub-eval-results", *_common(bench_dir), "--source-url",
                        URL, "--out", str(out), *more])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == EXIT_OK, err
    entries = {}
    for path in sorted(out.iterdir()):
        (entry,) = yaml.safe_load(path.read_text())
        _check_entry(entry)
        entries[path.stem] = entry
    return entries, err


def test_by_default_every_entry_is_said_not_to_link(bench_dir, capsys):
    entries, err = _export_hub(capsys, bench_dir)
    assert entries["glue_cola"]["dataset"] == {"id": "nyu-mll/glue", "task_id": "cola",
                                               "revision": "sha-a"}  # fmt: skip
    for task in BENCH_TASKS:
        assert f"note: {task}.yaml (" in err
    assert err.count("will not link to a leaderboard") == len(BENCH_TASKS)
    assert "nyu-mll/glue is not known to be a Hub Benchmark" in err and "--benchmark" in err


def test_mteb_rows_point_entries_at_mtebs_dataset_and_the_rest_say_why_not(bench_dir, capsys):
    entries, err = _export_hub(capsys, bench_dir, "--benchmark", "mteb")
    amazon = entries["amazon_reviews_multi"]
    # MTEB's dataset and task id; our data's revision is not theirs: it moves to the notes.
    assert amazon["dataset"] == {"id": "mteb/AmazonReviewsClassification",
                                 "task_id": "AmazonReviewsClassification"}  # fmt: skip
    assert "data mteb/AmazonReviewsClassification revision sha-a" in amazon["notes"]
    assert "frozen embedding" in amazon["notes"]  # the row's note: not the same protocol
    assert "note: amazon_reviews_multi.yaml links to mteb/AmazonReviewsClassification" in err
    # No row, or a row that says why: the task's own dataset, and the reason printed.
    assert entries["xnli"]["dataset"]["id"] == "facebook/xnli"
    assert "note: xnli.yaml (facebook/xnli task xnli) will not link to a leaderboard: " \
        "mteb has no task for xnli: MTEB's XNLI" in err  # fmt: skip
    assert "glue_stsb.yaml (nyu-mll/glue task stsb) will not link" in err and "test split" in err
    assert "glue_cola.yaml (nyu-mll/glue task cola) will not link to a leaderboard: mteb " \
        "has no row for glue_cola (--benchmark-map adds one)" in err  # fmt: skip


def test_a_users_benchmark_map_adds_and_replaces_rows(bench_dir, capsys, tmp_path):
    table = tmp_path / "bench.toml"
    table.write_text(
        '[mteb.glue_cola]\ndataset = "org/cola-bench"\ntask_id = "cola_mcc"\n'
        'note = "our split"\n'
        '[mine.xnli]\ndataset = "org/xnli-bench"\ntask_id = "xnli_acc"\n'
    )
    entries, err = _export_hub(capsys, bench_dir, "--benchmark", "mteb",
                               "--benchmark-map", str(table))  # fmt: skip
    assert entries["glue_cola"]["dataset"] == {"id": "org/cola-bench", "task_id": "cola_mcc"}
    assert "note: glue_cola.yaml links to org/cola-bench task cola_mcc: our split" in err
    entries, _ = _export_hub(capsys, bench_dir, "--benchmark", "mine",
                             "--benchmark-map", str(table))  # fmt: skip
    assert entries["xnli"]["dataset"] == {"id": "org/xnli-bench", "task_id": "xnli_acc"}
    assert entries["glue_cola"]["dataset"]["id"] == "nyu-mll/glue"
    # A map that is not rows, a dataset that is not an id, an unknown name: refused.
    base = ["--format", "hub-eval-results", *_common(bench_dir), "--source-url", URL,
            "--out", str(bench_dir / "o")]  # fmt: skip
    for text, bench, message in [
        ('[mteb.glue_cola]\ndataset = "org/x"\n', "mteb", "needs dataset and task_id"),
        ('[mteb.glue_cola]\ndataset = "x"\ntask_id = "t"\n', "mteb", "is not a Hub dataset id"),
        ("[mteb\n", "mteb", "--benchmark-map"),
        ("", "nope", "--benchmark 'nope' is neither a benchmark table"),
    ]:
        table.write_text(text)
        code = export.main([*base, "--benchmark", bench, "--benchmark-map", str(table)])
        err = capsys.readouterr().err
        assert code == EXIT_INPUT_ERROR and message in err and err.startswith("error: "), err
    fifo = tmp_path / "fifo.toml"  # read by the safe reader: refused unread, never waited on
    os.mkfifo(fifo)
    code = export.main([*base, "--benchmark", "mteb", "--benchmark-map", str(fifo)])
    assert code == EXIT_INPUT_ERROR and "is not a regular file" in capsys.readouterr().err
    assert not (bench_dir / "o").exists()


def test_the_protocol_as_a_benchmark_its_eval_yaml_names_every_entrys_task_id(
    bench_dir, capsys, hub
):
    """`push --benchmark-repo` writes the card and eval.yaml (the suite's 17 tasks); the
    entries of `--benchmark ORG/NAME` point at that dataset with ids of that eval.yaml,
    and say they link only once the Hub accepts it."""
    repo = "org/encoder-eval-protocol"
    code = push.main(["--benchmark-repo", repo, "--create", "--token", TOKEN])
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    (call,) = hub
    assert call["repo_id"] == repo and call["repo_type"] == "dataset"
    assert call.get("create_pr") in (None, False)
    assert sorted(call["files"]) == ["README.md", "eval.yaml"]
    eval_yaml = yaml.safe_load(call["files"]["eval.yaml"])
    assert set(eval_yaml) == {"name", "description", "evaluation_framework", "tasks"}
    ids = [t["id"] for t in eval_yaml["tasks"]]
    assert ids == group_tasks("all") and len(ids) == 17
    card = call["files"]["README.md"]
    front = yaml.safe_load(card.split("---\n")[1])
    assert "benchmark" in front["tags"]
    assert all(f"| `{t}` |" in card for t in ids)
    assert "only once it has accepted this dataset as a Benchmark" in card
    assert "only once it accepts the dataset as a Benchmark" in err and TOKEN not in err
    assert hub_created == [(repo, "dataset")]
    entries, err = _export_hub(capsys, bench_dir, "--benchmark", repo)
    for task, entry in entries.items():
        assert entry["dataset"] == {"id": repo, "task_id": task} and task in ids
        assert "data " in entry["notes"] and "revision sha-a" in entry["notes"]
    assert err.count(f"links once the Hub accepts {repo} as a Benchmark") == len(BENCH_TASKS)


def test_benchmark_repo_dry_run_and_refusals(bench_dir, capsys, hub):
    code = push.main(["--benchmark-repo", "org/p", "--dry-run"])
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert "eval.yaml" in stdout and "    - id: glue_cola" in stdout and hub == []
    for more, message in [
        ([*_common(bench_dir)], "drop --results-dir"),
        (["--source-url", URL], "not for --benchmark-repo"),
        (["--benchmark", "mteb"], "--benchmark: for --to-model"),
    ]:
        assert push.main(["--benchmark-repo", "org/p", "--dry-run", *more]) == EXIT_INPUT_ERROR
        assert message in capsys.readouterr().err
    for repo, more, message in [
        ("org", [], "--benchmark-repo 'org' is not a Hub repository id"),
        ("org/p", ["--private"], "--private sets the visibility"),
    ]:
        assert push.main(["--benchmark-repo", repo, "--dry-run", *more]) == EXIT_INPUT_ERROR
        assert message in capsys.readouterr().err
    assert push.main(["--repo", "org/p", "--dry-run"]) == EXIT_INPUT_ERROR
    assert "push needs --results-dir" in capsys.readouterr().err


def test_signed_metrics_are_written_signed_with_their_range_and_said(bench_dir, capsys):
    """MCC and Spearman run from -1 to 1: the value is the table's mean x100 as printed,
    below 0 when it is; the notes give the range and the export says which value a
    0-100 reader would refuse."""
    entries, err = _export_hub(capsys, bench_dir)
    cells = _cells(capsys, bench_dir)
    cola = entries["glue_cola"]
    assert cola["value"] == round(100 * cells[("enc-a", "glue_cola")]["mean"], 2) < 0
    assert "MCC x100 (from -100 to 100)" in cola["notes"]
    assert "Spearman x100 (from -100 to 100)" in entries["glue_stsb"]["notes"]
    assert "(from" not in entries["xnli"]["notes"]
    assert f"note: glue_cola.yaml: value {cola['value']} is below 0" in err
    assert "xnli.yaml: value" not in err


def test_source_user_and_org(bench_dir, capsys, hub):
    entries, _ = _export_hub(capsys, bench_dir, "--source-user", "alice", "--source-org",
                             "my-org")  # fmt: skip
    for entry in entries.values():
        assert entry["source"] == {"url": URL, "name": entry["source"]["name"],
                                   "user": "alice", "org": "my-org"}  # fmt: skip
    assert set(entries["xnli"]["source"]) <= set(SPEC_FULL["source"])
    code = push.main([*_common(bench_dir), "--to-model", "org/enc-a", "--source-url", URL,
                      "--source-org", "my-org", "--token", TOKEN])  # fmt: skip
    assert code == EXIT_OK, capsys.readouterr().err
    (call,) = hub
    for text in call["files"].values():
        (entry,) = yaml.safe_load(text)
        assert entry["source"]["org"] == "my-org" and "user" not in entry["source"]
    base = ["--results-dir", str(bench_dir / "report"), "--selection",
            str(bench_dir / "selection.json")]  # fmt: skip
    for args, message in [
        (["--format", "hub-eval-results", "--source-url", URL, "--out", str(bench_dir / "o"),
          "--source-user", "a/b"], "--source-user 'a/b' is not a Hub user or org name"),
        (["--format", "euroeval", "--source-org", "x"], "--source-org: for --format hub-eval"),
        (["--format", "eee", "--benchmark", "mteb"], "--benchmark: for --format hub-eval"),
    ]:  # fmt: skip
        assert export.main([*base, *args]) == EXIT_INPUT_ERROR
        assert message in capsys.readouterr().err


def test_huggingface_hubs_own_parser_reads_every_entry_back(bench_dir, capsys):
    """An independent oracle: `huggingface_hub.parse_eval_result_entries` (with
    `EvalResultEntry`, huggingface_hub >= 1.4) reads each file into the fields written,
    and `eval_result_entries_to_yaml` writes back the same entry."""
    hf = pytest.importorskip("huggingface_hub")
    if not hasattr(hf, "parse_eval_result_entries"):
        pytest.skip(
            f"huggingface_hub {hf.__version__} has no parse_eval_result_entries (1.4.0 "
            "added it; transformers 4.x pins huggingface_hub < 1.0)"
        )
    entries, _ = _export_hub(capsys, bench_dir, "--benchmark", "mteb", "--source-user", "alice",
                             "--source-org", "my-org")  # fmt: skip
    for task, entry in entries.items():
        (parsed,) = hf.parse_eval_result_entries([entry])
        assert isinstance(parsed, hf.EvalResultEntry)
        assert (parsed.dataset_id, parsed.task_id, parsed.value) == (
            entry["dataset"]["id"], entry["dataset"]["task_id"], entry["value"])  # fmt: skip
        assert parsed.dataset_revision == entry["dataset"].get("revision")
        assert (parsed.source_url, parsed.source_user, parsed.source_org) == (
            URL, "alice", "my-org")  # fmt: skip
        assert parsed.notes == entry["notes"] and parsed.date == entry["date"]
        assert hf.eval_result_entries_to_yaml([parsed]) == [entry], task
