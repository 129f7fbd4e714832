"""Linear probing of frozen embeddings: the fold protocol, the Q statistic, stored probes.

The seam to an encoder is `ProbeTask`: embeddings given as arrays (one row per example, in
the order of the task's split), labels beside them. `task_from_registry` builds one for a
registered task from arrays made by an extractor, `encoder_eval.reports.neuco` from NeuCo-Bench's
files; `probe_task` runs the protocol (EVALUATION_METHODOLOGY.md, "12. Probing"):

* `k_folds` repeated shuffle-splits of the train rows (`ShuffleSplit`, seed `seed`), each
  holding out `VALIDATION_FRACTION` of them to choose the regularisation strength from a
  fixed grid (`C_GRID` for logistic regression, `ALPHA_GRID` for ridge);
* standardisation fitted on each fold's fitting rows only;
* the chosen probe of each fold scored on the report split with the task's own metric
  (per language, headline as in fine-tuning) and the secondary metric (macro F1 or R²);
  without a report split (NeuCo mode) the fold's held-out rows are the evaluation and
  the strength is chosen on a further held-out tenth of the fold's fitting rows;
* mean and std over folds (ddof 1; ddof 0, NeuCo-Bench's np.nanstd, in NeuCo mode:
  `ProbeConfig.std_ddof`), and Q = 2 * mean / (Q_OFFSET + std).

With an `SvmSearch` (`encoder_eval.cells.svm_probe`, NeuCo-Bench's `probe_type: svm`), a
seeded Bayesian search over a polynomial-kernel SVM's hyperparameters takes the grid's
place in each fold, on the same rows.

NeuCo-Bench's unsound rules (`NEUCO_RULES`) are available behind `ProbeConfig.neuco_rules`;
a result computed under any of them says so and is off protocol. Stored probes are JSON
data (`save_probe` / `load_probe`), never pickles or generated code.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from encoder_eval.cells.svm_probe import SvmProbe, SvmSearch, bayes_search, fit_svm
from encoder_eval.core import cpu
from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.fileio import FileProblem, MissingFile, read_json, write_json_atomic
from encoder_eval.core.metrics import compute_metric, language_mean
from encoder_eval.core.problems import REGRESSION as TASK_REGRESSION
from encoder_eval.core.provenance import cpu_model, software_versions
from encoder_eval.data.task_loading import load_task
from encoder_eval.data.tasks import task_knobs

PROBE_SCHEMA = "encoder-eval-probe"
PROBE_SUMMARY_SCHEMA = "encoder-eval-probe-summary"
STORED_PROBE_SCHEMA = "encoder-eval-stored-probe"
PROBE_SCHEMA_VERSION = 1

CLASSIFICATION = "classification"
REGRESSION = "regression"
TASK_TYPES = (CLASSIFICATION, REGRESSION)
# The regularisation grids, strongest first (a tie on validation keeps the stronger one).
C_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # LogisticRegression C = 1 / strength
ALPHA_GRID = (1e3, 1e2, 1e1, 1.0, 1e-1, 1e-2)  # Ridge alpha = strength
VALIDATION_FRACTION = 0.1
# The embeddings' forward pass (`embed`): bf16 autocast or fp32. Here, not in torch-bound
# `embed`, so that `probe --help` builds its parser without importing torch.
PRECISIONS = ("bf16", "fp32")
Q_OFFSET = 0.02
DEFAULT_SEED = 42
DEFAULT_K_FOLDS = 10
LOGREG_MAX_ITER = 2000
# The probes are small (a few hundred dimensions): one BLAS thread fitted the 6-value grid of
# an Amazon-reviews fold (4,600 x 384, 5 classes) in 1.9 s against 9.7 s with two threads on
# this project's 2-core machine while other jobs ran; threads there only spin.
PROBE_BLAS_THREADS = 1
R2 = "r2"  # the regression secondary metric (sklearn r2_score); not a fine-tuning metric
SECONDARY_METRIC = {CLASSIFICATION: "macro_f1", REGRESSION: R2}

# NeuCo-Bench's documented rules we consider unsound, each behind a flag that marks results.
NEUCO_RULES: dict[str, str] = {
    "best_fold_score": (
        "each fold scores its best validation metric on the rows that chose it (optimistic)"
    ),
    "global_standardization": (
        "embeddings standardised by one mean and std over every value of every row, held-out "
        "and report rows included (leaks them into the fit)"
    ),
    "drop_incomplete_runs": (
        "the leaderboard silently drops a run that misses a task instead of refusing"
    ),
}


@dataclass(frozen=True)
class ProbeTask:
    """One task's embeddings and labels: the extraction seam.

    `train_x` is (n, d) float, `train_y` (n,) labels (class ids or any hashable class values
    for classification, floats for regression). `report_x`/`report_y` map a language to its
    report-split rows; None (NeuCo mode) makes each fold's held-out rows the evaluation.
    `metric` is the task's own metric (`encoder_eval.core.metrics` name, or "r2");
    `euro_languages` decide the headline as in fine-tuning (`metrics.language_mean`).
    `global_rows` are the rows NeuCo-Bench's global statistics cover (its rule
    global_standardization); None: the train and report rows."""

    name: str
    task_type: str
    metric: str
    train_x: np.ndarray
    train_y: np.ndarray
    report_x: dict[str, np.ndarray] | None = None
    report_y: dict[str, np.ndarray] | None = None
    euro_languages: tuple[str, ...] = ("en",)
    global_rows: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise unknown_name("task type", self.task_type, TASK_TYPES)
        x = np.asarray(self.train_x)
        if x.ndim != 2 or x.shape[0] != len(self.train_y):
            raise HarnessError(
                f"task {self.name!r}: train embeddings of shape {x.shape} for "
                f"{len(self.train_y)} labels; give one row per example, (n, dim)"
            )
        if not np.all(np.isfinite(x)):
            raise HarnessError(f"task {self.name!r}: train embeddings hold NaN or infinity")
        if self.task_type == REGRESSION and not np.all(
            np.isfinite(np.asarray(self.train_y, float))
        ):
            raise HarnessError(f"task {self.name!r}: regression targets hold NaN or infinity")
        if (self.report_x is None) != (self.report_y is None):
            raise HarnessError(f"task {self.name!r}: give report embeddings and labels together")
        for lang, rx in (self.report_x or {}).items():
            rx = np.asarray(rx)
            if lang not in self.report_y:
                raise unknown_name("report language", lang, self.report_y)
            if rx.ndim != 2 or rx.shape != (len(self.report_y[lang]), x.shape[1]):
                raise HarnessError(
                    f"task {self.name!r}: report embeddings ({lang}) of shape {rx.shape} for "
                    f"{len(self.report_y[lang])} labels and dim {x.shape[1]}"
                )
            if not np.all(np.isfinite(rx)):
                raise HarnessError(f"task {self.name!r}: report embeddings ({lang}) hold NaN")


@dataclass(frozen=True)
class ProbeConfig:
    """How to probe: folds, seed, preprocessing, and the NeuCo rules in force (if any)."""

    k_folds: int = DEFAULT_K_FOLDS
    seed: int = DEFAULT_SEED
    standardize: bool = True
    normalize_labels: bool = False
    neuco_rules: tuple[str, ...] = ()
    # The fold std's ddof, in the std and in Q: 1 here (the folds are a sample), 0 in NeuCo
    # mode, which follows NeuCo-Bench's np.nanstd so that its Q is NeuCo-Bench's.
    std_ddof: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.k_folds, int) or self.k_folds < 2:
            raise HarnessError(
                f"k_folds must be an integer of 2 or more (a std needs two folds), "
                f"not {self.k_folds!r}"
            )
        for rule in self.neuco_rules:
            if rule not in NEUCO_RULES:
                raise unknown_name("NeuCo rule", rule, NEUCO_RULES)

    @property
    def on_protocol(self) -> bool:
        return not self.neuco_rules

    def to_dict(self) -> dict:
        return {
            "k_folds": self.k_folds,
            "seed": self.seed,
            "validation_fraction": VALIDATION_FRACTION,
            "standardize": self.standardize,
            "std_ddof": self.std_ddof,
            "normalize_labels": self.normalize_labels,
            "neuco_rules": sorted(self.neuco_rules),
        }


# ----------------------------------------------------------------------------- the predictor


@dataclass
class Probe:
    """A fitted linear probe as plain arrays, sklearn-free: x -> (x - shift) / scale ->
    x @ coef.T + intercept -> class (argmax, or sign for two classes) or value."""

    task_type: str
    coef: np.ndarray  # (k, d): k = 1 for regression and for two classes
    intercept: np.ndarray  # (k,)
    shift: np.ndarray  # (d,) or a scalar array: standardisation mean (0 when none)
    scale: np.ndarray  # (d,) or a scalar array: standardisation std (1 when none)
    classes: list = field(default_factory=list)  # class value of each output, sorted
    label_offset: float = 0.0  # regression: prediction * label_range + label_offset
    label_range: float = 1.0
    hyperparameters: dict = field(default_factory=dict)

    def decision(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, dtype=np.float64) - self.shift) / self.scale
        return z @ self.coef.T + self.intercept

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted class values (classification) or targets (regression) of rows `x`."""
        scores = self.decision(x)
        if self.task_type == REGRESSION:
            return scores[:, 0] * self.label_range + self.label_offset
        classes = np.asarray(self.classes)
        if len(self.classes) == 2:
            return classes[(scores[:, 0] > 0).astype(int)]
        return classes[np.argmax(scores, axis=1)]

    def to_dict(self) -> dict:
        return {
            "schema": STORED_PROBE_SCHEMA,
            "schema_version": PROBE_SCHEMA_VERSION,
            "task_type": self.task_type,
            "coef": self.coef.tolist(),
            "intercept": self.intercept.tolist(),
            "shift": self.shift.tolist(),
            "scale": self.scale.tolist(),
            "classes": [_json_value(c) for c in self.classes],
            "label_offset": self.label_offset,
            "label_range": self.label_range,
            "hyperparameters": self.hyperparameters,
        }


def _json_value(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


PROBE_FILE = "probe.json"


def save_probe(folder: str | os.PathLike, probe: Probe | SvmProbe) -> Path:
    """Write `probe` (linear or SVM) as `<folder>/probe.json` (data only, atomically);
    returns the path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "schema": STORED_PROBE_SCHEMA,
        "schema_version": PROBE_SCHEMA_VERSION,
        **probe.to_dict(),
    }
    write_json_atomic(folder / PROBE_FILE, data)
    return folder / PROBE_FILE


def load_probe(folder: str | os.PathLike) -> tuple[Probe | SvmProbe, str]:
    """The stored probe of `folder` (linear or SVM) and its task type: `(probe, task_type)`,
    as NeuCo-Bench's `load_probe` returns, read from JSON data (no pickle, no code)."""
    path = Path(folder) / PROBE_FILE
    try:
        obj = read_json(path)
    except MissingFile:
        raise HarnessError(f"no stored probe at {path}; run with store_probes: true") from None
    except FileProblem as exc:
        raise HarnessError(f"{exc}; store the probe again") from None
    if (
        not isinstance(obj, dict)
        or obj.get("schema") != STORED_PROBE_SCHEMA
        or obj.get("schema_version") != PROBE_SCHEMA_VERSION
    ):
        raise HarnessError(
            f"{path} is not a stored probe of schema {STORED_PROBE_SCHEMA!r} "
            f"version {PROBE_SCHEMA_VERSION}; store the probe again with this harness"
        )
    if obj["task_type"] not in TASK_TYPES:
        raise unknown_name("task type", obj["task_type"], TASK_TYPES)
    if obj.get("probe_type") == "svm":
        svm = SvmProbe.from_dict(obj, str(path))
        return svm, svm.task_type
    probe = Probe(
        task_type=obj["task_type"],
        coef=np.asarray(obj["coef"], dtype=np.float64),
        intercept=np.asarray(obj["intercept"], dtype=np.float64),
        shift=np.asarray(obj["shift"], dtype=np.float64),
        scale=np.asarray(obj["scale"], dtype=np.float64),
        classes=list(obj["classes"]),
        label_offset=float(obj["label_offset"]),
        label_range=float(obj["label_range"]),
        hyperparameters=dict(obj["hyperparameters"]),
    )
    k, d = probe.coef.shape if probe.coef.ndim == 2 else (0, 0)
    outputs = 1 if probe.task_type == REGRESSION or len(probe.classes) == 2 else len(probe.classes)
    if k != outputs or probe.intercept.shape != (k,) or probe.shift.shape not in ((), (d,)):
        raise HarnessError(
            f"{path}: coefficient shape {probe.coef.shape}, intercept {probe.intercept.shape}, "
            f"{len(probe.classes)} classes and shift {probe.shift.shape} do not fit together; "
            "store the probe again"
        )
    return probe, probe.task_type


# ----------------------------------------------------------------------------- fitting


def grid(task_type: str) -> tuple[str, tuple[float, ...]]:
    """The regularisation parameter's name and its fixed grid, strongest first."""
    return ("C", C_GRID) if task_type == CLASSIFICATION else ("alpha", ALPHA_GRID)


def global_standardization(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """NeuCo-Bench's global statistics: one mean and one std over every value of every
    array given (std 1 when it is 0)."""
    values = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    mu, sigma = float(values.mean()), float(values.std())
    return np.asarray(mu), np.asarray(sigma if sigma != 0 else 1.0)


def _global_statistics(task: ProbeTask) -> tuple[np.ndarray, np.ndarray]:
    if task.global_rows is not None:
        return global_standardization([task.global_rows])
    return global_standardization([task.train_x, *(task.report_x or {}).values()])


def _standardization(
    x: np.ndarray, standardize: bool, fixed: tuple[np.ndarray, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) of rows `x`: the `fixed` statistics given, a per-dimension mean and
    std of these rows (std 1 for a constant dimension), or none (0 and 1)."""
    if fixed is not None:
        return fixed
    if standardize:
        scale = x.std(axis=0)
        return x.mean(axis=0), np.where(scale == 0, 1.0, scale)  # StandardScaler's rule
    return np.zeros(x.shape[1]), np.ones(x.shape[1])


def _label_scaling(y: np.ndarray, normalize_labels: bool) -> tuple[float, float]:
    """(offset, span) of regression targets: min-max from these rows with
    `normalize_labels` (R² and Spearman do not change under it), else (0, 1)."""
    if not normalize_labels:
        return 0.0, 1.0
    return float(y.min()), float(y.max() - y.min()) or 1.0


def fit_probe(
    task_type: str,
    x: np.ndarray,
    y: np.ndarray,
    strength: float,
    standardize: bool,
    normalize_labels: bool,
    fixed_standardization: tuple[np.ndarray, np.ndarray] | None = None,
) -> Probe:
    """Fit one probe on rows (x, y): a StandardScaler fitted on these rows only (or the
    `fixed_standardization` given, or none), then logistic regression (C = `strength`) or
    ridge (alpha = `strength`) from scikit-learn, returned as a `Probe`."""
    from sklearn.linear_model import LogisticRegression, Ridge

    x = np.asarray(x, dtype=np.float64)
    shift, scale = _standardization(x, standardize, fixed_standardization)
    z = (x - shift) / scale
    name = grid(task_type)[0]
    if task_type == CLASSIFICATION:
        model = LogisticRegression(C=strength, max_iter=LOGREG_MAX_ITER)
        model.fit(z, y)
        return Probe(
            task_type,
            model.coef_.astype(np.float64),
            model.intercept_.astype(np.float64),
            np.asarray(shift),
            np.asarray(scale),
            classes=list(model.classes_),
            hyperparameters={name: strength},
        )
    y = np.asarray(y, dtype=np.float64)
    offset, span = _label_scaling(y, normalize_labels)
    model = Ridge(alpha=strength, solver="cholesky")
    model.fit(z, (y - offset) / span)
    return Probe(
        task_type,
        np.atleast_2d(model.coef_).astype(np.float64),
        np.atleast_1d(model.intercept_).astype(np.float64),
        np.asarray(shift),
        np.asarray(scale),
        label_offset=offset,
        label_range=span,
        hyperparameters={name: strength},
    )


def score(metric: str, preds: np.ndarray, labels: np.ndarray) -> float | None:
    """`metric` on (preds, labels): "r2" with scikit-learn (None for constant labels), else
    the harness metric (`metrics.compute_metric`, None where undefined)."""
    if metric == R2:
        from sklearn.metrics import r2_score

        labels = np.asarray(labels, dtype=np.float64)
        if len(labels) < 2 or np.unique(labels).size < 2:
            return None
        return float(r2_score(labels, preds))
    return compute_metric(metric, list(preds), list(labels))


def _headline(
    probe: Probe, metric: str, xs: dict[str, np.ndarray], ys: dict[str, np.ndarray], euro
) -> tuple[float | None, dict[str, float | None]]:
    per_lang = {lang: score(metric, probe.predict(xs[lang]), ys[lang]) for lang in xs}
    return language_mean(per_lang, euro)[0], per_lang


def q_statistic(fold_scores: list[float], ddof: int = 1) -> tuple[float, float, float]:
    """(mean, std with `ddof`, Q = 2 * mean / (Q_OFFSET + std)) of per-fold scores; ddof 0
    is NeuCo-Bench's (np.nanstd), 1 the sample std."""
    values = np.asarray(fold_scores, dtype=np.float64)
    mean, std = float(values.mean()), float(values.std(ddof=ddof))
    return mean, std, 2.0 * mean / (Q_OFFSET + std)


def _splits(n: int, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import ShuffleSplit

    if n < 20:
        raise HarnessError(
            f"{n} rows are too few to hold out {VALIDATION_FRACTION:.0%} per fold; give 20 or more"
        )
    return list(
        ShuffleSplit(k, test_size=VALIDATION_FRACTION, random_state=seed).split(np.zeros(n))
    )


def _choose(task: ProbeTask, config: ProbeConfig, x, y, fit_idx, val_idx, fixed) -> tuple:
    """Fit one probe per grid value on `fit_idx`, return (probe, validation score) of the
    best on `val_idx` (undefined scores lose; ties keep the stronger regularisation)."""
    best = None
    for strength in grid(task.task_type)[1]:
        probe = fit_probe(
            task.task_type,
            x[fit_idx],
            y[fit_idx],
            strength,
            config.standardize,
            config.normalize_labels,
            fixed,
        )
        value = score(task.metric, probe.predict(x[val_idx]), y[val_idx])
        if best is None or (value is not None and (best[1] is None or value > best[1])):
            best = (probe, value)
    return best


def _choose_svm(
    task: ProbeTask,
    config: ProbeConfig,
    x,
    y,
    fit_idx,
    val_idx,
    fixed,
    search: SvmSearch,
    seed: int,
) -> tuple:
    """`_choose` for the SVM probe: `search`'s Bayesian search (seed `seed`), each trial
    an SVM fitted on `fit_idx` and scored on `val_idx`; returns (probe, score, trials)."""
    fit_x = x[fit_idx]
    shift, scale = _standardization(fit_x, config.standardize, fixed)
    z = (fit_x - shift) / scale
    offset, span = 0.0, 1.0
    if task.task_type == REGRESSION:
        offset, span = _label_scaling(
            np.asarray(y[fit_idx], dtype=np.float64), config.normalize_labels
        )

    def evaluate(params: dict) -> tuple[SvmProbe, float | None]:
        probe = fit_svm(task.task_type, z, y[fit_idx], params, shift, scale, offset, span)
        return probe, score(task.metric, probe.predict(x[val_idx]), y[val_idx])

    return bayes_search(search, task.task_type == REGRESSION, evaluate, seed)


def _search_seed(config: ProbeConfig, search: SvmSearch, index: int) -> int:
    """The seed of fold `index`'s search (index k_folds: the stored probe's)."""
    return (config.seed if search.random_state is None else search.random_state) + index


@dataclass
class ProbeOutcome:
    """What `probe_task` measured: per-fold scores (primary and secondary), the chosen
    strengths, Q with its mean and std, the fold probes, and why a score is undefined."""

    task: str
    task_type: str
    metric: str
    secondary_metric: str
    scored_on: str
    fold_scores: list[float | None]
    fold_secondary: list[float | None]
    fold_languages: list[dict[str, float | None]]
    chosen: list[float]
    fold_probes: list[Probe]
    mean_score: float | None
    std_dev: float | None
    q_stat: float | None
    secondary_mean: float | None
    secondary_std: float | None
    undefined: str | None
    n_train: int
    n_report: dict[str, int]
    search: dict | None = None  # the SVM probe's search space (None: the linear grid)
    trials: list[list[dict]] = field(default_factory=list)  # per fold, the search's trials


def probe_task(
    task: ProbeTask, config: ProbeConfig, search: SvmSearch | None = None
) -> ProbeOutcome:
    """Run the fold protocol on one task (module docstring) with the linear probe, or with
    `search` NeuCo-Bench's SVM probe chosen by its Bayesian search in place of the grid;
    deterministic given `config.seed`. The fits run on `PROBE_BLAS_THREADS` threads."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(PROBE_BLAS_THREADS):
        return _probe_task(task, config, search)


def _probe_task(task: ProbeTask, config: ProbeConfig, search: SvmSearch | None) -> ProbeOutcome:
    x = np.asarray(task.train_x, dtype=np.float64)
    y = np.asarray(task.train_y)
    if task.task_type == CLASSIFICATION and np.unique(y).size < 2:
        raise HarnessError(f"task {task.name!r}: the train labels hold one class; give two or more")
    report = task.report_x is not None
    best_rule = "best_fold_score" in config.neuco_rules
    fixed = None
    if "global_standardization" in config.neuco_rules and config.standardize:
        fixed = _global_statistics(task)
    secondary = SECONDARY_METRIC[task.task_type]
    scores, seconds, langs, chosen, probes, trials = [], [], [], [], [], []
    for fold, (fit_idx, held_idx) in enumerate(_splits(len(y), config.k_folds, config.seed)):
        if report or best_rule:
            choose_fit, choose_val = fit_idx, held_idx
        else:  # NeuCo mode, sound: choose on a tenth of the fitting rows, score held-out rows
            inner_fit, inner_val = _splits(len(fit_idx), 1, config.seed + 1 + fold)[0]
            choose_fit, choose_val = fit_idx[inner_fit], fit_idx[inner_val]
        if search is None:
            probe, _ = _choose(task, config, x, y, choose_fit, choose_val, fixed)
        else:
            probe, _, fold_trials = _choose_svm(
                task,
                config,
                x,
                y,
                choose_fit,
                choose_val,
                fixed,
                search,
                _search_seed(config, search, fold),
            )
            trials.append(fold_trials)
        if report and not best_rule:
            rows, labels, euro = task.report_x, task.report_y, task.euro_languages
        else:  # the fold's held-out rows (under best_fold_score: the rows that chose)
            rows, labels, euro = {"all": x[held_idx]}, {"all": y[held_idx]}, ("all",)
        head, per_lang = _headline(probe, task.metric, rows, labels, euro)
        scores.append(head)
        langs.append(per_lang)
        seconds.append(_headline(probe, secondary, rows, labels, euro)[0])
        chosen.append(
            probe.hyperparameters
            if search is not None
            else probe.hyperparameters[grid(task.task_type)[0]]
        )
        probes.append(probe)
    undefined = None
    mean = std = q = None
    if any(s is None for s in scores):
        undefined = f"{task.metric} undefined on {sum(s is None for s in scores)} fold(s)"
    else:
        mean, std, q = q_statistic(scores, config.std_ddof)
    sec_mean = sec_std = None
    if all(s is not None for s in seconds):
        sec_mean, sec_std, _ = q_statistic(seconds, config.std_ddof)
    scored_on = (
        "validation rows that chose the probe (NeuCo rule best_fold_score)"
        if best_rule
        else "report split"
        if report
        else "held-out rows of each fold"
    )
    return ProbeOutcome(
        task=task.name,
        task_type=task.task_type,
        metric=task.metric,
        secondary_metric=secondary,
        scored_on=scored_on,
        fold_scores=scores,
        fold_secondary=seconds,
        fold_languages=langs,
        chosen=chosen,
        fold_probes=probes,
        mean_score=mean,
        std_dev=std,
        q_stat=q,
        secondary_mean=sec_mean,
        secondary_std=sec_std,
        undefined=undefined,
        n_train=len(y),
        n_report={lang: len(v) for lang, v in (task.report_y or {}).items()},
        search=None if search is None else search.to_dict(),
        trials=trials,
    )


def held_out_predictions(
    task: ProbeTask, config: ProbeConfig, outcome: ProbeOutcome
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per fold, (labels, predictions) of the fold's probe on the rows that fold held out:
    the rows it was scored on in NeuCo mode (no report split), for plots."""
    x = np.asarray(task.train_x, dtype=np.float64)
    y = np.asarray(task.train_y)
    splits = _splits(len(y), config.k_folds, config.seed)
    return [
        (y[held], probe.predict(x[held]))
        for (_, held), probe in zip(splits, outcome.fold_probes, strict=True)
    ]


def most_chosen(outcome: ProbeOutcome) -> float:
    """The strength chosen by most folds (ties: the stronger), for the stored probe."""
    counts = Counter(outcome.chosen)
    order = grid(outcome.task_type)[1]
    return max(order, key=lambda s: (counts.get(s, 0), -order.index(s)))


def final_probe(
    task: ProbeTask, config: ProbeConfig, outcome: ProbeOutcome, search: SvmSearch | None = None
) -> Probe | SvmProbe:
    """The probe to store: refitted on every train row with the most chosen strength; the
    SVM probe (`search`): one more search, choosing on a tenth of every train row (seed
    + k_folds), then the best hyperparameters refitted on every row."""
    x = np.asarray(task.train_x, dtype=np.float64)
    fixed = None
    if "global_standardization" in config.neuco_rules and config.standardize:
        fixed = _global_statistics(task)
    if search is not None:
        y = np.asarray(task.train_y)
        fit_idx, val_idx = _splits(len(y), 1, config.seed + 1 + config.k_folds)[0]
        best, _, _ = _choose_svm(
            task,
            config,
            x,
            y,
            fit_idx,
            val_idx,
            fixed,
            search,
            _search_seed(config, search, config.k_folds),
        )
        shift, scale = _standardization(x, config.standardize, fixed)
        offset, span = 0.0, 1.0
        if task.task_type == REGRESSION:
            offset, span = _label_scaling(y.astype(np.float64), config.normalize_labels)
        return fit_svm(
            task.task_type, (x - shift) / scale, y, best.hyperparameters, shift, scale, offset, span
        )
    return fit_probe(
        task.task_type,
        x,
        np.asarray(task.train_y),
        most_chosen(outcome),
        config.standardize,
        config.normalize_labels,
        fixed,
    )


# ----------------------------------------------------------------------------- records


def probe_provenance() -> dict:
    """Software versions and CPU of a probe run (probes fit on the CPU, with scikit-learn),
    and whether that CPU has native bf16 (the embeddings' forward pass may run on it)."""
    return {
        "software": software_versions(),
        "cpu": cpu_model(),
        "cpu_native_bf16": cpu.cpu_native_bf16(),
    }


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def result_record(
    outcome: ProbeOutcome,
    cell: dict,
    config: ProbeConfig,
    fold_results: bool = False,
    provenance: dict | None = None,
) -> dict:
    """The result object of one (model or method, pooling, task): schema
    `encoder-eval-probe` version 1; `q_t` (the per-fold scores) only with `fold_results`."""
    name, values = grid(outcome.task_type)
    if outcome.search is None:
        hyperparameters = {
            "name": name,
            "grid": list(values),
            "per_fold": outcome.chosen,
            "stored_probe": most_chosen(outcome),
        }
    else:  # the SVM probe: the search space, each fold's choice (the stored probe's own)
        name = "hyperparameters"
        hyperparameters = {"name": "svm", "search": outcome.search, "per_fold": outcome.chosen}
    record = {
        "schema": PROBE_SCHEMA,
        "schema_version": PROBE_SCHEMA_VERSION,
        "cell": {**cell, "task": outcome.task},
        "task_type": outcome.task_type,
        "metric": outcome.metric,
        "q_stat": outcome.q_stat,
        "mean_score": outcome.mean_score,
        "std_dev": outcome.std_dev,
        "undefined": outcome.undefined,
        "secondary": {
            "metric": outcome.secondary_metric,
            "mean": outcome.secondary_mean,
            "std_dev": outcome.secondary_std,
        },
        "hyperparameters": hyperparameters,
        "scored_on": outcome.scored_on,
        "n": {"train": outcome.n_train, "report": outcome.n_report},
        "protocol": {
            **config.to_dict(),
            "on_protocol": config.on_protocol,
            "off_protocol_reasons": [
                f"neuco rule {r}: {NEUCO_RULES[r]}" for r in sorted(config.neuco_rules)
            ],
        },
    }
    if fold_results:
        record["q_t"] = outcome.fold_scores
        if outcome.trials:
            hyperparameters["trials"] = outcome.trials
        record["folds"] = [
            {"score": s, "secondary": s2, "languages": lang, name: c}
            for s, s2, lang, c in zip(
                outcome.fold_scores,
                outcome.fold_secondary,
                outcome.fold_languages,
                outcome.chosen,
                strict=True,
            )
        ]
    record["provenance"] = probe_provenance() if provenance is None else provenance
    record["created_at"] = _utc_now()
    return record


def write_result(path: str | os.PathLike, record: dict) -> None:
    """Write a probe result (or summary) atomically, parents created."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)


def run_summary(
    method: str, records: list[dict], config: dict, experiment: str | None = None
) -> dict:
    """The run-level summary over task results: overall_q_score and overall_acc_score (means
    over tasks; None when a task's score is undefined), per-task scores, the config.

    It carries every field NeuCo-Bench's `save_results` writes to `results_summary.json`,
    with the same types, so that NeuCo-Bench's leaderboard (`aggregate_results`, which
    reads `data["experiment"]`) takes our run folders: `experiment` is the run's name, in
    NeuCo-Bench its run folder's name (`<method>_<timestamp>`); a summary in no run folder
    (a probe cell's) names the method. `method` and the rest are ours."""
    q = {r["cell"]["task"]: r["q_stat"] for r in records}
    acc = {r["cell"]["task"]: r["mean_score"] for r in records}

    def mean(values: dict) -> float | None:
        vals = list(values.values())
        return None if not vals or any(v is None for v in vals) else float(np.mean(vals))

    rules = sorted({rule for r in records for rule in r["protocol"]["neuco_rules"]})
    return {
        "schema": PROBE_SUMMARY_SCHEMA,
        "schema_version": PROBE_SCHEMA_VERSION,
        "experiment": method if experiment is None else experiment,
        "method": method,
        "overall_q_score": mean(q),
        "overall_acc_score": mean(acc),
        "task_q_scores": q,
        "task_acc_scores": acc,
        "neuco_rules": rules,
        "on_protocol": not rules and all(r["protocol"]["on_protocol"] for r in records),
        "config": config,
        "created_at": _utc_now(),
    }


# ----------------------------------------------------------------------------- our tasks


def task_from_registry(
    task: str,
    train_x: np.ndarray,
    report_x: dict[str, np.ndarray],
    data_dir: str | os.PathLike | None = None,
    data: tuple | None = None,
) -> ProbeTask:
    """A registered task's `ProbeTask` from embeddings an extractor made: `train_x` one row
    per row of `load_task(task)`'s train split, in its order, and `report_x[lang]` one per
    row of its report split (test, or validation where that is the report split). `data`:
    that `load_task` result when the caller has it already."""
    knobs = task_knobs(task)
    train, _, test, _, problem = data if data is not None else load_task(task, data_dir)
    missing = sorted(set(test) - set(report_x))
    if missing:
        raise HarnessError(
            f"task {task!r}: no report embeddings for language(s) {', '.join(missing)}; "
            f"give one array per language: {', '.join(sorted(test))}"
        )
    extra = sorted(set(report_x) - set(test))
    if extra:
        raise unknown_name("report language", extra[0], test)
    return ProbeTask(
        name=task,
        task_type=REGRESSION if problem == TASK_REGRESSION else CLASSIFICATION,
        metric=knobs.metric,
        train_x=np.asarray(train_x),
        train_y=np.asarray(train["label"]),
        report_x={lang: np.asarray(report_x[lang]) for lang in test},
        report_y={lang: np.asarray(test[lang]["label"]) for lang in test},
        euro_languages=knobs.euro_languages,
    )
