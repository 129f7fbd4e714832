"""One real protocol run at tiny scale, made once a session and read by several tests
(`protocol_run` in conftest.py): tests/test_protocol_e2e.py checks each step's output and the
table's numbers, tests/test_report.py opens its report page in a browser. Each of its 12
cell processes pays about 10 CPU seconds of imports, so they share one run instead of making
two. The tests only read the run; each writes what it makes in its own tmp_path.

sweep --phase select -> run_all.sh -> select -> sweep --phase report -> run_all.sh (twice:
the second run finds every cell done), each as the user runs it (a subprocess)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fault_helpers import py, sh

# Three architectures, so the report compares three pairs of models.
MODELS = {"tiny-bert": "bert", "tiny-xlmr": "xlm-roberta", "tiny-deberta": "deberta-v2"}
TASKS = ("glue_rte", "glue_sst2")
LR_KEYS = "lr03,lr10"
SELECT_SEEDS = "42,43"
REPORT_SEEDS = "45,46"
SHRINK = ["--max-steps", "3", "--max-seq-len", "64", "--device", "cpu"]
# fp32 (sweep flags: `status` takes no precision): no test of this run checks precision,
# and bf16 autocast is emulated, slower, on a CPU without native bf16.
FP32 = ["--precision", "fp32"]


@dataclass(frozen=True)
class ProtocolRun:
    """Where the run lies (`root`: runs/, results/, selection.json), the flags its sweeps
    took besides FP32 (`common`, which `status` takes too), and what each run_all.sh
    printed."""

    root: Path
    common: list[str]
    select_stdout: str
    report_stdout: str
    report_again_stdout: str


def make_protocol_run(root: Path, tiny_models: dict[str, Path], mirror: Path) -> ProtocolRun:
    """Run the protocol's steps in `root` on the session's tiny models and small mirror."""
    models = [
        a for name, kind in MODELS.items() for a in ("--model", f"{name}={tiny_models[kind]}")
    ]
    common = [*models, "--tasks", ",".join(TASKS), "--data-dir", str(mirror), *SHRINK]
    sh(py("encoder_eval.sweep", "--phase", "select", *common, *FP32, "--lr-keys", LR_KEYS,
          "--seeds", SELECT_SEEDS, "--out-dir", "runs/select", "--results-dir", "results/select"),
       root)  # fmt: skip
    select = sh(["bash", "runs/select/run_all.sh"], root, timeout=1200)
    sh(py("encoder_eval.select", "--results-dir", "results/select", "--out", "selection.json",
          "--lr-keys", LR_KEYS, "--seeds", SELECT_SEEDS), root)  # fmt: skip
    sh(py("encoder_eval.sweep", "--phase", "report", "--selection", "selection.json", *common,
          *FP32, "--seeds", REPORT_SEEDS, "--out-dir", "runs/report",
          "--results-dir", "results/report"), root)  # fmt: skip
    report = sh(["bash", "runs/report/run_all.sh"], root, timeout=1200)
    again = sh(["bash", "runs/report/run_all.sh"], root)
    return ProtocolRun(root, common, select.stdout, report.stdout, again.stdout)
