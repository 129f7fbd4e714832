"""`encoder-eval export`: EuroEval benchmark-result records and one row per report example.

The EuroEval records are checked field by field against EuroEval's published schema, its
`BenchmarkResult` (src/euroeval/data_models.py of EuroEval/EuroEval, the version with
`dataset_languages`; `results` is its `ScoreDict` {raw: per-iteration scores, total:
{test_<metric>, test_<metric>_se, ...}} of src/euroeval/types.py and scores.py) as
docs/export.md cites it, by plain type checks and by a strict pydantic model of it. The
numbers are the `summarize --format json` table's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from result_helpers import make_selection, write_cell_with_predictions

from encoder_eval import export, summarize
from encoder_eval.cells.predictions import load_predictions, predictions_path
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import result_filename

MODELS = ("enc-a", "enc-b")
TASKS = ("glue_cola", "glue_rte")  # mcc and accuracy
SEEDS = range(45, 50)
N = 60

# EuroEval's BenchmarkResult: field -> the JSON types it accepts (None: null).
EUROEVAL_FIELDS: dict[str, tuple[type | None, ...]] = {
    "dataset": (str,),
    "task": (str,),
    "dataset_languages": (list,),
    "model": (str,),
    "results": (dict,),
    "num_model_parameters": (int,),
    "max_sequence_length": (int,),
    "vocabulary_size": (int,),
    "merge": (bool,),
    "generative": (bool,),
    "generative_type": (str, None),
    "few_shot": (bool,),
    "validation_split": (bool,),
    "euroeval_version": (str, None),
    "transformers_version": (str, None),
    "torch_version": (str, None),
}


@pytest.fixture
def report_dir(tmp_path):
    rng = np.random.default_rng(7)
    labels = {t: rng.integers(0, 2, N).tolist() for t in TASKS}
    for i, model in enumerate(MODELS):
        for task in TASKS:
            for seed in SEEDS:
                right = rng.random(N) < 0.7 + 0.1 * i
                preds = [y if ok else 1 - y for y, ok in zip(labels[task], right, strict=True)]
                write_cell_with_predictions(tmp_path, model, task, "lr05", seed, preds,
                                            labels[task])  # fmt: skip
    sel = make_selection({(m, t): "lr05" for m in MODELS for t in TASKS})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    return tmp_path


def _run(capsys, module, *args) -> tuple[int, str, str]:
    code = module.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _is(value, types) -> bool:
    if value is None:
        return None in types
    if isinstance(value, bool):  # a bool is an int to Python, never to the schema
        return bool in types
    return any(t is not None and t is not bool and isinstance(value, t) for t in types)


def test_euroeval_records_follow_the_published_schema_with_the_tables_numbers(report_dir, capsys):
    common = ["--results-dir", str(report_dir), "--selection", str(report_dir / "selection.json")]
    code, out, err = _run(capsys, export, "--format", "euroeval-legacy", *common)
    assert code == EXIT_OK, err
    records = [json.loads(line) for line in out.splitlines()]
    table = json.loads(_run(capsys, summarize, *common, "--format", "json")[1])
    cells = {(r["model"], t): c for r in table["rows"] for t, c in r["cells"].items()}
    assert len(records) == len(cells) == len(MODELS) * len(TASKS)
    for rec in records:
        for name, types in EUROEVAL_FIELDS.items():
            assert name in rec, name
            assert _is(rec[name], types), (name, rec[name])
        assert all(isinstance(lang, str) for lang in rec["dataset_languages"])
        assert set(rec["results"]) == {"raw", "total"}
        raw, total = rec["results"]["raw"], rec["results"]["total"]
        assert isinstance(raw, list) and all(isinstance(r, dict) for r in raw)
        assert all(isinstance(k, str) and type(v) is float for r in raw for k, v in r.items())
        assert all(isinstance(k, str) and type(v) is float for k, v in total.items())
        # The numbers: raw = each seed's score, total = the mean and 1.96 SE, x100.
        want = cells[(rec["encoder_eval"]["model_key"], rec["dataset"])]
        key = f"test_{want['metric']}"
        assert [r[key] for r in raw] == [want["scores"][str(s)] for s in want["seeds"]]
        assert total[key] == pytest.approx(100 * want["mean"], rel=1e-12)
        se = 1.96 * want["std"] / math.sqrt(want["n"])
        assert total[f"{key}_se"] == pytest.approx(100 * se, rel=1e-12)
        # GLUE's test labels are hidden: both tasks are reported on dev, as EuroEval's
        # validation_split says of a result on the validation split.
        assert rec["generative"] is False and rec["validation_split"] is True
        assert rec["dataset_languages"] == ["en"]
    cola = next(r for r in records if r["dataset"] == "glue_cola")
    assert cola["task"] == "linguistic-acceptability" and "test_mcc" in cola["results"]["total"]

    pydantic = pytest.importorskip("pydantic")

    class BenchmarkResult(pydantic.BaseModel):  # EuroEval's, strict: no coercion at all
        model_config = pydantic.ConfigDict(strict=True, protected_namespaces=())
        dataset: str
        task: str
        dataset_languages: list[str]
        model: str
        results: dict[str, dict[str, float] | list[dict[str, float]]]
        num_model_parameters: int
        max_sequence_length: int
        vocabulary_size: int
        merge: bool
        generative: bool
        generative_type: str | None
        few_shot: bool
        validation_split: bool
        euroeval_version: str | None = None
        transformers_version: str | None = None
        torch_version: str | None = None

    for rec in records:
        BenchmarkResult.model_validate(rec)


def test_examples_are_one_row_per_example_and_seed_from_the_predictions_files(report_dir, capsys):
    out_file = report_dir.parent / f"{report_dir.name}-examples.jsonl"  # outside the results
    code, _, err = _run(capsys, export, "--format", "examples", "--results-dir",
                        str(report_dir), "--selection", str(report_dir / "selection.json"),
                        "--out", str(out_file))  # fmt: skip
    assert code == EXIT_OK, err
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(rows) == len(MODELS) * len(TASKS) * len(SEEDS) * N
    assert set(rows[0]) == {"model", "task", "seed", "lr_key", "metric", "split", "language",
                            "id", "gold", "prediction"}  # fmt: skip
    # Each cell's rows are its predictions file, in order.
    mine = [r for r in rows if (r["model"], r["task"], r["seed"]) == ("enc-b", "glue_rte", 47)]
    path = report_dir / result_filename("enc-b", "glue_rte", LR_GRID["lr05"], 47)
    preds = load_predictions(predictions_path(path)).languages["en"]
    assert [r["prediction"] for r in mine] == preds.predictions
    assert [r["gold"] for r in mine] == preds.labels
    assert [r["id"] for r in mine] == list(range(N))
    assert {r["language"] for r in mine} == {"en"} and mine[0]["split"] == "validation"


def test_export_refuses_a_table_with_problems_unless_allow_partial(report_dir, capsys):
    (report_dir / result_filename("enc-a", "glue_rte", LR_GRID["lr05"], 49)).unlink()
    args = ["--format", "euroeval-legacy", "--results-dir", str(report_dir), "--selection",
            str(report_dir / "selection.json")]  # fmt: skip
    code, out, err = _run(capsys, export, *args)
    assert code == EXIT_INCOMPLETE and out == ""
    assert "export refuses this table" in err and "[missing_seeds]" in err
    code, out, _ = _run(capsys, export, *args, "--allow-partial")
    assert code == EXIT_OK
    rec = next(json.loads(x) for x in out.splitlines()
               if '"enc-a"' in x and '"glue_rte"' in x)  # fmt: skip
    assert len(rec["results"]["raw"]) == 4 and rec["encoder_eval"]["on_protocol"] is False


@pytest.mark.parametrize("fmt", ["euroeval", "examples"])
def test_export_refuses_an_output_in_a_results_folder(report_dir, capsys, fmt):
    # issue 50: accepted, and every later command warned about the stray file
    out = report_dir / "ours.jsonl"
    args = ["--format", fmt, "--results-dir", str(report_dir), "--selection",
            str(report_dir / "selection.json"), "--out", str(out)]  # fmt: skip
    code, stdout, err = _run(capsys, export, *args)
    assert code == EXIT_INPUT_ERROR and stdout == "" and not out.exists()
    assert f"--out {out} lies in --results-dir {report_dir}: a results folder keeps" in err


def test_examples_refuse_a_predictions_file_that_does_not_match_its_result(report_dir, capsys):
    """A stale file (here: its predictions flipped) is refused, never exported."""
    mine = predictions_path(report_dir / result_filename("enc-a", "glue_rte", LR_GRID["lr05"], 46))
    doc = json.loads(mine.read_text())
    doc["languages"]["en"]["predictions"] = [1 - p for p in doc["languages"]["en"]["predictions"]]
    mine.write_text(json.dumps(doc))
    code, out, err = _run(capsys, export, "--format", "examples", "--results-dir",
                          str(report_dir), "--selection", str(report_dir / "selection.json"))  # fmt: skip
    assert code == EXIT_INPUT_ERROR and out == ""
    last = err.strip().splitlines()[-1]  # after the warning about selection.json there
    assert last.startswith("error: ") and mine.name in last and "predictions score" in last
