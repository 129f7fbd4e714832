"""Kinds of cell: what differs between fine-tuning a classifier and a regressor, as hooks.

The training loop in `train.py` batches, computes the loss and turns logits into
predictions only through a cell's `Kind`, so it has no branch per kind. A new kind
(ranking, probing) is a new `Kind` row in `KINDS` and, when it comes from a new problem
type, a row in `PROBLEM_KINDS`; the loop does not change.

A training step is formed of "units": one example for a classifier or regressor, one
query's group (one relevant candidate plus sampled negatives) for a ranker, so a ranking
batch is counted in queries. The loop draws an epoch's units (`units`), batches them,
collates them (`train_collate`), counts their tokens (`members`) and runs forward, loss and
backward on the batch (`train_step`: a ranker's in pieces of bounded size); evaluation
scores single examples (`collate`, `predictions`), and `record` adds what a kind records
beside the scores. What a kind's metric and files need beside predictions and labels (a
ranker's query ids: `columns`, `groups`, `prediction_fields`, `files`) are hooks too.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from encoder_eval.cells.encoding import Encoded, with_columns
from encoder_eval.cells.predictions import (
    RANK_FIELDS,
    CellPredictions,
    trec_run_path,
    write_trec_run,
)
from encoder_eval.core import heap, metrics
from encoder_eval.core.errors import unknown_name
from encoder_eval.core.problems import RANKING, REGRESSION, SINGLE_LABEL
from encoder_eval.core.protocol import PROTOCOL_RECIPE, RANK_OBJECTIVES, Recipe
from encoder_eval.data.tasks import TaskKnobs


def pad_features(enc: Encoded, idx: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """The model inputs of examples `idx`, right-padded to the longest of them (input ids
    with the tokenizer's pad id, every other feature with 0), cut from the split's tensors
    (`Encoded.packed`, made once)."""
    width = max(enc.lengths[i] for i in idx)
    return enc.packed().padded(idx, width, {"input_ids": pad_id})


def _collate_with(label_dtype: torch.dtype):
    def collate(enc: Encoded, idx: list[int], pad_id: int, device) -> dict[str, torch.Tensor]:
        batch = pad_features(enc, idx, pad_id)
        batch["labels"] = torch.tensor([enc.labels[i] for i in idx], dtype=label_dtype)
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    return collate


# The loss is computed in fp32 whatever the autocast precision of the forward pass.
def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float(), labels)


def _squared_error(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(logits.float().squeeze(-1), labels)


def _argmax(logits: torch.Tensor) -> list:
    return logits.float().argmax(-1).cpu().tolist()


def _squeeze(logits: torch.Tensor) -> list:
    return logits.float().squeeze(-1).cpu().tolist()


def _each_example(enc: Encoded, rng: random.Random, recipe: Recipe) -> list[int]:
    """An epoch's units of a classifier or regressor: every example (`rng` is not drawn)."""
    return list(range(len(enc.labels)))


def _count_examples(enc: Encoded) -> int:
    return len(enc.labels)


def _itself(unit: int) -> list[int]:
    return [unit]


def _no_record(
    knobs: TaskKnobs, recipe: Recipe, enc_train: Encoded, evaluated: dict | None = None
) -> tuple[dict | None, list[str]]:
    return None, []


def _no_section_extra(knobs: TaskKnobs, encs: dict, preds: dict) -> dict:
    return {}


def _no_columns(enc: Encoded, split: dict) -> Encoded:
    return enc


def _no_groups(enc: Encoded) -> metrics.RankGroups | None:
    return None


def _no_fields(enc: Encoded) -> dict[str, list]:
    return {}


def _no_files(out_json: str | os.PathLike) -> dict[str, Path]:
    return {}


def _write_nothing(out_json: str | os.PathLike, preds: CellPredictions) -> list[Path]:
    return []


Autocast = Callable[[], AbstractContextManager]


def _whole_batch_step(
    kind: Kind, model: nn.Module, batch: dict, scale: float, autocast: Autocast
) -> torch.Tensor:
    """Forward the whole batch under `autocast`, backward `scale` times its loss; returns
    that scaled loss, detached."""
    labels = batch.pop("labels")
    with autocast():
        logits = model(**batch).logits
    loss = kind.loss(logits, labels) * scale
    loss.backward()
    return loss.detach()


# ----------------------------------------------------------------------------- ranking


# The split columns a ranking cell reads beside the model inputs (`Encoded.columns`), and
# the names its predictions file gives them per language (`predictions.RANK_FIELDS`).
RANK_COLUMNS = ("query_id", "doc_id", "first_stage_rank")
RANK_RECORD_FIELDS = dict(zip(RANK_COLUMNS, RANK_FIELDS, strict=True))


def with_rank_columns(enc: Encoded, split: dict) -> Encoded:
    """`enc` with a ranking split's query, candidate and first-stage columns (other splits
    unchanged): the ranking kinds' `columns` hook."""
    return with_columns(enc, split, RANK_COLUMNS)


def rank_groups(enc: Encoded) -> metrics.RankGroups | None:
    """What a grouped metric needs beside scores and labels (None for a split without query
    ids): the ranking kinds' `groups` hook."""
    if "query_id" not in enc.columns:
        return None
    return metrics.RankGroups(enc.columns["query_id"], enc.columns["first_stage_rank"])


def _rank_fields(enc: Encoded) -> dict[str, list]:
    """A ranking language's lists in the predictions file: each candidate's query, candidate
    id and first-stage rank."""
    return {
        field: enc.columns[column]
        for column, field in RANK_RECORD_FIELDS.items()
        if column in enc.columns
    }


def _rank_files(out_json: str | os.PathLike) -> dict[str, Path]:
    return {"TREC run": trec_run_path(out_json)}


def _write_trec(out_json: str | os.PathLike, preds: CellPredictions) -> list[Path]:
    """A ranking cell's TREC run file beside its result (`predictions.write_trec_run`);
    returns the files written."""
    if not preds.ranked:
        return []
    write_trec_run(trec_run_path(out_json), preds)
    return [trec_run_path(out_json)]


def query_members(enc: Encoded) -> dict[str, list[int]]:
    """Each query's candidates (example indices, in split order), queries in order of first
    appearance."""
    out: dict[str, list[int]] = {}
    for i, qid in enumerate(enc.columns["query_id"]):
        out.setdefault(qid, []).append(i)
    return out


def query_counts(enc: Encoded) -> dict[str, int]:
    """How many queries a ranking split holds, with and without a relevant candidate, and
    its candidate depth (the most candidates any query has)."""
    groups = list(query_members(enc).values())
    positive = sum(any(enc.labels[i] == 1 for i in g) for g in groups)
    return {
        "total": len(groups),
        "with_positive": positive,
        "without_positive": len(groups) - positive,
        "candidate_depth": max((len(g) for g in groups), default=0),
    }


def _query_groups(enc: Encoded, rng: random.Random, recipe: Recipe) -> list[tuple[int, ...]]:
    """An epoch's units of a ranker: per query with a relevant candidate, one group of a
    relevant candidate (drawn when there are several) first, then up to
    `recipe.rank_group_size - 1` negatives drawn without replacement; queries without a
    relevant candidate are skipped. Every draw comes from `rng` (seeded by the cell seed)."""
    out = []
    for members in query_members(enc).values():
        positives = [i for i in members if enc.labels[i] == 1]
        if not positives:
            continue
        negatives = [i for i in members if enc.labels[i] != 1]
        positive = positives[0] if len(positives) == 1 else rng.choice(positives)
        take = min(recipe.rank_group_size - 1, len(negatives))
        out.append((positive, *rng.sample(negatives, take)))
    return out


def _count_queries(enc: Encoded) -> int:
    return query_counts(enc)["with_positive"]


def _group_members(unit: tuple[int, ...]) -> list[int]:
    return list(unit)


def _collate_groups(
    enc: Encoded, groups: list[tuple[int, ...]], pad_id: int, device
) -> dict[str, torch.Tensor]:
    """The batch of query groups: every candidate's inputs, flattened group by group, and
    `labels` of shape (groups, largest group), relevance 1/0, -1 where a group is shorter."""
    batch = pad_features(enc, [i for g in groups for i in g], pad_id)
    labels = torch.full((len(groups), max(len(g) for g in groups)), -1.0)
    for row, g in enumerate(groups):
        labels[row, : len(g)] = torch.tensor([float(enc.labels[i]) for i in g])
    batch["labels"] = labels
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _grouped_scores(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The flat logits laid out as (groups, largest group), -inf where a group is shorter."""
    scores = torch.full(labels.shape, float("-inf"), device=logits.device)
    scores[labels >= 0] = logits.float().reshape(-1)
    return scores


def _listwise(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy of each group's relevant candidate (column 0) against its
    group, averaged over groups."""
    scores = _grouped_scores(logits, labels)
    target = torch.zeros(labels.shape[0], dtype=torch.long, device=logits.device)
    return nn.functional.cross_entropy(scores, target)


def _pointwise(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of every (query, candidate) pair's logit against its relevance,
    averaged over pairs."""
    mask = labels >= 0
    return nn.functional.binary_cross_entropy_with_logits(logits.float().reshape(-1), labels[mask])


def _groups_items(labels: torch.Tensor) -> int:
    return labels.shape[0]


def _pairs_items(labels: torch.Tensor) -> int:
    return int((labels >= 0).sum())


# How a ranking training batch is cut so that its memory stays bounded (the arithmetic is
# the same: see `_ranking_step`), by device type. A batch is 32 query groups of up to 36
# candidates, up to 1,152 pairs of up to 256 tokens; forwarded at once (padded to its
# longest pair) it kept 23 GB of activations on the CPU for MiniLM, where training-mode
# attention (dropout) leaves sdpa's fused kernel for its fp32 math path, which stores the
# fp32 attention scores of every head (bench/README.md, bench_rank.py).
# Chunk: whole groups whose real tokens are at most this many are forwarded before one
# backward (a larger group is one chunk alone, its pieces recomputed in the backward).
RANK_CHUNK_TOKENS = {"cpu": 4096, "cuda": 131072}
# Piece: one forward call, at most this many padded tokens of length-sorted pairs.
RANK_PIECE_TOKENS = {"cpu": 1024, "cuda": 32768}
# The body the cuda budgets are sized for (hidden size x layers of a base model: XLM-R base,
# BERT base). A token's activations grow with both, so a larger body gets budgets cut in
# proportion (XLM-R XL, 2,560 x 36: a tenth), a smaller one the same budgets.
RANK_BUDGET_BODY = 768 * 12


def rank_budgets(device_type: str, model: nn.Module) -> tuple[int, int]:
    """The chunk and piece token budgets of a ranking step on `device_type` for `model`:
    the table's (`RANK_CHUNK_TOKENS`, `RANK_PIECE_TOKENS`); on a GPU cut in proportion to
    how much larger than `RANK_BUDGET_BODY` the model's body is (its config's hidden size
    times its layers; a model without them keeps the table's)."""
    chunk = RANK_CHUNK_TOKENS.get(device_type, RANK_CHUNK_TOKENS["cuda"])
    piece = RANK_PIECE_TOKENS.get(device_type, RANK_PIECE_TOKENS["cuda"])
    if device_type == "cpu":
        return chunk, piece
    config = getattr(model, "config", None) or getattr(getattr(model, "body", None), "config", None)
    hidden = getattr(config, "hidden_size", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(hidden, int) or not isinstance(layers, int) or hidden * layers <= 0:
        return chunk, piece
    scale = min(1.0, RANK_BUDGET_BODY / (hidden * layers))
    return max(1, int(chunk * scale)), max(1, int(piece * scale))


def _by_budget(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive runs [start, end) of items whose `sizes` sum to at most `budget` (an item
    larger than the budget is a run alone)."""
    runs, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > budget:
            runs.append((start, i))
            start, total = i, 0
        total += size
    if sizes:
        runs.append((start, len(sizes)))
    return runs


def _pieces(lengths: list[int], budget: int) -> list[list[int]]:
    """Rows cut, longest first, into pieces whose padded size (rows x longest row) is at most
    `budget` (a row longer than the budget is a piece alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    pieces, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[current[0]] > budget:
            pieces.append(current)
            current = []
        current.append(i)
    if current:
        pieces.append(current)
    return pieces


def _forward_rows(
    model: nn.Module,
    batch: dict,
    rows: list[int],
    lengths: list[int],
    piece_tokens: int,
    autocast: Autocast,
    recompute: bool,
) -> torch.Tensor:
    """The logits of `rows` of a flat batch, in the order given, forwarded in length-sorted
    pieces each cut to its own longest row; with `recompute` each piece keeps only its
    inputs and is run again in the backward (activation checkpointing, same dropout)."""
    names = list(batch)
    device = batch[names[0]].device
    outs, order = [], []
    for piece in _pieces([lengths[r] for r in rows], piece_tokens):
        picked = [rows[i] for i in piece]
        width = lengths[picked[0]]
        index = torch.tensor(picked, device=device)
        inputs = [batch[n].index_select(0, index)[:, :width] for n in names]

        def run(*tensors: torch.Tensor) -> torch.Tensor:
            with autocast():
                return model(**dict(zip(names, tensors, strict=True))).logits

        outs.append(checkpoint(run, *inputs, use_reentrant=False) if recompute else run(*inputs))
        order.extend(piece)
    logits = torch.cat(outs)
    where = torch.tensor(order, device=logits.device)
    inverse = torch.empty_like(where)
    inverse[where] = torch.arange(len(order), device=logits.device)
    return logits.index_select(0, inverse)


def _ranking_step(
    kind: Kind, model: nn.Module, batch: dict, scale: float, autocast: Autocast
) -> torch.Tensor:
    """A ranking batch's forward, loss and backward in bounded memory, the same loss and
    gradient as at once: chunks of whole groups (`RANK_CHUNK_TOKENS` real tokens), each
    forwarded in length-sorted pieces (`RANK_PIECE_TOKENS` padded tokens; on a GPU both
    cut for a larger model: `rank_budgets`) and backed by its
    share of the batch loss (the loss is a mean over groups, or over pairs, so the shares add
    up to it); a chunk of one group over the budget recomputes its pieces in the backward.
    On the CPU the freed heap goes back to the system after each chunk (`heap`)."""
    labels = batch.pop("labels")
    device = labels.device.type
    chunk_tokens, piece_tokens = rank_budgets(device, model)
    width = batch["input_ids"].shape[1]
    mask = batch.get("attention_mask")
    lengths = mask.sum(1).tolist() if mask is not None else [width] * batch["input_ids"].shape[0]
    sizes = (labels >= 0).sum(1).tolist()
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    group_tokens = [sum(lengths[starts[g] : starts[g + 1]]) for g in range(len(sizes))]
    items = kind.loss_items(labels)
    total = torch.zeros((), device=labels.device)
    for g0, g1 in _by_budget(group_tokens, chunk_tokens):
        rows = list(range(starts[g0], starts[g1]))
        recompute = sum(group_tokens[g0:g1]) > chunk_tokens
        logits = _forward_rows(model, batch, rows, lengths, piece_tokens, autocast, recompute)
        sub = labels[g0:g1]
        loss = kind.loss(logits, sub) * (scale * kind.loss_items(sub) / items)
        loss.backward()
        total += loss.detach()
        if device == "cpu":
            heap.release_free_heap()
    return total


def _ranking_record(
    knobs: TaskKnobs, recipe: Recipe, enc_train: Encoded, evaluated: dict | None = None
) -> tuple[dict, list[str]]:
    """A ranking cell's `ranking` result section (objective, group sizes, training query
    counts, the ranking depth) and its off-protocol reasons: the data holds fewer candidates
    than a group, or its evaluated queries (`evaluated`: the dev encodings per language;
    else the training queries) do not all re-rank the protocol's `rank_depth` candidates
    (the seed re-ranks the first stage's top 1,000 of every query).

    The depth is the fewest candidates any evaluated query has: the protocol's depth holds
    only if every query has it, so one deep query among shallow ones cannot lift it (the
    deepest is recorded too, as `depth_max`, and one over the protocol's is off-protocol
    as well). `short_queries` counts the queries with fewer candidates than the recipe's
    depth."""
    counts = query_counts(enc_train)
    used = min(recipe.rank_group_size, counts["candidate_depth"])
    encs = list((evaluated or {}).values()) or [enc_train]
    sizes = [len(g) for e in encs for g in query_members(e).values()]
    depth, deepest = (min(sizes), max(sizes)) if sizes else (0, 0)
    short = sum(n < recipe.rank_depth for n in sizes)
    record = {
        "objective": recipe.rank_objective,
        "group_size": recipe.rank_group_size,
        "group_size_used": used,
        "group_size_protocol": PROTOCOL_RECIPE.rank_group_size,
        "first_stage": knobs.first_stage_name,
        "train_queries": {
            "total": counts["total"],
            "with_positive": counts["with_positive"],
            "skipped": counts["without_positive"],
        },
        "train_candidate_depth": counts["candidate_depth"],
        "depth": depth,
        "depth_max": deepest,
        "short_queries": short,
        "depth_protocol": PROTOCOL_RECIPE.rank_depth,
    }
    reasons = []
    if used < recipe.rank_group_size:
        reasons.append(
            f"rank group size {used} (protocol: {PROTOCOL_RECIPE.rank_group_size}; "
            f"the training queries have at most {counts['candidate_depth']} "
            "candidates)"
        )
    if depth != recipe.rank_depth or deepest != recipe.rank_depth:
        where = "evaluated" if evaluated else "training"
        if depth == deepest:
            what = f"every {where} query has {depth}"
        elif depth < recipe.rank_depth:
            what = f"{short} of the {len(sizes)} {where} queries have fewer, down to {depth}"
        else:
            what = f"the {where} queries have {depth} to {deepest}"
        reasons.append(
            f"rank depth {depth} (protocol: {PROTOCOL_RECIPE.rank_depth} "
            f"first-stage candidates re-ranked per query; {what})"
        )
    return record, reasons


def _ranking_section_extra(knobs: TaskKnobs, encs: dict, preds: dict) -> dict:
    """What a ranking score section records beside the primary metric, per language: the
    secondary metrics of the model's ranking, the first stage's own scores on the same
    queries, and the query counts and candidate depth."""
    secondary = {
        name: {
            lang: metrics.compute_metric(
                name, preds[lang], encs[lang].labels, rank_groups(encs[lang])
            )
            for lang in preds
        }
        for name in knobs.secondary_metrics
    }
    first_stage = {
        name: {
            lang: metrics.compute_metric(
                name,
                metrics.first_stage_scores(rank_groups(encs[lang])),
                encs[lang].labels,
                rank_groups(encs[lang]),
            )
            for lang in preds
        }
        for name in (knobs.metric, *knobs.secondary_metrics)
    }
    return {
        "secondary": secondary,
        "first_stage": {"name": knobs.first_stage_name, **first_stage},
        "queries": {lang: query_counts(encs[lang]) for lang in preds},
    }


@dataclass(frozen=True)
class Kind:
    """The hooks of one kind of cell.

    `collate(enc, idx, pad_id, device)`: the batch of examples `idx` on `device`, model
    inputs plus `labels` (evaluation, and training of kinds whose unit is an example).
    `loss(logits, labels)`: the mean training loss, in fp32, over a `train_collate` batch.
    `predictions(logits)`: one prediction per row of logits, as plain Python values that
    the task's metric scores. `problem`: the `problem_type` the model head is built for.
    `units(enc, rng, recipe)`: an epoch's training units; `count_units(enc)` how many an
    epoch has (the step budget counts them); `members(unit)`: its example indices;
    `train_collate(enc, units, pad_id, device)`: the training batch of `units`.
    `record(knobs, recipe, enc_train, evaluated)`: a result section of the kind's own
    (None: none) and its off-protocol reasons (`evaluated`: the dev encodings); `section_extra(knobs, encs, preds)`: what a score
    section records beside the primary metric, from the split's encodings and predictions.
    `step(kind, model, batch, scale, autocast)`: forward (under `autocast()`), loss and
    backward of `scale` times the loss of a `train_step` batch, returning that scaled loss
    detached; `loss_items(labels)`: how many terms the loss averages over (its share when a
    step cuts a batch).
    `columns(enc, split)`: the tokenised split with the split's columns the kind reads
    beside the model inputs (`Encoded.columns`); `groups(enc)`: what the task's metric needs
    beside predictions and labels (`metrics.RankGroups`, or None); `prediction_fields(enc)`:
    the lists a language of the predictions file holds beside predictions and labels;
    `write_files(out_json, preds)`: write the files the kind keeps beside a result from its
    predictions, returning those written; `files(out_json)`: their paths, by what each is
    (`beside_result` collects every kind's).
    """

    name: str
    problem: str
    collate: Callable[..., dict[str, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    predictions: Callable[[torch.Tensor], list]
    units: Callable[..., list] = _each_example
    count_units: Callable[..., int] = _count_examples
    members: Callable[..., list[int]] = _itself
    train_collate: Callable[..., dict[str, torch.Tensor]] | None = None
    record: Callable[..., tuple[dict | None, list[str]]] = _no_record
    section_extra: Callable[..., dict] = _no_section_extra
    step: Callable[..., torch.Tensor] = _whole_batch_step
    loss_items: Callable[[torch.Tensor], int] = _groups_items
    columns: Callable[[Encoded, dict], Encoded] = _no_columns
    groups: Callable[[Encoded], metrics.RankGroups | None] = _no_groups
    prediction_fields: Callable[[Encoded], dict[str, list]] = _no_fields
    files: Callable[[str | os.PathLike], dict[str, Path]] = _no_files
    write_files: Callable[[str | os.PathLike, CellPredictions], list[Path]] = _write_nothing

    def score(
        self, metric: str, preds: dict[str, list], encs: dict[str, Encoded]
    ) -> tuple[dict[str, float | None], dict[str, str]]:
        """`metrics.score_splits` of predictions on tokenised splits (per language), with
        what the kind's metric needs beside the labels (`groups`)."""
        groups = {k: g for k, e in encs.items() if (g := self.groups(e)) is not None}
        return metrics.score_splits(metric, preds, {k: e.labels for k, e in encs.items()}, groups)

    def collate_units(self, enc: Encoded, units: list, pad_id: int, device) -> dict:
        """The training batch of `units` (`train_collate`, else `collate`)."""
        return (self.train_collate or self.collate)(enc, units, pad_id, device)

    def train_step(self, model: nn.Module, batch: dict, scale: float, autocast: Autocast):
        """Forward, loss and backward of a `collate_units` batch (`labels` included), the
        loss scaled by `scale`; returns the scaled loss, detached."""
        return self.step(self, model, batch, scale, autocast)


_RANKER = {
    "problem": REGRESSION,
    "collate": _collate_with(torch.float32),
    "predictions": _squeeze,
    "units": _query_groups,
    "count_units": _count_queries,
    "members": _group_members,
    "train_collate": _collate_groups,
    "record": _ranking_record,
    "section_extra": _ranking_section_extra,
    "step": _ranking_step,
    "columns": with_rank_columns,
    "groups": rank_groups,
    "prediction_fields": _rank_fields,
    "files": _rank_files,
    "write_files": _write_trec,
}

KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("classification", SINGLE_LABEL, _collate_with(torch.long), _cross_entropy, _argmax),
        Kind("regression", REGRESSION, _collate_with(torch.float32), _squared_error, _squeeze),
        # A cross-encoder: one logit per (query, candidate) pair, a group per query.
        Kind("ranking", loss=_listwise, loss_items=_groups_items, **_RANKER),
        Kind("ranking_pointwise", loss=_pointwise, loss_items=_pairs_items, **_RANKER),
    )
}

# A task's problem type (`TaskKnobs.problem`) -> the kind of its fine-tune cells.
PROBLEM_KINDS: dict[str, str] = {
    SINGLE_LABEL: "classification",
    REGRESSION: "regression",
    RANKING: "ranking",
}
# A ranking cell's `Recipe.rank_objective` -> its kind.
RANK_OBJECTIVE_KINDS: dict[str, str] = dict(
    zip(RANK_OBJECTIVES, ("ranking", "ranking_pointwise"), strict=True)
)


def kind_for(problem: str, recipe: Recipe = PROTOCOL_RECIPE) -> Kind:
    """The kind of cell that fine-tunes a task of problem type `problem` under `recipe`
    (whose `rank_objective` picks a ranking cell's loss)."""
    if problem not in PROBLEM_KINDS:
        raise unknown_name("problem type", problem, PROBLEM_KINDS)
    name = PROBLEM_KINDS[problem]
    if name == "ranking":
        if recipe.rank_objective not in RANK_OBJECTIVE_KINDS:
            raise unknown_name("rank objective", recipe.rank_objective, RANK_OBJECTIVE_KINDS)
        name = RANK_OBJECTIVE_KINDS[recipe.rank_objective]
    return KINDS[name]


def beside_result(out_json: str | os.PathLike) -> dict[str, Path]:
    """Every file some kind writes beside the result `out_json`, by what it is (a run that
    does not rewrite one removes it, so no file beside a result describes another run)."""
    return {what: p for kind in KINDS.values() for what, p in kind.files(out_json).items()}
