"""When two results may share a table: the one comparability rule.

A cell's *setup* (`cell_setup`) is what every cell of one (model, task) must share, select
and report alike: the recipe signature (`protocol.signature` at table scope, precision and
selection split included), the model revision, the loader mode and remote-code trust, the
attention implementation that ran (sdpa, eager, flash_attention_2: not the same numbers),
the data read and the selection split. `setup_differences` names each entry in which one setup
departs from another. A table's cells must also share their transformers version
(`transformers_version`), and a tracking receipt's setup compares by `receipt_setup`.
`select`, `summarize`, `compare`, `leaderboard`, the probe tables and `track` ask here.
"""

from __future__ import annotations

from encoder_eval.core.errors import brief
from encoder_eval.core.protocol import TABLE, loader_label, signature
from encoder_eval.core.schema import PROBE_SCHEMA_NAME, data_identity

# A probe cell's fold protocol entries that every cell of one probe table must share.
PROBE_SETUP_KEYS = ("k_folds", "seed", "standardize")
# The entries of a tracking receipt's setup (`reports.tracking.TrackSetup`) that need not
# agree between receipts: where the learning rate came from (a selection file or a flag).
RECEIPT_FREE_KEYS = ("lr_source",)
# Setup entries that results written before they were recorded lack: compared only between
# two setups that both record them (`setup_differences`).
RECORDED_LATER = ("attn_implementation", "attn_backend")


def recipe_signature(data: dict) -> dict:
    """The recipe entries that every cell of one comparison must share (`protocol.signature`:
    the Recipe's table-scope entries, precision and selection split included)."""
    return signature(data.get("recipe") or {}, TABLE)


def cell_setup(data: dict) -> dict:
    """What a cell ran with that every cell of one (model, task), select and report alike,
    must share: the recipe signature, model revision, loader, data and selection split. For
    a probe cell (`schema.PROBE_SCHEMA_NAME`): its fold protocol (`PROBE_SETUP_KEYS`) and
    the precision its embeddings were computed in."""
    if data.get("schema") == PROBE_SCHEMA_NAME:
        protocol = data.get("protocol") or {}
        embedding = (data.get("provenance") or {}).get("embedding") or {}
        return {
            "folds": {k: protocol.get(k) for k in PROBE_SETUP_KEYS},
            "precision": embedding.get("precision"),
        }
    recipe = data.get("recipe") or {}
    provenance = data.get("provenance") or {}
    attention = recipe.get("attn_implementation")  # (`RECORDED_LATER`)
    backend = recipe.get("attn_backend")  # (`RECORDED_LATER`; None: compiled, or unknown)
    return {
        "model_revision": provenance.get("model_revision"),
        "mode": loader_label(recipe),  # the mode, with the decoder-adapted settings
        "trust_remote_code": provenance.get("trust_remote_code"),
        **({} if attention is None else {"attn_implementation": attention}),
        **({} if backend is None else {"attn_backend": backend}),
        "selection_split": recipe.get("selection_split"),
        "data_identity": data_identity(provenance),
        "recipe": recipe_signature(data),
    }


def setup_differences(setup: dict, reference: dict, reference_has: str) -> list[str]:
    """`entry value (reference_has other value)` for each `cell_setup` entry in which `setup`
    departs from `reference`; the recipe by its differing keys, its selection split once.
    An entry of `RECORDED_LATER` counts only when both record it."""
    pairs = [
        (k, v, reference.get(k))
        for k, v in setup.items()
        if k != "recipe" and (k not in RECORDED_LATER or k in reference)
    ]
    # Both sides through `signature`, so a setup recorded by an older harness (other keys,
    # entries not yet recorded) compares on what the Recipe defines today.
    recipe = signature(setup.get("recipe") or {}, TABLE)
    ref = signature(reference.get("recipe") or {}, TABLE)
    pairs += [
        (f"recipe {k}=", recipe.get(k), ref.get(k))
        for k in sorted(set(recipe) | set(ref))
        if k != "selection_split"
    ]
    return [
        f"{name}{'' if name.endswith('=') else ' '}{brief(value)} ({reference_has} {brief(other)})"
        for name, value, other in pairs
        if value != other
    ]


def transformers_version(data: dict) -> str:
    """The transformers version a result ran with (`provenance.software.transformers`;
    'None' when unrecorded), as a table compares it: every cell of one table must share it
    (the table's `transformers` rule), since another version can move a score."""
    software = (data.get("provenance") or {}).get("software") or {}
    return str(software.get("transformers"))


def receipt_setup(setup: dict) -> dict:
    """The entries of a tracking receipt's setup (`TrackSetup.to_dict()`) that must agree
    between receipts compared in one report: all but `RECEIPT_FREE_KEYS`."""
    return {k: v for k, v in setup.items() if k not in RECEIPT_FREE_KEYS}
