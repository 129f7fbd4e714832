"""Evaluation during training: at each checkpoint save, that checkpoint's receipt (probe,
synthetic or fine-tune kind, as `encoder-eval track receipt` writes it), the regression report
over every receipt so far, and a warning or a stop when a task regressed beyond its noise.

    from encoder_eval.reports.checkpoint_eval import CheckpointEvalCallback
    from encoder_eval.plans.tracking import build_setup

    setup = build_setup("synthetic", [])            # or "probe" with tasks, ...
    trainer = Trainer(..., callbacks=[CheckpointEvalCallback(setup, "runs/track",
                                                             on_regression="stop")])

`evaluate_saved_checkpoint` is the same step for a custom training loop: call it after each
save with the folder and the step. The receipts, `regression.json` and `regression.md` are
those of `track`, so `encoder-eval track report --out-dir D` reads the same folder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.receipt import Receipt, TrackSetup, load_receipts
from encoder_eval.plans.tracking import Checkpoint, evaluate_checkpoint
from encoder_eval.reports.tracking import (
    DEFAULT_HORIZON,
    DEFAULT_NOISE_ALPHA,
    DEFAULT_THRESHOLD,
    DEFAULT_ZERO_FLOOR,
    REFERENCES,
    Check,
    RegressionReport,
    write_report,
)

ON_REGRESSION = ("warn", "stop")
logger = logging.getLogger(__name__)


@dataclass
class CheckpointOutcome:
    """What one evaluated save gives: its receipt, the regression report over every receipt
    so far (None before the second), and the checks that flagged this checkpoint."""

    receipt: Receipt
    report: RegressionReport | None
    regressed: list[Check] = field(default_factory=list)

    @property
    def should_stop(self) -> bool:
        """True when a task of this checkpoint regressed beyond its noise."""
        return bool(self.regressed)


def evaluate_saved_checkpoint(
    checkpoint_dir: str | os.PathLike,
    setup: TrackSetup,
    out_dir: str | os.PathLike,
    *,
    step: int,
    metadata: dict | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    reference: str = "best",
    noise_alpha: float = DEFAULT_NOISE_ALPHA,
    horizon: int = DEFAULT_HORIZON,
    zero_floor: float = DEFAULT_ZERO_FLOOR,
    plots: bool = False,
    data_dir: str | None = None,
    device: str | None = None,
    log: Callable[[str], None] = logger.info,
) -> CheckpointOutcome:
    """Write the receipt of the checkpoint saved in `checkpoint_dir` at training step `step`
    (its id is the folder's name, its position the step), then rewrite the regression report
    of `out_dir`. For custom loops; the Trainer callback calls it at each save."""
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise HarnessError(f"checkpoint {path} is not a folder; evaluate it after it is saved")
    ckpt = Checkpoint(path.name, str(path.resolve()), int(step), {"step": int(step)})
    receipt = evaluate_checkpoint(
        setup, ckpt, out_dir, metadata=metadata, data_dir=data_dir, device=device, log=log
    )
    receipts = load_receipts(out_dir, warn=logger.warning)
    if len(receipts) < 2:
        return CheckpointOutcome(receipt, None)
    report, _ = write_report(
        receipts,
        out_dir,
        threshold=threshold,
        reference=reference,
        noise_alpha=noise_alpha,
        horizon=horizon,
        zero_floor=zero_floor,
        plots=plots,
    )
    mine = [f for f in report.flags if f.checkpoint_id == receipt.checkpoint_id]
    return CheckpointOutcome(receipt, report, mine)


class CheckpointEvalCallback(TrainerCallback):
    """A `transformers.TrainerCallback` that evaluates each saved checkpoint (see
    `evaluate_saved_checkpoint`) and, when a task regressed beyond its noise, logs a warning
    (`on_regression="warn"`) or also stops the run (`"stop"`)."""

    def __init__(
        self,
        setup: TrackSetup,
        out_dir: str | os.PathLike,
        *,
        on_regression: str = "warn",
        threshold: float = DEFAULT_THRESHOLD,
        reference: str = "best",
        noise_alpha: float = DEFAULT_NOISE_ALPHA,
        horizon: int = DEFAULT_HORIZON,
        zero_floor: float = DEFAULT_ZERO_FLOOR,
        plots: bool = False,
        data_dir: str | None = None,
        device: str | None = None,
    ) -> None:
        if on_regression not in ON_REGRESSION:
            raise unknown_name("on_regression", on_regression, ON_REGRESSION)
        if reference not in REFERENCES:
            raise unknown_name("reference", reference, REFERENCES)
        self.setup, self.out_dir, self.on_regression = setup, out_dir, on_regression
        self.rule = dict(
            threshold=threshold,
            reference=reference,
            noise_alpha=noise_alpha,
            horizon=horizon,
            zero_floor=zero_floor,
            plots=plots,
        )
        self.data_dir, self.device = data_dir, device
        self.outcomes: list[CheckpointOutcome] = []

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> TrainerControl:
        """Evaluate the checkpoint just saved; on a regression warn, and stop if asked."""
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not state.is_world_process_zero:
            return control
        if not folder.is_dir():
            logger.warning(f"checkpoint evaluation: {folder} was not saved; not evaluated")
            return control
        meta = {"epoch": state.epoch} if state.epoch is not None else {}
        outcome = evaluate_saved_checkpoint(
            folder,
            self.setup,
            self.out_dir,
            step=state.global_step,
            metadata=meta,
            data_dir=self.data_dir,
            device=self.device,
            **self.rule,
        )
        self.outcomes.append(outcome)
        if outcome.regressed:
            what = "; ".join(
                f"{c.task} {c.current_score:.4g} vs {c.reference_score:.4g} at "
                f"{c.reference_checkpoint_id}"
                for c in outcome.regressed
            )
            stop = self.on_regression == "stop"
            logger.warning(
                f"checkpoint {outcome.receipt.checkpoint_id} regressed beyond its noise: "
                f"{what} (report: {Path(self.out_dir) / 'regression.md'})"
                + ("; stopping the run" if stop else "")
            )
            if stop:
                control.should_training_stop = True
        return control
