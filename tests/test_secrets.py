"""Secrets and remote code.

With HF_TOKEN and HUGGING_FACE_HUB_TOKEN set to a canary, a demo-sized sweep (both phases,
select, summarize with plots, Slurm launch scripts and manifests, status) writes the canary
into no file: every file under the output directories is searched byte for byte, PNGs and
the tokenisation cache included. `trust_remote_code` is on only for registry rows that say
so; when it is on, a warning names the model and the revision that ran, and the requested
`--model-revision` is recorded.
"""

from __future__ import annotations

import json
import re
import secrets

import pytest
from fault_helpers import SHRINK, py, read_json, result_files, sh

from encoder_eval import run as run_command
from encoder_eval import sweep
from encoder_eval.cells import runner
from encoder_eval.data.models import MODEL_REGISTRY, model_entry
from encoder_eval.plans.plan import PlanInputs

MODEL, TASK = "tiny", "glue_rte"


@pytest.mark.slow
def test_a_demo_sized_sweep_writes_the_token_nowhere(tmp_path, tiny_models, small_mirror):
    canary = f"hf_CANARY{secrets.token_hex(12)}"
    tokens = {"HF_TOKEN": canary, "HUGGING_FACE_HUB_TOKEN": canary,
              "ENCODER_EVAL_CACHE_DIR": str(tmp_path / "token-cache")}  # fmt: skip
    common = ["--model", f"{MODEL}={tiny_models['bert']}", "--tasks", TASK, "--data-dir",
              small_mirror, *SHRINK]  # fmt: skip
    select = ["--lr-keys", "lr03,lr10", "--seeds", "42,43"]

    def run_(*cmd, ok=(0,)):
        return sh(list(map(str, cmd)), tmp_path, ok=ok, **tokens)

    run_(*py("encoder_eval.sweep", "--phase", "select", *common, *select, "--out-dir",
             "runs/select", "--results-dir", "results/select"))  # fmt: skip
    run_("bash", "runs/select/run_all.sh")
    run_(*py("encoder_eval.select", "--results-dir", "results/select", "--out", "selection.json",
             *select))  # fmt: skip
    report = ["--phase", "report", "--selection", "selection.json", *common, "--seeds", "45,46",
              "--results-dir", "results/report"]  # fmt: skip
    run_(*py("encoder_eval.sweep", *report, "--out-dir", "runs/report"))
    run_("bash", "runs/report/run_all.sh")
    tpl = tmp_path / "job.sh"
    tpl.write_text('#!/bin/bash\nexec python -m encoder_eval.run "$@"\n')
    for mode in ("slurm", "slurm-array"):
        run_(*py("encoder_eval.sweep", *report, "--out-dir", f"runs/{mode}", "--mode", mode,
                 "--slurm-template", tpl, "--requeue"))  # fmt: skip
    run_(*py("encoder_eval.status", *report, "--seeds", "45,46,47", "--emit", "runs/rest"),
         ok=(1,))  # fmt: skip
    table = run_(*py("encoder_eval.summarize", "--results-dir", "results/report", "--selection",
                     "selection.json", "--allow-partial", "--out", "table.md", "--plots",
                     "plots", "--select-results-dir", "results/select"))  # fmt: skip

    assert len(result_files(tmp_path / "results/select")) == 4
    assert len(result_files(tmp_path / "results/report")) == 2
    assert list((tmp_path / "plots").glob("*.png")), table.stderr
    searched = [p for p in tmp_path.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in searched}
    assert {".json", ".sh", ".log", ".png", ".tsv", ".md", ".tokens"} <= kinds, kinds
    leaks = [p for p in searched if canary.encode() in p.read_bytes()]
    assert leaks == [], leaks
    # Nor does any result record an environment variable or the model path.
    for path in result_files(tmp_path / "results/report"):
        prov = read_json(path)["provenance"]
        assert prov["model_path"] is None and "HF_TOKEN" not in json.dumps(prov)
    print(f"\nsecrets: searched {len(searched)} files ({', '.join(sorted(kinds))}), 0 leaks")


def test_trust_remote_code_follows_the_registry_column(tmp_path):
    plan = sweep.build_plan(
        "select", PlanInputs(tmp_path, tasks=["xnli"]), lr_keys=["lr06"], seeds=[42]
    )
    assert len(plan.cells) == len(MODEL_REGISTRY)
    for unit in plan.units():
        args = plan.run_args(unit)
        wants = model_entry(unit[0].model).trust_remote_code
        assert ("--trust-remote-code" in args) is wants, unit[0].model
        assert ("--no-trust-remote-code" in args) is not wants, unit[0].model
    assert {k for k in MODEL_REGISTRY if model_entry(k).trust_remote_code} >= {
        "eurobert-210m",
        "mgte-mlm-base",
        "lfm2.5-encoder-230m",
    }
    assert not model_entry("xlm-r-base").trust_remote_code
    # Added models never get it unless the sweep is told to trust them.
    for trust in (False, True):
        added = sweep.build_plan(
            "select",
            PlanInputs(
                tmp_path,
                extra_models=["mine=org/x"],
                tasks=["xnli"],
                trust_remote_code=["mine"] if trust else (),
            ),
            lr_keys=["lr06"],
            seeds=[42],
        )
        assert ("--trust-remote-code" in added.run_args(added.cells)) is trust


@pytest.mark.parametrize(
    "flags, trusted",
    [
        (["--model-key", "eurobert-210m"], True),
        (["--model-key", "eurobert-210m", "--no-trust-remote-code"], False),
        (["--model-key", "xlm-r-base"], False),
        (["--model-key", "xlm-r-base", "--trust-remote-code"], True),
        (["--model-path", "org/unlisted"], False),
    ],
    ids=["registry-on", "registry-on-overridden", "registry-off", "explicit", "unlisted"],
)
def test_run_turns_trust_on_only_when_the_registry_or_the_user_says(tmp_path, flags, trusted):
    args = run_command.build_parser().parse_args([*flags, "--task", "xnli", "--lr", "3.59e-05",
                                          "--seed", "45", "--out-json", str(tmp_path / "o.json")])  # fmt: skip
    (cell,) = runner.plan_cells(args)
    assert cell.trust_remote_code is trusted


def test_remote_code_warning_names_the_model_and_revision_and_the_pin_is_recorded(
    tmp_path, tiny_models, small_mirror
):
    out = tmp_path / "cell.json"
    proc = sh(py("encoder_eval.run", "--model-path", tiny_models["tinyenc"], "--model-key",
                 "tiny-remote", "--task", "sg_cb", "--lr", "3.59e-05", "--seed", "45",
                 "--trust-remote-code", "--model-revision", "0123abcd", "--data-dir",
                 small_mirror, *SHRINK, "--out-json", out, "--progress", "quiet"), tmp_path)  # fmt: skip
    prov = read_json(out)["provenance"]
    assert prov["trust_remote_code"] is True
    assert prov["model_revision_requested"] == "0123abcd"
    assert prov["model_revision"].startswith("sha256:")  # what ran: the local files' hash
    warning = [line for line in proc.stderr.splitlines() if "trust_remote_code is on" in line]
    assert len(warning) == 1, proc.stderr
    assert re.search(rf"tiny-remote: trust_remote_code is on, running model-authored code at "
                     rf"revision {re.escape(prov['model_revision'])}", warning[0])  # fmt: skip
