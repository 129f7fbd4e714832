"""The tokenisation cache: hits, misses, invalidation, concurrent writers, and no effect on scores."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO
from test_cell import cell
from transformers import AutoTokenizer

from encoder_eval import tokencache, train
from encoder_eval.tasks import load_task


def _setup(tiny_models, small_mirror, kind="bert"):
    tok = AutoTokenizer.from_pretrained(tiny_models[kind])
    split = load_task("glue_rte", small_mirror)[0]
    return tok, split, ("input_ids", "attention_mask")


def test_miss_then_hit_returns_the_same_encoding(tiny_models, small_mirror, tmp_path):
    tok, split, names = _setup(tiny_models, small_mirror)
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    assert tokencache.load(tmp_path, key) is None  # miss
    first = train.encode_cached(tok, split, 64, names, tmp_path)
    assert (tmp_path / f"{key}.pkl").exists()
    second = train.encode_cached(tok, split, 64, names, tmp_path)  # hit
    assert second == first == train.encode(tok, split, 64, names)


def test_max_length_tokenizer_and_data_change_the_key(tiny_models, small_mirror):
    tok, split, names = _setup(tiny_models, small_mirror)
    other_tok = AutoTokenizer.from_pretrained(tiny_models["xlm-roberta"])
    fp, other_fp = (tokencache.tokenizer_fingerprint(t) for t in (tok, other_tok))
    base = tokencache.cache_key(fp, split, 64, names)
    assert base == tokencache.cache_key(fp, split, 64, names)
    assert base != tokencache.cache_key(fp, split, 32, names)
    assert base != tokencache.cache_key(other_fp, split, 64, names)
    changed = {**split, "text": ["edited"] + split["text"][1:]}
    assert base != tokencache.cache_key(fp, changed, 64, names)
    tok.add_tokens(["brandnewtoken"])
    assert tokencache.tokenizer_fingerprint(tok) != fp


def test_torn_entry_is_a_miss(tiny_models, small_mirror, tmp_path):
    tok, split, names = _setup(tiny_models, small_mirror)
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    (tmp_path / f"{key}.pkl").write_bytes(b"\x80\x05truncated")
    assert tokencache.load(tmp_path, key) is None
    assert train.encode_cached(tok, split, 64, names, tmp_path) == train.encode(
        tok, split, 64, names
    )


WRITER = """
import sys
from transformers import AutoTokenizer
from encoder_eval import train
from encoder_eval.tasks import load_task
tok = AutoTokenizer.from_pretrained(sys.argv[1])
split = load_task("glue_sst2", sys.argv[2])[0]
for _ in range(20):
    train.encode_cached(tok, split, 64, ("input_ids", "attention_mask"), sys.argv[3],)
    import encoder_eval.tokencache as tc
    key = tc.cache_key(tc.tokenizer_fingerprint(tok), split, 64, ("input_ids", "attention_mask"))
    tc.store(sys.argv[3], key, train.encode(tok, split, 64, ("input_ids", "attention_mask")))
print("ok")
"""


def test_two_concurrent_writers_leave_one_valid_entry(tiny_models, small_mirror, tmp_path):
    args = [
        sys.executable,
        "-c",
        WRITER,
        str(tiny_models["bert"]),
        str(small_mirror),
        str(tmp_path),
    ]
    procs = [subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and all("ok" in o for o in outs)
    entries = list(tmp_path.glob("*.pkl"))
    assert len(entries) == 1
    assert not list(tmp_path.glob(".tmp-*"))
    tok, _, names = _setup(tiny_models, small_mirror)
    split = load_task("glue_sst2", small_mirror)[0]
    assert tokencache.load(tmp_path, entries[0].stem) == train.encode(tok, split, 64, names)


def test_cell_scores_are_the_same_with_and_without_the_cache(tiny_models, small_mirror, tmp_path):
    cold = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                               out_json=None, cache_dir=str(tmp_path / "c")))  # fmt: skip
    warm = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                               out_json=None, cache_dir=str(tmp_path / "c")))  # fmt: skip
    off = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                              out_json=None, cache_dir=None))  # fmt: skip
    assert cold["report"] == warm["report"] == off["report"]
    assert len(list((tmp_path / "c").glob("*.pkl"))) == 2  # train and validation
