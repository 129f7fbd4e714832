"""A ranking step in bounded memory (issue 26, item 1): the ranking kinds cut a training
batch into chunks of whole query groups, each forwarded in length-sorted pieces, and must
compute the same loss and the same gradients as the whole batch forwarded at once."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_small_mirror

from encoder_eval.cells import batching, cell_config, encoding, kinds, train
from encoder_eval.core.problems import RANKING
from encoder_eval.core.protocol import Recipe
from encoder_eval.data.loaders import load_model
from encoder_eval.data.task_loading import load_task

RANK_MIRROR = {"ms_marco": {"train.jsonl": 200, "validation.jsonl": 60}}
MAX_LEN = 64


@pytest.fixture(scope="module")
def rank_mirror(tmp_path_factory) -> Path:
    return write_small_mirror(tmp_path_factory.mktemp("rank_mem_mirror"), RANK_MIRROR)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model("bert", tmp_path_factory.mktemp("rank_mem_model") / "bert",
                            num_labels=None)  # fmt: skip


def fp32() -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", enabled=False)


def setup(tiny_bert: Path, rank_mirror: Path, objective: str, groups: int):
    """The tiny model and a real ranking batch of `groups` query groups (20 candidates each)."""
    recipe = Recipe(max_seq_len=MAX_LEN, rank_objective=objective)
    kind = kinds.kind_for(RANKING, recipe)
    loaded = load_model(str(tiny_bert), "auto", 1, kind.problem)
    split = load_task("ms_marco", rank_mirror)[0]
    enc = encoding.encode(loaded.tokenizer, split, MAX_LEN, loaded.input_names)
    enc = kinds.with_rank_columns(enc, split)
    units = kind.units(enc, random.Random(45), recipe)[:groups]
    # Shorten some groups so that groups of unequal size share a batch.
    units[1] = units[1][:7]
    return kind, loaded, enc, units


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def set_budgets(monkeypatch, chunk: int, piece: int) -> None:
    monkeypatch.setitem(kinds.RANK_CHUNK_TOKENS, "cpu", chunk)
    monkeypatch.setitem(kinds.RANK_PIECE_TOKENS, "cpu", piece)


@pytest.mark.parametrize("objective", ["listwise", "pointwise"])
@pytest.mark.parametrize(
    ("chunk", "piece"),
    [(10**9, 10**9), (2000, 300), (2000, 64), (100, 200)],
    ids=["one-piece", "chunks-and-pieces", "one-row-pieces", "recomputed-groups"],
)
def test_the_bounded_step_gives_the_whole_batch_loss_and_gradients(
    objective, chunk, piece, tiny_bert, rank_mirror, monkeypatch
):
    kind, loaded, enc, units = setup(tiny_bert, rank_mirror, objective, groups=5)
    model = loaded.model.eval()  # no dropout: both sides compute the same function
    batch = kind.collate_units(enc, units, loaded.tokenizer.pad_token_id, "cpu")
    # The reference: the whole batch at once, the kind's loss, scaled as a micro-batch is.
    ref_batch = dict(batch)
    labels = ref_batch.pop("labels")
    ref = kind.loss(model(**ref_batch).logits, labels) * 0.5
    ref.backward()
    ref = ref.detach()
    want = grads(model)
    model.zero_grad(set_to_none=True)

    set_budgets(monkeypatch, chunk, piece)
    calls = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    got = kind.train_step(model, dict(batch), 0.5, fp32)
    hook.remove()
    print(f"{objective}: chunk {chunk}, piece {piece}: forwards {calls}; loss {float(got)} "
          f"against {float(ref)}")  # fmt: skip
    assert float(got) == pytest.approx(float(ref), abs=1e-5)
    have = grads(model)
    assert have.keys() == want.keys()
    for name, g in want.items():
        assert torch.allclose(have[name], g, atol=1e-5, rtol=1e-4), name
    # Every forward stays within the piece budget (a row longer than it goes alone), and
    # together they forward every pair once (twice where a group is recomputed).
    for rows, width in calls:
        assert rows * width <= piece or rows == 1
    pairs = batch["input_ids"].shape[0]
    assert sum(rows for rows, _ in calls) == pairs * (2 if chunk < MAX_LEN * 20 else 1)
    if chunk == 10**9:
        assert calls == [tuple(batch["input_ids"].shape[:1]) + (max(
            enc.lengths[i] for u in units for i in u),)]  # fmt: skip


def test_recomputed_pieces_replay_the_same_dropout(tiny_bert, rank_mirror, monkeypatch):
    """In training mode (dropout on), a group recomputed in the backward gets the gradient
    of the very forward whose loss was taken: the same as without recomputation."""
    kind, loaded, enc, units = setup(tiny_bert, rank_mirror, "listwise", groups=3)
    model = loaded.model.train()
    batch = kind.collate_units(enc, units, loaded.tokenizer.pad_token_id, "cpu")
    results = []
    # One group a chunk both times (the same pieces, so the same dropout draws): within the
    # budget, activations stored; over it, every group recomputed in the backward.
    group_tokens = [sum(enc.lengths[i] for i in u) for u in units]
    assert sum(group_tokens[:2]) > max(group_tokens)
    for chunk in (max(group_tokens), 100):
        set_budgets(monkeypatch, chunk, 300)
        torch.manual_seed(7)
        loss = kind.train_step(model, dict(batch), 1.0, fp32)
        results.append((float(loss), grads(model)))
        model.zero_grad(set_to_none=True)
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    for name, g in grads_a.items():
        assert torch.allclose(grads_b[name], g, atol=1e-6), name


def test_a_ranking_cell_forwards_bounded_pieces(tiny_bert, rank_mirror, monkeypatch, tmp_path):
    """A whole cell: every training forward holds at most the piece budget of padded tokens,
    where the loop used to forward a micro-batch of whole groups at once."""
    set_budgets(monkeypatch, 1500, 256)
    recipe = Recipe(max_steps=2, batch_size=4, max_seq_len=MAX_LEN)
    kind = kinds.kind_for(RANKING, recipe)
    loaded = load_model(str(tiny_bert), "auto", 1, kind.problem)
    shapes = []

    def record(module, args, kw):
        if module.training:
            shapes.append(tuple(kw["input_ids"].shape))

    loaded.model.register_forward_pre_hook(record, with_kwargs=True)
    cfg = cell_config.CellConfig(model_path=str(tiny_bert), task="ms_marco", lr=1e-4, seed=45,
                           model_key="tiny", recipe=recipe, data_dir=str(rank_mirror),
                           device="cpu", progress="quiet", phase="select", cache_dir=None)  # fmt: skip
    result = train.run_cell(cfg, loaded=loaded)
    assert result["status"] == "ok" and result["training"]["steps"] == 2
    print(f"training forwards: {shapes}")
    assert shapes and all(rows * width <= 256 or rows == 1 for rows, width in shapes)
    # Every pair of the two batches the cell drew (its data draws are seeded), once.
    split = load_task("ms_marco", rank_mirror)[0]
    enc = kinds.with_rank_columns(encoding.encode(loaded.tokenizer, split, MAX_LEN,
                                               loaded.input_names), split)  # fmt: skip
    drawn = batching.epoch_batches(enc, kind, recipe, random.Random(45))[:2]
    assert sum(rows for rows, _ in shapes) == sum(len(u) for b in drawn for u in b)


def test_chunk_and_piece_cutting():
    assert kinds._by_budget([5, 5, 5, 20, 1], 10) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert kinds._by_budget([], 10) == []
    # Longest first; a piece's padded size (rows x its longest row) stays within the budget.
    assert kinds._pieces([3, 9, 4, 30, 8], 20) == [[3], [1, 4], [2, 0]]
    assert dataclasses.is_dataclass(kinds.KINDS["ranking"])


HEAP_SCRIPT = """
import os
from encoder_eval.core import heap

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

blocks = [bytearray(100_000) for _ in range(3000)]  # 300 MB, each under the mmap threshold
del blocks[:-1]  # all freed but the last, which pins the heap's top
before = rss()
trimmed = heap.release_free_heap()
print(trimmed, before, rss())
"""


BLOCKS_SCRIPT = """
import resource, sys
import numpy as np
from encoder_eval.core import heap

kept = heap.keep_large_blocks() if sys.argv[1] == "keep" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for size in [2_000_000, 1_500_000, 2_500_000] * 10:  # a few batch sizes, as resampling
    a = np.ones(size)
    b = a * 2.0
    del a, b
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_kept_large_blocks_are_not_faulted_in_again():
    """What the resampling statistics do (`verdicts.compute_rows`): with the thresholds
    raised, arrays of 12-20 MB allocated and freed in turn reuse the heap instead of
    page-faulting fresh mappings every time."""
    import subprocess

    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", BLOCKS_SCRIPT, mode], capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
        return out[0], int(out[1])

    (_, default), (kept, keep) = faults("default"), faults("keep")
    print(f"minor page faults: {default} by default, {keep} with the blocks kept")
    assert kept == "True"
    assert keep * 4 < default


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux's /proc")
def test_freed_heap_goes_back_to_the_system():
    """What a ranking step on the CPU does after each chunk: glibc keeps freed heap memory
    resident until malloc_trim returns it (here 300 MB freed under a live block)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", HEAP_SCRIPT], capture_output=True, text=True,
                          check=True)  # fmt: skip
    trimmed, before, after = proc.stdout.split()
    print(f"resident before {int(before) / 1e6:.0f} MB, after the trim {int(after) / 1e6:.0f} MB")
    assert trimmed == "True"
    assert int(before) - int(after) > 200e6


def test_the_ranking_step_trims_the_heap_after_each_chunk(tiny_bert, rank_mirror, monkeypatch):
    from encoder_eval.core import heap

    calls = []
    real = heap.release_free_heap
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append(1) or real())
    set_budgets(monkeypatch, 2000, 300)
    kind, loaded, enc, units = setup(tiny_bert, rank_mirror, "listwise", 6)
    batch = kind.collate_units(enc, units, loaded.tokenizer.pad_token_id, torch.device("cpu"))
    group_tokens = [sum(enc.lengths[i] for i in u) for u in units]
    kind.train_step(loaded.model, batch, 1.0, fp32)
    assert len(calls) == len(kinds._by_budget(group_tokens, 2000)) > 1


def without_cache_variable(monkeypatch) -> str:
    """Unset oneDNN's cache variable for this test (restored after it)."""
    from encoder_eval.core import heap

    monkeypatch.setenv(heap.PRIMITIVE_CACHE_VARIABLE, "unset")
    monkeypatch.delenv(heap.PRIMITIVE_CACHE_VARIABLE)
    return heap.PRIMITIVE_CACHE_VARIABLE


def test_the_primitive_cache_cap_keeps_a_users_value(monkeypatch):
    from encoder_eval.core import heap

    name = without_cache_variable(monkeypatch)
    assert heap.limit_primitive_cache() == str(heap.PRIMITIVE_CACHE_CAPACITY)
    monkeypatch.setenv(name, "512")
    assert heap.limit_primitive_cache() == "512"


def test_the_command_line_and_the_cell_cap_the_primitive_cache(tiny_bert, rank_mirror, monkeypatch):
    """Both ways into a cell set the cap before the cell's first matmul: every command
    (`encoder-eval ...`) and `run_cell` called as a library."""
    from encoder_eval import cli
    from encoder_eval.core import heap

    name = without_cache_variable(monkeypatch)
    assert cli.main(["list", "tasks"]) == 0
    assert os.environ[name] == str(heap.PRIMITIVE_CACHE_CAPACITY)

    monkeypatch.delenv(name)
    recipe = Recipe(max_steps=1, batch_size=2, max_seq_len=MAX_LEN)
    cfg = cell_config.CellConfig(model_path=str(tiny_bert), task="ms_marco", lr=1e-4, seed=45,
                           model_key="tiny", recipe=recipe, data_dir=str(rank_mirror),
                           device="cpu", progress="quiet", phase="select", cache_dir=None)  # fmt: skip
    seen = []
    real = train._run_cell
    monkeypatch.setattr(
        train, "_run_cell", lambda *a: seen.append(os.environ.get(name)) or real(*a)
    )
    assert train.run_cell(cfg)["status"] == "ok"
    assert seen == [str(heap.PRIMITIVE_CACHE_CAPACITY)]


CACHE_SCRIPT = """
import sys
import torch  # imported first, as in a cell: oneDNN reads the variable at its first kernel
from encoder_eval.core import heap
if sys.argv[1] == "capped":
    heap.limit_primitive_cache()
w = torch.randn(64, 64, dtype=torch.bfloat16)
xs = [torch.randn(8 + i, 64, dtype=torch.bfloat16) for i in range(heap.PRIMITIVE_CACHE_CAPACITY + 8)]
for _ in range(2):  # every shape twice: the second pass finds its kernel only in a big cache
    for x in xs:
        x @ w
"""


@pytest.mark.parametrize("variant", ["capped", "default"])
def test_onednn_keeps_at_most_the_capped_number_of_kernels(variant, monkeypatch):
    """oneDNN's own account (its verbose log): with the cap, a second pass over more
    shapes than the cap holds finds none of their kernels cached; without it, all."""
    import subprocess
    import sys

    without_cache_variable(monkeypatch)
    env = {**os.environ, "ONEDNN_VERBOSE": "2"}
    proc = subprocess.run([sys.executable, "-c", CACHE_SCRIPT, variant], capture_output=True,
                          text=True, check=True, env=env)  # fmt: skip
    created = [line for line in proc.stdout.splitlines() if ",primitive,create:cache_" in line]
    if not created:
        why = "this CPU's bf16 matmuls do not run through oneDNN (no AVX-512)"
        if os.environ.get("ENCODER_EVAL_REQUIRE_AVX512") == "1":  # a machine known to have it
            pytest.fail(f"ENCODER_EVAL_REQUIRE_AVX512=1 but {why}")
        pytest.skip(why)
    hits = sum(",create:cache_hit," in line for line in created)
    print(f"{variant}: {len(created)} kernels asked for, {hits} found in the cache")
    shapes = len(created) // 2
    assert hits == (0 if variant == "capped" else shapes)
