"""What a user's first GPU day would meet (issue 38), checked on the CPU.

No GPU runs these: each fault is injected at its narrowest seam on a real tiny model (the
optimizer's lazy state allocation, the model's forward raising what cuBLAS or an older
torch raises, the PATH a GPU tool is found on, torch's bf16 answer), and every retried
cell is compared, weight for weight, with a cell started where the retry ended.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import weakref

import pytest
import torch
from conftest import read_json

from encoder_eval.cells import cell_config, cell_state, devices, resume, train
from encoder_eval.cells.encoding import Encoded, encode
from encoder_eval.cells.kinds import KINDS, pad_features
from encoder_eval.core import comparability
from encoder_eval.core import device as gpu
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import result_filename, validate_result
from encoder_eval.data.loaders import load_model
from encoder_eval.data.task_loading import load_task

SHORT = Recipe(max_steps=6, patience=3, max_seq_len=128)


def _cell(root, tiny_models, small_mirror, name: str, **recipe) -> cell_config.CellConfig:
    (root / name).mkdir()
    return cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4, seed=45, model_key="tiny",
        recipe=dataclasses.replace(SHORT, **recipe), device="cpu", progress="quiet",
        data_dir=str(small_mirror), out_json=str(root / name / result_filename(
            "tiny", "glue_rte", 1e-4, 45)),
    )  # fmt: skip


def _models(monkeypatch, forward_fault=None) -> list[torch.nn.Module]:
    """The models the cells load (kept, to compare their final weights), each forward going
    through `forward_fault(model, rows)` first when given."""
    models, real_load = [], train.load_model

    def load(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        model, forward = loaded.model, loaded.model.forward
        if forward_fault is not None:

            def faulty(*a, **kw):
                forward_fault(model, kw["input_ids"].shape[0])
                return forward(*a, **kw)

            model.forward = faulty
        models.append(model)
        return loaded

    monkeypatch.setattr(train, "load_model", load)
    return models


@pytest.fixture(scope="module")
def reference(tiny_models, small_mirror, tmp_path_factory):
    """A cell started at micro-batch 8 (accumulation 4): what every retried cell must equal."""
    root = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as m:
        models = _models(m)
        result = train.run_cell(_cell(root, tiny_models, small_mirror, "ref", micro_batch=8))
    (model,) = models
    return result, model


def _same_cell(result: dict, model: torch.nn.Module, reference) -> None:
    ref_result, ref_model = reference
    training = result["training"]
    assert result["status"] == "ok" and training["steps"] == 6
    assert training["micro_batch_used"] == 8 and training["grad_accumulation_used"] == 4
    assert training["final_loss"] == ref_result["training"]["final_loss"]
    assert training["dev_history"] == ref_result["training"]["dev_history"]
    assert result["report"]["per_language"] == ref_result["report"]["per_language"]
    ours, theirs = model.state_dict(), ref_model.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


# ----------------------------------------------------------------------------- item 1, 2


def test_out_of_memory_in_the_first_optimizer_step_is_retried_and_changes_nothing(
    tiny_models, small_mirror, tmp_path, monkeypatch, capsys, reference
):
    # AdamW allocates its state at the first step: the first group's state is allocated,
    # then the device is full (nothing was updated yet).
    real_init, calls = torch.optim.AdamW._init_group, []

    def init_group(self, group, *args, **kwargs):
        out = real_init(self, group, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.8 GiB")
        return out

    monkeypatch.setattr(torch.optim.AdamW, "_init_group", init_group)
    models = _models(monkeypatch)
    cfg = _cell(tmp_path, tiny_models, small_mirror, "opt", micro_batch=16)
    result = train.run_cell(cfg)

    assert validate_result(read_json(cfg.out_json)) == []
    assert result["training"]["oom_retries"] == 1
    assert "out of memory in the optimizer step at step 1 with a micro-batch of 16; " \
        "retrying the step with 8" in capsys.readouterr().err  # fmt: skip
    _same_cell(result, models[0], reference)
    assert all(p.grad is None for p in models[0].parameters())  # freed after the last step


def test_an_optimizer_step_that_updated_weights_before_running_out_is_not_retried(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    # The first group is updated, then the second group's state does not fit: a retry
    # would update the first group twice.
    real_init, calls = torch.optim.AdamW._init_group, []

    def init_group(self, group, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real_init(self, group, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "_init_group", init_group)
    cfg = _cell(tmp_path, tiny_models, small_mirror, "half", micro_batch=16)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        train.run_cell(cfg)
    (note,) = raised.value.__notes__
    assert "after it had updated some of the weights, so the step cannot be retried" in note
    assert not os.path.exists(cfg.out_json)


def _oom_above_8_rows(error: BaseException):
    def fault(model, rows):
        if model.training and rows > 8:
            raise error

    return fault


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "HIP error: hipErrorOutOfMemory",
    ],
)
def test_an_out_of_memory_reported_as_a_runtime_error_is_retried(
    message, tiny_models, small_mirror, tmp_path, monkeypatch, reference
):
    models = _models(monkeypatch, _oom_above_8_rows(RuntimeError(message)))
    result = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "rt", micro_batch=16))
    assert result["training"]["oom_retries"] == 1
    _same_cell(result, models[0], reference)


def test_the_out_of_memory_path_works_on_a_torch_without_torch_out_of_memory_error(
    tiny_models, small_mirror, tmp_path, monkeypatch, reference
):
    # torch 2.4 (pyproject's floor) has torch.cuda.OutOfMemoryError only.
    error = torch.cuda.OutOfMemoryError("CUDA out of memory (torch 2.4)")
    monkeypatch.delattr(torch, "OutOfMemoryError")
    models = _models(monkeypatch, _oom_above_8_rows(error))
    result = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "t24", micro_batch=16))
    assert result["training"]["oom_retries"] == 1
    _same_cell(result, models[0], reference)


def test_an_error_that_is_not_out_of_memory_is_never_retried(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    _models(monkeypatch, _oom_above_8_rows(RuntimeError("CUDA error: device-side assert")))
    with pytest.raises(RuntimeError, match="device-side assert") as raised:
        train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "assert", micro_batch=16))
    assert not getattr(raised.value, "__notes__", None)
    assert not gpu.is_out_of_memory(RuntimeError("CUDA error: device-side assert triggered"))
    assert gpu.is_out_of_memory(torch.cuda.OutOfMemoryError("x"))


# ----------------------------------------------------------------------------- item 3


def test_a_cell_leaves_nothing_in_memory_when_it_returns(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    # The first model a process loads is caught in a reference cycle (a traceback of
    # transformers' lazy import holds a frame that holds it): made here the same way, since
    # that happens once per process, and this process has loaded models already.
    refs, real_load = [], train.load_model

    def caught_in_a_cycle(model: torch.nn.Module) -> None:
        try:
            raise ImportError("lazy import")
        except ImportError as exc:
            kept = exc  # noqa: F841  (exc -> traceback -> this frame -> kept, and model)

    def load(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        refs.append(weakref.ref(loaded.model))
        caught_in_a_cycle(loaded.model)
        return loaded

    monkeypatch.setattr(train, "load_model", load)
    was_enabled = gc.isenabled()
    gc.disable()  # only what the cell frees itself is freed
    try:
        train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "leak"))
        (ref,) = refs
        assert ref() is None, "the cell's model outlived its cell"
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak GPU memory needs a GPU")
def test_a_second_cell_on_a_gpu_peaks_where_the_first_did(tiny_models, small_mirror, tmp_path):
    peaks = []
    for name in ("first", "second"):
        cfg = dataclasses.replace(_cell(tmp_path, tiny_models, small_mirror, name), device="cuda")
        peaks.append(train.run_cell(cfg)["training"]["peak_memory_bytes"])
    assert peaks[0] == peaks[1]


# ----------------------------------------------------------------------------- item 4


def _gpu_free_environment(monkeypatch, tmp_path, tools: dict[str, str]) -> None:
    """No GPU variable set, and PATH holding only the fake `tools` (name -> its output)."""
    for name in gpu.GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, output in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(gpu, "_WARNED", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_on_the_cpu_says_so_when_nvidia_smi_lists_a_gpu(monkeypatch, tmp_path, capsys):
    line = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)"
    _gpu_free_environment(monkeypatch, tmp_path, {"nvidia-smi": line})
    assert devices.resolve_device("auto") == torch.device("cpu")
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith("warning: --device auto found no usable GPU")
    assert "nvidia-smi lists GPU 0: NVIDIA H100 80GB HBM3" in warning
    assert "docs/install.md" in warning and "--device cuda makes this an error" in warning
    with pytest.raises(HarnessError, match="although nvidia-smi lists GPU 0"):
        devices.resolve_device("cuda")


@pytest.mark.parametrize(
    "variable, value", [("SLURM_JOB_GPUS", "0,1"), ("CUDA_VISIBLE_DEVICES", "0")]
)
def test_auto_on_the_cpu_says_so_when_the_scheduler_allocated_a_gpu(
    variable, value, monkeypatch, tmp_path, capsys
):
    _gpu_free_environment(monkeypatch, tmp_path, {})
    monkeypatch.setenv(variable, value)
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert f"although {variable}={value};" in capsys.readouterr().err


def test_auto_on_a_machine_without_a_gpu_is_silent(monkeypatch, tmp_path, capsys):
    _gpu_free_environment(monkeypatch, tmp_path, {"nvidia-smi": "No devices were found"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hidden on purpose: not a GPU request
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert gpu.expected_gpu() is None
    assert capsys.readouterr().err == ""


def test_rocm_make_install_stops_before_installing_pypis_cuda_torch(tmp_path):
    import subprocess

    from conftest import REPO

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rocm-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "rocm-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    venv = tmp_path / "venv"
    run = subprocess.run(
        ["make", "-s", "install", f"VENV={venv}"], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0
    assert "rocm-smi" in run.stderr and "docs/install.md" in run.stderr
    assert "TORCH_ROCM=" in run.stderr
    assert not venv.exists()  # stopped before creating anything


# ----------------------------------------------------------------------------- item 5


def test_bf16_autocast_is_refused_on_a_gpu_without_bf16(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    with pytest.raises(HarnessError, match="Tesla V100-SXM2-16GB cannot run bf16 autocast"):
        devices.check_bf16(torch.device("cuda", 0), "bf16-autocast")
    devices.check_bf16(torch.device("cuda", 0), "fp32")  # fp32 needs nothing
    devices.check_bf16(torch.device("cpu"), "bf16-autocast")  # the CPU emulates it (cpu.py)
    assert capsys.readouterr().err == ""

    # A torch that emulates bf16 there: the cell runs, saying so once.
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    monkeypatch.setattr(devices, "_WARNED_BF16", set())
    for _ in range(2):
        devices.check_bf16(torch.device("cuda", 0), "bf16-autocast")
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: Tesla V100-SXM2-16GB has no native bf16: torch emulates")


def test_evaluation_runs_its_widest_batch_first_and_keeps_the_split_order(
    tiny_models, small_mirror
):
    loaded = load_model(str(tiny_models["bert"]), "auto", 2, "single_label_classification")
    _, dev_splits, *_ = load_task("glue_rte", str(small_mirror), with_test=False)
    split = next(iter(dev_splits.values()))
    enc = encode(loaded.tokenizer, split, 128, loaded.input_names)
    model, forward, widths = loaded.model, loaded.model.forward, []

    def recording(*a, **kw):
        widths.append(kw["input_ids"].shape[1])
        return forward(*a, **kw)

    model.forward = recording
    args = (model, enc, loaded.tokenizer.pad_token_id, torch.device("cpu"), "fp32")
    batched = cell_state.predict(*args, 4, KINDS["classification"])
    assert widths[0] == max(enc.lengths) and widths == sorted(widths, reverse=True)
    one_by_one = cell_state.predict(*args, 1, KINDS["classification"])
    assert batched == one_by_one  # each prediction back at its example's place


def test_the_best_weights_are_copied_into_the_earlier_copy(tiny_models):
    model = load_model(str(tiny_models["bert"]), "auto", 2, "single_label_classification").model
    st = resume.LoopState()
    train.keep_best_weights(st, model.state_dict())
    first = {k: v.data_ptr() for k, v in st.best_state.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    train.keep_best_weights(st, model.state_dict())
    assert {k: v.data_ptr() for k, v in st.best_state.items()} == first  # no second copy
    assert all(torch.equal(st.best_state[k], v) for k, v in model.state_dict().items())


# ----------------------------------------------------------------------------- item 6


def test_a_step_leaves_its_loss_on_the_device_and_divergence_is_still_found_at_its_step(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    # Today's reference: the same cell, its losses per step.
    returned, real = [], train._accumulate

    def accumulate(*args, **kwargs):
        loss, tokens = real(*args, **kwargs)
        returned.append(loss)
        return loss, tokens

    monkeypatch.setattr(train, "_accumulate", accumulate)
    normal = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "normal"))
    # No host read per step: the step hands back a tensor, read in batches later.
    assert returned and all(isinstance(loss, torch.Tensor) for loss in returned)

    # The loss of step 5 (no evaluation there, so not read at once) is not finite.
    def poisoned(*args, **kwargs):
        loss, tokens = real(*args, **kwargs)
        returned.append(loss)
        return (loss * math.nan if len(returned) == 5 else loss), tokens

    returned.clear()
    monkeypatch.setattr(train, "_accumulate", poisoned)
    cfg = _cell(tmp_path, tiny_models, small_mirror, "nan")
    result = train.run_cell(cfg)
    assert validate_result(read_json(cfg.out_json)) == []
    training = result["training"]
    assert result["status"] == "diverged" and training["diverged_at_step"] == 5
    assert training["steps"] == 4 and training["stopped_by"] == "diverged"
    # What it recorded is what the normal run had at step 4.
    evaluated = [h for h in normal["training"]["dev_history"] if h["step"] <= 4]
    assert training["dev_history"] == evaluated
    assert evaluated, "the test needs an evaluation before the poisoned step"
    assert training["final_loss"] == pytest.approx(float(returned[3]), abs=0)


def test_a_split_becomes_arrays_once_and_batches_match_the_lists(tiny_models, small_mirror):
    loaded = load_model(str(tiny_models["bert"]), "auto", 2, "single_label_classification")
    split = load_task("glue_rte", str(small_mirror), with_test=False)[0]
    enc = encode(loaded.tokenizer, split, 128, loaded.input_names)
    assert enc.packed() is enc.packed()
    pad = loaded.tokenizer.pad_token_id
    for idx in ([0], [3, 1, 2], list(range(len(enc.lengths)))[::-1][:17]):
        width = max(enc.lengths[i] for i in idx)
        batch = pad_features(enc, idx, pad)
        for name, seqs in enc.features.items():
            fill = pad if name == "input_ids" else 0
            rows = [seqs[i] + [fill] * (width - len(seqs[i])) for i in idx]
            assert batch[name].dtype == torch.long and batch[name].tolist() == rows
    assert pad_features(Encoded({"input_ids": [[5, 2**40]]}, [0], [2]), [0], 0)[
        "input_ids"
    ].tolist() == [[5, 2**40]]  # ids beyond int32 kept whole


# ----------------------------------------------------------------------------- item 9


def test_the_attention_implementation_is_recorded_and_compared(reference):
    result, _ = reference
    assert result["recipe"]["attn_implementation"] == "sdpa"
    assert result["provenance"]["hardware"]["device"] == "cpu"
    assert result["provenance"]["hardware"]["device_requested"] == "cpu"
    flash = {**result, "recipe": {**result["recipe"], "attn_implementation": "flash_attention_2"}}
    older = {**result, "recipe": {k: v for k, v in result["recipe"].items()
                                  if k != "attn_implementation"}}  # fmt: skip
    setup = comparability.cell_setup(result)
    assert comparability.setup_differences(comparability.cell_setup(flash), setup, "has") == [
        "attn_implementation flash_attention_2 (has sdpa)"
    ]
    # A result written before it was recorded is still valid and compares on the rest.
    assert validate_result(older) == []
    assert comparability.setup_differences(comparability.cell_setup(older), setup, "has") == []
    assert comparability.setup_differences(setup, comparability.cell_setup(older), "has") == []
    bad = {**result, "recipe": {**result["recipe"], "attn_implementation": 3}}
    assert validate_result(bad) == ["recipe.attn_implementation is 3, not a string or null"]


# ----------------------------------------------------------------------------- issue 40, 12


def test_a_cell_says_what_it_does_before_its_first_step(
    tiny_models, small_mirror, tmp_path, capsys
):
    import json

    cfg = dataclasses.replace(_cell(tmp_path, tiny_models, small_mirror, "beat"), progress="json")
    train.run_cell(cfg)
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    stages = [x["stage"] for x in lines if "stage" in x]
    assert stages[0].startswith("loading model ") and stages[0].endswith("onto cpu")
    assert stages[1].startswith("tokenising ") and " training and " in stages[1]
    assert stages[2].startswith("training: 6 steps of 32")
    assert stages[3].startswith("step 1 done, loss ")
    assert all(x["cell"] == "tiny/glue_rte/lr10/s45" for x in lines)
    first_score = next(i for i, x in enumerate(lines) if "dev" in x)
    assert lines.index(next(x for x in lines if x.get("stage", "").startswith("step 1"))) < (
        first_score
    )

    quiet = dataclasses.replace(_cell(tmp_path, tiny_models, small_mirror, "still"))
    train.run_cell(quiet)
    assert "loading model" not in capsys.readouterr().err


def test_the_ranking_budgets_on_a_gpu_shrink_with_the_model():
    from types import SimpleNamespace

    from encoder_eval.cells import kinds

    def body(hidden: int, layers: int):
        model = torch.nn.Linear(1, 1)
        model.config = SimpleNamespace(hidden_size=hidden, num_hidden_layers=layers)
        return model

    base = (kinds.RANK_CHUNK_TOKENS["cuda"], kinds.RANK_PIECE_TOKENS["cuda"])
    assert kinds.rank_budgets("cuda", body(768, 12)) == base
    assert kinds.rank_budgets("cuda", body(384, 6)) == base  # never above the table's
    chunk, piece = kinds.rank_budgets("cuda", body(2560, 36))  # XLM-R XL: a tenth
    assert (chunk, piece) == (base[0] * 9216 // 92160, base[1] * 9216 // 92160)
    cpu = (kinds.RANK_CHUNK_TOKENS["cpu"], kinds.RANK_PIECE_TOKENS["cpu"])
    assert kinds.rank_budgets("cpu", body(2560, 36)) == cpu  # measured there as it is
