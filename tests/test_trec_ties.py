"""A ranking cell's TREC run, given to trec_eval (through pytrec_eval), gives the result
file's MRR@10 and NDCG@10, also when scores tie.

trec_eval ignores the rank column of a run: it sorts a query's lines by score, highest
first, and breaks a tie by document id, descending (`comp_sim_docno` in `form_res_rels.c`
of usnistgov/trec_eval, commit f4253652c8efd0d86ddffd0d163cc0a0f813111a, `strcmp(p2->docno,
p1->docno)` on equal `sim`); the harness breaks a tie by first-stage rank. pytrec_eval
(terrierteam/pytrec_eval, commit 68c150b2a8341b4655fbd545ca009cd5c5efcfc8) builds trec_eval
de6a29f8, which holds that score as a C `float`, so scores equal in float32 tie there.
trec_eval has no MRR@10: `recip_rank` is 1 / the rank of the first relevant document at
any depth, so MRR@10 is `recip_rank` where it is at least 1/10 and 0 elsewhere.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval  # the dev extra's pytrec-eval-terrier
from conftest import write_small_mirror
from mirror_helpers import shared_data

from encoder_eval.cells import cell_config, train
from encoder_eval.cells.predictions import (
    CellPredictions,
    LanguagePredictions,
    PredictionsError,
    load_predictions,
    predictions_path,
    trec_run_path,
    trec_scores,
    write_trec_run,
)
from encoder_eval.core import metrics
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import result_filename
from encoder_eval.core.schema import CellId
from encoder_eval.data.task_loading import load_task

TOLERANCE = 1e-9


def trec_eval_scores(run_file: Path, lang: LanguagePredictions) -> tuple[float, float]:
    """MRR@10 and NDCG@10 of a TREC run file by trec_eval (pytrec_eval), every candidate
    judged with its label, averaged over every query (one without a relevant candidate
    counts 0, as in the harness)."""
    qrels: dict[str, dict[str, int]] = {}
    for qid, doc, label in zip(lang.query_ids, lang.doc_ids, lang.labels, strict=True):
        qrels.setdefault(str(qid), {})[str(doc)] = int(label)
    run: dict[str, dict[str, float]] = {}
    for line in run_file.read_text(encoding="utf-8").splitlines():
        qid, _, doc, _, score, _ = line.split(" ")
        run.setdefault(qid, {})[doc] = float(score)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "ndcg_cut.10"})
    per_query = evaluator.evaluate(run)
    assert set(per_query) == set(qrels)  # every query evaluated, none dropped
    rr = [q["recip_rank"] if q["recip_rank"] >= 1 / 10 else 0.0 for q in per_query.values()]
    ndcg = [q["ndcg_cut_10"] for q in per_query.values()]
    return sum(rr) / len(rr), sum(ndcg) / len(ndcg)


def ties(lang: LanguagePredictions) -> int:
    """How many candidates share their score with another candidate of their query."""
    counts = Counter(zip(lang.query_ids, lang.predictions, strict=True))
    return sum(n for n in counts.values() if n > 1)


def test_trec_scores_keep_the_models_score_and_nudge_only_ties():
    one = float(np.float32(1.0) - np.finfo(np.float32).eps / 2)  # the float32 below 1.0
    assert trec_scores([3.0, 2.5, -1.0]) == [3.0, 2.5, -1.0]  # strictly decreasing: kept
    # Three ties, then a score the nudges pass: each is the next float32 below the last.
    assert trec_scores([1.0, 1.0, 1.0, one]) == [
        1.0,
        one,
        float(np.nextafter(np.float32(one), np.float32(-np.inf))),
        float(np.nextafter(np.nextafter(np.float32(one), np.float32(-2)), np.float32(-2))),
    ]
    # Distinct in float64, equal in float32 (where pytrec_eval's trec_eval compares).
    close = trec_scores([0.5, 0.5 - 1e-12])
    assert close[0] == 0.5 and np.float32(close[1]) < np.float32(0.5)
    assert abs(close[1] - 0.5) < 1e-7
    with pytest.raises(PredictionsError, match="beyond float32's range"):
        trec_scores([1e300])


def test_pytrec_eval_ties_scores_equal_in_float32_and_breaks_them_by_docid_descending():
    """Why `trec_scores` works in float32: the relevant "a" scores above "b" in float64,
    yet trec_eval ranks "b" first (a float32 tie; "b" > "a"), until the gap is a float32's."""
    evaluator = pytrec_eval.RelevanceEvaluator({"q": {"a": 1, "b": 0}}, {"recip_rank"})
    rr = [evaluator.evaluate({"q": {"a": 0.5, "b": b}})["q"]["recip_rank"]
          for b in (0.5, 0.5 - 1e-12, 0.5 - 1e-7)]  # fmt: skip
    assert rr == [0.5, 0.5, 1.0]
    nudged = trec_scores([0.5, 0.5 - 1e-12])
    assert evaluator.evaluate({"q": dict(zip("ab", nudged, strict=True))})["q"]["recip_rank"] == 1.0


@pytest.mark.parametrize("kind", ["all tied", "coarse", "bf16"])
def test_a_run_with_tied_scores_gives_trec_eval_the_result_files_numbers(kind, tmp_path):
    """The mirror's 180 ms_marco validation queries (20 BM25 candidates each), scored with
    many ties: every candidate tied (BM25's order alone), scores on a coarse grid, and
    scores rounded to bf16 as bf16 autocast rounds a logit."""
    _, val, _, _, _ = load_task("ms_marco", shared_data())
    split = val["en"]
    rng = np.random.default_rng(7)
    raw = rng.normal(size=len(split["label"])) + np.asarray(split["label"])
    scores = {
        "all tied": np.zeros_like(raw),
        "coarse": np.round(raw),
        "bf16": raw.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000),
    }[kind]
    if kind == "bf16":
        scores = scores.view(np.float32).astype(np.float64)
    lang = LanguagePredictions(
        ids=list(range(len(raw))),
        predictions=[float(x) for x in scores],
        labels=list(split["label"]),
        query_ids=[str(q) for q in split["query_id"]],
        doc_ids=[str(d) for d in split["doc_id"]],
        first_stage_ranks=list(split["first_stage_rank"]),
    )
    assert ties(lang) >= 50
    preds = CellPredictions(
        cell=CellId("tiny", "ms_marco", 1e-4, "lr10", 45, "report"),
        metric="mrr_at_10",
        split="validation",
        data_identity="test",
        languages={"en": lang},
    )
    run_file = tmp_path / "cell.run.trec"
    write_trec_run(run_file, preds)
    mrr, ndcg = trec_eval_scores(run_file, lang)
    groups = lang.rank_groups
    want_mrr = metrics.compute_metric("mrr_at_10", lang.predictions, lang.labels, groups)
    want_ndcg = metrics.compute_metric("ndcg_at_10", lang.predictions, lang.labels, groups)
    print(f"{kind}: {ties(lang)} tied; trec_eval - harness: MRR@10 {mrr - want_mrr:.3g}, "
          f"NDCG@10 {ndcg - want_ndcg:.3g}")  # fmt: skip
    assert mrr == pytest.approx(want_mrr, abs=TOLERANCE)
    assert ndcg == pytest.approx(want_ndcg, abs=TOLERANCE)
    # The score column is the model's: within float32's reach of the score it replaces.
    written = {}
    for line in run_file.read_text(encoding="utf-8").splitlines():
        qid, _, doc, _, score, _ = line.split(" ")
        written[qid, doc] = float(score)
    for qid, doc, score in zip(lang.query_ids, lang.doc_ids, lang.predictions, strict=True):
        assert abs(written[qid, doc] - score) <= 1e-5 * max(1.0, abs(score))


def test_a_tiny_ranking_cell_s_run_file_gives_trec_eval_its_result(tmp_path):
    """A real cell: a tiny BERT re-ranker, one step, length 16, so that pairs truncated
    to the same tokens score the same (ties, as bf16 also makes them); its TREC run,
    through trec_eval, gives the MRR@10 and NDCG@10 its result file records."""
    from tiny_models import build_tiny_model

    mirror = write_small_mirror(tmp_path / "mirror", {"ms_marco": {"train.jsonl": 200,
                                                                   "validation.jsonl": 160}})  # fmt: skip
    model = build_tiny_model("bert", tmp_path / "bert", num_labels=None)
    out = tmp_path / result_filename("tiny", "ms_marco", 1e-4, 45)
    cfg = cell_config.CellConfig(model_path=str(model), task="ms_marco", lr=1e-4, seed=45,
                           model_key="tiny", recipe=Recipe(max_steps=1, batch_size=4,
                           max_seq_len=16), data_dir=str(mirror), device="cpu",
                           progress="quiet", out_json=str(out))  # fmt: skip
    train.run_cell(cfg)
    report = json.loads(out.read_text(encoding="utf-8"))["report"]  # the result file's
    lang = load_predictions(predictions_path(out)).languages["en"]
    assert ties(lang) >= 10  # the case under test: tied candidates within a query
    mrr, ndcg = trec_eval_scores(trec_run_path(out), lang)
    print(f"{ties(lang)} tied; trec_eval MRR@10 {mrr:.6f} NDCG@10 {ndcg:.6f}")
    assert mrr == pytest.approx(report["per_language"]["en"], abs=TOLERANCE)
    assert ndcg == pytest.approx(report["secondary"]["ndcg_at_10"]["en"], abs=TOLERANCE)
