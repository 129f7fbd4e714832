"""`export --format euroeval`: EuroEval's "Every Eval Ever" (EEE) records, checked against
the published schema and against how EuroEval reads them.

- The schema: `every_eval_ever/schemas/eval.schema.json` of evaleval/every_eval_ever at
  commit a6a1211897850892a7a58ecd749947538785d0e9, version 0.2.1 (vendored in
  tests/fixtures/eee/, its README gives the source). Every record is validated against it
  by `jsonschema` when installed, and always by `_validate` below, a draft-07 validator
  of the keywords that file uses (it refuses any other keyword, so none is skipped).
- EuroEval's side, EuroEval/EuroEval at commit f37841c8d538d81a7360212746f7a2b30815b1d1:
  `EEE_SCHEMA_VERSION = "0.2.1"` (src/euroeval/constants.py); the leaderboard loader
  (src/leaderboards/result_loading.py) refuses a record unless `is_eee_record`
  (src/leaderboards/eee_validation.py: `schema_version`, and `model_info`, `eval_library`
  dicts, `evaluation_results` a list) and keys it by `identity_from_eee_record`
  (src/leaderboards/result_identity.py); `BenchmarkResult.from_dict` reads an EEE record
  through `benchmark_result_from_eee_dict` (src/euroeval/eee_utils.py). `_euroeval_reads`
  restates where that reader takes each field from; the test checks it gets back the
  `BenchmarkResult` fields of the legacy record of the same cell (`--format
  euroeval-legacy`), so the two formats say one thing.
- The numbers are `summarize --format json`'s.
- Every Eval Ever 0.3.0 (PyPI `every-eval-ever` 0.3.0, `every_eval_ever/schemas/
  eval.schema.json`, vendored beside 0.2.1 as `eval.schema.0.3.0.json`): it requires
  `model_info.additional_details.deployment_type` and `.model_availability`. The records
  say 0.2.1 (what EuroEval writes) and are valid under both schemas.

On main, `--format euroeval` wrote the legacy records, which `is_eee_record` refuses."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from result_helpers import make_selection, write_cell_with_predictions

from encoder_eval import export, summarize
from encoder_eval.core.errors import EXIT_INPUT_ERROR, EXIT_OK

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "eee" / "eval.schema.json").read_text())
SCHEMA_030 = json.loads(
    (Path(__file__).parent / "fixtures" / "eee" / "eval.schema.0.3.0.json").read_text()
)
SCHEMAS = {"0.2.1": SCHEMA, "0.3.0": SCHEMA_030}
MODELS = ("enc-a", "enc-b")
TASKS = ("glue_cola", "glue_rte", "xnli")  # mcc (range -1..1), accuracy, a multilingual task
SEEDS = range(45, 50)
N = 60

# ----------------------------------------------------------------------------- the schema

_ANNOTATIONS = {"description", "default", "$schema", "version", "$defs"}
_TYPES = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _validate(value, schema: dict, where: str = "$", root: dict | None = None) -> list[str]:
    """The errors of `value` against `schema` (draft-07, the keywords of the EEE schemas),
    `$ref`s resolved in `root` (default: `schema` itself at the top, else 0.2.1's)."""
    errors: list[str] = []
    root = root if root is not None else (schema if "$defs" in schema else SCHEMA)
    unknown = set(schema) - _ANNOTATIONS - {
        "type", "required", "properties", "additionalProperties", "enum", "const", "oneOf",
        "$ref", "if", "then", "else", "items", "minItems", "minimum", "maximum", "pattern",
    }  # fmt: skip
    assert not unknown, f"the validator does not know {unknown} (at {where})"
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), ref
        errors += _validate(value, root["$defs"][ref.removeprefix("#/$defs/")], where, root)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return [*errors, f"{where}: {value!r} is not {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} != {schema['const']!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: {value} > {schema['maximum']}")
    if isinstance(value, dict):
        errors += [f"{where}: missing {k}" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        for k, v in value.items():
            if k in props:
                errors += _validate(v, props[k], f"{where}.{k}", root)
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: {k} is not allowed")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += _validate(v, schema["additionalProperties"], f"{where}.{k}", root)
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if "items" in schema:
            for i, v in enumerate(value):
                errors += _validate(v, schema["items"], f"{where}[{i}]", root)
    if "oneOf" in schema:
        passing = sum(not _validate(value, s, where, root) for s in schema["oneOf"])
        if passing != 1:
            errors.append(f"{where}: matches {passing} of oneOf's schemas, not 1")
    if "if" in schema:
        branch = "then" if not _validate(value, schema["if"], where, root) else "else"
        if branch in schema:
            errors += _validate(value, schema[branch], where, root)
    return errors


def test_the_validator_catches_what_the_schema_forbids():
    """The hand validator is not a no-op: each kind of error of the schema is found."""
    good = {"schema_version": "0.2.1", "evaluation_id": "a/b/1", "retrieved_timestamp": "1",
            "source_metadata": {"source_type": "evaluation_run", "source_organization_name":
                                "x", "evaluator_relationship": "other"},
            "model_info": {"name": "m", "id": "m"}, "eval_library": {"name": "l", "version": "1"},
            "evaluation_results": [{"evaluation_name": "e", "source_data": {
                "dataset_name": "d", "source_type": "hf_dataset"},
                "metric_config": {"lower_is_better": False, "score_type": "continuous",
                                  "min_score": 0, "max_score": 1},
                "score_details": {"score": 1.0}}]}  # fmt: skip
    assert _validate(good, SCHEMA) == []
    bad = [
        ("extra", lambda r: r.update(extra=1)),  # additionalProperties: false
        ("missing", lambda r: r.pop("model_info")),  # required
        ("null detail", lambda r: r["model_info"].update(additional_details={"a": None})),
        ("bool detail", lambda r: r["model_info"].update(additional_details={"open": True})),
        ("enum", lambda r: r["source_metadata"].update(evaluator_relationship="me")),
        ("oneOf", lambda r: r["evaluation_results"][0]["source_data"].update(source_type="hf")),
        ("if/then", lambda r: r["evaluation_results"][0]["metric_config"].pop(
            "min_score")),  # a continuous score needs min_score and max_score
        # No score_type: the `if` (score_type = levels) holds vacuously, so level_names
        # and has_unknown_level are required (EuroEval's speed metrics fail this).
        ("vacuous if", lambda r: r["evaluation_results"][0]["metric_config"].pop(
            "score_type")),
        ("maximum", lambda r: r["evaluation_results"][0]["score_details"].update(
            uncertainty={"confidence_interval": {"lower": 0, "upper": 1,
                                                 "confidence_level": 95}})),
        ("type", lambda r: r["evaluation_results"][0]["score_details"].update(score="1")),
    ]  # fmt: skip
    for name, change in bad:
        rec = json.loads(json.dumps(good))
        change(rec)
        assert _validate(rec, SCHEMA), name


def _check_under_both_schemas(rec: dict) -> None:
    """`rec` is valid under EEE 0.2.1 and 0.3.0: by the hand validator and by `jsonschema`
    (the `dev` extra's)."""
    import jsonschema

    for version, schema in SCHEMAS.items():
        assert _validate(rec, schema) == [], (version, _validate(rec, schema))
        jsonschema.Draft7Validator(schema).validate(rec)


def test_the_validator_knows_what_0_3_0_added():
    """0.3.0 requires the two deployment details (enums) that 0.2.1 did not know: the hand
    validator finds a record without them, or with another value, invalid under 0.3.0
    only, as `jsonschema` does."""
    import jsonschema

    rec = {"schema_version": "0.2.1", "evaluation_id": "a/b/1", "retrieved_timestamp": "1",
           "source_metadata": {"source_type": "evaluation_run", "source_organization_name":
                               "x", "evaluator_relationship": "other"},
           "model_info": {"name": "m", "id": "m", "additional_details": {
               "deployment_type": "self_deployed", "model_availability": "unknown"}},
           "eval_library": {"name": "l", "version": "1"},
           "evaluation_results": [{"evaluation_name": "e", "source_data": {
               "dataset_name": "d", "source_type": "hf_dataset"},
               "metric_config": {"lower_is_better": False, "score_type": "continuous",
                                 "min_score": 0, "max_score": 1},
               "score_details": {"score": 1.0}}]}  # fmt: skip
    for version, schema in SCHEMAS.items():
        assert _validate(rec, schema) == [], version
        jsonschema.Draft7Validator(schema).validate(rec)
    for change in (lambda d: d.pop("deployment_type"), lambda d: d.pop("model_availability"),
                   lambda d: d.update(deployment_type="local"),
                   lambda d: d.update(model_availability="open")):  # fmt: skip
        bad = json.loads(json.dumps(rec))
        change(bad["model_info"]["additional_details"])
        assert _validate(bad, SCHEMA) == []
        assert _validate(bad, SCHEMA_030), bad
        assert not jsonschema.Draft7Validator(SCHEMA_030).is_valid(bad)


# ----------------------------------------------------------------------------- EuroEval's reader


def _euroeval_reads(rec: dict) -> dict:
    """The `BenchmarkResult` fields EuroEval's `benchmark_result_from_eee_dict`
    (src/euroeval/eee_utils.py @ f37841c) takes from an EEE record, from where it takes
    them (its int/bool parsing: `int(str)`, `== "true"`, `json.loads`)."""
    model_add = rec["model_info"].get("additional_details", {})
    lib_add = rec["eval_library"].get("additional_details", {})
    total: dict[str, float] = {}
    for er in rec["evaluation_results"]:
        name, sd = er["evaluation_name"], er["score_details"]
        total[name] = sd["score"]
        ci = sd.get("uncertainty", {}).get("confidence_interval", {})
        if "lower" in ci and "upper" in ci:
            total[f"{name}_se"] = (ci["upper"] - ci["lower"]) / 2
        details = sd.get("details", {})
        if "num_failed_instances" in details and "num_failed_instances" not in total:
            total["num_failed_instances"] = float(details["num_failed_instances"])
    opt_bool = lambda v: None if v is None else v.lower() == "true"  # noqa: E731
    return {
        "dataset": rec["evaluation_results"][0]["source_data"]["dataset_name"],
        "task": lib_add.get("task", ""),
        "languages": json.loads(lib_add.get("languages", "[]")),
        "model": rec["model_info"].get("name", ""),
        "raw": json.loads(lib_add.get("raw_results", "[]")),
        "total": total,
        "num_model_parameters": int(model_add.get("num_model_parameters", "0") or "0"),
        "max_sequence_length": int(model_add.get("max_sequence_length", "0") or "0"),
        "vocabulary_size": int(model_add.get("vocabulary_size", "0") or "0"),
        "merge": model_add.get("merge", "false") == "true",
        "generative": model_add.get("generative", "false") == "true",
        "generative_type": model_add.get("generative_type"),
        "few_shot": opt_bool(lib_add.get("few_shot")),
        "validation_split": opt_bool(lib_add.get("validation_split")),
        "transformers_version": lib_add.get("transformers_version"),
        "torch_version": lib_add.get("torch_version"),
    }


def _is_eee_record(rec: dict) -> bool:
    """src/leaderboards/eee_validation.py @ f37841c, `is_eee_record`."""
    return (
        "schema_version" in rec
        and isinstance(rec.get("model_info"), dict)
        and isinstance(rec.get("eval_library"), dict)
        and isinstance(rec.get("evaluation_results"), list)
    )


# ----------------------------------------------------------------------------- the export


@pytest.fixture
def report_dir(tmp_path):
    rng = np.random.default_rng(11)
    labels = {t: rng.integers(0, 2 if t != "xnli" else 3, N).tolist() for t in TASKS}
    for i, model in enumerate(MODELS):
        for task in TASKS:
            for seed in SEEDS:
                right = rng.random(N) < 0.6 + 0.15 * i
                preds = [y if ok else (y + 1) % 2 for y, ok in zip(labels[task], right,
                                                                     strict=True)]  # fmt: skip
                write_cell_with_predictions(tmp_path, model, task, "lr05", seed, preds,
                                            labels[task])  # fmt: skip
    sel = make_selection({(m, t): "lr05" for m in MODELS for t in TASKS})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    return tmp_path


def _export(capsys, report_dir, fmt: str, *more: str) -> list[dict]:
    code = export.main(["--format", fmt, "--results-dir", str(report_dir), "--selection",
                        str(report_dir / "selection.json"), *more])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    return [json.loads(line) for line in out.splitlines()]


def test_euroeval_records_are_eee_records_euroeval_reads_as_the_legacy_ones(report_dir, capsys):
    records = _export(capsys, report_dir, "euroeval")
    legacy = _export(capsys, report_dir, "euroeval-legacy")
    table = json.loads(_run_summarize(capsys, report_dir))
    cells = {(r["model"], t): c for r in table["rows"] for t, c in r["cells"].items()}
    assert len(records) == len(legacy) == len(MODELS) * len(TASKS)
    for rec, old in zip(records, legacy, strict=True):
        # The published schema, field by field.
        assert _validate(rec, SCHEMA) == [], _validate(rec, SCHEMA)
        jsonschema.validate(rec, SCHEMA)
        assert rec["schema_version"] == "0.2.1" == SCHEMA["version"]
        assert (
            rec["evaluation_id"] == f"{old['dataset']}/{old['model']}/" + rec["retrieved_timestamp"]
        )  # the schema's eval_name/model_id/retrieved_timestamp
        assert _is_eee_record(rec) and not _is_eee_record(old)
        _check_under_both_schemas(rec)
        # EuroEval reads back what the legacy record says (its `from_dict` of either).
        got = _euroeval_reads(rec)
        key = next(k for k in old["results"]["total"] if k.startswith("test_") and
                   not k.endswith("_se"))  # fmt: skip
        for name in ("dataset", "task", "model", "num_model_parameters", "max_sequence_length",
                     "vocabulary_size", "merge", "generative", "generative_type", "few_shot",
                     "validation_split", "transformers_version", "torch_version"):  # fmt: skip
            assert got[name] == old[name], name
        assert got["languages"] == old["dataset_languages"]
        assert got["raw"] == old["results"]["raw"]
        assert got["total"][key] == old["results"]["total"][key]
        assert got["total"]["num_failed_instances"] == 0.0
        # The leaderboard's identity: (model id, dataset, validation_split, few_shot).
        lib = rec["eval_library"]["additional_details"]
        assert (rec["model_info"]["id"], lib["dataset"], lib["validation_split"],
                lib["few_shot"]) == (old["model"], old["dataset"],
                                     str(old["validation_split"]).lower(), "false")  # fmt: skip
        # The numbers: the table's mean, std and 95 % t interval (x100), n = the seeds.
        want = cells[(json.loads(lib["encoder_eval"])["model_key"], old["dataset"])]
        result = rec["evaluation_results"][0]
        sd, unc = result["score_details"], result["score_details"]["uncertainty"]
        assert sd["score"] == pytest.approx(100 * want["mean"], rel=1e-12)
        assert unc["num_samples"] == want["n"] == 5
        assert unc["standard_deviation"] == pytest.approx(100 * want["std"], rel=1e-12)
        se = 100 * want["std"] / math.sqrt(want["n"])
        assert unc["standard_error"]["value"] == pytest.approx(se, rel=1e-12)
        ci = unc["confidence_interval"]
        assert (ci["lower"], ci["upper"]) == pytest.approx(
            (100 * want["ci"]["low"], 100 * want["ci"]["high"]), rel=1e-12
        )
        assert want["ci"]["method"] == "t" and ci["confidence_level"] == 0.95
        # So EuroEval's `_se` is the t half-width (2.776 SE for 5 seeds), not 1.96 SE.
        assert got["total"][f"{key}_se"] == pytest.approx(2.7764451 * se, rel=1e-6)
        assert result["evaluation_name"] == key
        assert result["metric_config"]["metric_id"] == want["metric"]
    # The metric's range: MCC runs from -100 to 100, accuracy from 0.
    by_task = {r["evaluation_results"][0]["source_data"]["dataset_name"]: r for r in records}
    assert by_task["glue_cola"]["evaluation_results"][0]["metric_config"]["min_score"] == -100
    assert by_task["glue_rte"]["evaluation_results"][0]["metric_config"]["min_score"] == 0
    # The Hub dataset each score was read from, and the split it is on.
    src = by_task["glue_rte"]["evaluation_results"][0]["source_data"]
    assert (src["source_type"], src["hf_repo"], src["hf_split"]) == (
        "hf_dataset", "nyu-mll/glue", "validation")  # fmt: skip
    assert src["additional_details"] == {"config": "rte", "revision": "sha-a"}
    xnli = by_task["xnli"]["evaluation_results"][0]["source_data"]["additional_details"]
    assert json.loads(xnli["configs"])["de"] == "de"


def test_eee_is_the_euroeval_format_and_valid_under_0_2_1_and_0_3_0(report_dir, capsys):
    """`--format eee` (the name docs use) writes the records of `--format euroeval`; each
    says how the model ran (the harness loaded and ran it: self_deployed) and that the
    weights' availability is not known to it, the two details EEE 0.3.0 requires, and is
    valid under both schema versions."""
    eee = _export(capsys, report_dir, "eee")
    euroeval = _export(capsys, report_dir, "euroeval")
    assert len(eee) == len(MODELS) * len(TASKS)
    for a, b in zip(eee, euroeval, strict=True):
        _check_under_both_schemas(a)
        for rec in (a, b):
            rec.pop("retrieved_timestamp")
            rec.pop("evaluation_id")
        assert a == b
        details = a["model_info"]["additional_details"]
        assert (details["deployment_type"], details["model_availability"]) == (
            "self_deployed", "unknown")  # fmt: skip
    assert SCHEMA_030["version"] == "0.3.0"


def _run_summarize(capsys, report_dir) -> str:
    code = summarize.main(["--results-dir", str(report_dir), "--selection",
                           str(report_dir / "selection.json"), "--format", "json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    return out


def test_one_seed_has_no_interval_and_stays_valid(report_dir, capsys):
    """A partial cell of one seed: no std, no interval (EuroEval writes none for a NaN
    `_se`), and the record still validates."""
    for seed in range(46, 50):
        for p in report_dir.glob(f"enc-a_glue_rte_*_s{seed}*"):
            p.unlink()
    records = _export(capsys, report_dir, "euroeval", "--allow-partial", "--models", "enc-a",
                      "--tasks", "glue_rte")  # fmt: skip
    (rec,) = records
    assert _validate(rec, SCHEMA) == []
    _check_under_both_schemas(rec)
    unc = rec["evaluation_results"][0]["score_details"]["uncertainty"]
    assert unc == {"num_samples": 1}
    assert "test_accuracy_se" not in _euroeval_reads(rec)["total"]
    assert json.loads(rec["eval_library"]["additional_details"]["encoder_eval"])[
        "on_protocol"] is False  # fmt: skip


def test_source_url_belongs_to_hub_eval_results(report_dir, capsys):
    code = export.main(["--format", "euroeval", "--results-dir", str(report_dir),
                        "--source-url", "https://huggingface.co/x"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_INPUT_ERROR and "--source-url is for --format hub-eval-results" in err


def test_a_recorded_local_model_path_never_reaches_a_record(report_dir, capsys, tmp_path):
    """`--record-model-path` recorded a local folder for enc-a and a Hub id for enc-b: the
    record names enc-a by its key and enc-b by its Hub id, and holds no local path."""
    local = tmp_path / "models" / "enc-a"
    for path in report_dir.glob("enc-*_s4?.json"):
        data = json.loads(path.read_text())
        data["provenance"]["model_path"] = str(local) if "enc-a" in path.name else "org/enc-b"
        path.write_text(json.dumps(data))
    records = _export(capsys, report_dir, "euroeval")
    assert {r["model_info"]["id"] for r in records} == {"enc-a", "org/enc-b"}
    assert str(tmp_path) not in json.dumps(records)
    assert {r["evaluation_id"].rsplit("/", 1)[0] for r in records} >= {"xnli/org/enc-b"}
