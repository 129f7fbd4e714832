"""NeuCo-Bench's SVM probe: a polynomial-kernel SVC (classification) or SVR (regression)
whose C, degree, gamma, coef0 and epsilon come from a seeded Bayesian search over the
ranges of a NeuCo-Bench config's `probe_params` (`SvmSearch`).

NeuCo-Bench runs scikit-optimize's `BayesSearchCV`; scikit-optimize is archived upstream,
so the search here is Optuna's TPE sampler (sequential model-based, seeded, one trial at a
time), imported only when a search runs (the `neuco` extra). The fold protocol around it
(which rows fit, choose and score) is `encoder_eval.cells.probing`'s; this module fits one
SVM on prepared (standardised) rows, runs one search given a scoring callback, and holds
the fitted SVM as plain arrays (`SvmProbe`) that predict without scikit-learn, so a stored
SVM probe is JSON data like a linear one (EVALUATION_METHODOLOGY.md, "12. Probing").
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np

from encoder_eval.core.errors import HarnessError, unknown_name

PROBE_TYPE = "svm"
KERNEL = "poly"  # NeuCo-Bench's: (gamma <x, sv> + coef0) ** degree; degree 1 is linear
SVM_PARAMS_REQUIRED = ("C_start_end", "kernel_degree_list")
SVM_PARAMS = (
    *SVM_PARAMS_REQUIRED,
    "kernel_coef0_start_end",
    "kernel_gamma_start_end",
    "epsilon_list",
    "opt_params",
)
# The keys of `opt_params` honoured, with BayesSearchCV's defaults: trials per search, the
# random trials before the model guides the search (skopt's n_initial_points, TPE's
# n_startup_trials), and the search's seed (default: the config's seed).
OPT_PARAMS: dict[str, int | None] = {"n_iter": 50, "n_initial_points": 10, "random_state": None}
# Where the search fails to need them: sklearn's defaults when a range is not given.
DEFAULT_COEF0 = 0.0
DEFAULT_EPSILON = 0.1
EXTRA_HINT = "pip install 'encoder-eval-harness[neuco]' (or pip install optuna)"


def _range(params: dict, key: str, where: str, positive: bool) -> tuple[float, float] | None:
    value = params.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise HarnessError(f"{where}: probe_params {key} must be a list [min, max], not {value!r}")
    low, high = float(value[0]), float(value[1])
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise HarnessError(
            f"{where}: probe_params {key} must be [min, max] with min < max, not {value!r}"
        )
    if positive and low <= 0:
        raise HarnessError(
            f"{where}: probe_params {key} is searched on a log scale; "
            f"its min must be above 0, not {value[0]!r}"
        )
    return low, high


@dataclass(frozen=True)
class SvmSearch:
    """The SVM probe's search space and budget, from a NeuCo-Bench config's `probe_params`
    (`probe_type: svm`): C and gamma log-uniform, coef0 uniform, degree and epsilon from
    their lists (epsilon for regression only), `n_iter` trials per search."""

    c_range: tuple[float, float]
    degrees: tuple[int, ...]
    coef0_range: tuple[float, float] | None = None
    gamma_range: tuple[float, float] | None = None
    epsilons: tuple[float, ...] | None = None
    n_iter: int = 50
    n_initial_points: int = 10
    random_state: int | None = None

    @classmethod
    def from_params(cls, params: dict, where: str) -> SvmSearch:
        """Check `probe_params` of an svm probe as NeuCo-Bench does (both required keys,
        [min, max] ranges, integer degrees, no gamma or coef0 range with degree 1, no `cv`
        in `opt_params`) and return the search; an error names the key to fix."""
        for key in params:
            if key not in SVM_PARAMS:
                raise unknown_name("svm probe_params key", key, SVM_PARAMS)
        missing = [k for k in SVM_PARAMS_REQUIRED if k not in params]
        if missing:
            raise HarnessError(f"{where}: probe_params lacks {', '.join(missing)}; add them")
        c_range = _range(params, "C_start_end", where, positive=True)
        degrees = params["kernel_degree_list"]
        degrees = [degrees] if not isinstance(degrees, list) else degrees
        if not degrees or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in degrees
        ):
            raise HarnessError(
                f"{where}: probe_params kernel_degree_list must be a positive "
                f"integer or a list of them, not {params['kernel_degree_list']!r}"
            )
        coef0 = _range(params, "kernel_coef0_start_end", where, positive=False)
        gamma = _range(params, "kernel_gamma_start_end", where, positive=True)
        for key, value in (("kernel_coef0_start_end", coef0), ("kernel_gamma_start_end", gamma)):
            if value is not None and 1 in degrees:
                raise HarnessError(
                    f"{where}: probe_params {key} cannot be searched with degree 1 in "
                    "kernel_degree_list (with degree 1 it only rescales C or adds a constant); "
                    f"drop 1 from kernel_degree_list or drop {key}"
                )
        epsilons = params.get("epsilon_list")
        if epsilons is not None:
            epsilons = [epsilons] if not isinstance(epsilons, list) else epsilons
            if not epsilons or not all(
                isinstance(e, int | float) and not isinstance(e, bool) and e >= 0 for e in epsilons
            ):
                raise HarnessError(
                    f"{where}: probe_params epsilon_list must be a list of "
                    f"numbers >= 0, not {params['epsilon_list']!r}"
                )
        opt = params.get("opt_params") or {}
        if not isinstance(opt, dict):
            raise HarnessError(f"{where}: probe_params opt_params must be a mapping")
        for key, value in opt.items():
            if key == "cv":
                raise HarnessError(
                    f"{where}: opt_params must not set cv: the folds are the "
                    "probe protocol's (k_folds); remove it"
                )
            if key not in OPT_PARAMS:
                raise unknown_name(
                    "opt_params key",
                    key,
                    OPT_PARAMS,
                    "the others of BayesSearchCV do not apply to this search",
                )
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < (key != "random_state")
            ):
                raise HarnessError(
                    f"{where}: opt_params {key} must be an integer "
                    f"({'>= 0' if key == 'random_state' else '>= 1'}), not {value!r}"
                )
        opt = {**OPT_PARAMS, **opt}
        return cls(
            c_range,
            tuple(degrees),
            coef0,
            gamma,
            None if epsilons is None else tuple(float(e) for e in epsilons),
            opt["n_iter"],
            opt["n_initial_points"],
            opt["random_state"],
        )

    def to_dict(self) -> dict:
        """The search as recorded in a result (`hyperparameters.search`)."""
        return {
            "kernel": KERNEL,
            "C": {"range": list(self.c_range), "prior": "log-uniform"},
            "degree": list(self.degrees),
            "gamma": {"range": list(self.gamma_range), "prior": "log-uniform"}
            if self.gamma_range
            else "scale",
            "coef0": {"range": list(self.coef0_range), "prior": "uniform"}
            if self.coef0_range
            else DEFAULT_COEF0,
            "epsilon": list(self.epsilons) if self.epsilons else DEFAULT_EPSILON,
            "n_iter": self.n_iter,
            "n_initial_points": self.n_initial_points,
            "random_state": self.random_state,
            "sampler": f"optuna TPESampler {_optuna_version()}",
        }


def _optuna_version() -> str:
    try:
        return metadata.version("optuna")
    except metadata.PackageNotFoundError:  # the search refuses before it runs
        return "(not installed)"


def require_search_library() -> None:
    """Refuse before anything runs when the search library (the `neuco` extra) is missing."""
    if importlib.util.find_spec("optuna") is None:
        raise HarnessError(
            f"probe_type svm needs optuna for its hyperparameter search: {EXTRA_HINT}"
        )


# ----------------------------------------------------------------------------- the predictor


@dataclass
class SvmProbe:
    """A fitted SVM as plain arrays, sklearn-free: x -> (x - shift) / scale -> the poly
    kernel against the support vectors -> one-vs-one votes (classes), sign (two classes)
    or value * label_range + label_offset (regression)."""

    task_type: str
    support_vectors: np.ndarray  # (n_sv, d), standardised
    dual_coef: np.ndarray  # (k, n_sv): sklearn's layout (k = classes - 1; 1 for SVR)
    intercept: np.ndarray  # (pairs,) or (1,)
    n_support: list[int]  # support vectors per class, in class order ([n_sv] for SVR)
    degree: int
    gamma: float
    coef0: float
    shift: np.ndarray
    scale: np.ndarray
    classes: list = field(default_factory=list)
    label_offset: float = 0.0
    label_range: float = 1.0
    hyperparameters: dict = field(default_factory=dict)

    def _kernel(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, dtype=np.float64) - self.shift) / self.scale
        return (self.gamma * z @ self.support_vectors.T + self.coef0) ** self.degree

    def decision(self, x: np.ndarray) -> np.ndarray:
        """(n, pairs) decision values: one column per one-vs-one pair (i, j), i < j, in
        sklearn's order (positive: class i); one column for two classes or regression."""
        k = self._kernel(x)
        if self.task_type != "classification" or len(self.classes) == 2:
            return (k @ self.dual_coef[0] + self.intercept[0])[:, None]
        starts = np.cumsum([0, *self.n_support])
        out, pair = [], 0
        for i in range(len(self.classes)):
            for j in range(i + 1, len(self.classes)):
                si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
                out.append(
                    k[:, si] @ self.dual_coef[j - 1, si]
                    + k[:, sj] @ self.dual_coef[i, sj]
                    + self.intercept[pair]
                )
                pair += 1
        return np.stack(out, axis=1)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted class values (classification) or targets (regression) of rows `x`."""
        scores = self.decision(x)
        if self.task_type != "classification":
            return scores[:, 0] * self.label_range + self.label_offset
        classes = np.asarray(self.classes)
        if len(self.classes) == 2:
            return classes[(scores[:, 0] > 0).astype(int)]
        votes = np.zeros((len(scores), len(self.classes)), dtype=np.int64)
        pair = 0
        for i in range(len(self.classes)):
            for j in range(i + 1, len(self.classes)):
                wins = scores[:, pair] > 0
                votes[:, i] += wins
                votes[:, j] += ~wins
                pair += 1
        return classes[np.argmax(votes, axis=1)]  # ties: the first class, as libsvm

    def to_dict(self) -> dict:
        return {
            "probe_type": PROBE_TYPE,
            "task_type": self.task_type,
            "kernel": KERNEL,
            "support_vectors": self.support_vectors.tolist(),
            "dual_coef": self.dual_coef.tolist(),
            "intercept": self.intercept.tolist(),
            "n_support": list(self.n_support),
            "degree": self.degree,
            "gamma": self.gamma,
            "coef0": self.coef0,
            "shift": self.shift.tolist(),
            "scale": self.scale.tolist(),
            "classes": [c.item() if isinstance(c, np.generic) else c for c in self.classes],
            "label_offset": self.label_offset,
            "label_range": self.label_range,
            "hyperparameters": self.hyperparameters,
        }

    @classmethod
    def from_dict(cls, obj: dict, where: str) -> SvmProbe:
        """The probe of `to_dict`'s data; shapes checked (an error names `where`)."""
        probe = cls(
            task_type=obj["task_type"],
            support_vectors=np.asarray(obj["support_vectors"], dtype=np.float64),
            dual_coef=np.asarray(obj["dual_coef"], dtype=np.float64),
            intercept=np.asarray(obj["intercept"], dtype=np.float64),
            n_support=[int(n) for n in obj["n_support"]],
            degree=int(obj["degree"]),
            gamma=float(obj["gamma"]),
            coef0=float(obj["coef0"]),
            shift=np.asarray(obj["shift"], dtype=np.float64),
            scale=np.asarray(obj["scale"], dtype=np.float64),
            classes=list(obj["classes"]),
            label_offset=float(obj["label_offset"]),
            label_range=float(obj["label_range"]),
            hyperparameters=dict(obj["hyperparameters"]),
        )
        n_sv = probe.support_vectors.shape[0] if probe.support_vectors.ndim == 2 else -1
        classes = len(probe.classes) if probe.task_type == "classification" else 2
        pairs = 1 if classes == 2 else classes * (classes - 1) // 2
        if (
            probe.dual_coef.shape != (classes - 1, n_sv)
            or probe.intercept.shape != (pairs,)
            or sum(probe.n_support) != n_sv
        ):
            raise HarnessError(
                f"{where}: the SVM's support vectors, dual coefficients, "
                "intercepts and classes do not fit together; store the probe "
                "again"
            )
        return probe


def fit_svm(
    task_type: str,
    z: np.ndarray,
    y: np.ndarray,
    params: dict,
    shift: np.ndarray,
    scale: np.ndarray,
    label_offset: float = 0.0,
    label_range: float = 1.0,
) -> SvmProbe:
    """Fit one poly-kernel SVC (classification) or SVR (regression, on (y - label_offset) /
    label_range) with `params` (C, degree, optional gamma, coef0, epsilon) on standardised
    rows `z`; gamma defaults to sklearn's "scale", computed here so it can be stored."""
    from sklearn.svm import SVC, SVR

    z = np.asarray(z, dtype=np.float64)
    var = float(z.var())
    gamma = float(params.get("gamma", 1.0 / (z.shape[1] * var) if var != 0 else 1.0))
    coef0 = float(params.get("coef0", DEFAULT_COEF0))
    common = {
        "kernel": KERNEL,
        "C": float(params["C"]),
        "degree": int(params["degree"]),
        "gamma": gamma,
        "coef0": coef0,
    }
    if task_type == "classification":
        model = SVC(**common).fit(z, y)
        classes, n_support = list(model.classes_), [int(n) for n in model.n_support_]
    else:
        target = (np.asarray(y, dtype=np.float64) - label_offset) / label_range
        model = SVR(**common, epsilon=float(params.get("epsilon", DEFAULT_EPSILON))).fit(z, target)
        classes, n_support = [], [int(model.support_vectors_.shape[0])]
    return SvmProbe(
        task_type,
        np.asarray(model.support_vectors_, dtype=np.float64),
        np.asarray(model.dual_coef_, dtype=np.float64),
        np.asarray(model.intercept_, dtype=np.float64),
        n_support,
        int(params["degree"]),
        gamma,
        coef0,
        np.asarray(shift),
        np.asarray(scale),
        classes,
        label_offset,
        label_range,
        hyperparameters=dict(params),
    )


# ----------------------------------------------------------------------------- the search


def _suggest(trial: Any, search: SvmSearch, regression: bool) -> dict:
    params: dict[str, Any] = {
        "C": trial.suggest_float("C", *search.c_range, log=True),
        "degree": trial.suggest_categorical("degree", list(search.degrees)),
    }
    if search.gamma_range is not None:
        params["gamma"] = trial.suggest_float("gamma", *search.gamma_range, log=True)
    if search.coef0_range is not None:
        params["coef0"] = trial.suggest_float("coef0", *search.coef0_range)
    if regression and search.epsilons:
        params["epsilon"] = trial.suggest_categorical("epsilon", list(search.epsilons))
    return params


def bayes_search(
    search: SvmSearch,
    regression: bool,
    evaluate: Callable[[dict], tuple[SvmProbe, float | None]],
    seed: int,
) -> tuple[SvmProbe, float | None, list[dict]]:
    """Run `search.n_iter` trials of Optuna's TPE sampler (seed `seed`, one trial at a
    time, so deterministic); `evaluate(params)` fits a probe and returns it with its
    validation score (None: undefined, never the best). Returns the best probe (ties: the
    earliest trial), its score, and every trial's params and score."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best: tuple[SvmProbe, float | None] | None = None
    trials: list[dict] = []

    def objective(trial: Any) -> float:
        nonlocal best
        params = _suggest(trial, search, regression)
        probe, value = evaluate(params)
        trials.append({"params": params, "score": value})
        if best is None or (value is not None and (best[1] is None or value > best[1])):
            best = (probe, value)
        return -math.inf if value is None else value

    try:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=search.n_initial_points)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(objective, n_trials=search.n_iter)
    finally:
        optuna.logging.set_verbosity(verbosity)
    assert best is not None  # n_iter >= 1
    return best[0], best[1], trials
