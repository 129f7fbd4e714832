"""MS MARCO from the Hub (`ms_marco_v21`): rows in exactly the published microsoft/ms_marco
v2.1 schema, replacing only `datasets.load_dataset` (the narrowest seam), read through the
loader and through `prefetch` into a mirror that loads the same; the candidate depth the
result records and checks. The passages and queries are real MS MARCO rows of the shared
mirror, regrouped into the Hub's one-row-per-query shape."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict

import pytest
from mirror_helpers import shared_data

from encoder_eval import prefetch
from encoder_eval.cells import encoding, kinds
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import RANKING
from encoder_eval.core.protocol import PROTOCOL_RECIPE
from encoder_eval.data import revisions, sources, task_loading, tasks

PIN = "a47ee7aae8d7d466ba15f9f0bfac3b3681087b3a"  # the revision the task row pins
DEPTH = 10  # v2.1 lists about ten passages per query


def _hub_rows(split: str, n_queries: int) -> list[dict]:
    """`n_queries` real queries of the mirror as microsoft/ms_marco v2.1 rows: each with its
    first DEPTH passages in `passages` (a struct of lists, as `datasets` returns a sequence of
    structs), `is_selected` the qrel, and the schema's other fields filled."""
    by_query: dict[int, list[dict]] = defaultdict(list)
    with open(shared_data() / "ms_marco" / f"{split}.jsonl", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            by_query[row["query_id"]].append(row)
    out = []
    for qid, cands in list(by_query.items())[:n_queries]:
        cands = sorted(cands, key=lambda r: r["bm25_rank"])[:DEPTH]
        out.append({
            "answers": ["No Answer Present."], "query": cands[0]["query"], "query_id": qid,
            "query_type": "DESCRIPTION", "wellFormedAnswers": [],
            "passages": {"is_selected": [r["label"] for r in cands],
                         "passage_text": [r["passage"] for r in cands],
                         "url": [f"http://example.org/{r['passage_id']}" for r in cands]},
        })  # fmt: skip
    return out


@pytest.fixture
def hub(monkeypatch):
    """The Hub answered from the published schema: `datasets.load_dataset` and the commit
    lookup replaced, every call recorded."""
    import datasets

    rows = {"train": _hub_rows("train", 40), "validation": _hub_rows("validation", 30)}
    asked = []

    def load_dataset(path, name=None, split=None, revision=None):
        asked.append((path, name, split, revision))
        return datasets.Dataset.from_list(rows[split])

    revisions.resolve_dataset_revision.cache_clear()
    monkeypatch.setattr(
        revisions, "_hub_dataset_sha", lambda repo, rev: hashlib.sha1(b"x").hexdigest()
    )
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.delenv("ENCODER_EVAL_DATA_DIR", raising=False)
    yield rows, asked
    revisions.resolve_dataset_revision.cache_clear()


def test_hub_rows_load_as_one_ranking_row_per_query_and_passage(hub):
    rows, asked = hub
    train, val, test, num_labels, problem = task_loading.load_task("ms_marco_v21")
    assert asked == [("microsoft/ms_marco", "v2.1", s, PIN) for s in ("train", "validation")]
    assert problem == RANKING and num_labels == 1 and test is val
    first = rows["train"][0]
    assert train["query_id"][:DEPTH] == [str(first["query_id"])] * DEPTH
    assert train["doc_id"][:DEPTH] == [f"{first['query_id']}-{i}" for i in range(1, DEPTH + 1)]
    assert train["first_stage_rank"][:DEPTH] == list(range(1, DEPTH + 1))
    assert train["label"][:DEPTH] == first["passages"]["is_selected"]
    assert train["text_pair"][:DEPTH] == first["passages"]["passage_text"]
    assert set(train["text"][:DEPTH]) == {first["query"]}
    assert len(train["label"]) == sum(len(r["passages"]["is_selected"]) for r in rows["train"])
    assert sum(val["en"]["label"]) == sum(sum(r["passages"]["is_selected"])
                                          for r in rows["validation"])  # fmt: skip


def test_the_depth_of_the_hub_lists_is_recorded_and_off_protocol(hub):
    """Ten candidates a query, not BM25's 1,000: the cell records depth 10 and its first
    stage, and says why it is off-protocol."""
    train, val, _, _, _ = task_loading.load_task("ms_marco_v21")

    def enc(split):
        n = len(split["label"])
        return encoding.Encoded(features={"input_ids": [[1, 2]] * n}, labels=split["label"],
                                lengths=[2] * n, columns={
                                    c: split[c] for c in kinds.RANK_COLUMNS})  # fmt: skip

    record, reasons = kinds.kind_for(RANKING).record(
        tasks.task_knobs("ms_marco_v21"), PROTOCOL_RECIPE, enc(train), {"en": enc(val["en"])}
    )
    assert record["depth"] == DEPTH and record["depth_protocol"] == 1000
    assert record["first_stage"] == "bing"
    assert f"rank depth {DEPTH} (protocol: 1000 first-stage candidates" in " ".join(reasons)


def test_prefetch_mirrors_the_hub_rows_and_the_mirror_loads_the_same(hub, tmp_path, capsys):
    rows, asked = hub
    from_hub = task_loading.load_task("ms_marco_v21")
    manifest = prefetch.prefetch(["ms_marco_v21"], tmp_path)
    entry = manifest["tasks"]["ms_marco_v21"]
    assert entry["dataset"] == "microsoft/ms_marco" and entry["revision_requested"] == PIN
    written = sources.read_jsonl(tmp_path / "ms_marco_v21" / "train.jsonl")
    assert written == rows["train"]  # the published rows, as read
    assert "will not load" not in capsys.readouterr().out
    assert task_loading.load_task("ms_marco_v21", data_dir=tmp_path) == from_hub


def test_a_row_outside_the_schema_is_one_clear_error(hub):
    rows, _ = hub
    rows["train"][3] = {**rows["train"][3], "passages": {"url": ["u"]}}
    with pytest.raises(HarnessError, match=r"row 4 is not in the microsoft/ms_marco schema"):
        task_loading.load_task("ms_marco_v21")
