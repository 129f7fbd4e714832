"""MS MARCO passage re-ranking at the protocol's depth, from the Hub: the files of
`MrLight/msmarco-passage` (Tevatron's release), turned into ranking rows.

The dataset is a set of files, not a table `datasets` reads, so the task reads them with
`huggingface_hub.hf_hub_download` (`download`, the one call that reaches the Hub):

- `train_bm25top200filtered.jsonl.gz`: one training query a line, in Tevatron's format
  (`query_id`, `query`, `positive_passages` and `negative_passages`, each a list of
  `{docid, title, text}`; the negatives sampled from BM25's top 200);
- `dev.jsonl.gz`: the dev queries in the same format (their `positive_passages` the qrels);
- `run.dev.bm25.trec`: BM25's run over them, a TREC run (`qid Q0 docid rank score tag`,
  1,000 lines a query);
- `corpus.jsonl.gz`: the 8.8M passages (`docid`, `title`, `text`).

Both splits become rows `query_id, query, passage_id, passage, label, bm25_rank`, the rows
`task_loading.ranking_rows_to_split` reads: training rows one per listed passage (label 1 for a
positive; the file gives no BM25 ranks, so `bm25_rank` is the passage's place in the
query's list, positives first), validation rows one per run line (its rank; the text
looked up in the corpus, read once keeping only the passages the run names; label 1 when
the passage is among the query's dev positives).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from encoder_eval.core.errors import HarnessError

REPO = "MrLight/msmarco-passage"
# The commit that added run.dev.bm25.trec ("add files", 928d883; its parent 3bdc4a6 has the
# json files but no BM25 run).
REVISION = "928d88393cfe0cda557805c2ffb486aa1543389d"
TRAIN_FILE = "train_bm25top200filtered.jsonl.gz"
DEV_FILE = "dev.jsonl.gz"
RUN_FILE = "run.dev.bm25.trec"
CORPUS_FILE = "corpus.jsonl.gz"


def download(repo_id: str, filename: str, revision: str | None) -> Path:
    """One file of a Hub dataset, from the local cache or the Hub (the seam tests replace)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, filename, repo_type="dataset", revision=revision))


def iter_jsonl_gz(path: Path) -> Iterator[dict]:
    """The objects of a gzip JSON-lines file, streamed; a bad line names the file and line."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise HarnessError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise HarnessError(f"{path}:{number}: expected a JSON object per line")
                yield row
    except (OSError, EOFError) as exc:  # not gzip, or cut short
        raise HarnessError(f"{path}: cannot read it as gzip JSON lines ({exc})") from None


def _query(row: dict, where: str) -> tuple[str, str, list[dict], list[dict]]:
    """A Tevatron query row's id, text, positives and negatives, checked."""
    missing = [k for k in ("query_id", "query", "positive_passages") if k not in row]
    lists = [row.get(k, []) for k in ("positive_passages", "negative_passages")]
    bad = missing or not all(
        isinstance(v, list) and all(isinstance(p, dict) and "docid" in p for p in v) for v in lists
    )
    if bad:
        raise HarnessError(
            f"{where} is not in Tevatron's format (query_id, query, and positive_passages / "
            "negative_passages as lists of {docid, title, text})"
        )
    return str(row["query_id"]), str(row["query"]), lists[0], lists[1]


def train_rows(path: Path) -> list[dict]:
    """One ranking row per (training query, listed passage); a negative that repeats a
    passage listed before it (a positive, or a negative twice) is dropped."""
    out = []
    for number, row in enumerate(iter_jsonl_gz(path), start=1):
        qid, query, positives, negatives = _query(row, f"{path}: row {number}")
        seen: set[str] = set()
        for label, passages in ((1, positives), (0, negatives)):
            for passage in passages:
                docid = str(passage["docid"])
                if docid in seen:
                    continue
                seen.add(docid)
                out.append(
                    {
                        "query_id": qid,
                        "query": query,
                        "passage_id": docid,
                        "passage": str(passage.get("text") or ""),
                        "label": label,
                        "bm25_rank": len(seen),
                    }
                )
    return out


def read_run(path: Path, depth: int | None = None) -> dict[str, list[tuple[int, str]]]:
    """A TREC run's (rank, docid) lists per query, in rank order, cut to the top `depth`
    (None: all); a line that is not `qid Q0 docid rank score tag` is an error."""
    run: dict[str, list[tuple[int, str]]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6 or not parts[3].isdigit() or int(parts[3]) < 1:
                raise HarnessError(
                    f"{path}:{number}: not a TREC run line (qid Q0 docid rank score tag): "
                    f"{line.strip()[:80]!r}"
                )
            run.setdefault(parts[0], []).append((int(parts[3]), parts[2]))
    for qid, entries in run.items():
        entries.sort()
        run[qid] = entries[:depth] if depth is not None else entries
    return run


def passage_texts(path: Path, wanted: set[str]) -> dict[str, str]:
    """The texts of the `wanted` passages, reading the corpus once and keeping only those."""
    texts: dict[str, str] = {}
    for number, row in enumerate(iter_jsonl_gz(path), start=1):
        if "docid" not in row or "text" not in row:
            raise HarnessError(f"{path}: row {number} is not a corpus row (docid, title, text)")
        docid = str(row["docid"])
        if docid in wanted:
            texts[docid] = str(row["text"] or "")
    return texts


def dev_rows(
    dev_path: Path, run_path: Path, corpus_path: Path, depth: int | None = None
) -> list[dict]:
    """One ranking row per (dev query, BM25 candidate of the run's top `depth`), label 1 for
    a dev positive; queries in the order of the dev file, those the run lacks skipped. A
    candidate the corpus lacks is an error (its text is what the model reads)."""
    queries = {}
    for number, row in enumerate(iter_jsonl_gz(dev_path), start=1):
        qid, query, positives, _ = _query(row, f"{dev_path}: row {number}")
        queries[qid] = (query, {str(p["docid"]) for p in positives})
    run = read_run(run_path, depth)
    kept = [q for q in queries if q in run]
    if not kept:
        raise HarnessError(f"{run_path}: no query of {dev_path.name} has a BM25 candidate")
    texts = passage_texts(corpus_path, {d for q in kept for _, d in run[q]})
    out = []
    for qid in kept:
        query, positives = queries[qid]
        for rank, docid in run[qid]:
            if docid not in texts:
                raise HarnessError(
                    f"{run_path}: query {qid}'s candidate {docid} is not in {corpus_path.name}"
                )
            out.append(
                {
                    "query_id": qid,
                    "query": query,
                    "passage_id": docid,
                    "passage": texts[docid],
                    "label": int(docid in positives),
                    "bm25_rank": rank,
                }
            )
    return out


def read_split(
    split: str, revision: str | None, repo: str = REPO, depth: int | None = None
) -> list[dict]:
    """The ranking rows of `split` (train, validation) read from the Hub files at `revision`;
    `depth` cuts the dev run to its top k (a cheaper check, off-protocol below 1,000)."""

    def fetch(name: str) -> Path:
        return download(repo, name, revision)

    if split == "train":
        return train_rows(fetch(TRAIN_FILE))
    if split == "validation":
        return dev_rows(fetch(DEV_FILE), fetch(RUN_FILE), fetch(CORPUS_FILE), depth)
    raise HarnessError(f"{repo} has no {split} split here (train, validation)")
