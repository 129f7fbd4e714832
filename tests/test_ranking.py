"""Re-ranking (ms_marco): the metrics against an independent computation from the raw
file, the ranking kinds' groups and losses, tiny cells trained listwise and pointwise, the
TREC run file, and a ranking cell through sweep, run_all.sh, select, status and summarize."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_small_mirror
from fault_helpers import py, sh
from mirror_helpers import shared_data
from sklearn.metrics import ndcg_score

from encoder_eval.cells import cell_config, encoding, kinds, train
from encoder_eval.cells.predictions import (
    check_against_result,
    load_predictions,
    predictions_path,
    trec_run_path,
)
from encoder_eval.core import metrics
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.problems import RANKING
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import load_results, result_filename, validate_result
from encoder_eval.core.schema import CellResult
from encoder_eval.data.task_loading import load_task, ranking_rows_to_split
from encoder_eval.reports import verdicts

# The first 10 training queries (one without a relevant passage) and the first 8
# validation queries (one without), 20 BM25 candidates each.
RANK_MIRROR = {
    "ms_marco": {"train.jsonl": 200, "validation.jsonl": 160},
    "glue_rte": {"train.jsonl": 64, "validation.jsonl": 32},
}
SHORT = Recipe(max_steps=4, batch_size=4, max_seq_len=64)


@pytest.fixture(scope="module")
def rank_mirror(tmp_path_factory) -> Path:
    return write_small_mirror(tmp_path_factory.mktemp("rank_mirror"), RANK_MIRROR)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model("bert", tmp_path_factory.mktemp("rank_model") / "bert",
                            num_labels=None)  # fmt: skip


def raw_queries(path: Path) -> dict[str, list[dict]]:
    """The raw file's rows per query id, read with json alone."""
    out: dict[str, list[dict]] = defaultdict(list)
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            out[str(row["query_id"])].append(row)
    return out


def independent_bm25_scores(path: Path) -> tuple[float, float, int]:
    """MRR@10 and NDCG@10 of the BM25 order of every query in the raw file, by hand (MRR)
    and with scikit-learn (NDCG: BM25 ranks are distinct, so its tie handling plays no
    part); a query without a relevant passage counts 0 in both. Also the query count."""
    rr, ndcg = [], []
    for rows in raw_queries(path).values():
        ordered = sorted(rows, key=lambda r: r["bm25_rank"])
        rels = [r["label"] for r in ordered]
        first = next((i for i, rel in enumerate(rels[:10]) if rel == 1), None)
        rr.append(0.0 if first is None else 1.0 / (first + 1))
        if sum(rels) == 0:
            ndcg.append(0.0)
        else:
            scores = [-r["bm25_rank"] for r in ordered]
            ndcg.append(float(ndcg_score([rels], [scores], k=10)))
    return sum(rr) / len(rr), sum(ndcg) / len(ndcg), len(rr)


# ----------------------------------------------------------------------------- metrics


def test_bm25_order_through_the_harness_equals_an_independent_computation():
    path = shared_data() / "ms_marco" / "validation.jsonl"
    want_mrr, want_ndcg, n_queries = independent_bm25_scores(path)
    _, val, _, _, problem = load_task("ms_marco", shared_data())
    split = val["en"]
    assert problem == RANKING and len(set(split["query_id"])) == n_queries == 180
    groups = metrics.RankGroups(split["query_id"], split["first_stage_rank"])
    bm25 = metrics.first_stage_scores(groups)
    tied = [0.0] * len(split["label"])  # every score equal: the tie-break alone orders
    for scores in (bm25, tied):
        mrr = metrics.compute_metric("mrr_at_10", scores, split["label"], groups)
        ndcg = metrics.compute_metric("ndcg_at_10", scores, split["label"], groups)
        print(f"BM25 on the mirror's validation queries: MRR@10 {mrr:.6f} NDCG@10 {ndcg:.6f}")
        assert mrr == pytest.approx(want_mrr, abs=1e-12)
        assert ndcg == pytest.approx(want_ndcg, abs=1e-12)


def test_ties_are_broken_by_first_stage_rank_and_every_query_counts():
    # q1: relevant candidate at BM25 rank 3; q2: none relevant; scores tie within q1.
    groups = metrics.RankGroups(["q1", "q1", "q1", "q2", "q2"], [1, 2, 3, 1, 2])
    labels = [0, 0, 1, 0, 0]
    # q1: the relevant one (score 5) first.
    assert metrics.compute_metric("mrr_at_10", [1, 1, 5, 0, 0], labels, groups) == 0.5 * 1.0
    # q1 ties 2-2-2: BM25 order puts the relevant candidate third -> RR 1/3, q2 0.
    assert metrics.compute_metric("mrr_at_10", [2, 2, 2, 0, 0], labels, groups) == \
        pytest.approx((1 / 3) / 2)  # fmt: skip
    # Tie between ranks 2 and 3 only; the relevant is at rank 3 -> position 2 after a 9.
    ndcg = metrics.compute_metric("ndcg_at_10", [9, 2, 2, 0, 0], labels, groups)
    assert ndcg == pytest.approx((1 / math.log2(4)) / 2)
    # Candidates past the cutoff earn nothing.
    many = metrics.RankGroups(["q"] * 11, list(range(1, 12)))
    rels = [0] * 10 + [1]
    assert metrics.compute_metric("mrr_at_10", [0] * 11, rels, many) == 0.0
    assert metrics.compute_metric("ndcg_at_10", [0] * 11, rels, many) == 0.0


def test_a_non_finite_score_makes_the_ranking_metric_undefined():
    groups = metrics.RankGroups(["q", "q"], [1, 2])
    assert metrics.compute_metric("mrr_at_10", [float("nan"), 1.0], [1, 0], groups) is None
    assert "not finite" in metrics.undefined_reason("mrr_at_10", [float("nan"), 1.0], [1, 0])
    with pytest.raises(ValueError, match="query"):
        metrics.compute_metric("mrr_at_10", [0.0, 1.0], [1, 0])
    with pytest.raises(ValueError, match="per-query"):
        metrics.score_array("mrr_at_10", np.zeros(2), np.array([1, 0]))


def test_ranking_rows_are_checked():
    row = {"query_id": 1, "query": "q", "passage_id": 7, "passage": "p", "label": 1,
           "bm25_rank": 1}  # fmt: skip
    assert ranking_rows_to_split("ms_marco", [row], "f")["doc_id"] == ["7"]
    for bad, message in (({"label": 2}, "not 0 or 1"), ({"bm25_rank": 0}, "positive integer"),
                         ({"passage_id": None} | {"bm25_rank": "1"}, "positive integer")):  # fmt: skip
        with pytest.raises(HarnessError, match=message):
            ranking_rows_to_split("ms_marco", [{**row, **bad}], "f")
    with pytest.raises(HarnessError, match="twice"):
        ranking_rows_to_split("ms_marco", [row, {**row, "bm25_rank": 2}], "f")
    broken = {k: v for k, v in row.items() if k != "bm25_rank"}
    with pytest.raises(HarnessError, match="no field 'bm25_rank'"):
        ranking_rows_to_split("ms_marco", [broken], "f")


def test_ranking_refuses_the_holdout_split_and_a_missing_mirror(rank_mirror):
    with pytest.raises(HarnessError, match="split queries"):
        load_task("ms_marco", rank_mirror, selection_split="holdout")
    with pytest.raises(HarnessError, match="data mirror only"):
        load_task("ms_marco", None)


# ----------------------------------------------------------------------------- the kind


def encoded_train(rank_mirror: Path) -> encoding.Encoded:
    split = load_task("ms_marco", rank_mirror)[0]
    enc = encoding.Encoded(features={"input_ids": [[1, 2]] * len(split["label"])},
                        labels=split["label"], lengths=[2] * len(split["label"]))  # fmt: skip
    return kinds.with_rank_columns(enc, split)


def test_groups_hold_one_positive_first_and_seeded_negatives(rank_mirror):
    enc = encoded_train(rank_mirror)
    kind = kinds.kind_for(RANKING)
    recipe = dataclasses.replace(SHORT, rank_group_size=5)
    seed = 45
    print(f"seed {seed}")
    groups = kind.units(enc, random.Random(seed), recipe)
    assert kind.count_units(enc) == len(groups) == 9  # 10 queries, one without a positive
    for g in groups:
        assert len(g) == 5 and enc.labels[g[0]] == 1
        assert all(enc.labels[i] == 0 for i in g[1:])
        assert len({enc.columns["query_id"][i] for i in g}) == 1 and len(set(g)) == 5
    assert groups == kind.units(enc, random.Random(seed), recipe)
    assert groups != kind.units(enc, random.Random(seed + 1), recipe)
    # A group is capped at the candidates a query has (20 in the mirror).
    capped = kind.units(enc, random.Random(seed), SHORT)
    assert {len(g) for g in capped} == {20}


def _queries(n_queries: int, depth: int) -> encoding.Encoded:
    """A ranking split of `n_queries` queries with `depth` candidates each, one relevant."""
    n = n_queries * depth
    return encoding.Encoded(
        features={"input_ids": [[1, 2]] * n}, labels=[int(i % depth == 0) for i in range(n)],
        lengths=[2] * n, columns={"query_id": [f"q{i // depth}" for i in range(n)],
        "doc_id": [str(i) for i in range(n)], "first_stage_rank": [i % depth + 1 for i in range(n)]},
    )  # fmt: skip


@pytest.mark.parametrize(("depth", "on_protocol"), [(40, False), (1000, True), (1200, False)])
def test_the_ranking_depth_is_recorded_and_checked(depth, on_protocol):
    # The seed re-ranks the first stage's top 1,000 candidates per query. A mirror of 36 or
    # more candidates fills the protocol's group of 36, so the group size alone let any
    # depth from 36 up pass as on protocol; the depth of the evaluated queries is checked.
    from encoder_eval.core.protocol import PROTOCOL_RECIPE
    from encoder_eval.data.tasks import task_knobs

    kind = kinds.kind_for(RANKING)
    train_enc = _queries(3, 40)
    record, reasons = kind.record(task_knobs("ms_marco"), PROTOCOL_RECIPE, train_enc,
                                  {"en": _queries(2, depth)})  # fmt: skip
    assert record["depth"] == depth and record["depth_protocol"] == 1000
    assert record["group_size_used"] == 36  # 40 candidates fill the group
    depth_reasons = [r for r in reasons if r.startswith("rank depth")]
    assert (depth_reasons == []) == on_protocol
    if not on_protocol:
        assert depth_reasons == [f"rank depth {depth} (protocol: 1000 first-stage candidates "
                                 f"re-ranked per query; every evaluated query has "
                                 f"{depth})"]  # fmt: skip
    assert record["short_queries"] == (2 if depth < 1000 else 0)
    assert PROTOCOL_RECIPE.to_dict()["rank_depth"] == 1000  # recorded in every recipe


def _uneven(sizes: list[int]) -> encoding.Encoded:
    """A ranking split whose query i has sizes[i] candidates, its first one relevant."""
    qids = [f"q{q}" for q, n in enumerate(sizes) for _ in range(n)]
    ranks = [i + 1 for n in sizes for i in range(n)]
    return encoding.Encoded(
        features={"input_ids": [[1, 2]] * len(qids)}, labels=[int(r == 1) for r in ranks],
        lengths=[2] * len(qids), columns={"query_id": qids, "doc_id": [str(i) for i in
        range(len(qids))], "first_stage_rank": ranks},
    )  # fmt: skip


def test_the_ranking_depth_is_the_fewest_candidates_any_evaluated_query_has():
    """99 queries cut to 100 candidates and one kept at 1,000: the depth is 100, not 1,000,
    and the cell is off-protocol with the count of short queries; the deepest is recorded
    too, and every query at 1,000 but one at 1,200 is off-protocol as well."""
    from encoder_eval.core.protocol import PROTOCOL_RECIPE
    from encoder_eval.data.tasks import task_knobs

    kind = kinds.kind_for(RANKING)
    knobs, train_enc = task_knobs("ms_marco"), _queries(3, 40)
    # the deep query in another language: the depth is over every evaluated query
    evaluated = {"en": _uneven([100] * 99), "de": _uneven([1000])}
    record, reasons = kind.record(knobs, PROTOCOL_RECIPE, train_enc, evaluated)
    assert (record["depth"], record["depth_max"], record["short_queries"]) == (100, 1000, 99)
    assert [r for r in reasons if r.startswith("rank depth")] == [
        "rank depth 100 (protocol: 1000 first-stage candidates re-ranked per query; 99 of the "
        "100 evaluated queries have fewer, down to 100)"
    ]
    record, reasons = kind.record(knobs, PROTOCOL_RECIPE, train_enc,
                                  {"en": _uneven([1000] * 4 + [1200])})  # fmt: skip
    assert (record["depth"], record["depth_max"], record["short_queries"]) == (1000, 1200, 0)
    assert [r for r in reasons if r.startswith("rank depth")] == [
        "rank depth 1000 (protocol: 1000 first-stage candidates re-ranked per query; the "
        "evaluated queries have 1000 to 1200)"
    ]
    # without evaluated splits the training queries are judged, by the same rule
    record, reasons = kind.record(knobs, PROTOCOL_RECIPE, _uneven([1000, 1000, 999]))
    assert (record["depth"], record["short_queries"]) == (999, 1)
    assert "1 of the 3 training queries have fewer, down to 999" in reasons[-1]
    record, reasons = kind.record(knobs, PROTOCOL_RECIPE, train_enc,
                                  {"en": _uneven([1000] * 3)})  # fmt: skip
    assert record["depth"] == record["depth_max"] == 1000 and record["short_queries"] == 0
    assert not [r for r in reasons if r.startswith("rank depth")]


def test_listwise_and_pointwise_losses_equal_their_formulas(rank_mirror):
    enc = encoded_train(rank_mirror)
    groups = [(0, 1, 2), (20, 21)]
    enc.labels[0], enc.labels[20] = 1, 1  # make both first candidates relevant here
    batch = kinds.kind_for(RANKING).collate_units(enc, groups, 0, "cpu")
    assert batch["input_ids"].shape[0] == 5
    assert batch["labels"].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, -1.0]]
    logits = torch.tensor([[0.5], [1.5], [-1.0], [2.0], [0.0]])
    listwise = kinds.KINDS["ranking"].loss(logits, batch["labels"])
    want = -(math.log(math.exp(0.5) / (math.exp(0.5) + math.exp(1.5) + math.exp(-1.0)))
             + math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0)))) / 2  # fmt: skip
    assert float(listwise) == pytest.approx(want, rel=1e-6)

    def bce(x, y):
        p = 1 / (1 + math.exp(-x))
        return -(y * math.log(p) + (1 - y) * math.log(1 - p))

    pairs = [(0.5, 1), (1.5, 0), (-1.0, 0), (2.0, 1), (0.0, 0)]
    pointwise = kinds.KINDS["ranking_pointwise"].loss(logits, batch["labels"])
    assert float(pointwise) == pytest.approx(sum(bce(x, y) for x, y in pairs) / 5, rel=1e-6)
    pw = dataclasses.replace(SHORT, rank_objective="pointwise")
    assert kinds.kind_for(RANKING, pw).name == "ranking_pointwise"


# ----------------------------------------------------------------------------- cells


def check_trec(path: Path, result: dict, raw: dict[str, list[dict]]) -> None:
    """A TREC run: six fields a line, Q0, ranks 1..n per query, scores non-increasing,
    the cell's run name, every candidate of every query once."""
    run = f"tiny_ms_marco_{result['cell']['lr_key']}_s{result['cell']['seed']}"
    seen: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        qid, q0, doc, rank, score, name = line.split(" ")
        assert q0 == "Q0" and name == run
        seen[qid].append((int(rank), float(score), doc))
    assert set(seen) == set(raw)
    for qid, entries in seen.items():
        assert [r for r, _, _ in entries] == list(range(1, len(raw[qid]) + 1))
        scores = [s for _, s, _ in entries]
        assert all(a >= b for a, b in zip(scores, scores[1:], strict=False))
        assert sorted(d for _, _, d in entries) == sorted(str(r["passage_id"]) for r in raw[qid])


@pytest.mark.parametrize("objective", ["listwise", "pointwise"])
def test_a_tiny_ranking_cell_trains_and_writes_result_predictions_and_trec(
    objective, tiny_bert, rank_mirror, tmp_path
):
    recipe = dataclasses.replace(SHORT, rank_objective=objective)
    out = tmp_path / result_filename("tiny", "ms_marco", 1e-4, 45)
    cfg = cell_config.CellConfig(model_path=str(tiny_bert), task="ms_marco", lr=1e-4, seed=45,
                           model_key="tiny", recipe=recipe, data_dir=str(rank_mirror),
                           device="cpu", progress="quiet", out_json=str(out))  # fmt: skip
    result = train.run_cell(cfg)
    assert validate_result(json.loads(out.read_text())) == []
    assert result["status"] == "ok" and result["metric"] == "mrr_at_10"
    assert result["training"]["steps"] == 4
    rk = result["ranking"]
    assert rk["objective"] == objective and rk["group_size"] == 36
    assert rk["group_size_used"] == 20 and rk["first_stage"] == "bm25"
    assert rk["train_queries"] == {"total": 10, "with_positive": 9, "skipped": 1}
    reasons = result["protocol"]["off_protocol_reasons"]
    assert result["protocol"]["on_protocol"] is False
    assert any(r.startswith("rank group size 20 (protocol: 36") for r in reasons)
    assert any(r.startswith("rank depth 20 (protocol: 1000") for r in reasons)
    assert rk["depth"] == 20 and result["recipe"]["rank_depth"] == 1000
    assert any(r.startswith("rank_objective=pointwise") for r in reasons) == (
        objective == "pointwise"
    )
    raw_path = rank_mirror / "ms_marco" / "validation.jsonl"
    want_mrr, want_ndcg, n = independent_bm25_scores(raw_path)
    for section in ("dev", "report"):
        s = result[section]
        assert 0.0 <= s["mean"] <= 1.0
        assert s["queries"]["en"] == {"total": 8, "with_positive": 7, "without_positive": 1,
                                      "candidate_depth": 20}  # fmt: skip
        assert s["first_stage"]["name"] == "bm25"
        assert s["first_stage"]["mrr_at_10"]["en"] == pytest.approx(want_mrr, abs=1e-12)
        assert s["first_stage"]["ndcg_at_10"]["en"] == pytest.approx(want_ndcg, abs=1e-12)
        assert 0.0 <= s["secondary"]["ndcg_at_10"]["en"] <= 1.0
    # dev-reported: the report split is dev, scored on the kept weights
    assert result["report"]["mean"] == pytest.approx(result["dev"]["mean"], abs=1e-9)
    preds = load_predictions(predictions_path(out))
    assert check_against_result(preds, CellResult.from_dict(result)) == []
    lang = preds.languages["en"]
    assert len(lang) == 160 and len(set(lang.query_ids)) == n
    groups = metrics.RankGroups(lang.query_ids, lang.first_stage_ranks)
    ndcg = metrics.compute_metric("ndcg_at_10", lang.predictions, lang.labels, groups)
    assert ndcg == pytest.approx(result["report"]["secondary"]["ndcg_at_10"]["en"], abs=1e-12)
    check_trec(trec_run_path(out), result, raw_queries(raw_path))
    # compare's example-level tests resample single examples: not run on a per-query metric
    examples, why = verdicts.load_examples(load_results(tmp_path))
    assert examples is None and "per-query metric" in why


def test_run_cli_takes_the_rank_objective_and_refuses_a_group_of_one(
    tiny_bert, rank_mirror, tmp_path
):
    out = tmp_path / "cell.json"
    base = ["--model-path", str(tiny_bert), "--model-key", "tiny", "--task", "ms_marco",
            "--lr", "1e-4", "--seed", "45", "--allow-off-protocol", "--max-steps", "2",
            "--max-seq-len", "64", "--bsz", "4", "--device", "cpu", "--progress", "quiet",
            "--data-dir", str(rank_mirror), "--out-json", str(out)]  # fmt: skip
    bad = sh(py("encoder_eval.run", *base, "--rank-group-size", "1"), tmp_path, ok=(2,))
    assert bad.returncode == 2 and "error: --rank-group-size must be at least 2" in bad.stderr
    assert not out.exists()
    sh(py("encoder_eval.run", *base, "--rank-objective", "pointwise", "--rank-group-size", "6"),
       tmp_path)  # fmt: skip
    result = json.loads(out.read_text())
    assert result["recipe"]["rank_objective"] == "pointwise"
    assert result["ranking"]["group_size_used"] == 6 and result["ranking"]["group_size"] == 6
    assert not any(r.startswith("rank group size") for r in
                   result["protocol"]["off_protocol_reasons"])  # fmt: skip
    assert trec_run_path(out).exists()


def test_ranking_through_sweep_run_all_select_status_and_summarize(
    tiny_bert, rank_mirror, tmp_path
):
    """The protocol's commands on a ranking task beside a GLUE task: ms_marco gets its own
    column (no Ranking column over it alone: the JSON keeps its bucket), and the Average is
    the GLUE task's alone."""
    common = ["--model", f"tiny={tiny_bert}", "--tasks", "ms_marco,glue_rte", "--data-dir",
              str(rank_mirror), "--max-steps", "2", "--max-seq-len", "64", "--device", "cpu"]  # fmt: skip
    sh(py("encoder_eval.sweep", "--phase", "select", *common, "--lr-keys", "lr03,lr10",
          "--seeds", "42,43", "--out-dir", "runs/select", "--results-dir", "results/select"),
       tmp_path)  # fmt: skip
    run = sh(["bash", "runs/select/run_all.sh"], tmp_path)
    assert "[cells 8/8 done, units 2/2, failed 0]" in run.stdout
    status = sh(py("encoder_eval.status", "--results-dir", "results/select"), tmp_path)
    assert "done          8" in status.stdout and "missing       0" in status.stdout
    sh(py("encoder_eval.select", "--results-dir", "results/select", "--out", "selection.json"),
       tmp_path)  # fmt: skip
    selection = json.loads((tmp_path / "selection.json").read_text())
    assert selection["pairs"]["tiny"]["ms_marco"]["lr_key"] in ("lr03", "lr10")
    sh(py("encoder_eval.sweep", "--phase", "report", "--selection", "selection.json", *common,
          "--seeds", "45,46", "--out-dir", "runs/report", "--results-dir", "results/report"),
       tmp_path)  # fmt: skip
    sh(["bash", "runs/report/run_all.sh"], tmp_path)
    out = sh(py("encoder_eval.summarize", "--results-dir", "results/report", "--format", "json",
                "--allow-partial"), tmp_path).stdout  # fmt: skip
    table = json.loads(out)
    tasks = {t["task"]: t for t in table["tasks"]}
    assert tasks["ms_marco"]["metric"] == "mrr_at_10" and tasks["ms_marco"]["bucket"] == "ranking"
    row = table["rows"][0]
    marco, rte = row["cells"]["ms_marco"], row["cells"]["glue_rte"]
    assert marco["n"] == 2 and rte["n"] == 2
    assert row["buckets"]["ranking"] == pytest.approx(marco["mean"])
    assert row["average"] == pytest.approx(rte["mean"])  # ranking left out
    assert table["average_excludes_buckets"] == ["ranking"]
    markdown = sh(py("encoder_eval.summarize", "--results-dir", "results/report",
                     "--allow-partial"), tmp_path).stdout  # fmt: skip
    assert "MS-MARCO* (MRR@10)" in markdown and "| Ranking |" not in markdown  # one task
    assert "Average leaves out the ranking tasks (ms_marco)" in markdown
    trecs = sorted((tmp_path / "results/report").glob("*.run.trec"))
    assert [p.name.split("_ms_marco_")[0] for p in trecs] == ["tiny", "tiny"]


@pytest.mark.slurm
def test_a_ranking_cell_through_real_slurm(tiny_bert, rank_mirror, tmp_path, slurm):
    """An ms_marco report cell as an sbatch job: the result, its predictions and TREC file."""
    import shlex
    import sys

    from test_slurm import job_ids, template, wait_for

    tpl = template(tmp_path / "job.sh",
                   f'exec {shlex.quote(sys.executable)} -m encoder_eval.run "$@"\n')  # fmt: skip
    from result_helpers import make_selection

    from encoder_eval.core.protocol import LR_GRID

    selection = make_selection({("tiny", "ms_marco"): "lr10"})
    (tmp_path / "selection.json").write_text(json.dumps(selection))
    sh(py("encoder_eval.sweep", "--phase", "report", "--selection", "selection.json", "--model",
          f"tiny={tiny_bert}", "--tasks", "ms_marco", "--seeds", "45", "--data-dir",
          str(rank_mirror), "--max-steps", "2", "--max-seq-len", "64", "--device", "cpu",
          "--mode", "slurm", "--slurm-template", str(tpl), "--out-dir", "runs",
          "--results-dir", "res"), tmp_path)  # fmt: skip
    launch = sh(["bash", "runs/launch.sh"], tmp_path)
    ids = job_ids(launch.stdout)
    assert len(ids) == 1, launch.stdout
    wait_for(ids, tmp_path / "runs" / "logs")
    path = tmp_path / "res" / result_filename("tiny", "ms_marco", LR_GRID["lr10"], 45)
    logs = "\n".join(p.read_text()[-2000:] for p in (tmp_path / "runs" / "logs").glob("*"))
    assert path.exists(), logs
    result = json.loads(path.read_text())
    assert validate_result(result) == [] and result["metric"] == "mrr_at_10"
    assert predictions_path(path).exists() and trec_run_path(path).exists()
