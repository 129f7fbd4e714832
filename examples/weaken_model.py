"""Save a deliberately weakened copy of an encoder: its top N layers re-initialised.

    python examples/weaken_model.py SRC_DIR DST_DIR [--reinit-top N | --reinit-all] [--seed S]

A control for `encoder-eval compare`: the copy keeps the tokenizer, embeddings and lower
layers of SRC_DIR, and its top N transformer layers start from the model's own random
initialisation (`_init_weights`, seeded), so fine-tuning it should score lower where the
upper layers matter. The copy is a plain local model directory (`save_pretrained`),
loaded like any other `--model NAME=DST_DIR`. `--reinit-all` re-initialises every weight,
embeddings included: the same architecture and tokenizer with no pretraining at all (the
random baseline of a probing leaderboard).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer


def encoder_layers(model) -> torch.nn.ModuleList:
    """The model's stack of transformer layers (BERT-style `encoder.layer` or `layers`)."""
    for path in ("encoder.layer", "layers", "encoder.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.nn.ModuleList):
            return obj
    raise SystemExit(f"error: {type(model).__name__} has no layer list this script knows")


def weaken(src: str, dst: str, reinit_top: int, seed: int, reinit_all: bool = False) -> list[int]:
    """Copy `src` to `dst` with its top `reinit_top` layers (or, `reinit_all`, every module)
    re-initialised; returns the layer indices re-initialised."""
    model = AutoModel.from_pretrained(src)
    layers = encoder_layers(model)
    if not reinit_all and not 0 < reinit_top <= len(layers):
        raise SystemExit(f"error: --reinit-top must be 1..{len(layers)}, got {reinit_top}")
    torch.manual_seed(seed)
    chosen = list(range(0 if reinit_all else len(layers) - reinit_top, len(layers)))
    if reinit_all:
        model.apply(model._init_weights)
    for i in chosen:
        layers[i].apply(model._init_weights)
    Path(dst).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--reinit-top", type=int, default=3, help="layers to re-initialise")
    p.add_argument("--reinit-all", action="store_true",
                   help="re-initialise every weight, embeddings included")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    chosen = weaken(args.src, args.dst, args.reinit_top, args.seed, args.reinit_all)
    what = "every weight" if args.reinit_all else f"layers {chosen}"
    print(f"wrote {args.dst}: {what} of {args.src} re-initialised (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
