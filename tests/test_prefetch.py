"""`python -m encoder_eval.prefetch`: mirror layout, manifest, atomic writes, clear errors.

The Hub is not reachable here: the tests replace the one function that returns Hub rows
(`sources.read_hub_rows`) with one reading a source mirror built from real data, and the
commit resolver with a fixed answer; the real offline path runs in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from mirror_helpers import (
    SEAHORSE_LONG_QUESTIONS,
    massive_mirror,
    shared_data,
    split_mirror,
    write_jsonl,
)

from encoder_eval import prefetch
from encoder_eval.core.errors import HarnessError
from encoder_eval.data import revisions, sources
from encoder_eval.data.sources import data_provenance, read_jsonl
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.tasks import TASK_KNOBS

REPO = Path(__file__).resolve().parents[1]
SHA = {"current": "c0ffee" + "0" * 34}
# The suite's Hub tasks (the Hub's ranking task, ms_marco_v21, has tests/test_marco_hub.py).
REAL_TASKS = [n for n, k in TASK_KNOBS.items() if k.hf_path is not None and k.bucket != "ranking"]


def _quiet_load(task, data_dir):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*mirror has no .*skipped")
        return load_task(task, data_dir)


def _fill_languages(source: Path, task: str) -> None:
    """Give every language the Hub has a file: copy the first rows of another language's."""
    for split in ("train", "validation", "test"):
        have = [lang for lang in sources.file_languages(task)
                if sources.mirror_file(source, task, split, lang).exists()]  # fmt: skip
        if not have:
            continue
        donor = sources.read_jsonl(sources.mirror_file(source, task, split, have[0]))[:20]
        for lang in sources.file_languages(task):
            path = sources.mirror_file(source, task, split, lang)
            if not path.exists():
                rows = [{**r, "language": lang} if "language" in r else r for r in donor]
                write_jsonl(path, rows)


def _copy_spread(task: str, dest: Path, n: int) -> None:
    """Copy n rows spread evenly over each real file: its head can be one class (sorted files)."""
    for path in sorted((shared_data() / task).glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        spread = lines[:: max(1, len(lines) // n)][:n]
        (dest / task).mkdir(parents=True, exist_ok=True)
        (dest / task / path.name).write_text("".join(spread), encoding="utf-8")


def build_source(task: str, root: Path) -> Path:
    """A stand-in for the Hub: every split and language the task's loader reads."""
    if task in ("glue_stsb", "sg_wsc"):
        return shared_data()  # full real files
    if task == "massive_intent":
        return massive_mirror(root, {"train": 60, "validation": 20, "test": 20})
    if task == "amazon_reviews_multi":
        _copy_spread(task, root, 60)
    else:  # xnli, paws_x, seahorse: validation only in the real mirror
        split_mirror(task, root, limit=None if task == "seahorse" else 300)
    _fill_languages(root, task)
    return root


class FakeHub:
    """Replaces `sources.read_hub_rows`: rows of (task, split, lang) from a source mirror."""

    def __init__(self, source: Path, fail_for: str | None = None):
        self.source, self.fail_for, self.calls = source, fail_for, []

    def __call__(self, task, split, lang, revision=None):
        self.calls.append((task, split, lang, revision))
        path = sources.mirror_file(self.source, task, split, lang)
        if task == self.fail_for or not path.exists():
            raise HarnessError(f"could not load {task} {split} {lang} from the Hub: fake")
        return read_jsonl(path)


@pytest.fixture
def hub(monkeypatch):
    """Install a FakeHub over a source directory; resolve every revision to SHA['current']."""
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    monkeypatch.delenv("ENCODER_EVAL_DATASET_REVISIONS", raising=False)
    monkeypatch.setattr(prefetch, "resolve_revision", lambda repo, rev: SHA["current"])

    def install(source: Path, fail_for: str | None = None) -> FakeHub:
        fake = FakeHub(source, fail_for)
        monkeypatch.setattr(sources, "read_hub_rows", fake)
        return fake

    return install


def _manifest(out: Path) -> dict:
    return json.loads((out / "MANIFEST.json").read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize(
    "task",
    ["glue_stsb", "sg_wsc", "amazon_reviews_multi", "seahorse", "massive_intent", "xnli"],
)
def test_prefetch_writes_a_mirror_that_loads_like_the_source(task, tmp_path, hub, capsys):
    source = build_source(task, tmp_path / "hub")
    fake = hub(source)
    out = tmp_path / "mirror"
    assert prefetch.main(["--tasks", task, "--out", str(out)]) == 0
    knobs = TASK_KNOBS[task]

    # Exactly the layout the loaders read, and nothing else (no temporaries left).
    names = {sources.mirror_file(out, task, split, lang).name
             for split in prefetch.default_splits(task) for lang in sources.file_languages(task)}  # fmt: skip
    assert {p.name for p in (out / task).iterdir()} == names
    assert {p.name for p in out.iterdir()} == {task, "MANIFEST.json"}
    if knobs.language_field:
        assert names == {"train.jsonl", "validation.jsonl", "test.jsonl"}
    for name in names:
        assert read_jsonl(out / task / name) == read_jsonl(source / task / name)

    # The manifest: resolved commit, requested revision, rows and SHA-256 of every file.
    manifest = _manifest(out)
    assert manifest["schema"] == "encoder-eval-mirror" and manifest["version"] == 1
    entry = manifest["tasks"][task]
    assert entry["dataset"] == knobs.hf_path
    assert entry["revision"] == SHA["current"]
    assert entry["revision_requested"] == revisions.dataset_revisions()[knobs.hf_path]
    assert set(entry["files"]) == names
    for name, info in entry["files"].items():
        data = (out / task / name).read_bytes()
        assert info == {"rows": data.count(b"\n"), "sha256": hashlib.sha256(data).hexdigest()}
    assert {c[3] for c in fake.calls} == {SHA["current"]}  # read at the resolved commit

    # The mirror loads to the same data as the source, and as Hub mode (same rows) does.
    from_mirror = _quiet_load(task, out)
    assert from_mirror == _quiet_load(task, source)
    assert _quiet_load(task, None) == from_mirror
    prov = data_provenance(task, out)
    assert prov["source"] == "mirror" and prov["revision"] == entry["revision"] == SHA["current"]
    assert prov["manifest"] == {k: entry[k] for k in ("dataset", "revision", "revision_requested")}
    assert prov["identity"] == f"mirror:sha256:{prov['sha256']}"

    printed = capsys.readouterr().out
    for name in names:
        assert f"{task}: wrote {out / task / name} ({entry['files'][name]['rows']} rows" in printed
    assert "manifest updated" in printed


def _seahorse_long(wide: list[dict]) -> list[dict]:
    """The Hub copy's long schema: a row per Yes/No answer, `question` holding its text."""
    keep = ("gem_id", "worker_lang", "model", "article", "summary")
    long = []
    for row in wide:
        for number, text in enumerate(SEAHORSE_LONG_QUESTIONS, start=1):
            if (answer := row[f"question{number}"]) in ("Yes", "No"):
                long.append({**{k: row[k] for k in keep}, "question": text, "answer": answer})
    return long


def test_seahorse_prefetched_in_the_long_schema_loads_like_the_wide(tmp_path, hub, capsys):
    wide = tmp_path / "wide"
    split_mirror("seahorse", wide, limit=1500)
    for split in ("train", "validation", "test"):
        path = sources.mirror_file(wide, "seahorse", split, None)
        rows = [{**r, "article": f"Article {r['gem_id']}."} for r in read_jsonl(path)]
        write_jsonl(path, rows)
        write_jsonl(sources.mirror_file(tmp_path / "hub", "seahorse", split, None),
                    _seahorse_long(rows))  # fmt: skip
    hub(tmp_path / "hub")
    out = tmp_path / "mirror"
    assert prefetch.main(["--tasks", "seahorse", "--out", str(out)]) == 0
    assert "will not load" not in capsys.readouterr().out
    for name in ("train.jsonl", "validation.jsonl", "test.jsonl"):  # the Hub's rows, as read
        assert read_jsonl(out / "seahorse" / name) == read_jsonl(tmp_path / "hub/seahorse" / name)
    expected = _quiet_load("seahorse", wide)
    assert len({v for s in expected[1].values() for v in s["label"]}) == 7
    assert _quiet_load("seahorse", out) == expected


def test_default_splits():
    assert prefetch.default_splits("glue_rte") == ("train", "validation")
    assert prefetch.default_splits("sg_cb") == ("train", "validation")
    assert prefetch.default_splits("xnli") == ("train", "validation", "test")
    assert prefetch.default_splits("seahorse") == ("train", "validation", "test")


def test_splits_option(tmp_path, hub):
    fake = hub(shared_data())
    out = tmp_path / "m"
    assert prefetch.main(["--tasks", "glue_stsb", "--out", str(out), "--splits", "test"]) == 0
    assert sorted(p.name for p in (out / "glue_stsb").iterdir()) == ["test.jsonl"]
    assert fake.calls == [("glue_stsb", "test", None, SHA["current"])]
    assert list(_manifest(out)["tasks"]["glue_stsb"]["files"]) == ["test.jsonl"]


def test_manifest_merges_tasks_and_revisions(tmp_path, hub, capsys):
    hub(shared_data())
    out = tmp_path / "m"
    prefetch.prefetch(["glue_stsb"], out, ["validation"])
    prefetch.prefetch(["sg_cb"], out)
    manifest = _manifest(out)
    assert set(manifest["tasks"]) == {"glue_stsb", "sg_cb"}
    # Same commit, another split: the task's files merge.
    prefetch.prefetch(["glue_stsb"], out, ["train"])
    files = _manifest(out)["tasks"]["glue_stsb"]["files"]
    assert set(files) == {"train.jsonl", "validation.jsonl"}
    assert _manifest(out)["tasks"]["sg_cb"] == manifest["tasks"]["sg_cb"]
    # Another commit: the entry is replaced, and files left from the old one are named.
    SHA["current"], old = "beef" + "1" * 36, SHA["current"]
    try:
        capsys.readouterr()
        prefetch.prefetch(["glue_stsb"], out, ["validation"])
    finally:
        SHA["current"] = old
    entry = _manifest(out)["tasks"]["glue_stsb"]
    assert entry["revision"] == "beef" + "1" * 36 and set(entry["files"]) == {"validation.jsonl"}
    assert "glue_stsb: note: train.jsonl not written by this run" in capsys.readouterr().out


def test_unresolved_revision_is_recorded_as_such(tmp_path, hub, monkeypatch, capsys):
    fake = hub(shared_data())
    monkeypatch.setattr(prefetch, "resolve_revision", lambda repo, rev: None)
    monkeypatch.setenv("ENCODER_EVAL_DATASET_REVISIONS", json.dumps({"aps/super_glue": "v1.0"}))
    out = tmp_path / "m"
    prefetch.prefetch(["sg_cb"], out)
    entry = _manifest(out)["tasks"]["sg_cb"]
    assert entry["revision"] is None and entry["revision_requested"] == "v1.0"
    assert {c[3] for c in fake.calls} == {"v1.0"}  # read at the requested revision
    assert "could not resolve aps/super_glue@v1.0 to a commit" in capsys.readouterr().out
    # Unresolved revisions never merge: a second run replaces the entry.
    prefetch.prefetch(["sg_cb"], out, ["train"])
    assert set(_manifest(out)["tasks"]["sg_cb"]["files"]) == {"train.jsonl"}


def test_hub_reads_use_the_task_config_split_and_revision(monkeypatch):
    """Below the seam: what `sources.read_hub_rows` asks `datasets.load_dataset` for."""
    import datasets

    asked = []

    def load_dataset(path, name=None, split=None, revision=None):
        asked.append((path, name, split, revision))
        return [{"premise": "p", "hypothesis": "h", "label": 0}]

    def commit_of(repo, revision):
        return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()

    revisions.resolve_dataset_revision.cache_clear()
    monkeypatch.setattr(revisions, "_hub_dataset_sha", commit_of)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setenv("ENCODER_EVAL_DATASET_REVISIONS", json.dumps({"facebook/xnli": "r1"}))
    assert sources.read_hub_rows("glue_mnli", "validation", None, revision="abc") == [
        {"premise": "p", "hypothesis": "h", "label": 0}]  # fmt: skip
    sources.read_hub_rows("xnli", "test", "de")
    sources.read_hub_rows("massive_intent", "train", "fr-FR")
    sources.read_hub_rows("seahorse", "validation", None)
    assert asked == [
        ("nyu-mll/glue", "mnli", "validation_matched", "abc"),
        ("facebook/xnli", "de", "test", commit_of("facebook/xnli", "r1")),
        (
            "AmazonScience/massive",
            "fr-FR",
            "train",
            commit_of("AmazonScience/massive", "refs/convert/parquet"),
        ),
        (
            "tasksource/seahorse_summarization_evaluation",
            None,
            "validation",
            commit_of("tasksource/seahorse_summarization_evaluation", None),
        ),
    ]  # the revision in effect, resolved to the commit that is then read
    revisions.resolve_dataset_revision.cache_clear()


def test_resolve_revision_asks_the_hub_and_is_guarded(monkeypatch):
    import huggingface_hub

    asked = []

    class Info:
        sha = "f" * 40

    def dataset_info(self, repo, revision=None):
        asked.append((repo, revision))
        return Info()

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    assert prefetch.resolve_revision("nyu-mll/glue", "main") == "f" * 40
    assert asked == [("nyu-mll/glue", "main")]

    def unreachable(self, repo, revision=None):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", unreachable)
    assert prefetch.resolve_revision("nyu-mll/glue", None) is None


# ----------------------------------------------------------------------------- failures


def test_hub_failure_keeps_finished_tasks(tmp_path, hub, capsys):
    hub(shared_data(), fail_for="sg_wsc")
    out = tmp_path / "m"
    assert prefetch.main(["--tasks", "sg_cb,sg_wsc", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: prefetch of sg_wsc stopped before train.jsonl: could not load")
    assert "then run it again (files and tasks already written are kept)" in err
    assert "Traceback" not in err
    assert set(_manifest(out)["tasks"]) == {"sg_cb"}
    assert not (out / "sg_wsc").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "glue_cola" / "train.jsonl"
    assert prefetch.write_jsonl_atomic(path, [{"sentence": "old", "label": 1}]) == (
        1, hashlib.sha256(b'{"sentence": "old", "label": 1}\n').hexdigest())  # fmt: skip
    rows = [{"sentence": "a", "label": 0}, {"sentence": "b", "label": 1}, {"bad": object()}]
    with pytest.raises(HarnessError, match=r"train\.jsonl: row 3 cannot be written as JSON"):
        prefetch.write_jsonl_atomic(path, rows)
    assert read_jsonl(path) == [{"sentence": "old", "label": 1}]
    assert [p.name for p in path.parent.iterdir()] == ["train.jsonl"]


def test_numpy_values_and_unicode_are_written_as_json(tmp_path):
    path = tmp_path / "t" / "train.jsonl"
    rows = [{"text": "Grüße\u2028über zwei Zeilen\n", "label": np.int64(2), "v": np.array([1, 2])}]
    assert prefetch.write_jsonl_atomic(path, rows)[0] == 1
    assert read_jsonl(path) == [{"text": "Grüße\u2028über zwei Zeilen\n", "label": 2, "v": [1, 2]}]


def test_bad_arguments_fail_before_anything_is_fetched(tmp_path, hub, capsys):
    fake = hub(shared_data())
    out = tmp_path / "m"
    assert prefetch.main(["--tasks", "sg_cb,glue_sst", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'glue_sst'. Did you mean 'glue_sst2'?" in err
    assert prefetch.main(["--tasks", "sg_cb", "--out", str(out), "--splits", "dev"]) == 2
    assert "--splits 'dev'" in capsys.readouterr().err
    assert prefetch.main(["--tasks", " , ", "--out", str(out)]) == 2
    assert "--tasks is empty" in capsys.readouterr().err
    synthetic = [name for name, k in TASK_KNOBS.items() if k.hf_path is None]
    if synthetic:
        assert prefetch.main(["--tasks", synthetic[0], "--out", str(out)]) == 2
        assert "nothing to prefetch" in capsys.readouterr().err
    assert fake.calls == [] and not out.exists()


def test_all_means_every_hub_task(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(prefetch, "prefetch", lambda names, out, splits: seen.extend(names))
    assert prefetch.main(["--tasks", "all", "--out", str(tmp_path)]) == 0
    assert seen == REAL_TASKS and len(seen) == 17


def test_groups_and_task_files_name_what_to_prefetch(tmp_path, monkeypatch, task_registry):
    seen = []
    monkeypatch.setattr(prefetch, "prefetch", lambda names, out, splits: seen.extend(names))
    wnli = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "glue_wnli.toml"
    argv = ["--tasks", "superglue,glue_wnli", "--tasks-file", str(wnli), "--out", str(tmp_path)]
    assert prefetch.main(argv) == 0
    assert seen == ["sg_boolq", "sg_cb", "sg_wic", "sg_wsc", "glue_wnli"]


def test_a_foreign_or_broken_manifest_is_not_overwritten(tmp_path, hub, capsys):
    hub(shared_data())
    (tmp_path / "MANIFEST.json").write_text("{broken")
    assert prefetch.main(["--tasks", "sg_cb", "--out", str(tmp_path)]) == 2
    assert "MANIFEST.json is not valid JSON" in capsys.readouterr().err
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"schema": "other", "tasks": {}}))
    assert prefetch.main(["--tasks", "sg_cb", "--out", str(tmp_path)]) == 2
    assert "is not an encoder-eval mirror manifest" in capsys.readouterr().err
    assert (tmp_path / "MANIFEST.json").read_text() == json.dumps({"schema": "other", "tasks": {}})


def test_a_split_that_will_not_load_is_flagged_at_prefetch_time(tmp_path, hub, capsys):
    source = tmp_path / "hub"
    write_jsonl(source / "glue_rte" / "train.jsonl", [{"sentence1": "a", "sentence2": "b",
                                                       "label": -1}])  # fmt: skip
    write_jsonl(source / "glue_rte" / "validation.jsonl", [])
    hub(source)
    assert prefetch.main(["--tasks", "glue_rte", "--out", str(tmp_path / "m")]) == 0
    printed = capsys.readouterr().out
    assert "glue_rte: warning: train.jsonl will not load: " in printed
    assert "hidden test label" in printed
    assert "glue_rte: warning: validation.jsonl is empty" in printed


def test_offline_hub_gives_a_clear_error_not_a_traceback(tmp_path):
    """The real code path: datasets.load_dataset with HF_HUB_OFFLINE=1 and an empty cache."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}  # fmt: skip
    env.pop("ENCODER_EVAL_DATA_DIR", None)
    out = tmp_path / "m"
    load = (
        "import sys\nfrom encoder_eval.core.errors import HarnessError\n"
        "from encoder_eval.data.task_loading import load_task\n"
        "try:\n    load_task('glue_rte')\nexcept HarnessError as exc:\n    print(exc)\n"
        "    sys.exit(3)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "encoder_eval.prefetch", "--tasks", "glue_rte", "--out", str(out)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ),
        subprocess.Popen(
            [sys.executable, "-c", load], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        ),
    ]  # fmt: skip
    (p_out, p_err), (l_out, l_err) = (p.communicate(timeout=120) for p in procs)
    assert procs[0].returncode == 2, p_err
    assert p_err.startswith("error: prefetch of glue_rte stopped before train.jsonl: "), p_err
    assert "cannot resolve nyu-mll/glue@main to a commit" in p_err
    assert "HF_HUB_OFFLINE is set: unset it, on a machine with internet access" in p_err
    assert "Traceback" not in p_err
    assert not (out / "MANIFEST.json").exists() and not list(out.glob("*/*.jsonl"))
    # Training code reading the Hub says how to use a mirror instead.
    assert procs[1].returncode == 3, l_err
    assert "encoder-eval prefetch --tasks glue_rte --out DIR" in l_out
    assert "--data-dir DIR" in l_out


def test_prefetch_prints_the_pin_line_for_the_commits_it_mirrored(tmp_path, monkeypatch, capsys):
    """A later Hub run can pin to exactly the commits a mirror holds (issue 11, item 8)."""
    manifest = {"tasks": {
        "glue_rte": {"dataset": "nyu-mll/glue", "revision": "a" * 40},
        "glue_cola": {"dataset": "nyu-mll/glue", "revision": "a" * 40},
        "sg_cb": {"dataset": "aps/super_glue", "revision": None},  # unresolved: no pin
    }}  # fmt: skip
    monkeypatch.setattr(prefetch, "prefetch", lambda names, out, splits: manifest)
    assert prefetch.main(["--tasks", "glue_rte,glue_cola,sg_cb", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.endswith(
        """export ENCODER_EVAL_DATASET_REVISIONS='{"nyu-mll/glue": "%s"}'""" % ("a" * 40)
    )
    pins = json.loads(shlex.split(line.split("=", 1)[1])[0])
    monkeypatch.setenv("ENCODER_EVAL_DATASET_REVISIONS", json.dumps(pins))
    assert revisions.dataset_revisions()["nyu-mll/glue"] == "a" * 40
