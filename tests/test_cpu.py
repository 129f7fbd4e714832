"""Native bf16 on the CPU: detection from /proc/cpuinfo, and the one warning a cell gives
before its first step when bf16 autocast would be emulated (issue 29, item 1)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import read_json

from encoder_eval.cells import cell_config, train
from encoder_eval.core import cpu
from encoder_eval.core.protocol import Recipe
from encoder_eval.core.results import result_filename

# Trimmed from real /proc/cpuinfo files.
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
LAPTOP_AVX2 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM) i7-10510U CPU @ 1.80GHz
flags\t\t: fpu vme sse sse2 avx avx2 fma f16c bmi2
"""
ZEN4_AVX512_BF16_ONLY = "flags\t\t: avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
# avx512bf16 without the underscore is not the kernel's spelling: not a match
LOOKALIKE = "flags\t\t: avx2 avx512bf16 amx_bf16x\n"
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16
CPU implementer\t: 0x41
"""


@pytest.mark.parametrize(
    "text, expected",
    [(SAPPHIRE_RAPIDS, True), (LAPTOP_AVX2, False), (ZEN4_AVX512_BF16_ONLY, True),
     (LOOKALIKE, False), (ARM, None), ("", None)],
)  # fmt: skip
def test_native_bf16_from_cpuinfo(text, expected):
    assert cpu.native_bf16_from_cpuinfo(text) is expected


def test_the_warning_names_the_slowdown_and_fp32(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: False)
    line = cpu.slow_bf16_warning("cpu", "bf16-autocast")
    assert line.startswith("warning: ") and "\n" not in line
    assert "5-8x slower than fp32" in line and "--precision fp32" in line
    assert "off-protocol" in line
    assert cpu.slow_bf16_warning("cpu", "fp32") is None
    assert cpu.slow_bf16_warning("cuda", "bf16-autocast") is None
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: True)
    assert cpu.slow_bf16_warning("cpu", "bf16") is None


def test_cpu_native_bf16_is_a_bool_decided_once():
    assert isinstance(cpu.cpu_native_bf16(), bool)
    assert cpu.cpu_native_bf16.cache_info().currsize == 1


SHORT = Recipe(max_steps=2, patience=3, max_seq_len=64)


def _cell(tmp_path, model_path, mirror, recipe=SHORT, seed=45) -> cell_config.CellConfig:
    return cell_config.CellConfig(
        model_path=str(model_path), task="glue_rte", lr=1e-4, seed=seed, model_key="tiny",
        recipe=recipe, device="cpu", progress="quiet", data_dir=str(mirror),
        out_json=str(tmp_path / result_filename("tiny", "glue_rte", 1e-4, seed)),
    )  # fmt: skip


@pytest.mark.parametrize("native", [False, True])
def test_a_cell_warns_once_before_training_without_native_bf16(
    native, monkeypatch, capsys, tiny_models, small_mirror, tmp_path
):
    monkeypatch.setattr(cpu, "cpu_native_bf16", lambda: native)
    monkeypatch.setattr(cpu, "_WARNED", set())
    started, real_train = [], train._train

    def train_after_noting_stderr(*args):
        started.append(capsys.readouterr().err)
        return real_train(*args)

    monkeypatch.setattr(train, "_train", train_after_noting_stderr)
    result = train.run_cell(_cell(tmp_path, tiny_models["bert"], small_mirror))
    warned = [ln for ln in started[0].splitlines() if "no native bf16" in ln]
    assert len(warned) == (0 if native else 1)  # printed before the first step
    assert result["provenance"]["hardware"]["cpu_native_bf16"] is native
    assert read_json(tmp_path / result_filename("tiny", "glue_rte", 1e-4, 45))["provenance"][
        "hardware"]["cpu_native_bf16"] is native  # fmt: skip
    # a second cell of the same process does not repeat it; an fp32 cell never warns
    train.run_cell(_cell(tmp_path, tiny_models["bert"], small_mirror, seed=46))
    fp32 = dataclasses.replace(SHORT, precision="fp32")
    train.run_cell(_cell(tmp_path, tiny_models["bert"], small_mirror, recipe=fp32, seed=47))
    assert "no native bf16" not in capsys.readouterr().err
