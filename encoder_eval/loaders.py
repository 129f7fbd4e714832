"""Loading a model, always in fp32: for sequence classification in one of two modes, or as
a frozen encoder body for embeddings (`load_encoder`, probing).

- `auto`: `AutoModelForSequenceClassification` (one output for regression).
- `liquid-bidir`: the encoder body from `AutoModel` plus a fresh mean-pool + linear head,
  for bidirectional encoders that ship only a backbone.

Every architecture-specific adjustment lives in `_prepare_architecture` and `_prepare_tokenizer`,
so a reader finds them in one place.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from .errors import HarnessError
from .models import MODES
from .provenance import directory_content_hash

# Families whose position ids start after the padding index (pad_token_id + 1 slots are unusable).
_OFFSET_POSITION_TYPES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert"}
_DECODER_HINTS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: object
    revision: str  # Hub commit hash, or a content hash of a local directory
    source: str  # "hub" or "local"
    max_positions: int | None
    input_names: tuple[str, ...]


class MeanPoolClassifier(nn.Module):
    """An encoder body with a mean-pooled linear head (the `liquid-bidir` mode)."""

    def __init__(self, body: nn.Module, hidden_size: int, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.body = body
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids, attention_mask, **kwargs):
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = hidden.last_hidden_state if hasattr(hidden, "last_hidden_state") else hidden[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return _Logits(self.classifier(self.dropout(pooled)))


@dataclass
class _Logits:
    logits: torch.Tensor


def _is_local(path: str) -> bool:
    return os.path.isdir(os.path.expanduser(path))


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


def _load_config_and_tokenizer(
    model_path: str,
    label: str,
    kw: dict,
    max_seq_len: int | None,
) -> tuple[object, object, bool, int | None]:
    """The checks and loads every mode shares: path, config (encoders only), tokenizer with
    a pad token, the length limit. Returns (config, tokenizer, local, max positions)."""
    from transformers import AutoConfig, AutoTokenizer

    trust = bool(kw.get("trust_remote_code"))
    local = _is_local(model_path)
    if not local and (model_path.startswith((".", "/", "~")) or os.sep * 2 in model_path):
        raise HarnessError(f"model directory {model_path!r} does not exist; check --model-path")
    if local and not os.access(os.path.expanduser(model_path), os.R_OK | os.X_OK):
        raise HarnessError(f"model directory {model_path!r} is not readable; fix its permissions")
    try:
        config = AutoConfig.from_pretrained(model_path, **kw)
    except Exception as exc:
        raise HarnessError(_load_error("config", label, exc, local, trust)) from None
    archs = getattr(config, "architectures", None) or []
    if getattr(config, "is_decoder", False) or (
        archs and all(any(h in a for h in _DECODER_HINTS) for a in archs)
    ):
        raise HarnessError(
            f"{label} is a decoder ({', '.join(archs) or config.model_type}), not an encoder; "
            "this harness fine-tunes bidirectional encoders"
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


def _loaded(
    model: nn.Module,
    config,
    tokenizer,
    model_path: str,
    label: str,
    local: bool,
    positions: int | None,
    trust_remote_code: bool,
) -> LoadedModel:
    """Wrap a loaded fp32 model with its resolved revision and the inputs it takes."""
    commit = getattr(config, "_commit_hash", None)
    resolved = directory_content_hash(os.path.expanduser(model_path)) if local else commit
    if trust_remote_code:
        warnings.warn(
            f"{label}: trust_remote_code is on, running model-authored code at revision "
            f"{resolved or 'unknown'}; pin it with --model-revision",
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
    )


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
) -> LoadedModel:
    """Load tokenizer and model for fine-tuning, in fp32, with the architecture fixes applied.

    Raises HarnessError with a one-line fix for every input problem found before training.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    if mode not in MODES:
        raise HarnessError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    label = model_label or model_path
    kw = {"revision": revision, "trust_remote_code": trust_remote_code}
    config, tokenizer, local, positions = _load_config_and_tokenizer(
        model_path, label, kw, max_seq_len
    )
    config.num_labels = num_labels
    config.problem_type = problem
    try:
        if mode == "auto":
            model = AutoModelForSequenceClassification.from_pretrained(
                # A checkpoint fine-tuned with another label count gets a fresh head.
                model_path,
                config=config,
                dtype=torch.float32,
                ignore_mismatched_sizes=True,
                **kw,
            )
        else:
            body = AutoModel.from_pretrained(model_path, config=config, dtype=torch.float32, **kw)
            hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", None)
            if hidden is None:
                raise HarnessError(f"{label}'s config names no hidden_size for the pooled head")
            model = MeanPoolClassifier(body, int(hidden), num_labels)
    except HarnessError:
        raise
    except Exception as exc:
        raise HarnessError(_load_error("model", label, exc, local, trust_remote_code)) from None
    model = model.float()
    check_fp32(model)
    output_layer_in_fp32(model, 1 if problem == "regression" else num_labels)
    return _loaded(model, config, tokenizer, model_path, label, local, positions,
                   trust_remote_code)  # fmt: skip


def load_encoder(
    model_path: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    max_seq_len: int | None = None,
    model_label: str | None = None,
) -> LoadedModel:
    """Load the frozen encoder body (`AutoModel`, fp32, eval mode) and its tokenizer for
    embedding extraction, through the same checks as `load_model`."""
    from transformers import AutoModel

    label = model_label or model_path
    kw = {"revision": revision, "trust_remote_code": trust_remote_code}
    config, tokenizer, local, positions = _load_config_and_tokenizer(
        model_path, label, kw, max_seq_len
    )
    try:
        model = AutoModel.from_pretrained(model_path, config=config, dtype=torch.float32, **kw)
    except Exception as exc:
        raise HarnessError(_load_error("model", label, exc, local, trust_remote_code)) from None
    model = model.float().eval()
    check_fp32(model)
    model.requires_grad_(False)
    return _loaded(model, config, tokenizer, model_path, label, local, positions,
                   trust_remote_code)  # fmt: skip


def output_layer_in_fp32(model: nn.Module, num_outputs: int) -> nn.Module:
    """Run the model's output layer (its last Linear onto the labels) outside autocast.

    Under bf16 autocast the logits would be bf16, whose 8-bit mantissa rounds a regression
    output near 2.5 to steps of 1/64: measured on MiniLM, 96 distinct predictions became 6,
    and the ties distort Spearman. The output layer is tiny; computing it in fp32 costs
    nothing and keeps predictions exact. Returns the layer it patched.
    """
    candidates = [m for m in model.modules()
                  if isinstance(m, nn.Linear) and m.out_features == num_outputs]  # fmt: skip
    if not candidates:
        raise HarnessError(f"found no output layer with {num_outputs} outputs in the model")
    layer = candidates[-1]
    plain_forward = layer.forward

    def forward_fp32(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return plain_forward(x.float())

    layer.forward = forward_fp32
    return layer


def check_fp32(model: nn.Module) -> None:
    """Refuse a model whose parameters are not fp32: the protocol compares weights, not formats."""
    bad = {str(p.dtype) for p in model.parameters() if p.dtype != torch.float32}
    if bad:
        raise HarnessError(
            f"model parameters are {', '.join(sorted(bad))}, not float32; the protocol trains "
            "fp32 master weights under bf16 autocast"
        )


def _load_error(what: str, label: str, exc: Exception, local: bool, trust: bool) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
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
