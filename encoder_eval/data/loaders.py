"""Loading a model, always in fp32: for sequence classification in one of three modes, or as
a frozen encoder body for embeddings (`load_encoder`, probing).

- `auto`: `AutoModelForSequenceClassification` (one output for regression).
- `liquid-bidir`: the encoder body from `AutoModel` plus a fresh mean-pool + linear head,
  for bidirectional encoders that ship only a backbone.
- `decoder-adapted`: a decoder-only body (Llama, Qwen2, Gemma, ...) from `AutoModel` plus a
  fresh pooled linear head, its attention made bidirectional (a full padding-only mask) or
  left causal, its pair inputs given an explicit separator when the tokenizer has none.
  `verify_attention` proves the masking on the loaded model before any training.

Every architecture-specific adjustment lives in `_prepare_architecture` and `_prepare_tokenizer`,
so a reader finds them in one place.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from encoder_eval.core import process_state, provenance
from encoder_eval.core.errors import HarnessError, unknown_name
from encoder_eval.core.provenance import code_repositories, directory_content_hash
from encoder_eval.data.models import (
    FIXED_POOLINGS,
    MODES,
    all_modes,
    check_local_model,
    loader_settings,
    plugin_loader,
    pooling_pitfall,
)

# Families whose position ids start after the padding index (pad_token_id + 1 slots are unusable).
_OFFSET_POSITION_TYPES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert"}
_DECODER_HINTS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def _reset_transformers_logging() -> None:
    """transformers' verbosity back to its default, and its warn-once caches emptied: a
    warning one unit of a warm worker printed shows in the next unit's log too."""
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is None:  # not imported yet: nothing to put back
        return
    hf_logging.set_verbosity(hf_logging._get_default_logging_level())
    for once in ("warning_once", "info_once"):
        cached = getattr(hf_logging, once, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


process_state.register("transformers logging (data/loaders.py)", _reset_transformers_logging)


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: object
    revision: str  # Hub commit hash, or a content hash of a local directory
    source: str  # "hub" or "local"
    max_positions: int | None
    input_names: tuple[str, ...]
    # What the loader derived that a result records beside its recipe (decoder-adapted: the
    # pair separator, the attention implementation, the pooling pitfall); empty otherwise.
    recorded: dict = field(default_factory=dict)
    # Remote code held by other repositories: {"repositories": {repo: commit}, and the
    # "code_revision_requested"}; None when the model runs no such code.
    code: dict | None = None


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool (batch, length, dim) hidden states to (batch, dim) in fp32 over a right-padded
    attention mask: `mean` of the real tokens, the `first` token, or the `last` real one."""
    hidden = hidden.float()
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    if pooling == "first":
        return hidden[:, 0]
    if pooling == "last":
        last = mask.long().sum(1).clamp(min=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise unknown_name("pooling", pooling, FIXED_POOLINGS)


# Attention implementations whose layers take a 4D mask as given (transformers 4.56
# `masking_utils._preprocess_mask_arguments` returns a 4D mask unchanged): eager adds it to
# the scores, sdpa passes it to torch as `attn_mask` (and then is not causal).
_FULL_MASK_IMPLEMENTATIONS = ("eager", "sdpa")


def full_attention_mask(attention_mask: torch.Tensor, implementation: str) -> torch.Tensor:
    """The (batch, 1, length, length) mask under which every position attends to every real
    (non-padding) position: bidirectional attention for a decoder body. Boolean for sdpa
    (True: attend), additive fp32 for eager (0 or the fp32 minimum), as transformers builds
    its own masks."""
    if implementation not in _FULL_MASK_IMPLEMENTATIONS:
        raise HarnessError(
            f"bidirectional attention needs the eager or sdpa attention implementation; the "
            f"model uses {implementation!r} (use --attention causal, or load it with sdpa)"
        )
    length = attention_mask.shape[-1]
    allowed = attention_mask.bool()[:, None, None, :].expand(-1, 1, length, -1)
    if implementation == "sdpa":
        return allowed
    additive = torch.zeros(allowed.shape, dtype=torch.float32, device=attention_mask.device)
    return additive.masked_fill(~allowed, torch.finfo(torch.float32).min)


class PooledClassifier(nn.Module):
    """A body with a fresh pooled linear head. `liquid-bidir`: mean pooling, the body's own
    masking. `decoder-adapted`: `attention` "bidirectional" (a full padding-only mask) or
    "causal" (the decoder's own mask), pooling mean, first, last (the last real token) or
    attention (a learned query scoring the real tokens, softmax, weighted sum)."""

    def __init__(
        self,
        body: nn.Module,
        hidden_size: int,
        num_labels: int,
        dropout: float = 0.1,
        pooling: str = "mean",
        attention: str | None = None,
    ):
        super().__init__()
        self.body = body
        self.pooling = pooling
        self.attention = attention  # None: the body masks as it always does
        self.dropout = nn.Dropout(dropout)
        if pooling == "attention":
            self.pool_query = nn.Parameter(torch.empty(hidden_size))
            nn.init.normal_(self.pool_query, std=0.02)
        self.classifier = nn.Linear(hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def hidden_states(self, input_ids, attention_mask, **kwargs) -> torch.Tensor:
        """The body's last hidden states (batch, length, dim) under this model's masking."""
        mask = attention_mask
        if self.attention == "bidirectional":
            mask = full_attention_mask(attention_mask, self.body.config._attn_implementation)
        out = self.body(input_ids=input_ids, attention_mask=mask, **kwargs)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def pooled(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One fp32 vector per example from its real tokens' states."""
        if self.pooling != "attention":
            return pool(hidden, attention_mask, self.pooling)
        hidden = hidden.float()
        scores = hidden @ self.pool_query.float() / hidden.shape[-1] ** 0.5
        scores = scores.masked_fill(~attention_mask.bool(), float("-inf"))
        return (scores.softmax(dim=1).unsqueeze(-1) * hidden).sum(1)

    def forward(self, input_ids, attention_mask, **kwargs):
        hidden = self.hidden_states(input_ids, attention_mask, **kwargs)
        return _Logits(self.classifier(self.dropout(self.pooled(hidden, attention_mask))))


@dataclass
class _Logits:
    logits: torch.Tensor


def _prepare_architecture(config) -> None:
    """Architecture-specific configuration, in one place."""
    model_type = getattr(config, "model_type", "")
    if model_type == "modernbert":
        # torch.compile of ModernBERT's MLP is on by default on CUDA; it breaks on many
        # stacks (ROCm, CPU, older Triton) and adds minutes of warm-up per cell.
        config.reference_compile = False


def _prepare_tokenizer(tokenizer, config) -> None:
    """Give tokenizers without a pad token one, and keep the config's pad id in step."""
    if tokenizer.pad_token is None:
        for candidate in (tokenizer.eos_token, tokenizer.sep_token, tokenizer.unk_token):
            if candidate is not None:
                tokenizer.pad_token = candidate
                break
        else:
            raise HarnessError("the tokenizer has no pad, eos, sep or unk token to pad with")
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = tokenizer.pad_token_id


def max_positions(config) -> int | None:
    """How many token positions the model can take (None when the config does not say)."""
    n = getattr(config, "max_position_embeddings", None)
    if n is None:
        return None
    if getattr(config, "model_type", "") in _OFFSET_POSITION_TYPES:
        n -= (config.pad_token_id or 0) + 1
    return int(n)


_COMMIT = re.compile(r"[0-9a-f]{40}")


def pin_remote_code(
    model_path: str,
    label: str,
    revision: str | None,
    code_revision: str | None,
    require: bool = False,
) -> dict | None:
    """Resolve the code another repository holds for this model (its config's or tokenizer
    config's `auto_map` naming `repo--module.Class`) to one commit, before any of it runs.

    Returns None when there is no such code, else {"repositories": {repo: commit or None},
    "code_revision_requested": code_revision, "code_revision": the commit loads pass as
    `code_revision` (None: not pinned)}. `code_revision` (a commit, a tag or a branch) is the
    user's pin; without it each repository's head is resolved. `require` refuses an
    unpinned reference, or one that cannot be resolved.
    """
    from transformers import PretrainedConfig
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    try:
        config, _ = PretrainedConfig.get_config_dict(model_path, revision=revision)
        tokenizer_config = get_tokenizer_config(model_path, revision=revision)
    except Exception:  # the loads that follow report an unreadable model in full
        return None
    repos = code_repositories(config.get("auto_map"), tokenizer_config.get("auto_map"))
    if not repos:
        return None
    named = ", ".join(repos)
    if code_revision is None and require:
        raise HarnessError(
            f"{label}: its auto_map runs code from {named}, another repository, at whatever "
            "its head is; pin it with --model-code-revision <commit> (--require-code-revision "
            "is on)"
        )
    commits: dict[str, str | None] = {}
    for repo in repos:
        if code_revision is not None and _COMMIT.fullmatch(code_revision):
            commits[repo] = code_revision
            continue
        try:
            commits[repo] = provenance.resolve_commit(repo, code_revision)
        except Exception as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if require:
                raise HarnessError(
                    f"{label}: cannot resolve the code of {repo} at "
                    f"{code_revision or 'its head'} to a commit ({why}); give "
                    "--model-code-revision <40-hex commit>"
                ) from None
            warnings.warn(
                f"{label}: could not resolve the code of {repo} to a commit ({why}); "
                "it runs unpinned (recorded as null)",
                stacklevel=3,
            )
            commits[repo] = None
    distinct = set(commits.values())
    pin = next(iter(distinct)) if len(distinct) == 1 else None
    if pin is None and len(distinct) > 1 and require:
        raise HarnessError(
            f"{label}: its code repositories ({named}) resolve to different "
            "commits, which one --model-code-revision cannot pin"
        )
    return {
        "repositories": commits,
        "code_revision_requested": code_revision,
        "code_revision": pin or code_revision,
    }


def _load_config_and_tokenizer(
    model_path: str,
    label: str,
    kw: dict,
    max_seq_len: int | None,
    mode: str | None = None,
) -> tuple[object, object, bool, int | None]:
    """The checks and loads every mode shares: path, config (encoders only, except for the
    `decoder-adapted` mode; `mode` None: the frozen encoder of probing), tokenizer with a pad
    token, the length limit. Returns (config, tokenizer, local, max positions)."""
    from transformers import AutoConfig, AutoTokenizer

    trust = bool(kw.get("trust_remote_code"))
    local = check_local_model(model_path)
    try:
        config = AutoConfig.from_pretrained(model_path, **kw)
    except Exception as exc:
        raise HarnessError(_load_error("config", label, exc, local, trust)) from None
    archs = getattr(config, "architectures", None) or []
    if mode != "decoder-adapted" and (
        getattr(config, "is_decoder", False)
        or (archs and all(any(h in a for h in _DECODER_HINTS) for a in archs))
    ):
        pointer = (
            "; to fine-tune a decoder-only model (Llama, Qwen2, Gemma) as an encoder, use "
            "--mode decoder-adapted"
            if mode is not None
            else "; probing reads encoders only"
        )
        raise HarnessError(
            f"{label} is a decoder ({', '.join(archs) or config.model_type}), not an encoder; "
            f"this harness fine-tunes bidirectional encoders{pointer}"
        )
    _prepare_architecture(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, **kw)
    except Exception as exc:
        raise HarnessError(_load_error("tokenizer", label, exc, local, trust)) from None
    _prepare_tokenizer(tokenizer, config)
    positions = max_positions(config)
    if max_seq_len is not None and positions is not None and max_seq_len > positions:
        raise HarnessError(
            f"--max-seq-len {max_seq_len} is beyond {label}'s {positions} positions; "
            f"use --max-seq-len {positions} or less"
        )
    return config, tokenizer, local, positions


def pair_separator(tokenizer) -> dict:
    """Make sure a pair's two texts are told apart: a tokenizer whose own pair template puts
    special tokens between them is kept; one without (most decoder tokenizers just join the
    texts) gets `A <eos> B` through its post-processor, so `encoding.encode` and truncation see
    the separator as a special token. Returns what the result records."""
    specials = set(tokenizer.all_special_ids)

    def n_special(*texts: str) -> int:
        return sum(i in specials for i in tokenizer(*texts)["input_ids"])

    if n_special("a", "b") > n_special("a"):
        return {"pair_separator": None, "pair_template": "tokenizer"}
    sep = tokenizer.eos_token or tokenizer.sep_token
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if sep is None or backend is None:
        raise HarnessError(
            "the tokenizer has no pair template and "
            + ("no eos or sep token" if sep is None else "is not a fast tokenizer")
            + " to separate a pair's texts with; decoder-adapted needs one of them"
        )
    from tokenizers import processors

    sep_id = tokenizer.convert_tokens_to_ids(sep)
    template = processors.TemplateProcessing(
        single="$A:0", pair=f"$A:0 {sep}:0 $B:1", special_tokens=[(sep, sep_id)]
    )
    own = backend.post_processor
    backend.post_processor = template if own is None else processors.Sequence([own, template])
    return {"pair_separator": sep, "pair_template": "added"}


def verify_attention(model: PooledClassifier, tokenizer, label: str) -> None:
    """Prove the masking of a decoder-adapted model on its own weights: token 0's state must
    change when the last token changes under `bidirectional` and must not under `causal`, and
    right padding must leave the real tokens' states unchanged in both. Refuses otherwise."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = tokenizer(
                "The quick brown fox jumps over the lazy dog", add_special_tokens=False
            )["input_ids"][:8]
            vocab = int(model.body.get_input_embeddings().weight.shape[0])
            if len(ids) < 3:
                ids = [(i * 7 + 3) % vocab for i in range(1, 7)]
            other = list(ids)
            other[-1] = (ids[-1] + 1) % vocab
            pad = tokenizer.pad_token_id
            batch = torch.tensor([ids, other, [*ids[:-1], pad]])
            mask = torch.ones_like(batch)
            mask[2, -1] = 0
            hidden = model.hidden_states(batch, mask).float()
            alone = model.hidden_states(batch[:1, :-1], mask[:1, :-1]).float()
    finally:
        model.train(was_training)
    scale = 1e-4 * (1.0 + float(hidden.abs().max()))
    moved = float((hidden[0, 0] - hidden[1, 0]).abs().max()) > scale
    padding_leaks = float((hidden[2, :-1] - alone[0]).abs().max()) > scale
    if padding_leaks:
        raise HarnessError(
            f"{label}: padding changes the real tokens' states under "
            f"{model.attention} attention; this architecture is not supported"
        )
    if model.attention == "bidirectional" and not moved:
        raise HarnessError(
            f"{label}: a full attention mask left the body causal (token 0 "
            "ignores later tokens); this architecture is not supported"
        )
    if model.attention == "causal" and moved:
        raise HarnessError(
            f"{label} is not a causal decoder (token 0 sees later tokens); "
            "use --mode auto or liquid-bidir for an encoder"
        )


def _loaded(
    model: nn.Module,
    config,
    tokenizer,
    model_path: str,
    label: str,
    local: bool,
    positions: int | None,
    trust_remote_code: bool,
    recorded: dict | None = None,
    code: dict | None = None,
) -> LoadedModel:
    """Wrap a loaded fp32 model with its resolved revision and the inputs it takes."""
    commit = getattr(config, "_commit_hash", None)
    resolved = directory_content_hash(os.path.expanduser(model_path)) if local else commit
    if trust_remote_code:
        other = "".join(
            f", and code from {repo} at {sha or 'an unresolved head'}"
            for repo, sha in ((code or {}).get("repositories") or {}).items()
        )
        warnings.warn(
            f"{label}: trust_remote_code is on, running model-authored code at revision "
            f"{resolved or 'unknown'}{other}; pin it with --model-revision"
            + (" and --model-code-revision" if other else ""),
            stacklevel=3,
        )
    names = tuple(n for n in tokenizer.model_input_names if n in ("input_ids", "attention_mask"))
    if (
        "token_type_ids" in tokenizer.model_input_names
        and getattr(config, "type_vocab_size", 0) > 1
    ):
        names += ("token_type_ids",)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        revision=resolved or "unknown",
        source="local" if local else "hub",
        max_positions=positions,
        input_names=names,
        recorded=recorded or {},
        code=code,
    )


def _load_kwargs(
    model_path: str,
    label: str,
    revision: str | None,
    trust_remote_code: bool,
    code_revision: str | None,
    require_code_revision: bool,
) -> tuple[dict, dict | None]:
    """The keyword arguments of every `from_pretrained` call, with remote code held by
    another repository pinned to one commit first (`pin_remote_code`), and that pin."""
    kw = {"revision": revision, "trust_remote_code": trust_remote_code}
    if not trust_remote_code:  # transformers then refuses remote code: nothing to pin
        return kw, None
    code = pin_remote_code(model_path, label, revision, code_revision, require_code_revision)
    if code is not None and code["code_revision"] is not None:
        kw["code_revision"] = code["code_revision"]
    return kw, code


def load_model(
    model_path: str,
    mode: str,
    num_labels: int,
    problem: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    max_seq_len: int | None = None,
    model_label: str | None = None,
    attention: str | None = None,
    pooling: str | None = None,
    head_dropout: float | None = None,
    code_revision: str | None = None,
    require_code_revision: bool = False,
    body_dropout: float | None = None,
) -> LoadedModel:
    """Load tokenizer and model for fine-tuning, in fp32, with the architecture fixes applied.
    `attention`, `pooling`, `head_dropout` and `body_dropout` are the decoder-adapted settings
    (`models.loader_settings`: None takes the default; other modes refuse them).
    `code_revision` and `require_code_revision`: see `pin_remote_code`.

    Raises HarnessError with a one-line fix for every input problem found before training.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    if mode not in MODES and mode not in all_modes():
        raise HarnessError(f"unknown mode {mode!r}; valid modes: {', '.join(all_modes())}")
    settings = loader_settings(mode, attention, pooling, head_dropout, body_dropout=body_dropout)
    label = model_label or model_path
    plugin = None if mode in MODES else plugin_loader(mode)  # imported before any download
    kw, code = _load_kwargs(
        model_path, label, revision, trust_remote_code, code_revision, require_code_revision
    )
    config, tokenizer, local, positions = _load_config_and_tokenizer(
        model_path, label, kw, max_seq_len, mode
    )
    config.num_labels = num_labels
    config.problem_type = problem
    recorded = {}
    try:
        if plugin is not None:
            model = _plugin_model(plugin, model_path, config, num_labels, problem, kw, label)
        elif mode == "auto":
            model = AutoModelForSequenceClassification.from_pretrained(
                # A checkpoint fine-tuned with another label count gets a fresh head.
                model_path,
                config=config,
                dtype=torch.float32,
                ignore_mismatched_sizes=True,
                **kw,
            )
        else:
            if mode == "decoder-adapted":
                config.use_cache = False  # training and scoring never generate
                body = _decoder_body(model_path, config, kw, label)
                if settings["body_dropout"] is not None:
                    set_body_dropout(body, settings["body_dropout"])
            else:
                body = AutoModel.from_pretrained(
                    model_path, config=config, dtype=torch.float32, **kw
                )
            hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", None)
            if hidden is None:
                raise HarnessError(f"{label}'s config names no hidden_size for the pooled head")
            if mode == "liquid-bidir":
                model = PooledClassifier(body, int(hidden), num_labels)
            else:
                model = PooledClassifier(
                    body,
                    int(hidden),
                    num_labels,
                    dropout=settings["head_dropout"],
                    pooling=settings["pooling"],
                    attention=settings["attention"],
                )
    except HarnessError:
        raise
    except Exception as exc:
        raise HarnessError(_load_error("model", label, exc, local, trust_remote_code)) from None
    model = model.float()  # fp32 master weights, whatever dtype the checkpoint stores
    if mode == "decoder-adapted":
        verify_attention(model, tokenizer, label)
        pitfall = pooling_pitfall(settings["attention"], settings["pooling"])
        if pitfall:
            warnings.warn(
                f"{label}: {pitfall} (the seed's pitfall; recorded in the result)", stacklevel=2
            )
        recorded = {
            **pair_separator(tokenizer),
            "attn_implementation": body.config._attn_implementation,
            "pooling_pitfall": pitfall,
        }
    if plugin is not None:
        info = plugin[1]
        recorded = {"loader_plugin": f"{info.package} {info.version} ({info.target})"}
    output_layer_in_fp32(model, 1 if problem == "regression" else num_labels)
    return _loaded(
        model,
        config,
        tokenizer,
        model_path,
        label,
        local,
        positions,
        trust_remote_code,
        recorded,
        code,
    )


def _plugin_model(
    plugin, model_path: str, config, num_labels: int, problem: str, kw: dict, label: str
) -> nn.Module:
    """The model a loader plug-in builds: `load(model_path, config=, num_labels=, problem=,
    revision=, trust_remote_code=[, code_revision=])` returns a module whose forward takes the
    tokenizer's inputs and returns an object with `.logits`."""
    fn, info = plugin
    model = fn(model_path, config=config, num_labels=num_labels, problem=problem, **kw)
    if not isinstance(model, nn.Module):
        raise HarnessError(
            f"{label}: loader mode {info.mode!r} of package {info.package} "
            f"returned {type(model).__name__}, not a torch module; fix or "
            f"uninstall {info.package}"
        )
    return model


# The config fields that hold a body's dropout probabilities across architectures (Llama,
# Qwen2, Gemma: attention_dropout; GPT-2 style: *_pdrop; BERT style: *_dropout_prob).
BODY_DROPOUT_FIELDS = (
    "attention_dropout",
    "hidden_dropout",
    "dropout",
    "activation_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)


def set_body_dropout(body: nn.Module, p: float) -> None:
    """Set every dropout of a loaded body to `p`: its `nn.Dropout` modules, the attention
    modules' `attention_dropout` rate (Llama-family attention reads it at each forward), and
    the config fields that hold them, so that the body trains under the ablation's rate."""
    for name in BODY_DROPOUT_FIELDS:
        if isinstance(getattr(body.config, name, None), int | float):
            setattr(body.config, name, p)
    for module in body.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
        rate = getattr(module, "attention_dropout", None)
        if isinstance(rate, int | float) and not isinstance(rate, bool):
            module.attention_dropout = p


def _decoder_body(model_path: str, config, kw: dict, label: str) -> nn.Module:
    """The decoder-only body with the checkpoint's weights: `AutoModel`, or, where its weight
    names do not match the checkpoint's (Gemma 3 saves `model.*` while `Gemma3TextModel`
    expects another prefix), the body of `AutoModelForCausalLM`. A body whose weights are not
    all in the checkpoint is refused: it would train from random weights without a word."""
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the first try's "newly initialized" list is expected
    try:
        body, info = AutoModel.from_pretrained(
            model_path, config=config, dtype=torch.float32, output_loading_info=True, **kw
        )
        missing = info["missing_keys"]
        if missing:
            lm, info = AutoModelForCausalLM.from_pretrained(
                model_path, config=config, dtype=torch.float32, output_loading_info=True, **kw
            )
            body = lm.get_decoder()
            missing = [k for k in info["missing_keys"] if not k.startswith("lm_head")]
    finally:
        hf_logging.set_verbosity(level)
    if missing:
        raise HarnessError(
            f"{label}: {len(missing)} weights of the decoder body are not in the checkpoint "
            f"(first: {sorted(missing)[0]}); is it a decoder-only model directory?"
        )
    return body


def load_encoder(
    model_path: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    max_seq_len: int | None = None,
    model_label: str | None = None,
    code_revision: str | None = None,
    require_code_revision: bool = False,
) -> LoadedModel:
    """Load the frozen encoder body (`AutoModel`, fp32, eval mode) and its tokenizer for
    embedding extraction, through the same checks (and code pins) as `load_model`."""
    from transformers import AutoModel

    label = model_label or model_path
    kw, code = _load_kwargs(
        model_path, label, revision, trust_remote_code, code_revision, require_code_revision
    )
    config, tokenizer, local, positions = _load_config_and_tokenizer(
        model_path, label, kw, max_seq_len
    )
    try:
        model = AutoModel.from_pretrained(model_path, config=config, dtype=torch.float32, **kw)
    except Exception as exc:
        raise HarnessError(_load_error("model", label, exc, local, trust_remote_code)) from None
    model = model.float().eval()
    model.requires_grad_(False)
    return _loaded(
        model, config, tokenizer, model_path, label, local, positions, trust_remote_code, code=code
    )


def output_layer_in_fp32(model: nn.Module, num_outputs: int) -> nn.Module:
    """Run the model's output layer (its last Linear onto the labels) outside autocast.

    Under bf16 autocast the logits would be bf16, whose 8-bit mantissa rounds a regression
    output near 2.5 to steps of 1/64: measured on MiniLM, 96 distinct predictions became 6,
    and the ties distort Spearman. The output layer is tiny; computing it in fp32 costs
    nothing and keeps predictions exact. Returns the layer it patched.
    """
    candidates = [
        m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == num_outputs
    ]
    if not candidates:
        raise HarnessError(f"found no output layer with {num_outputs} outputs in the model")
    layer = candidates[-1]
    plain_forward = layer.forward

    def forward_fp32(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return plain_forward(x.float())

    layer.forward = forward_fp32
    return layer


def _load_error(what: str, label: str, exc: Exception, local: bool, trust: bool) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(text) > 300:  # transformers lists every model type it knows: keep the hint visible
        text = text[:297] + "..."
    if "trust_remote_code" in str(exc) and not trust:
        return (
            f"{label} needs trust_remote_code to load its {what}; pass --trust-remote-code "
            "only if you trust its code (and pin --model-revision)"
        )
    if local:
        hint = "is it a Hugging Face model directory with config.json and tokenizer files?"
    else:
        hint = "check the Hub id and your network; offline, point --model-path at a local directory"
    return f"could not load the {what} of {label}: {text} ({hint})"
