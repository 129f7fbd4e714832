"""Build a checkpoint ladder from one encoder, for `encoder-eval track`:

    python examples/make_ladder.py SRC_DIR OUT_DIR [--reinit-top 3 --reinit-top 5] [--seed 0]

writes OUT_DIR/{copy,bf16,int8,reinit3,reinit5}/ and OUT_DIR/ladder.tsv listing, in order:
  orig     SRC_DIR itself
  copy     a byte-identical copy (tracking must never flag it)
  bf16     every floating weight rounded to bfloat16 and back to float32
  int8     weight matrices quantised to int8 (symmetric, one scale per output row) and
           dequantised; biases and norms kept
  reinitN  the top N layers re-initialised (examples/weaken_model.py), for each
           --reinit-top N (default: 3 and 5)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weaken_model import weaken  # noqa: E402


def int8_round_trip(w: torch.Tensor) -> torch.Tensor:
    """Quantise a 2-D weight to int8 with one symmetric scale per row, then dequantise."""
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    return (torch.round(w / scale).clamp(-127, 127) * scale).to(w.dtype)


def transformed_copy(src: Path, dst: Path, fn) -> int:
    """Copy `src` to `dst` with `fn` applied to the tensors of its model.safetensors;
    returns how many tensors changed."""
    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    out, changed = {}, 0
    for name, t in tensors.items():
        new = fn(name, t)
        changed += int(not torch.equal(new, t))
        out[name] = new.contiguous()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--reinit-top", type=int, action="append",
                   help="layers to re-initialise, one checkpoint each (default: 3 and 5)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    src, out = Path(args.src).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = [("orig", src)]
    if not (out / "copy").exists():
        shutil.copytree(src, out / "copy")
    rows.append(("copy", out / "copy"))
    if not (out / "bf16").exists():
        n = transformed_copy(src, out / "bf16", lambda _, t: t.to(torch.bfloat16).float()
                             if t.is_floating_point() else t)  # fmt: skip
        print(f"bf16: {n} tensors changed")
    rows.append(("bf16", out / "bf16"))
    if not (out / "int8").exists():
        n = transformed_copy(src, out / "int8", lambda _, t: int8_round_trip(t)
                             if t.is_floating_point() and t.dim() == 2 else t)  # fmt: skip
        print(f"int8: {n} tensors changed")
    rows.append(("int8", out / "int8"))
    for top in args.reinit_top or [3, 5]:
        name = f"reinit{top}"
        if not (out / name).exists():
            layers = weaken(str(src), str(out / name), top, args.seed)
            print(f"{name}: layers {layers} re-initialised (seed {args.seed})")
        rows.append((name, out / name))
    (out / "ladder.tsv").write_text("".join(f"{cid}\t{path}\n" for cid, path in rows))
    print(f"wrote {out / 'ladder.tsv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
