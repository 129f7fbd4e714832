"""A trained cell's scores and its result: the best weights restored, dev completed and the
report split scored (`score_trained`), the result dict (`build_result`, schema v2) and its
files written with what they supersede removed (`write_cell_result`)."""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from encoder_eval.cells.cell_config import (
    CellConfig,
    cell_label,
    resume_state_path,
)
from encoder_eval.cells.cell_state import ResolvedCell, Trained
from encoder_eval.cells.devices import (
    attn_implementation,
    peak_memory,
    warm_unit,
)
from encoder_eval.cells.kinds import Kind, beside_result
from encoder_eval.cells.predictions import (
    PredictionsError,
    predictions_path,
    write_predictions,
)
from encoder_eval.cells.predictions import from_cell as predictions_from_cell
from encoder_eval.cells.resume import LoopState
from encoder_eval.core import metrics
from encoder_eval.core.protocol import off_protocol_reasons
from encoder_eval.core.results import (
    write_json_atomic,
)
from encoder_eval.core.schema import CellResult, Protocol, ScoreSection, Training


def _score_section(scores: dict, undefined: dict, euro: tuple[str, ...]) -> dict:
    mean, langs = metrics.language_mean(scores, euro)
    return {
        "per_language": scores,
        "mean": mean,
        "languages_in_mean": langs,
        "undefined": undefined,
    }


@dataclass
class CellScores:
    """A trained cell's scores (`score_trained`), what `build_result` writes into the result."""

    status: str  # ok | diverged
    dev: dict | None
    report: dict | None
    predictions: dict[str, dict]  # report split, per language: predictions and labels


def score_trained(cell: ResolvedCell, trained: Trained) -> CellScores:
    """Restore the best weights, complete the dev scores and score the report split."""
    if trained.diverged_at is not None:
        return CellScores("diverged", None, None, {})
    knobs, euro, kind = cell.knobs, cell.knobs.euro_languages, cell.kind
    *dev_scores, dev_preds = _final_dev_scores(cell, trained.st)
    dev = {
        **_score_section(*dev_scores, euro),
        **kind.section_extra(knobs, cell.enc_val, dev_preds),
    }
    report, predictions = None, {}
    if cell.cfg.phase == "report":
        encs = {lang: cell.tokenise(split) for lang, split in cell.test_splits.items()}
        preds = {lang: cell.predict(enc) for lang, enc in encs.items()}
        for lang, enc in encs.items():
            predictions[lang] = {
                "predictions": preds[lang],
                "labels": enc.labels,
                **kind.prediction_fields(enc),
            }
        scores, undefined = kind.score(knobs.metric, preds, encs)
        report = {
            "split": knobs.report_split,
            **_score_section(scores, undefined, euro),
            **kind.section_extra(knobs, encs, preds),
        }
    for name, section in (("dev", dev), ("report", report)):
        for lang, why in (section or {}).get("undefined", {}).items():
            print(
                f"warning: {cell_label(cell.cfg)}: {knobs.metric} is undefined on the {name} "
                f"split ({lang}: {why}); recorded as undefined, not as 0",
                file=sys.stderr,
            )
    return CellScores("ok", dev, report, predictions)


def _final_dev_scores(
    cell: ResolvedCell, st: LoopState
) -> tuple[dict[str, float | None], dict[str, str], dict[str, list]]:
    """Every dev language's score (and predictions) on the weights the cell keeps: the best
    evaluation's (restored here), else the last one's. The languages that evaluation scored
    keep its numbers; the others are scored once, now, on the same weights."""
    if st.best_state is not None:
        cell.model.load_state_dict(st.best_state)
        scores, undefined, preds = st.best_per_language, st.best_undefined, st.best_predictions
    else:  # no evaluation had a defined score: the last one says why
        scores, undefined, preds = st.last_per_language, st.last_undefined, st.last_predictions
    rest = [lang for lang in cell.enc_val if lang not in scores]
    more, more_undefined = cell.dev_scores(rest) if rest else ({}, {})
    more_preds = cell.last_dev_predictions if rest else {}
    scores, undefined = {**scores, **more}, {**undefined, **more_undefined}
    preds = {**preds, **more_preds}
    order = list(cell.enc_val)
    return (
        {lang: scores[lang] for lang in order},
        {lang: undefined[lang] for lang in order if lang in undefined},
        {lang: preds[lang] for lang in order if lang in preds},
    )


def build_result(cell: ResolvedCell, trained: Trained, scored: CellScores) -> dict:
    """The cell's result dict (schema v2, `results.validate_result`)."""
    cfg, recipe, st = cell.cfg, cell.cfg.recipe, trained.st
    device, train_time = cell.device, trained.train_time
    kind_record, kind_reasons = cell.kind.record(cell.knobs, recipe, cell.enc_train, cell.enc_val)
    off = off_protocol_reasons(recipe, cfg.lr, cfg.seed, cfg.phase) + kind_reasons
    stopped_by = _stopped_by(trained.diverged_at, st.early_stopped, cell.max_steps, recipe)
    first_step_s = trained.first_step_s
    micro_used = st.micro or cell.micro  # the recipe's, unless out of memory halved it
    training = Training(
        steps=st.step,
        max_steps=cell.max_steps,
        best_step=st.best_step,
        epochs=round(st.step / cell.steps_per_epoch, 3),
        epochs_started=st.epoch,
        steps_per_epoch=cell.steps_per_epoch,
        eval_every=cell.every,
        early_stopped=st.early_stopped,
        stopped_by=stopped_by,
        diverged_at_step=trained.diverged_at,
        final_loss=st.last_loss if math.isfinite(st.last_loss) else None,
        train_examples=len(cell.enc_train.labels),
        dev_history=st.history,
        wall_time_s=round(time.perf_counter() - cell.t0, 3),
        train_time_s=round(train_time, 3),
        dev_eval_time_s=round(cell.dev_eval_seconds, 3),
        time_to_first_step_s=None if first_step_s is None else round(first_step_s, 3),
        process_start_to_first_step_s=trained.process_first_step_s,
        train_tokens_per_s=round(st.real_tokens / train_time, 1) if train_time > 0 else None,
        peak_memory_bytes=peak_memory(device),
        peak_memory_scope=cell.peak_scope,
        process_cell=cell.process_cell,
        process_id=os.getpid(),
        warm_unit=warm_unit(),
        oom_retries=st.oom_retries,
        micro_batch_used=micro_used,
        grad_accumulation_used=recipe.batch_size // micro_used,
        eval_oom_retries=cell.eval_oom_retries,
        eval_batch_used=cell.eval_batch_used or cell.eval_batch,
    )
    recorded_recipe = {
        **recipe.to_dict(),
        # What the run derived from the recipe on this device and task (the micro-batch and
        # evaluation batch it started with; `training` says what out of memory left):
        "effective_batch": recipe.batch_size,
        "micro_batch": cell.micro,
        "grad_accumulation": cell.accum,
        "eval_batch": cell.eval_batch,
        "warmup_steps": cell.warmup,
        "optimizer": "AdamW",
        "schedule": "linear warmup, linear decay",
        "pair_format": cell.knobs.pair_format,
        # Which attention kernels ran (sdpa, eager, flash_attention_2): a table never mixes
        # them within one model silently (`comparability.cell_setup`).
        "attn_implementation": attn_implementation(cell.model),
        # The SDPA kernel torch chose for the first training forward (flash, mem_efficient,
        # cudnn, math; eager: no SDPA call; None: compiled, or no step ran), compared as
        # attn_implementation is, and the cuDNN attention variables in force (a CUDA cell
        # sets TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 unless the user set it: `cells/attention.py`).
        "attn_backend": cell.attn_backend[0] if cell.attn_backend else None,
        "attn_environment": cell.attn_environment,
        # torch.compile's mode when `compile` is on (reduce-overhead: CUDA graphs), else None.
        "compile_mode": cell.compile_mode,
        # --graph-step: graphs captured, batch shapes met, and why it fell back to eager
        # steps (null: it did not); None when off.
        "graph_step_run": cell.graph.record() if cell.graph is not None else cell.graph_run,
        **cell.loaded.recorded,  # what the loader derived (decoder-adapted: pair separator, ...)
    }
    return CellResult(
        cell=cfg.cell_id(),
        status=scored.status,
        metric=cell.knobs.metric,
        dev=ScoreSection.from_dict(scored.dev),
        report=ScoreSection.from_dict(scored.report),
        training=training,
        recipe=recorded_recipe,
        protocol=Protocol(on_protocol=not off, off_protocol_reasons=off),
        provenance=cell.prov,
        ranking=kind_record,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    ).to_dict()


def write_cell_result(cfg: CellConfig, kind: Kind, result: dict, predictions: dict) -> None:
    """Write the report predictions (unless turned off), then the result, and only then
    remove what the result supersedes: a predictions or TREC file of an earlier run that
    was not rewritten (so no file beside the result describes another run), and the resume
    state. A write that fails (a full disk) raises with the resume state still in place and
    the files this run wrote beside the result removed, so the cell left nothing behind."""
    if not cfg.out_json:
        return
    pred_path = predictions_path(cfg.out_json)
    rewritten = set()
    if cfg.save_predictions and predictions:
        try:
            preds = predictions_from_cell(result, predictions)
            write_predictions(pred_path, preds)
            rewritten.add(pred_path)
            rewritten.update(kind.write_files(cfg.out_json, preds))
        except PredictionsError as exc:  # e.g. a non-finite regression output: keep the result
            print(f"warning: {cell_label(cfg)}: predictions not written: {exc}", file=sys.stderr)
    try:
        write_json_atomic(cfg.out_json, result)
    except BaseException:  # no result: nothing of this run stays beside it ("nothing written")
        for written in rewritten:
            written.unlink(missing_ok=True)
        raise
    for stale in (pred_path, *beside_result(cfg.out_json).values()):
        if stale not in rewritten:
            stale.unlink(missing_ok=True)
    resume_path = resume_state_path(cfg.out_json)
    if resume_path is not None:
        resume_path.unlink(missing_ok=True)


def _stopped_by(diverged_at: int | None, early_stopped: bool, max_steps: int, recipe) -> str:
    """What ended training: divergence, early stopping, or the step or epoch cap."""
    if diverged_at is not None:
        return "diverged"
    if early_stopped:
        return "early_stop"
    return "step_cap" if max_steps == recipe.max_steps else "epoch_cap"


def final_metrics(result: dict) -> dict[str, float | None]:
    """The scores a tracker shows as the cell's outcome: dev and report means, per language."""
    out: dict[str, float | None] = {}
    for name in ("dev", "report"):
        section = result.get(name) or {}
        out[f"{name}/mean"] = section.get("mean")
        for lang, score in (section.get("per_language") or {}).items():
            out[f"{name}/{lang}"] = score
    out["best_step"] = result["training"]["best_step"]
    out["steps"] = result["training"]["steps"]
    return out
