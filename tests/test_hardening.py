"""Issue 40 items 1-10: what a hostile teammate's files and a full disk found. Each test
failed on the code the issue was filed against (791364c); all run on real files, real
results and the real commands (the Hub upload is never reached: staging is the library)."""

from __future__ import annotations

import csv
import errno
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from result_helpers import make_result, make_selection, write_cell_with_predictions, write_many
from test_neuco import _summary

from encoder_eval import export, select, summarize, sweep
from encoder_eval.core import fileio
from encoder_eval.core.errors import EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.core.results import EXPERIMENT_NAME
from encoder_eval.plans import experiment
from encoder_eval.plans.experiment import REDACTED, Experiment, ModelSpec, PhaseRecord
from encoder_eval.reports import neuco
from encoder_eval.reports.export import euroeval_records
from encoder_eval.reports.share import redact_paths, stage_results
from encoder_eval.reports.table_loading import load_table

MODELS, TASK, SEEDS = ("enc-a", "enc-b"), "glue_rte", range(45, 48)
SECRET = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"


@pytest.fixture
def report(tmp_path) -> dict:
    """A report folder (2 models x 3 seeds, predictions beside each) and its selection,
    which an experiment file in the folder records."""
    rdir = tmp_path / "results" / "report"
    paths = []
    for model in MODELS:
        for seed in SEEDS:
            preds = [0, 1, 1, 0, 1, 0] if model == "enc-a" else [0, 1, 0, 0, 1, 1]
            paths.append(write_cell_with_predictions(rdir, model, TASK, "lr05", seed, preds,
                                                     [0, 1, 1, 0, 1, 1]))  # fmt: skip
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(make_selection({(m, TASK): "lr05" for m in MODELS})))
    exp = Experiment(tasks=[TASK], seeds={"report": list(SEEDS)}, phase="report",
                     phases={"report": PhaseRecord(str(rdir), None, str(sel))})  # fmt: skip
    experiment.write(exp, rdir / EXPERIMENT_NAME)
    return {"dir": rdir, "selection": sel, "paths": paths, "tmp": tmp_path}


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ----------------------------------------------------------------------------- item 1


def test_push_stages_only_regular_files_that_parse_as_their_name_says(report, tmp_path):
    """A private key symlinked in under a predictions name and a TREC name, a file that is
    not a predictions file, a FIFO: none is staged, each is named among the skipped; the
    cells' real predictions files are staged."""
    key = tmp_path / "id_ed25519"
    key.write_text(SECRET)
    first, second, third = report["paths"][:3]
    pred = first.with_name(first.name.replace(".json", ".predictions.json"))
    pred.unlink()
    pred.symlink_to(key)
    first.with_name(first.name.replace(".json", ".run.trec")).symlink_to(key)
    second.with_name(second.name.replace(".json", ".predictions.json")).write_text(SECRET)
    os.mkfifo(third.with_name(third.name.replace(".json", ".run.trec")))
    staged = stage_results(report["dir"], tmp_path / "stage", allow_partial=True)
    texts = [p.read_text() for p in (tmp_path / "stage").rglob("*") if p.is_file()]
    assert not any("PRIVATE KEY" in t for t in texts)
    names = set(staged.files)
    assert f"results/{pred.name}" not in names
    assert not any(n.endswith(".run.trec") for n in names)
    assert not any(second.stem in n and "predictions" in n for n in names)
    kept = [p for p in report["paths"][3:]]
    for path in kept:  # every real predictions file is staged, byte for byte
        real = path.with_name(path.name.replace(".json", ".predictions.json"))
        assert (tmp_path / "stage" / "results" / real.name).read_bytes() == real.read_bytes()
    skipped = "\n".join(staged.skipped)
    assert "symlink out of the results folder" in skipped
    assert "not a predictions file" in skipped and "FIFO" in skipped


# ----------------------------------------------------------------------------- items 2, 10


def _select_folder(tmp_path: Path, extra: list[str]) -> Path:
    res = tmp_path / "select"
    exp = Experiment(models={"m": ModelSpec("org/m")}, tasks=[TASK], lr_keys=["lr06", "lr08"],
                     seeds={"select": [42]}, extra_run_args=extra, phase="select")  # fmt: skip
    res.mkdir()
    experiment.write(exp, res / EXPERIMENT_NAME)
    write_many(res, [make_result("m", TASK, k, 42, "select", s)
                     for k, s in (("lr06", 0.6), ("lr08", 0.7))])  # fmt: skip
    return res


EXTRA = ["--tracking-dir=/scratch/alice/trackers", "--cache-dir", "/scratch/alice/cache",
         "--notes=~/private/notes", "--micro-batch", "8"]  # fmt: skip


def test_select_redact_paths_redacts_both_spellings_inside_extra_run_args(tmp_path, capsys):
    res = _select_folder(tmp_path, EXTRA)
    out = tmp_path / "shared.json"
    assert select.main(["--results-dir", str(res), "--out", str(out), "--redact-paths"]) == 0
    text = out.read_text()
    assert "/scratch/alice" not in text and "private/notes" not in text
    args = json.loads(text)["experiment"]["extra_run_args"]
    assert args == ["--tracking-dir=<redacted>", "--cache-dir", REDACTED, "--notes=<redacted>",
                    "--micro-batch", "8"]  # fmt: skip


def test_push_redacts_extra_run_args_of_the_selection_in_both_spellings(report, tmp_path):
    sel = json.loads(report["selection"].read_text())
    sel["experiment"] = Experiment(tasks=[TASK], extra_run_args=EXTRA).to_dict()
    report["selection"].write_text(json.dumps(sel))
    stage_results(report["dir"], tmp_path / "stage", allow_partial=True)
    staged = (tmp_path / "stage" / "selection.json").read_text()
    assert "/scratch/alice" not in staged and "private/notes" not in staged
    assert "--tracking-dir=<redacted>" in staged and '"--micro-batch"' in staged


def test_redaction_reaches_paths_inside_messages_links_relative_paths_and_host_names(
    monkeypatch,
):
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-17.cluster.private")
    from encoder_eval.reports.share import local_roots, scrub_text

    data = {
        "error": "cannot open /scratch/alice/run/x.bin: No space left on device",
        "links": ["file:///home/alice/model", "sqlite:////scratch/alice/mlflow.db",
                  "http://gpu-node-17:5000/api", "https://huggingface.co/org/model"],
        "relative": ["./models/enc", "../private/enc", "results/select/m_t_lr06_s42.json"],
        "kept": ["org/model", "hub:org/x@abc", "mirror:sha256:00ff", "4.56.2", "macro/micro"],
    }  # fmt: skip
    clean, fields = redact_paths(data)
    assert clean["error"] == f"cannot open {REDACTED}: No space left on device"
    assert clean["links"] == [REDACTED, REDACTED, REDACTED, "https://huggingface.co/org/model"]
    assert clean["relative"] == [REDACTED] * 3
    assert clean["kept"] == data["kept"]
    assert "kept[0]" not in fields and "error" in fields
    message = "connection to gpu-node-17.cluster.private refused (gpu-node-17)"
    assert scrub_text(message, local_roots()) == f"connection to {REDACTED} refused ({REDACTED})"


def test_euroeval_export_never_writes_a_local_model_path(report, tmp_path):
    """`--record-model-path` recorded a local directory for enc-a and a Hub id for enc-b:
    EuroEval's `model` is the key for the one, the Hub id for the other."""
    local = tmp_path / "models" / "enc-a"
    local.mkdir(parents=True)
    for path in report["paths"]:
        data = json.loads(path.read_text())
        data["provenance"]["model_path"] = str(local) if "enc-a" in path.name else "org/enc-b"
        path.write_text(json.dumps(data))
    loaded = load_table(report["dir"], str(report["selection"]))
    records = {r["encoder_eval"]["model_key"]: r for r in euroeval_records(loaded.table,
                                                                           loaded.results)}  # fmt: skip
    assert records["enc-a"]["model"] == "enc-a" and records["enc-b"]["model"] == "org/enc-b"
    assert str(tmp_path) not in json.dumps(list(records.values()))


# ----------------------------------------------------------------------------- item 5


def _disk_full_for(monkeypatch, target: Path) -> None:
    real = fileio.write_atomic

    def write_atomic(path, data, **kw):
        if Path(path).absolute() == target.absolute():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(fileio, "write_atomic", write_atomic)


@pytest.mark.parametrize("command", ["select", "summarize", "export"])
def test_a_full_disk_on_out_is_one_error_line_and_the_old_file_stays(
    command, report, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out.txt"
    out.write_text("the old output\n")
    _disk_full_for(monkeypatch, out)
    if command == "select":
        argv = ["--results-dir", str(_select_folder(tmp_path, [])), "--out", str(out)]
        rc = select.main(argv)
    elif command == "summarize":
        rc = summarize.main(["--results-dir", str(report["dir"]), "--out", str(out),
                             "--allow-partial"])  # fmt: skip
    else:
        rc = export.main(["--format", "euroeval", "--results-dir", str(report["dir"]), "--out",
                          str(out), "--allow-partial"])  # fmt: skip
    assert rc == EXIT_INPUT_ERROR
    line = _last_error(capsys)
    assert f"--out {out} could not be written (No space left on device)" in line
    assert out.read_text() == "the old output\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(fileio.TMP_PREFIX)]


def _last_error(capsys) -> str:
    """The one `error:` line of stderr (select and summarize print notes before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return line


def test_a_cell_whose_result_cannot_be_written_leaves_no_predictions_behind(
    tmp_path, tiny_models, small_mirror, monkeypatch
):
    """The disk fills between the predictions and the result: the cell raises ("nothing
    written", as `run` says) and indeed leaves nothing beside the missing result."""
    from test_cell import cell

    from encoder_eval.cells import cell_result, train
    from encoder_eval.cells.predictions import predictions_path

    cfg = cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror))

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(cell_result, "write_json_atomic", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train.run_cell(cfg)
    assert not Path(cfg.out_json).exists()
    assert not predictions_path(cfg.out_json).exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".resume-")] == []


# ----------------------------------------------------------------------------- item 6


NEW_RESULT = "enc-c_glue_rte_lr05_s45.json"


def test_out_may_not_replace_an_input_or_a_file_the_results_folder_keeps(report, tmp_path, capsys):
    rdir, sel = report["dir"], report["selection"]
    before = {p: p.read_bytes() for p in [*rdir.iterdir(), sel]}
    link = tmp_path / "link.json"
    link.symlink_to(sel)
    attempts = [
        (summarize.main, ["--results-dir", rdir, "--out", sel]),  # the recorded selection
        (summarize.main, ["--results-dir", rdir, "--selection", sel, "--out", link]),
        (summarize.main, ["--results-dir", rdir, "--out", rdir / EXPERIMENT_NAME]),
        (
            summarize.main,
            ["--results-dir", rdir, "--format", "json", "--out", rdir / NEW_RESULT],
        ),  # named like a result: read as one next time
        (export.main, ["--format", "euroeval", "--results-dir", rdir, "--out", sel]),
        (
            export.main,
            ["--format", "examples", "--results-dir", rdir, "--out", report["paths"][0]],
        ),  # fmt: skip
        (
            select.main,
            [
                "--results-dir",
                _select_folder(tmp_path, []),
                "--out",
                tmp_path / "select" / EXPERIMENT_NAME,
            ],
        ),  # fmt: skip
        (
            select.main,
            [
                "--results-dir",
                tmp_path / "select",
                "--out",
                tmp_path / "select" / "m_glue_rte_lr06_s42.json",
            ],
        ),  # fmt: skip
    ]
    for main, argv in attempts:
        assert main([str(a) for a in argv]) == EXIT_INPUT_ERROR, argv
        line = _one_error(capsys)
        assert "this command's inputs" in line or "results folder" in line, line
    assert {p: p.read_bytes() for p in before} == before
    assert not (rdir / NEW_RESULT).exists()
    # a table written beside the results under a name of its own is fine
    for name in ("table.md", "table.json"):
        argv = ["--results-dir", str(rdir), "--out", str(rdir / name), "--allow-partial"]
        assert summarize.main(argv) == 0


# ----------------------------------------------------------------------------- item 7


@pytest.mark.parametrize("name", ["a,b", ".hidden", "-x", "..", ""])
def test_invalid_model_names_are_refused_when_planning(name, tmp_path, capsys):
    argv = ["--phase", "select", f"--model={name}=org/model", "--tasks", TASK,
            "--out-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "r")]  # fmt: skip
    assert sweep.main(argv) == EXIT_INPUT_ERROR
    line = _one_error(capsys)
    assert "must look like" in line if not name else "is not valid" in line
    assert not (tmp_path / "runs").exists()
    path = tmp_path / "exp.toml"
    path.write_text(f'version = 1\ntasks = ["{TASK}"]\n[models."{name}"]\npath = "org/m"\n')
    with pytest.raises(experiment.HarnessError, match="model name .* is not valid"):
        experiment.load(path)


# ----------------------------------------------------------------------------- item 8


@pytest.mark.parametrize("where", ["absolute", "escaping"])
def test_an_experiment_file_may_not_choose_where_a_sweep_writes_outside_its_folder(
    where, tmp_path, capsys
):
    shared = tmp_path / "shared"
    shared.mkdir()
    target = tmp_path / "victim" if where == "absolute" else "../victim"
    (shared / "experiment.toml").write_text(
        f'version = 1\ntasks = ["{TASK}"]\nmodels = ["xlm-r-base"]\nlr_keys = ["lr06"]\n'
        f'[seeds]\nselect = [42]\n[phases.select]\nresults_dir = "{target}"\n'
        f'out_dir = "{target}"\n'
    )
    argv = ["--experiment", str(shared / "experiment.toml"), "--phase", "select"]
    assert sweep.main(argv) == EXIT_INPUT_ERROR
    line = _one_error(capsys)
    assert "outside the experiment file's folder" in line and "on the command line" in line
    assert not (tmp_path / "victim").exists()
    # the command line decides: the same file with the user's own folders runs
    mine = ["--results-dir", str(tmp_path / "mine"), "--out-dir", str(tmp_path / "runs")]
    assert sweep.main(argv + mine) == EXIT_OK
    assert (tmp_path / "runs" / "run_all.sh").exists() and not (tmp_path / "victim").exists()


def test_phase_folders_inside_the_experiment_folder_are_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "experiment.toml").write_text(
        f'version = 1\ntasks = ["{TASK}"]\nmodels = ["xlm-r-base"]\nlr_keys = ["lr06"]\n'
        '[seeds]\nselect = [42]\n[phases.select]\nresults_dir = "results/select"\n'
        'out_dir = "runs/select"\n'
    )
    argv = ["--experiment", str(shared / "experiment.toml"), "--phase", "select"]
    assert sweep.main(argv) == EXIT_OK
    assert (shared / "runs" / "select" / "run_all.sh").exists()


# ----------------------------------------------------------------------------- item 9


def test_a_neuco_task_name_that_is_a_path_is_refused(tmp_path):
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "..__classification.csv").write_text("id,label\na,1\n")
    with pytest.raises(neuco.HarnessError, match=r"task name '\.\.' is not valid"):
        neuco.read_annotations(labels)


def test_the_neuco_leaderboard_is_csv_with_quotes_doubled_and_no_formulas(tmp_path):
    hostile = '=HYPERLINK("http://x","click"), "quoted"'
    _summary(tmp_path, "a", {"t1": 10.0})
    _summary(tmp_path, "b", {"t1": 4.0})
    summary = tmp_path / "out" / "dev" / "a" / "results_summary.json"
    summary.write_text(summary.read_text().replace('"method": "a"', json.dumps({"method": hostile})[1:-1]))  # fmt: skip
    path = neuco.summarize_runs(tmp_path / "out", "dev", now=datetime(2026, 1, 1, tzinfo=UTC))
    rows = list(csv.DictReader(path.read_text().splitlines()))
    assert [r["run"] for r in rows] == ["a", "b"]
    assert rows[0]["method"] == "'" + hostile  # the cell is text, not a formula
    assert rows[1]["method"] == "b" and rows[0]["t1_q"] == "10"
