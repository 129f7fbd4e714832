"""The tokenisation cache: hits, misses, invalidation, concurrent writers, no effect on
scores; entries are data (never unpickled), damage is a miss, the folder is private."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import pickle
import random
import stat
import struct
import subprocess
import sys
import time

from conftest import REPO
from test_cell import cell
from transformers import AutoTokenizer

from encoder_eval.cells import encoding, train
from encoder_eval.core import fileio
from encoder_eval.core.fileio import TMP_PREFIX
from encoder_eval.data import tokencache
from encoder_eval.data.task_loading import load_task


def _value(enc) -> tuple[dict, list]:
    """What the cache holds of an encoding: its features and labels."""
    return {k: list(v) for k, v in enc.features.items()}, enc.labels


def _setup(tiny_models, small_mirror, kind="bert"):
    tok = AutoTokenizer.from_pretrained(tiny_models[kind])
    split = load_task("glue_rte", small_mirror)[0]
    return tok, split, ("input_ids", "attention_mask")


def test_miss_then_hit_returns_the_same_encoding(tiny_models, small_mirror, tmp_path):
    tok, split, names = _setup(tiny_models, small_mirror)
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    assert tokencache.load(tmp_path, key) is None  # miss
    first = encoding.encode_cached(tok, split, 64, names, tmp_path)
    assert tokencache.entry_path(tmp_path, key).exists()
    second = encoding.encode_cached(tok, split, 64, names, tmp_path)  # hit
    assert second == first == encoding.encode(tok, split, 64, names)


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
    tokencache.store(tmp_path, key, *_value(encoding.encode(tok, split, 64, names)))
    entry = tokencache.entry_path(tmp_path, key)
    entry.write_bytes(entry.read_bytes()[:-7])
    assert tokencache.load(tmp_path, key) is None
    assert encoding.encode_cached(tok, split, 64, names, tmp_path) == encoding.encode(
        tok, split, 64, names
    )


WRITER = """
import sys
from transformers import AutoTokenizer
from encoder_eval.cells import encoding, train
from encoder_eval.data.task_loading import load_task
tok = AutoTokenizer.from_pretrained(sys.argv[1])
split = load_task("glue_sst2", sys.argv[2])[0]
for _ in range(20):
    encoding.encode_cached(tok, split, 64, ("input_ids", "attention_mask"), sys.argv[3],)
    import encoder_eval.data.tokencache as tc
    key = tc.cache_key(tc.tokenizer_fingerprint(tok), split, 64, ("input_ids", "attention_mask"))
    enc = encoding.encode(tok, split, 64, ("input_ids", "attention_mask"))
    tc.store(sys.argv[3], key, enc.features, enc.labels)
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
    entries = list(tmp_path.glob("*" + tokencache.SUFFIX))
    assert len(entries) == 1
    assert not list(tmp_path.glob(f"{TMP_PREFIX}*"))
    tok, _, names = _setup(tiny_models, small_mirror)
    split = load_task("glue_sst2", small_mirror)[0]
    assert tokencache.load(tmp_path, entries[0].stem) == _value(
        encoding.encode(tok, split, 64, names)
    )


def test_cell_scores_are_the_same_with_and_without_the_cache(tiny_models, small_mirror, tmp_path):
    cold = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                               out_json=None, cache_dir=str(tmp_path / "c")))  # fmt: skip
    warm = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                               out_json=None, cache_dir=str(tmp_path / "c")))  # fmt: skip
    off = train.run_cell(cell(tmp_path, tiny_models["bert"], data_dir=str(small_mirror),
                              out_json=None, cache_dir=None))  # fmt: skip
    assert cold["report"] == warm["report"] == off["report"]
    assert len(list((tmp_path / "c").glob("*" + tokencache.SUFFIX))) == 2  # train, validation


# ----------------------------------------------------------------------------- never code


class _Plant:
    """A pickle that, when unpickled, creates the file `path` (what a planted entry could do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_in_the_cache_is_never_unpickled(tiny_models, small_mirror, tmp_path):
    """Entries of the old pickle format, and a pickle under the new name, are misses: no
    entry is ever unpickled, so a planted one runs nothing."""
    tok, split, names = _setup(tiny_models, small_mirror)
    cache, canary = tmp_path / "cache", tmp_path / "canary"
    cache.mkdir(mode=0o700)
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    planted = pickle.dumps(_Plant(canary))
    for name in (f"{key}.pkl", f"{key}.tokens"):  # the old entry's name, and the new one
        (cache / name).write_bytes(planted)
    assert tokencache.load(cache, key) is None
    assert encoding.encode_cached(tok, split, 64, names, cache) == encoding.encode(
        tok, split, 64, names
    )
    assert not canary.exists()


# ----------------------------------------------------------------------------- damage


def _damage(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One random kind of damage a disk, a copy or a killed writer can do to a file."""
    n = len(data)
    at, span = rng.randrange(n), rng.randrange(1, 64)
    noise = rng.randbytes(rng.randrange(1, 64))
    kind = rng.choice(("truncate", "flip", "overwrite", "insert", "delete", "append", "zero",
                       "duplicate", "random", "empty", "header-digits"))  # fmt: skip
    if kind == "truncate":
        return kind, data[:at]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randrange(1, 9)):
            out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return kind, bytes(out)
    if kind == "overwrite":
        return kind, data[:at] + noise + data[at + len(noise) :]
    if kind == "insert":
        return kind, data[:at] + noise + data[at:]
    if kind == "delete":
        return kind, data[:at] + data[at + span :]
    if kind == "append":
        return kind, data + noise
    if kind == "zero":
        return kind, data[:at] + bytes(span) + data[at + span :]
    if kind == "duplicate":
        return kind, data[:at] + data[at : at + span] * 2 + data[at + span :]
    if kind == "random":
        return kind, rng.randbytes(rng.randrange(1, 2 * n))
    if kind == "empty":
        return kind, b""
    # A digit of a number in the header replaced by many (sizes, lengths, shapes).
    digits = [i for i in range(min(n, 600)) if data[i : i + 1].isdigit()]
    i = rng.choice(digits)
    return kind, data[:i] + b"9" * rng.randrange(2, 5000) + data[i + 1 :]


def test_every_damaged_entry_is_a_miss_and_nothing_raises(tiny_models, small_mirror, tmp_path):
    """1,200 randomly damaged copies of a real entry, each put in the entry's place: every
    one loads as a miss (None), none raises, and the cell's path re-tokenises correctly."""
    seed = int(os.environ.get("EE_CACHE_FUZZ_SEED", str(time.time_ns() % 10**6)))
    print(f"\ncache fuzz seed {seed} (EE_CACHE_FUZZ_SEED={seed} repeats the draws)")
    rng = random.Random(seed)
    tok, split, names = _setup(tiny_models, small_mirror)
    split = {column: values[:8] for column, values in split.items()}
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    fresh = encoding.encode(tok, split, 64, names)
    encoding.encode_cached(tok, split, 64, names, tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    good = entry.read_bytes()
    assert tokencache.load(tmp_path, key) is not None  # the undamaged entry is a hit
    kinds = collections.Counter()
    for _ in range(1200):
        kind, bad = _damage(rng, good)
        if bad == good:
            continue
        entry.write_bytes(bad)
        kinds[kind] += 1
        assert tokencache.load(tmp_path, key) is None, f"{kind} (seed {seed})"
    assert sum(kinds.values()) >= 1000, kinds
    print(f"damaged entries: {sum(kinds.values())} ({dict(sorted(kinds.items()))}), all misses")
    assert encoding.encode_cached(tok, split, 64, names, tmp_path) == fresh  # rewritten
    assert tokencache.load(tmp_path, key) is not None


def _resigned(good: bytes, header: bytes, payload: bytes | None = None) -> bytes:
    """An entry with `header` (and `payload`) whose checksum is valid: what a hostile writer
    of a shared cache, not a disk, could produce."""
    start = len(tokencache.MAGIC) + 32
    n_head = int.from_bytes(good[start : start + 8], "little")
    if payload is None:
        payload = good[start + 8 + n_head :]
    rest = len(header).to_bytes(8, "little") + header + payload
    return tokencache.MAGIC + hashlib.sha256(rest).digest() + rest


def test_entries_with_a_valid_checksum_but_a_hostile_header_are_misses(
    tiny_models, small_mirror, tmp_path
):
    tok, split, names = _setup(tiny_models, small_mirror)
    split = {column: values[:8] for column, values in split.items()}
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    enc = encoding.encode(tok, split, 64, names)
    good = tokencache.encode_entry(key, *_value(enc))
    assert tokencache.decode_entry(good, key) == _value(enc)
    start = len(tokencache.MAGIC) + 32
    n_head = int.from_bytes(good[start : start + 8], "little")
    header = json.loads(good[start + 8 : start + 8 + n_head])
    specs = header["arrays"]

    def with_(**changes) -> bytes:
        return json.dumps({**header, **changes}).encode()

    def spec(i: int, **changes) -> list:
        return [{**s, **changes} if j == i else s for j, s in enumerate(specs)]

    hostile = {
        "deep nesting": b"[" * 100_000 + b"]" * 100_000,
        "5000-digit version": b'{"version": ' + b"9" * 5000 + b"}",
        "not an object": b"[1, 2]",
        "not JSON": b"\xff\xfe{",
        "another key": with_(key="0" * 64),
        "another version": with_(version=1),
        "object dtype": with_(arrays=spec(0, dtype="|O")),
        "pickled dtype": with_(arrays=spec(0, dtype="V8")),
        "negative shape": with_(arrays=spec(0, shape=[-1])),
        "huge shape": with_(arrays=spec(0, shape=[2**62])),
        "three dimensions": with_(arrays=spec(0, shape=[1, 1, 1])),
        "float shape": with_(arrays=spec(0, shape=[8.0])),
        "shape as a string": with_(arrays=spec(0, shape="8")),
        "duplicate array": with_(arrays=[specs[0], *specs]),
        "missing array": with_(arrays=specs[:-1]),
        "arrays not a list": with_(arrays={"a": 1}),
        "name not a string": with_(arrays=spec(0, name=["lengths"])),
        "features missing": with_(meta={}),
        "features not a list": with_(meta={"features": "input_ids"}),
        "feature names repeated": with_(meta={"features": ["input_ids", "input_ids"]}),
        "feature names not strings": with_(meta={"features": ["input_ids", 7]}),
        "meta not an object": with_(meta=[1]),
    }
    lengths_at = [s["name"] for s in specs].index("lengths")
    payload = good[start + 8 + n_head :]
    # The lengths array rewritten: negative, huge (a sum that would overflow), wrong total.
    offset = sum(8 * s["shape"][0] if s["dtype"].endswith("8") else 4 * s["shape"][0]
                 for s in specs[:lengths_at])  # fmt: skip
    for name, lengths in (("negative lengths", [-1] * 8), ("huge lengths", [2**62] * 8),
                          ("lengths off by one", [*enc.lengths[:-1], enc.lengths[-1] + 1])):  # fmt: skip
        body = payload[:offset] + struct.pack("<8q", *lengths) + payload[offset + 64 :]
        hostile[name] = (json.dumps(header).encode(), body)
    for name, value in hostile.items():
        data = _resigned(good, *value) if isinstance(value, tuple) else _resigned(good, value)
        assert tokencache.decode_entry(data, key) is None, name
        tokencache.entry_path(tmp_path, key).write_bytes(data)
        assert tokencache.load(tmp_path, key) is None, name
    # A declared header length beyond the file, with a valid checksum.
    rest = (10**12).to_bytes(8, "little") + b"{}"
    assert tokencache.decode_entry(
        tokencache.MAGIC + hashlib.sha256(rest).digest() + rest, key) is None  # fmt: skip


# ----------------------------------------------------------------------------- folder modes


def test_the_cache_folder_is_private_unless_shared_on_purpose(
    tiny_models, small_mirror, tmp_path, monkeypatch, capsys
):
    tok, split, names = _setup(tiny_models, small_mirror)
    split = {column: values[:8] for column, values in split.items()}
    key = tokencache.cache_key(tokencache.tokenizer_fingerprint(tok), split, 64, names)
    monkeypatch.delenv("ENCODER_EVAL_CACHE_SHARED", raising=False)
    private = tmp_path / "a" / "private"
    encoding.encode_cached(tok, split, 64, names, private)
    assert stat.S_IMODE(private.stat().st_mode) == stat.S_IMODE(private.parent.stat().st_mode)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700  # and the folder above it it made
    (entry,) = private.iterdir()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert tokencache.load(private, key) is not None
    # A folder others can write into is not used (one warning), unless sharing is asked for.
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    for _ in range(2):
        encoding.encode_cached(tok, split, 64, names, loose)
    assert list(loose.iterdir()) == []
    warning = capsys.readouterr().err.strip()
    assert warning.count("warning: not using the token cache") == 1 and "\n" not in warning
    assert f"chmod 700 {loose}" in warning and f"{tokencache.SHARED_ENV}=1" in warning
    monkeypatch.setenv(tokencache.SHARED_ENV, "1")
    encoding.encode_cached(tok, split, 64, names, loose)
    assert tokencache.load(loose, key) is not None
    entry_mode = stat.S_IMODE(tokencache.entry_path(loose, key).stat().st_mode)
    assert entry_mode == fileio.FILE_MODE  # what the umask gives: readable by the team
    shared = tmp_path / "shared"
    encoding.encode_cached(tok, split, 64, names, shared)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777 & ~umask  # as the user's umask says
