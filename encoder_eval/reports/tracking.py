"""Checkpoint tracking, the library behind `encoder-eval track` and the training callback
(`reports.checkpoint_eval`): one receipt per checkpoint, then a noise-aware regression
report over the ordered sequence.

A receipt (`<out-dir>/receipts/<id>.receipt.json`, schema `encoder-eval-receipt`) is built
from ordinary harness cells in `<out-dir>/results`: probe cells (`encoder_eval.probe`, one
pooling, the folds as noise) or report-phase fine-tune cells at one fixed learning rate (given,
or read from a selection file) over N seeds. The cells run through the same plan as `sweep`,
so a receipt is idempotent: done cells are not run again, and an existing receipt of the same
checkpoint (same weights) and setup is kept.

`track_regression` compares each checkpoint with a reference, `best` (the best earlier
score: catches slow drift) or `prior` (the previous checkpoint: catches step drops),
direction-aware. A drop is flagged when it exceeds `threshold` relative to the reference
and, unless `noise_alpha` is 0, a one-sided Welch t bound: drop > t_{1-level}(Welch df) ·
SE, SE the standard error of the difference of the two means (seed or fold spread of both
checkpoints). The level spreads `noise_alpha` over the sequence so that, per task, the
chance of any false flag over a sequence of up to `horizon` checkpoints with no true change
is at most `noise_alpha`: level = noise_alpha / (H - 1), H = max(horizon, checkpoints), and
under `best` divided again by the number of earlier checkpoints the best is the maximum of
(a Bonferroni bound: a drop below the maximum is a drop below one of them). A reference
within `zero_floor` of zero is measured against `zero_floor` instead of its own magnitude:
an absolute threshold.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.fileio import write_json_atomic, write_output
from encoder_eval.core.receipt import SCHEMA_VERSION, Receipt, TaskResult, TrackSetup
from encoder_eval.reports.plots import new_figure, save_png

REPORT_SCHEMA = "encoder-eval-regression"
REFERENCES = ("best", "prior")
DEFAULT_THRESHOLD = 0.05  # the seed's relative threshold
DEFAULT_NOISE_ALPHA = 0.05  # per task: any false flag over the horizon, at most this
DEFAULT_HORIZON = 10  # checkpoints the noise level is spread over (more when there are more)
DEFAULT_ZERO_FLOOR = 0.1  # metric units: below it a reference's magnitude is replaced by this


# ----------------------------------------------------------------------------- regression


@dataclass(frozen=True)
class Check:
    """One (task, checkpoint) compared with its reference. `status`: flagged, within_noise
    (past the threshold but not the noise), within_threshold, or not_worse. `relative_delta`
    is (current - reference) / max(|reference|, zero_floor), signed; `rule` says whether the
    reference's magnitude (relative) or the floor (absolute) divided."""

    task: str
    checkpoint_id: str
    checkpoint_index: int
    current_score: float
    reference_score: float
    reference_checkpoint_id: str
    reference_index: int
    relative_delta: float
    threshold: float
    higher_is_better: bool
    rule: str
    drop: float  # how much worse, in metric units (negative: better)
    noise: float | None  # standard error of the difference of the two means
    level: float | None  # the one-sided level of this check's noise bound (None: rule off)
    df: float | None  # Welch-Satterthwaite degrees of freedom of `noise`
    critical: float | None  # t quantile at 1 - level on df: a flag needs drop > critical x noise
    status: str

    @property
    def flagged(self) -> bool:
        return self.status == "flagged"


# A flag is a Check whose status is "flagged"; the seed's name is kept for readers of its API.
RegressionFlag = Check


@dataclass
class RegressionReport:
    """The regression receipt of a sequence: every check, and the flagged ones."""

    checks: list[Check]
    n_checkpoints: int
    threshold: float
    reference: str
    noise_alpha: float
    horizon: int
    zero_floor: float
    checkpoints: list[str] = field(default_factory=list)
    setup: dict = field(default_factory=dict)

    @property
    def flags(self) -> list[Check]:
        return [c for c in self.checks if c.flagged]

    def to_dict(self) -> dict:
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "n_checkpoints": self.n_checkpoints,
            "checkpoints": self.checkpoints,
            "threshold": self.threshold,
            "reference": self.reference,
            "noise_alpha": self.noise_alpha,
            "horizon": self.horizon,
            "zero_floor": self.zero_floor,
            "setup": self.setup,
            "flags": [asdict(c) for c in self.flags],
            "checks": [asdict(c) for c in self.checks],
        }


def _noise(a: TaskResult, b: TaskResult) -> tuple[float, float] | None:
    """(standard error of the difference of the two means, its Welch-Satterthwaite df), or
    None when a side has no spread measured (one seed)."""
    parts = []
    for t in (a, b):
        std, n = t.details.get("std"), t.details.get("n") or 0
        if std is None or n < 2:
            return None
        parts.append((std * std / n, n - 1))
    var = sum(u for u, _ in parts)
    denom = sum(u * u / df for u, df in parts)
    return math.sqrt(var), (math.inf if denom == 0 else var * var / denom)


def _critical(level: float, df: float) -> float:
    """The one-sided t quantile at 1 - level on df degrees of freedom (normal for infinite)."""
    from scipy import stats as sps

    return float(sps.norm.isf(level) if math.isinf(df) else sps.t.isf(level, df))


def track_regression(
    receipts: Sequence[Receipt],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    reference: str = "best",
    noise_alpha: float = DEFAULT_NOISE_ALPHA,
    horizon: int = DEFAULT_HORIZON,
    zero_floor: float = DEFAULT_ZERO_FLOOR,
) -> RegressionReport:
    """Compare every checkpoint after the first with its reference on each task (see the
    module docstring for the rule). With no noise measured (one seed), only the threshold
    decides, the check's `noise` is None, and the false-flag bound does not hold."""
    if reference not in REFERENCES:
        raise unknown_name("reference", reference, REFERENCES)
    if threshold < 0 or zero_floor < 0 or not 0 <= noise_alpha < 1:
        raise HarnessError("--threshold and --zero-floor must be >= 0, --noise-alpha in [0, 1)")
    if horizon < 2:
        raise HarnessError(f"--horizon {horizon}: a sequence to check has 2 checkpoints or more")
    checks: list[Check] = []
    tasks = list(dict.fromkeys(t.name for r in receipts for t in r.tasks))
    for task in tasks:
        present = sum(r.task(task) is not None for r in receipts)
        per_check = noise_alpha / (max(horizon, present) - 1)
        seen: list[tuple[Receipt, TaskResult]] = []
        for r in receipts:
            cur = r.task(task)
            if cur is None:
                continue
            if seen:
                direction = cur.sign
                if reference == "prior":
                    ref_r, ref = seen[-1]
                else:
                    ref_r, ref = seen[0]
                    for cand_r, cand in seen[1:]:
                        if direction * cand.score > direction * ref.score:
                            ref_r, ref = cand_r, cand
                drop = direction * (ref.score - cur.score)
                absolute = abs(ref.score) < zero_floor
                denom = zero_floor if absolute else abs(ref.score)
                measured = _noise(cur, ref)
                noise, df = (None, None) if measured is None else measured
                level = critical = None
                if noise_alpha > 0 and noise is not None:
                    level = per_check / (len(seen) if reference == "best" else 1)
                    critical = _critical(level, df)
                if denom == 0 or drop / denom <= threshold:
                    status = "not_worse" if drop <= 0 else "within_threshold"
                elif critical is not None and drop <= critical * noise:
                    status = "within_noise"
                else:
                    status = "flagged"
                checks.append(
                    Check(
                        task,
                        r.checkpoint_id,
                        r.checkpoint_index,
                        cur.score,
                        ref.score,
                        ref_r.checkpoint_id,
                        ref_r.checkpoint_index,
                        (cur.score - ref.score) / denom if denom else 0.0,
                        threshold,
                        direction > 0,
                        "absolute" if absolute else "relative",
                        drop,
                        noise,
                        level,
                        df,
                        critical,
                        status,
                    )
                )
            seen.append((r, cur))
    return RegressionReport(
        checks,
        len(receipts),
        threshold,
        reference,
        noise_alpha,
        horizon,
        zero_floor,
        [r.checkpoint_id for r in receipts],
        receipts[0].setup if receipts else {},
    )


def check_comparable(receipts: Sequence[Receipt]) -> None:
    """Refuse receipts made under different setups: their scores do not compare."""
    groups: dict[str, list[str]] = {}
    for r in receipts:
        key = json.dumps(TrackSetup.from_dict(r.setup).comparable(), sort_keys=True)
        groups.setdefault(key, []).append(r.checkpoint_id)
    if len(groups) > 1:
        parts = [f"{', '.join(ids)}: {key}" for key, ids in groups.items()]
        raise HarnessError(
            "the receipts were made under different setups; track each setup "
            "in its own --out-dir: " + " | ".join(parts)
        )


# ----------------------------------------------------------------------------- outputs


def _pts(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def format_markdown(report: RegressionReport, receipts: Sequence[Receipt]) -> str:
    """The report as markdown: the rule, then per task every checkpoint with its score,
    reference, relative change, noise and verdict. Scores are in points (x100)."""
    s = report.setup
    how = (
        f"probe ({s.get('pooling')} pooling, {s.get('k_folds')} folds, seed {s.get('seed')})"
        if s.get("kind") == "probe"
        else f"fine-tune at {s.get('lr_key')} ({s.get('lr_source')}), seeds "
        f"{','.join(map(str, s.get('seeds') or []))}"
    )
    a = report.noise_alpha
    noise_rule = (
        f" and a one-sided Welch t bound on the seed/fold spread: drop > t_(1-level) x SE, the "
        f"level spreading {a:g} over the sequence so that per task the chance of any false "
        f"flag over up to {report.horizon} checkpoints (or all of them, when there are more) "
        "with no true change is at most "
        f"{a:g}"
        + (
            ", the best earlier score counted as the maximum it is."
            if report.reference == "best"
            else "."
        )
        if a
        else " (noise rule off: --noise-alpha 0)."
    )
    lines = [
        f"# Regression report: {report.n_checkpoints} checkpoints, {len(report.flags)} flag(s)",
        "",
        f"Evaluation: {how}. Reference: **{report.reference}**"
        f" ({'best earlier score' if report.reference == 'best' else 'previous checkpoint'}). "
        f"A drop is flagged when it exceeds {100 * report.threshold:g} % of the reference "
        f"(of {report.zero_floor:g} when the reference is closer to zero: absolute)"
        + noise_rule
        + " A check without a measured spread (one seed) has the threshold alone.",
        "",
    ]
    by_key = {(c.task, c.checkpoint_id): c for c in report.checks}
    tasks = list(dict.fromkeys(t.name for r in receipts for t in r.tasks))
    for task in tasks:
        lines += [
            f"## {task}",
            "",
            "| # | checkpoint | score ± std (n) | reference | Δ rel | "
            "drop / noise (needed) | verdict |",
            "|---:|---|---:|---|---:|---:|---|",
        ]
        for r in receipts:
            t = r.task(task)
            if t is None:
                continue
            c = by_key.get((task, r.checkpoint_id))
            std, n = t.details.get("std"), t.details.get("n")
            score = f"{_pts(t.score)} ± {_pts(std)} ({n})"
            if c is None:
                lines.append(
                    f"| {r.checkpoint_index} | {r.checkpoint_id} | {score} | — | — | — | first |"
                )
                continue
            ratio = "—" if not c.noise else f"{c.drop / c.noise:.2f}"
            if c.critical is not None and c.noise:
                ratio += f" ({c.critical:.2f})"
            verdict = "**REGRESSED**" if c.flagged else c.status.replace("_", " ")
            lines.append(
                f"| {r.checkpoint_index} | {r.checkpoint_id} | {score} | "
                f"{c.reference_checkpoint_id} ({_pts(c.reference_score)}) | "
                f"{100 * c.relative_delta:+.2f} %{' abs' if c.rule == 'absolute' else ''} | "
                f"{ratio} | {verdict} |"
            )
        lines.append("")
    if report.flags:
        lines.append(
            "Flags: "
            + "; ".join(
                f"{f.task} at {f.checkpoint_id} ({_pts(f.current_score)} vs "
                f"{f.reference_checkpoint_id} {_pts(f.reference_score)})"
                for f in report.flags
            )
        )
    else:
        lines.append("No regression flagged.")
    return "\n".join(lines) + "\n"


def plot_tracks(
    report: RegressionReport, receipts: Sequence[Receipt], out_dir: str | os.PathLike
) -> list[Path]:
    """One PNG per task: score against checkpoint, a band of ± one seed/fold std, and the
    flagged checkpoints marked."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flagged = {(f.task, f.checkpoint_id) for f in report.flags}
    paths = []
    tasks = list(dict.fromkeys(t.name for r in receipts for t in r.tasks))
    for task in tasks:
        pts = [(r, r.task(task)) for r in receipts if r.task(task) is not None]
        xs = [r.checkpoint_index for r, _ in pts]
        ys = [100 * t.score for _, t in pts]
        sd = [100 * (t.details.get("std") or 0.0) for _, t in pts]
        fig = new_figure(max(4.0, 0.9 * len(xs) + 2), 3.2)
        ax = fig.add_subplot(1, 1, 1)
        ax.fill_between(
            xs,
            [y - s for y, s in zip(ys, sd, strict=True)],
            [y + s for y, s in zip(ys, sd, strict=True)],
            alpha=0.25,
            label="± 1 std",
        )
        ax.plot(xs, ys, marker="o", label="score")
        bad = [
            (x, y)
            for (r, _), x, y in zip(pts, xs, ys, strict=True)
            if (task, r.checkpoint_id) in flagged
        ]
        if bad:
            ax.scatter(
                [b[0] for b in bad],
                [b[1] for b in bad],
                s=120,
                marker="x",
                color="red",
                zorder=3,
                label="regressed",
            )
        ax.set_xticks(xs, [r.checkpoint_id for r, _ in pts], rotation=30, ha="right")
        metric = pts[0][1].details.get("metric", "score")
        ax.set_ylabel(f"{metric} (x100)")
        ax.set_title(f"{task}: reference {report.reference}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"track_{task}.png"
        save_png(fig, path)
        paths.append(path)
    return paths


def write_report(
    receipts: Sequence[Receipt],
    out_dir: str | os.PathLike,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    reference: str = "best",
    noise_alpha: float = DEFAULT_NOISE_ALPHA,
    horizon: int = DEFAULT_HORIZON,
    zero_floor: float = DEFAULT_ZERO_FLOOR,
    plots: bool = True,
) -> tuple[RegressionReport, str]:
    """Track, then write `regression.json`, `regression.md` and the plots into `out_dir`."""
    if len(receipts) < 2:
        raise HarnessError(
            f"{len(receipts)} receipt(s) in {out_dir}; tracking needs two or more checkpoints"
        )
    check_comparable(receipts)
    report = track_regression(
        receipts,
        threshold=threshold,
        reference=reference,
        noise_alpha=noise_alpha,
        horizon=horizon,
        zero_floor=zero_floor,
    )
    text = format_markdown(report, receipts)
    out = Path(out_dir)
    write_json_atomic(out / "regression.json", report.to_dict())
    write_output(text, out / "regression.md")
    if plots:
        plot_tracks(report, receipts, out / "plots")
    return report, text
