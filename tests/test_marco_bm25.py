"""MS MARCO at the protocol's depth from the Hub (`ms_marco_bm25`): tiny files in exactly
the published schemas of MrLight/msmarco-passage (Tevatron's gzip JSON lines for the
corpus, the training and the dev queries; a TREC run for BM25 over dev), handed out by
replacing only `marco_bm25.download` (the one call that reaches the Hub). Checked: the
rows and labels, the recorded depth and its protocol verdict (on at 1,000 candidates, off
below), `prefetch` writing a mirror that loads the same, and a real tiny ranking cell."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from encoder_eval import prefetch
from encoder_eval.cells import cell_config, encoding, kinds, train
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import RANKING
from encoder_eval.core.protocol import PROTOCOL_RECIPE, Recipe
from encoder_eval.core.results import result_filename, validate_result
from encoder_eval.data import marco_bm25, sources, task_loading, tasks

TASK = "ms_marco_bm25"
DEPTH = 1000  # BM25's candidates per dev query in the run
N_NEG = 40  # negatives per training query: a group of 36 fills
WORDS = "river bank loan money water fish stone bridge city road tax rate music song".split()


def _text(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4 + i % 5))


def _passage(docid: int) -> dict:
    return {"docid": str(docid), "title": "", "text": f"passage {docid} {_text(docid)}"}


def _gz(path: Path, rows: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def write_hub_files(folder: Path, depth: int = DEPTH) -> dict[str, Path]:
    """The four files, tiny: 6 training queries (1 positive + N_NEG negatives each, one
    negative repeating the positive as in an unfiltered list), 3 dev queries whose run lists
    `depth` corpus passages (query 2's positive outside them), and the corpus."""
    corpus = [_passage(d) for d in range(depth + 500)]
    trainq = []
    for q in range(6):
        pos = _passage(100 + q)
        negs = [_passage(200 + q * N_NEG + k) for k in range(N_NEG)] + [pos]
        trainq.append({"query_id": str(9000 + q), "query": f"what is {WORDS[q]}",
                       "positive_passages": [pos], "negative_passages": negs})  # fmt: skip
    dev, run = [], []
    for q in range(3):
        qid = str(1048585 + q)
        positive = str([3, 0, depth + 100][q])  # rank 4, the last rank, not retrieved
        dev.append({"query_id": qid, "query": f"where is the {WORDS[q + 5]}",
                    "positive_passages": [_passage(int(positive))],
                    "negative_passages": []})  # fmt: skip
        order = list(range(depth))[:: -1 if q == 1 else 1]
        run += [f"{qid} Q0 {d} {r} {30.0 - r / 100:.4f} Anserini" for r, d in enumerate(order, 1)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / marco_bm25.RUN_FILE).write_text("\n".join(run) + "\n", encoding="utf-8")
    return {
        marco_bm25.TRAIN_FILE: _gz(folder / "train.jsonl.gz", trainq),
        marco_bm25.DEV_FILE: _gz(folder / "dev.jsonl.gz", dev),
        marco_bm25.CORPUS_FILE: _gz(folder / "corpus.jsonl.gz", corpus),
        marco_bm25.RUN_FILE: folder / marco_bm25.RUN_FILE,
    }


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The Hub's files answered from `write_hub_files`, every download recorded."""
    files = write_hub_files(tmp_path / "hub")
    asked = []

    def download(repo_id, filename, revision):
        asked.append((repo_id, filename, revision))
        return files[filename]

    monkeypatch.setattr(marco_bm25, "download", download)
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    return files, asked


def _enc(split: dict) -> encoding.Encoded:
    n = len(split["label"])
    return encoding.Encoded(features={"input_ids": [[1, 2]] * n}, labels=split["label"],
                            lengths=[2] * n,
                            columns={c: split[c] for c in kinds.RANK_COLUMNS})  # fmt: skip


def _verdict(train_split: dict, val_split: dict) -> tuple[dict, list[str]]:
    return kinds.kind_for(RANKING).record(
        tasks.task_knobs(TASK), PROTOCOL_RECIPE, _enc(train_split), {"en": _enc(val_split)}
    )


def test_the_task_row_pins_the_commit_with_the_bm25_run():
    knobs = tasks.task_knobs(TASK)
    assert knobs.bucket == "ranking" and TASK not in tasks.resolve_task_names(["all"])
    assert TASK in tasks.resolve_task_names(["ranking"])
    assert knobs.hf_path == "MrLight/msmarco-passage"
    assert knobs.revision == "928d88393cfe0cda557805c2ffb486aa1543389d"
    assert knobs.first_stage_name == "bm25"


def test_hub_files_load_as_ranking_rows_with_qrel_labels_and_bm25_ranks(hub):
    files, asked = hub
    train_split, val, test, num_labels, problem = task_loading.load_task(TASK)
    assert {name for _, name, _ in asked} == set(files)
    assert {(repo, rev) for repo, _, rev in asked} == {(marco_bm25.REPO, marco_bm25.REVISION)}
    assert problem == RANKING and num_labels == 1 and test is val
    # training: 1 positive + N_NEG negatives per query; the repeated positive dropped
    assert len(train_split["label"]) == 6 * (1 + N_NEG)
    assert train_split["query_id"][0] == "9000" and train_split["doc_id"][0] == "100"
    assert train_split["label"][: 2 + N_NEG] == [1] + [0] * N_NEG + [1]
    assert train_split["first_stage_rank"][: 1 + N_NEG] == list(range(1, 2 + N_NEG))
    assert train_split["text_pair"][0] == _passage(100)["text"]
    # validation: 3 queries x the run's 1,000 candidates, texts from the corpus
    dev = val["en"]
    assert len(dev["label"]) == 3 * DEPTH
    assert dev["query_id"][:DEPTH] == ["1048585"] * DEPTH
    assert dev["first_stage_rank"][:DEPTH] == list(range(1, DEPTH + 1))
    assert dev["doc_id"][3] == "3" and dev["label"][3] == 1
    assert dev["text_pair"][3] == _passage(3)["text"]
    assert dev["text"][DEPTH] == "where is the stone"
    per_query = [sum(dev["label"][i * DEPTH : (i + 1) * DEPTH]) for i in range(3)]
    assert per_query == [1, 1, 0]  # the third query's positive is not in BM25's top 1,000


def test_depth_1000_is_on_protocol_and_a_shallower_run_is_not(hub):
    train_split, val, _, _, _ = task_loading.load_task(TASK)
    record, reasons = _verdict(train_split, val["en"])
    assert record["depth"] == DEPTH == record["depth_protocol"]
    assert record["first_stage"] == "bm25" and record["group_size_used"] == 36
    assert reasons == []
    rows = marco_bm25.read_split("validation", marco_bm25.REVISION, depth=50)
    shallow = task_loading.ranking_rows_to_split(TASK, rows, "cut")
    assert len(shallow["label"]) == 3 * 50
    record, reasons = _verdict(train_split, shallow)
    assert record["depth"] == 50
    assert reasons == [
        "rank depth 50 (protocol: 1000 first-stage candidates re-ranked per query; "
        "every evaluated query has 50)"
    ]


def test_prefetch_writes_the_mirror_and_the_mirror_loads_the_same(hub, tmp_path, capsys):
    from_hub = task_loading.load_task(TASK)
    out = tmp_path / "mirror"
    manifest = prefetch.prefetch([TASK], out)
    entry = manifest["tasks"][TASK]
    assert entry["dataset"] == marco_bm25.REPO and entry["revision"] == marco_bm25.REVISION
    assert entry["files"]["validation.jsonl"]["rows"] == 3 * DEPTH
    assert entry["files"]["train.jsonl"]["rows"] == 6 * (1 + N_NEG)
    assert "will not load" not in capsys.readouterr().out
    first = sources.read_jsonl(out / TASK / "validation.jsonl")[0]
    assert first == {"query_id": "1048585", "query": "where is the fish", "passage_id": "0",
                     "passage": _passage(0)["text"], "label": 0, "bm25_rank": 1}  # fmt: skip
    assert task_loading.load_task(TASK, data_dir=out) == from_hub


def test_files_outside_the_published_schemas_are_clear_errors(hub, tmp_path):
    files, _ = hub
    _gz(files[marco_bm25.DEV_FILE], [{"query_id": "1", "query": "q", "positives": []}])
    with pytest.raises(HarnessError, match=r"row 1 is not in Tevatron's format"):
        task_loading.load_task(TASK)
    write_hub_files(tmp_path / "hub")
    files[marco_bm25.RUN_FILE].write_text("1048585 7 1\n", encoding="utf-8")
    with pytest.raises(HarnessError, match=r"run.dev.bm25.trec:1: not a TREC run line"):
        task_loading.load_task(TASK)


def test_a_failed_download_says_how_to_work_offline(monkeypatch):
    def download(repo_id, filename, revision):
        raise OSError("network unreachable")

    monkeypatch.setattr(marco_bm25, "download", download)
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    with pytest.raises(HarnessError, match=r"could not load MrLight/msmarco-passage .*"
                       r"network unreachable.*prefetch --tasks ms_marco_bm25"):  # fmt: skip
        task_loading.load_task(TASK)


def test_a_tiny_ranking_cell_trains_on_the_hub_rows(hub, tmp_path):
    from tiny_models import build_tiny_model

    model = build_tiny_model("bert", tmp_path / "bert", num_labels=None)
    recipe = Recipe(max_steps=2, batch_size=2, max_seq_len=32, precision="fp32")
    out = tmp_path / result_filename("tiny", TASK, 1e-4, 45)
    cfg = cell_config.CellConfig(model_path=str(model), task=TASK, lr=1e-4, seed=45,
                           model_key="tiny", recipe=recipe, device="cpu", progress="quiet",
                           out_json=str(out))  # fmt: skip
    result = train.run_cell(cfg)
    assert validate_result(json.loads(out.read_text())) == []
    assert result["status"] == "ok" and result["training"]["steps"] == 2
    data = result["provenance"]["data"]
    assert data["source"] == "hub" and data["revision"] == marco_bm25.REVISION
    rk = result["ranking"]
    assert rk["depth"] == DEPTH and rk["first_stage"] == "bm25" and rk["group_size_used"] == 36
    reasons = result["protocol"]["off_protocol_reasons"]
    assert not any(r.startswith(("rank depth", "rank group size")) for r in reasons)
    assert result["report"]["queries"]["en"] == {"total": 3, "with_positive": 2,
                                                 "without_positive": 1,
                                                 "candidate_depth": DEPTH}  # fmt: skip
    # BM25's own order: reciprocal ranks 1/4, 0 (rank 1,000 is past 10) and 0
    assert result["report"]["first_stage"]["mrr_at_10"]["en"] == pytest.approx(0.25 / 3)
