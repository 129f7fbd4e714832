"""Bad input, one test per case: every command exits non-zero with exactly one stderr line,
`error: ...`, naming the problem and the fix, and writes nothing.

Each case runs the command as a user would (a subprocess). "Writes nothing" is checked on
the whole test directory, hidden files included: the output and results directories, the
inputs, everything. Two cases need permission bits to stop the command; the tests run as
root, so those run it without root's CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fault_helpers import (
    _drop_dac_capabilities,
    _permissions_problem,
    env,
    skip_without_permission_bits,
    snapshot,
)
from result_helpers import make_result, write_result

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import result_filename


@dataclass
class Ctx:
    """Paths a case builds its command from; `root` is the directory that must not change."""

    root: Path
    bert: Path
    mirror: Path
    remote: Path  # a tiny model whose architecture is remote code
    extra_env: dict = field(default_factory=dict)
    restricted: bool = False  # run the command without root's permission override

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def results(self) -> Path:
        return self.root / "results"

    def cell(self, *override: str, drop: tuple[str, ...] = ()) -> list[str]:
        """A valid `run` command line, with flags replaced by `override` or dropped."""
        args = {
            "--model-path": str(self.bert), "--model-key": "tiny", "--task": "glue_rte",
            "--lr": "1.67e-05", "--seed": "45", "--data-dir": str(self.mirror),
            "--device": "cpu", "--max-steps": "3", "--max-seq-len": "128",
            "--out-json": str(self.out / "cell.json"), "--progress": "quiet",
        }  # fmt: skip
        extra = []
        i = 0
        while i < len(override):
            flag = override[i]
            takes = i + 1 < len(override) and not override[i + 1].startswith("--")
            if flag in args or takes:
                args[flag] = override[i + 1] if takes else ""
                i += 2
            else:
                extra.append(flag)
                i += 1
        line = ["encoder_eval.run"]
        for flag, value in args.items():
            if flag not in drop:
                line += [flag] + ([value] if value != "" else [])
        return line + extra

    def sweep(self, *args: str) -> list[str]:
        return ["encoder_eval.sweep", "--out-dir", str(self.root / "runs"),
                "--results-dir", str(self.results), *args]  # fmt: skip


def _model_copy(ctx: Ctx, name: str) -> Path:
    dest = ctx.root / name
    shutil.copytree(ctx.bert, dest)
    return dest


def _decoder(ctx: Ctx) -> Path:
    """A tiny GPT-2 (a decoder, no encoder classification path) saved like a Hub checkpoint."""
    from transformers import GPT2Config, GPT2LMHeadModel

    dest = ctx.root / "tiny-gpt2"
    config = GPT2Config(vocab_size=1000, n_positions=128, n_embd=32, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(dest)
    for tok in ctx.bert.glob("*token*"):
        shutil.copy(tok, dest / tok.name)
    return dest


def _vision(ctx: Ctx) -> Path:
    """A tiny ViT with a text tokenizer: a checkpoint with no sequence-classification path."""
    from transformers import ViTConfig, ViTModel

    dest = ctx.root / "tiny-vit"
    ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, image_size=32, patch_size=16)).save_pretrained(dest)  # fmt: skip
    for tok in ctx.bert.glob("*token*"):
        shutil.copy(tok, dest / tok.name)
    return dest


def _mirror_with(ctx: Ctx, task: str, files: dict[str, str]) -> Path:
    mirror = ctx.root / "mirror"
    shutil.copytree(ctx.mirror / task, mirror / task)
    for name, text in files.items():
        (mirror / task / name).write_text(text)
    return mirror


def _template(ctx: Ctx, body: str) -> Path:
    path = ctx.root / "job.sh"
    path.write_text(body)
    return path


def _selection(ctx: Ctx, text: str) -> Path:
    path = ctx.root / "selection.json"
    path.write_text(text)
    return path


def _select_grid(ctx: Ctx) -> Path:
    for key in ("lr03", "lr06"):
        for seed in (42, 43):
            write_result(ctx.results, make_result("m", "glue_rte", key, seed, "select", 0.5))
    return ctx.results


def _read_only(ctx: Ctx) -> Path:
    ctx.out.chmod(0o555)
    return ctx.out


def _a_file(ctx: Ctx) -> Path:
    path = ctx.root / "a-file"
    path.write_text("not a directory\n")
    return path


def _unreadable_model(ctx: Ctx) -> Path:
    model = _model_copy(ctx, "locked-model")
    model.chmod(0)
    return model


def _good_selection(ctx: Ctx) -> Path:
    return _selection(ctx, json.dumps({"schema": "encoder-eval-selection", "version": 2,
                                       "pairs": {"m": {"glue_rte": {"lr_key": "lr06",
                                                                    "lr": LR_GRID["lr06"]}}}}))  # fmt: skip


def _report_grid(ctx: Ctx) -> Path:
    """Report results of two models on glue_rte at lr06, seeds 45-49, and the selection that
    names them (written beside): enough for summarize and compare to do all their work."""
    for model, score in (("m", 0.6), ("m2", 0.7)):
        for seed in range(45, 50):
            write_result(ctx.results, make_result(model, "glue_rte", "lr06", seed, "report",
                                                  score + seed / 1000))  # fmt: skip
    return ctx.results


def _report_args(ctx: Ctx, command: str) -> list[str]:
    pairs = {m: {"glue_rte": {"lr_key": "lr06", "lr": LR_GRID["lr06"]}} for m in ("m", "m2")}
    selection = _selection(ctx, json.dumps({"schema": "encoder-eval-selection", "version": 2,
                                            "pairs": pairs}))  # fmt: skip
    return [f"encoder_eval.{command}", "--results-dir", str(_report_grid(ctx)), "--selection",
            str(selection), "--allow-partial"]  # fmt: skip


# An output path root cannot write either: /proc takes no new file or folder.
PROC = "/proc/encoder-eval-test"

# id -> (build the command from a Ctx, regex the one error line must match)
CASES = {
    # --- run: the cell's identity
    "unknown-model-key": (lambda c: c.cell("--model-key", "xlm-r-bse", drop=("--model-path",)),
                          r"unknown model 'xlm-r-bse'\. Did you mean 'xlm-r-base'"),
    "unknown-task": (lambda c: c.cell("--task", "glue_rtee"),
                     r"unknown task 'glue_rtee'\. Did you mean 'glue_rte'"),
    "unknown-mode": (lambda c: c.cell("--mode", "bidirectional"),
                     r"--mode: invalid choice: 'bidirectional'.*--help"),
    "unknown-flag": (lambda c: c.cell("--learning-rate", "1e-5"),
                     r"unrecognized arguments: --learning-rate.*--help"),
    "misspelt-flag": (lambda c: c.cell("--seeds", "45", drop=("--seed",)),
                      r"arguments are required: --seed; --seeds: did you mean --seed\?.*--help"),
    "misspelt-optional-flag": (lambda c: c.cell("--skip-exisiting"),
                               r"unrecognized arguments: --skip-exisiting; --skip-exisiting: "
                               r"did you mean --skip-existing\?.*--help"),
    "lr-off-grid": (lambda c: c.cell("--lr", "2e-05"),
                    r"--lr 2e-05 is not on the protocol grid \(the nearest grid value is "
                    r"2\.15e-05, lr04\); use a grid value or pass --allow-off-protocol"),
    "lr-not-a-number": (lambda c: c.cell("--lr", "fast"),
                        r"--lr 'fast' is not a comma-separated list of numbers"),
    "lr-out-of-range": (lambda c: c.cell("--lr=1.5", "--allow-off-protocol", drop=("--lr",)),
                        r"not a usable learning rate \(0 < lr < 1\)"),
    "seed-outside-phase": (lambda c: c.cell("--seed", "42"),
                           r"--seed 42 is not a report seed \[45, 46, 47, 48, 49\]; use one of "
                           r"those or pass --allow-off-protocol"),
    "seed-negative": (lambda c: c.cell("--seed=-3", "--allow-off-protocol", drop=("--seed",)),
                      r"--seed -3 must be an integer from 0 to 4294967295"),
    "seed-beyond-32-bits": (lambda c: c.cell("--seed=4294967296", "--allow-off-protocol",
                                             drop=("--seed",)),
                            r"--seed 4294967296 must be an integer from 0 to 4294967295"),
    # --- run: the model
    "missing-model-dir": (lambda c: c.cell("--model-path", str(c.root / "no-such-model")),
                          r"model directory .*no-such-model' does not exist; check --model-path"),
    "unreadable-model-dir": (lambda c: c.cell("--model-path", str(_unreadable_model(c))),
                             r"model directory .*locked-model' is not readable; fix its "
                             r"permissions"),
    "not-a-model-dir": (lambda c: c.cell("--model-path", str(c.mirror)),
                        r"could not load the config of tiny: .*is it a Hugging Face model "
                        r"directory"),
    "decoder-model": (lambda c: c.cell("--model-path", str(_decoder(c))),
                      r"tiny is a decoder \(GPT2LMHeadModel\), not an encoder; this harness "
                      r"fine-tunes bidirectional encoders; to fine-tune a decoder-only model "
                      r"\(Llama, Qwen2, Gemma\) as an encoder, use --mode decoder-adapted"),
    "no-classification-path": (lambda c: c.cell("--model-path", str(_vision(c))),
                               r"could not load the model of tiny: Unrecognized configuration "
                               r"class .*ViTConfig"),
    "remote-code-without-trust": (lambda c: c.cell("--model-path", str(c.remote), "--task",
                                                   "sg_cb", "--no-trust-remote-code"),
                                  r"tiny needs trust_remote_code to load its config; pass "
                                  r"--trust-remote-code only if you trust its code \(and pin "
                                  r"--model-revision\)"),
    "max-seq-len-beyond-positions": (lambda c: c.cell("--max-seq-len", "512"),
                                     r"--max-seq-len 512 is beyond tiny's 128 positions; use "
                                     r"--max-seq-len 128 or less"),
    # --- run: the data
    "data-dir-without-task": (lambda c: c.cell("--data-dir", str(c.out)),
                              r"the data mirror has no train\.jsonl for task 'glue_rte'.*"
                              r"Copy the task's files into .*glue_rte/"),  # offline: no Hub
    "empty-task": (lambda c: c.cell("--data-dir", str(_mirror_with(c, "glue_rte",
                                                                     {"train.jsonl": ""}))),
                   r"task 'glue_rte': the train \(en\) split is empty; check its data"),
    "mirror-row-not-json": (lambda c: c.cell("--data-dir", str(_mirror_with(
                                c, "glue_rte", {"validation.jsonl": '{"sentence1": "a",\n'}))),
                            r"validation\.jsonl:1: invalid JSON"),  # fmt: skip
    "bad-dataset-revisions-env": (lambda c: (c.extra_env.update(
        ENCODER_EVAL_DATASET_REVISIONS="{nyu-mll/glue: abc}") or c.cell()),
        r"ENCODER_EVAL_DATASET_REVISIONS is not valid JSON .*set it to an object"),
    # --- run: the recipe
    "bsz-zero": (lambda c: c.cell("--bsz", "0"), r"--bsz must be at least 1"),
    "bsz-negative": (lambda c: c.cell("--bsz=-32", drop=()), r"--bsz must be at least 1"),
    "bsz-not-an-integer": (lambda c: c.cell("--bsz", "32.5"),
                           r"--bsz: invalid int value: '32\.5'"),
    "micro-batch-not-dividing": (lambda c: c.cell("--micro-batch", "5"),
                                 r"--micro-batch 5 must divide --bsz 32"),
    "max-steps-zero": (lambda c: c.cell("--max-steps", "0"), r"--max-steps must be at least 1"),
    "pad-multiple-zero": (lambda c: c.cell("--pad-multiple", "0"),
                          r"--pad-multiple must be at least 1"),
    "device-cuda-without-gpu": (lambda c: c.cell("--device", "cuda"),
                                r"--device cuda but no CUDA or ROCm GPU is visible to torch "
                                r".*, or use --device cpu"),
    # --- run: the outputs
    "out-json-under-a-file": (lambda c: c.cell("--out-json", str(_a_file(c) / "d" / "c.json")),
                              r"output directory .*a-file/d cannot be created: .*a-file is a "
                              r"file"),
    "out-json-in-read-only-dir": (lambda c: c.cell("--out-json", str(_read_only(c) / "c.json")),
                                  r"output directory .* is not writable \(Permission denied\); "
                                  r"choose another --out-json"),
    "results-dir-in-proc": (lambda c: c.cell("--results-dir", PROC, drop=("--out-json",)),
                            rf"--results-dir {PROC}: output directory {PROC} cannot be created "
                            r"in /proc \(.*\); choose another --results-dir$"),
    "results-dir-read-only": (lambda c: c.cell("--results-dir", str(_read_only(c)),
                                               drop=("--out-json",)),
                              r"--results-dir .*out: output directory .*out is not writable "
                              r"\(Permission denied\); choose another --results-dir$"),
    "out-json-for-several-seeds": (lambda c: c.cell("--seed", "45,46"),
                                   r"--out-json names one file; use --results-dir"),
    "results-dir-is-a-file": (lambda c: c.cell("--results-dir", str(_a_file(c)),
                                               drop=("--out-json",)),
                              r"output directory .*a-file cannot be created: .*a-file is a "
                              r"file"),
    # --- sweep
    "sweep-unknown-lr-key": (lambda c: c.sweep("--phase", "select", "--lr-keys", "lr03,lr11"),
                             r"lr11"),
    "sweep-report-without-selection": (lambda c: c.sweep("--phase", "report"),
                                       r"--phase report needs --selection selection\.json; "
                                       r"create it with encoder-eval select"),
    "sweep-malformed-selection": (lambda c: c.sweep("--phase", "report", "--selection",
                                                    str(_selection(c, '{"schema": "encoder'))),
                                  r"cannot read selection file .*selection\.json: .*; "
                                  r"regenerate it with encoder-eval select"),
    "sweep-foreign-selection": (lambda c: c.sweep("--phase", "report", "--selection",
                                                  str(_selection(c, '{"pairs": {}}'))),
                                r"is not a selection file .*pass the file encoder-eval select "
                                r"wrote"),
    "sweep-template-without-the-cell": (lambda c: c.sweep(
        "--phase", "select", "--models", "xlm-r-base", "--mode", "slurm", "--slurm-template",
        str(_template(c, "#!/bin/bash\n#SBATCH --gres=gpu:1\n# runs \"$@\"\n"
                         "python -m encoder_eval.run --task xnli\n"))),
        r"job\.sh never passes the cell to encoder_eval\.run.*python -m encoder_eval\.run "
        r"\"\$@\""),
    "sweep-template-missing": (lambda c: c.sweep("--phase", "select", "--mode", "slurm-array",
                                                 "--slurm-template", str(c.root / "nope.sh")),
                               r"cannot read --slurm-template .*nope\.sh"),
    "sweep-requeue-in-shell-mode": (lambda c: c.sweep("--phase", "select", "--requeue"),
                                    r"--requeue are for --mode slurm/slurm-array"),
    "sweep-data-dir-missing": (lambda c: c.sweep("--phase", "select", "--data-dir",
                                                 str(c.root / "nope")),
                               r"--data-dir .*nope is not a directory; give the mirror's path"),
    "sweep-reserved-extra-run-args": (lambda c: c.sweep("--phase", "select",
                                                        "--extra-run-args", "--seed 1"),
                                      r"--extra-run-args may not set --seed"),
    "sweep-malformed-model-spec": (lambda c: c.sweep("--phase", "select", "--model", "mine"),
                                   r"--model 'mine' must look like NAME=PATH_OR_HUB_ID\[:MODE\]"),
    "sweep-unknown-model-mode": (lambda c: c.sweep("--phase", "select", "--model",
                                                   "mine=org/m:bidir"),
                                 r"--model 'mine=org/m:bidir': unknown mode 'bidir'\. Did you "
                                 r"mean 'liquid-bidir'\? Valid modes: auto, decoder-adapted, liquid-bidir"),
    # --- select, summarize, status
    "select-results-dir-missing": (lambda c: ["encoder_eval.select", "--results-dir",
                                              str(c.root / "nope"), "--out",
                                              str(c.out / "sel.json")],
                                   r"--results-dir .*nope is not a directory"),
    "select-out-in-missing-dir": (lambda c: ["encoder_eval.select", "--results-dir",
                                             str(_select_grid(c)), "--out",
                                             str(c.root / "nope" / "sel.json"), "--lr-keys",
                                             "lr03,lr06", "--seeds", "42,43"],
                                  r"--out .*sel\.json: its directory .*nope does not exist"),
    "select-out-in-read-only-dir": (lambda c: ["encoder_eval.select", "--results-dir",
                                               str(_select_grid(c)), "--out",
                                               str(_read_only(c) / "sel.json"), "--lr-keys",
                                               "lr03,lr06", "--seeds", "42,43"],
                                    r"--out .*sel\.json: output directory .*out is not "
                                    r"writable \(Permission denied\); choose another --out$"),
    "summarize-malformed-selection": (lambda c: ["encoder_eval.summarize", "--results-dir",
                                                 str(c.out), "--selection",
                                                 str(_selection(c, "[1, 2"))],
                                      r"cannot read selection file .*; regenerate it"),
    "summarize-selection-of-an-old-version": (lambda c: ["encoder_eval.summarize", "--results-dir",
                                                         str(c.out), "--selection",
                                                         str(_selection(c, json.dumps({
                                                             "schema": "encoder-eval-selection",
                                                             "version": 1, "pairs": {}})))],
                                              r"selection version 1, this harness reads 2 and 3; "
                                              r"regenerate it with encoder-eval select"),
    "summarize-out-in-missing-dir": (lambda c: ["encoder_eval.summarize", "--results-dir",
                                                str(c.out), "--selection",
                                                str(_good_selection(c)), "--out",
                                                str(c.root / "nope" / "t.md")],
                                     r"--out .*t\.md: its directory .*nope does not exist"),
    "summarize-out-in-read-only-dir": (lambda c: [*_report_args(c, "summarize"), "--out",
                                                  str(_read_only(c) / "t.md")],
                                       r"--out .*t\.md: output directory .*out is not writable "
                                       r"\(Permission denied\); choose another --out$"),
    "summarize-plots-in-proc": (lambda c: [*_report_args(c, "summarize"), "--plots", PROC],
                                rf"--plots {PROC}: output directory {PROC} cannot be created in "
                                r"/proc \(.*\); choose another --plots$"),
    "compare-out-in-read-only-dir": (lambda c: [*_report_args(c, "compare"), "--resamples", "99",
                                                "--out", str(_read_only(c) / "c.md")],
                                     r"--out .*c\.md: output directory .*out is not writable "
                                     r"\(Permission denied\); choose another --out$"),
    "compare-out-in-proc": (lambda c: [*_report_args(c, "compare"), "--resamples", "99", "--out",
                                       f"{PROC}.md"],
                            r"--out /proc/.*: output directory /proc is not writable \(.*\); "
                            r"choose another --out$"),
    "status-without-results-dir": (lambda c: ["encoder_eval.status", "--phase", "select"],
                                   r"give --results-dir"),
}  # fmt: skip
# Cases that need permission bits to stop the command. The tests run as root, whose
# CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH ignore them, so these commands run with both
# capabilities dropped (prctl PR_CAPBSET_DROP before exec): a root without them is held to
# the permission bits like any user.
NEEDS_PERMISSIONS = {
    "unreadable-model-dir",
    "out-json-in-read-only-dir",
    "results-dir-read-only",
    "summarize-out-in-read-only-dir",
    "compare-out-in-read-only-dir",
    "select-out-in-read-only-dir",
}


@pytest.fixture
def ctx(request, tmp_path, tiny_models, small_mirror):
    c = Ctx(tmp_path, tiny_models["bert"], small_mirror, tiny_models["tinyenc"])
    c.out.mkdir()
    if request.node.callspec.params["case"] in NEEDS_PERMISSIONS:
        locked = tmp_path / "probe"
        locked.mkdir(mode=0)
        locked.chmod(0)
        problem = _permissions_problem(locked)
        locked.rmdir()
        skip_without_permission_bits(
            problem, "the tests run as root, whom permission bits do not stop"
        )
        c.restricted = True
    yield c
    for p in tmp_path.rglob("*"):  # give pytest's clean-up its directories back
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_with_one_line_and_writes_nothing(case, ctx):
    build, pattern = CASES[case]
    if case == "device-cuda-without-gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible: --device cuda is valid here")
    argv = build(ctx)
    before = snapshot(ctx.root)
    proc = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ctx.root, env=env(**ctx.extra_env),
        capture_output=True, text=True, timeout=300,
        preexec_fn=_drop_dac_capabilities if ctx.restricted else None,
    )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stderr.strip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert __import__("re").search(pattern, lines[0]), lines[0]
    assert snapshot(ctx.root) == before, "the command wrote something"
    print(f"\n{case}: exit {proc.returncode}: {lines[0]}")


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


# ----------------------------------------------------------------------------- hostile files
# Issue 23 items 12 and 13: a file that parses badly in any way is one line naming it (a
# refusal, or a skipped file with a warning where a command reads many), never a traceback.


def _one_line_each(text: str) -> list[str]:
    lines = text.splitlines()
    assert "Traceback" not in text and all(len(x) < 2500 for x in lines), text[-3000:]
    return lines


def test_done_moves_a_result_with_a_huge_integer_or_deep_nesting_and_says_so(tmp_path):
    good = json.dumps(make_result("m", "glue_rte", "lr06", 42, "select", 0.5))
    huge, deep = (write_result(tmp_path, make_result("m", "glue_rte", "lr06", s, "select", 0.5))
                  for s in (43, 44))  # fmt: skip
    huge.write_text(good.replace('"seed": 42', '"seed": ' + "4" * 5000))
    deep.write_text("[" * 100_000 + "]" * 100_000)
    proc = subprocess.run([sys.executable, "-m", "encoder_eval.done", "--phase", "select",
                           "--states", str(huge), str(deep)], capture_output=True, text=True,
                          env=env(), timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout.split() == ["moved", "moved"], proc.stderr
    lines = _one_line_each(proc.stderr)
    assert len(lines) == 2 and all(x.startswith("moved the corrupt result") for x in lines)
    assert "Exceeds the limit (4300 digits)" in lines[0] and "nested too deeply" in lines[1]


def test_readers_of_many_files_skip_a_hostile_one_with_a_warning(tmp_path, capsys):
    from encoder_eval import estimate, select, status

    rdir = tmp_path / "select"
    for key in ("lr03", "lr06"):
        for seed in (42, 43):
            write_result(rdir, make_result("m", "glue_rte", key, seed, "select", 0.5))
    bad = write_result(rdir, make_result("m", "glue_rte", "lr10", 42, "select", 0.5))
    data = json.loads(bad.read_text())
    data["training"].update(steps=10, train_time_s="twelve seconds")
    bad.write_text(json.dumps(data))
    deep = rdir / result_filename("m", "glue_rte", LR_GRID["lr10"], 43)
    deep.write_text("{" * 50_000)
    for main, argv in (
        (estimate.main, ["--results-dir", rdir, "--tasks", "glue_rte"]),
        (select.main, ["--results-dir", rdir, "--out", tmp_path / "s.json",
                       "--lr-keys", "lr03,lr06", "--seeds", "42,43"]),
        (status.main, ["--phase", "select", "--model", "m=org/m", "--tasks", "glue_rte",
                       "--lr-keys", "lr03,lr06,lr10", "--seeds", "42,43", "--results-dir", rdir]),
    ):  # fmt: skip
        rc = main([str(a) for a in argv])
        err = capsys.readouterr().err
        warned = [x for x in _one_line_each(err) if x.startswith("warning: skipping")]
        assert rc in (0, 1) and len(warned) == 2, (main.__module__, err)
        assert "training.train_time_s is 'twelve seconds'" in warned[0]
        assert "not valid JSON" in warned[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["pairs"]["m"]["glue_rte"].update(select_setup="dev"),
            r"pairs\.m\.glue_rte\.select_setup is 'dev', not an object or null",
        ),
        (
            lambda s: s["pairs"]["m"]["glue_rte"].update(lr_key=["lr06"]),
            r"pairs\.m\.glue_rte\.lr_key is \['lr06'\], not a grid key or null",
        ),
        (
            lambda s: s["pairs"]["m"]["glue_rte"]["select_setup"].update(selection_split=True),
            r"select_setup\.selection_split is True, not one of",
        ),
        (lambda s: s.update(policy={"seeds": "42"}), r"policy\.seeds is '42', not a list"),
    ],
)
def test_a_malformed_selection_is_one_error_line_naming_it(tmp_path, capsys, change, message):
    from result_helpers import make_selection

    from encoder_eval import summarize

    selection = make_selection({("m", "glue_rte"): "lr06"})
    change(selection)
    sel = tmp_path / "selection.json"
    sel.write_text(json.dumps(selection))
    write_result(tmp_path / "report", make_result("m", "glue_rte", "lr06", 45, "report", 0.5))
    rc = summarize.main(["--results-dir", str(tmp_path / "report"), "--selection", str(sel)])
    (line,) = _one_line_each(capsys.readouterr().err)
    assert rc == 2 and line.startswith(f"error: {sel}: "), line
    assert __import__("re").search(message, line), line


def test_a_malformed_receipt_is_skipped_with_one_warning(tmp_path, capsys):
    from encoder_eval import track

    out = tmp_path / "track"
    (out / "receipts").mkdir(parents=True)
    for i, (setup, score) in enumerate(((None, 0.7), (None, 0.69), ("finetune", 0.5))):
        r = track.Receipt(f"c{i}", i, [track.TaskResult("glue_rte", score, True, 100,
                                                        {"std": 0.01, "n": 5})],
                          [45], {}, {"kind": "probe", "tasks": ["glue_rte"]},
                          f"/ckpt/{i}", f"rev{i}")  # fmt: skip
        data = r.to_dict()
        if setup:
            data["setup"] = setup  # a string where the setup object belongs
        track.receipt_path(out, r.checkpoint_id).write_text(json.dumps(data))
    rc = track.main(["report", "--out-dir", str(out), "--no-plots"])
    warned = [x for x in _one_line_each(capsys.readouterr().err) if x.startswith("warning:")]
    assert rc == 0 and len(warned) == 1, warned
    assert (
        "c2.receipt.json: not a valid encoder-eval-receipt (field setup is 'finetune'" in warned[0]
    )


def test_a_yaml_task_file_with_aliases_is_refused_at_once(tmp_path):
    """A 403-byte 'billion laughs' task file once gave a 58 MB error message."""
    from encoder_eval.data.taskfile import read_task_file

    bomb = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                     + [f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]"
                        for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
                     + ["tasks: {my_task: {inputs: *i, metric: accuracy}}"])  # fmt: skip
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    assert len(bomb) < 500
    with pytest.raises(HarnessError) as refused:
        read_task_file(path)
    message = str(refused.value)
    assert len(message) < 300 and "anchor or alias (line 1)" in message, message


def test_a_task_file_value_is_quoted_cut_short(tmp_path):
    from encoder_eval.data.taskfile import parse_task_rows, read_task_file

    path = tmp_path / "t.toml"
    path.write_text('[tasks.my_task]\ninputs = "text"\nlabels = ["' + "n" * 100_000
                    + '", 7]\nmetric = "accuracy"\nreport_split = "test"\ndata_dir = "."\n')  # fmt: skip
    with pytest.raises(HarnessError) as refused:
        parse_task_rows(read_task_file(path), str(path))
    message = str(refused.value)
    assert "field 'labels'" in message and "is not a list of non-empty strings" in message
    assert len(message) < 1000, len(message)
