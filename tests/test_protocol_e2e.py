"""The whole protocol for real, in shell mode, on tiny local models and a tiny data mirror.

sweep --phase select -> run_all.sh -> select -> sweep --phase report -> run_all.sh ->
summarize, each as the user runs it (a subprocess), then the table's numbers are checked
against mean ± sample std recomputed from the result JSONs. The run up to summarize is the
session's shared `protocol_run` (tests/protocol_run.py), which test_report.py reads too.
"""

from __future__ import annotations

import json
import statistics

import pytest
from fault_helpers import py, sh
from protocol_run import LR_KEYS, MODELS, SELECT_SEEDS, TASKS
from scipy import stats as sps

from encoder_eval.core.results import load_results


@pytest.mark.slow
def test_select_report_summarize_end_to_end(protocol_run):
    root, common = protocol_run.root, protocol_run.common
    pairs = len(MODELS) * len(TASKS)  # one unit, and one process, per (model, task)
    select_cells = pairs * len(LR_KEYS.split(",")) * len(SELECT_SEEDS.split(","))

    # 1. selection sweep: one process per (model, task), 2 LRs x 2 seeds in each
    assert (f"[cells {select_cells}/{select_cells} done, units {pairs}/{pairs}, failed 0] "
            f"finished: {pairs} run") in protocol_run.select_stdout  # fmt: skip
    assert len(list((root / "runs/select/logs").glob("*.log"))) == pairs
    status = sh(py("encoder_eval.status", "--phase", "select", *common, "--lr-keys", LR_KEYS,
                   "--seeds", SELECT_SEEDS, "--results-dir", "results/select"), root)  # fmt: skip
    assert f"done         {select_cells}" in status.stdout and "missing       0" in status.stdout

    # 2. choose the LR per (model, task)
    selection = json.loads((root / "selection.json").read_text())
    select_results = load_results(root / "results/select")
    assert len(select_results) == select_cells
    for name in MODELS:
        for task in TASKS:
            entry = selection["pairs"][name][task]
            means = {}
            for key in LR_KEYS.split(","):
                devs = [r.data["dev"]["mean"] for r in select_results
                        if r.cell["model"] == name and r.cell["task"] == task
                        and r.cell["lr_key"] == key]  # fmt: skip
                assert len(devs) == 2
                means[key] = statistics.mean(devs)
                assert entry["dev_mean_by_lr"][key] == pytest.approx(means[key])
            best = max(means.values())
            assert entry["lr_key"] == min(k for k, v in means.items() if v == pytest.approx(best))

    # 3. reporting sweep at the selected LRs; a second run_all.sh finds every cell done
    assert (f"[cells {2 * pairs}/{2 * pairs} done, units {pairs}/{pairs}, failed 0] "
            f"finished: {pairs} run") in protocol_run.report_stdout  # fmt: skip
    assert f"finished: 0 run, {pairs} skipped" in protocol_run.report_again_stdout

    # 4. the table: refused as a protocol table (shrunken), printed with --allow-partial
    refused = sh(py("encoder_eval.summarize", "--results-dir", "results/report",
                    "--selection", "selection.json"), root, ok=(1,))  # fmt: skip
    assert "[missing_seeds]" in refused.stderr and "[off_protocol]" in refused.stderr
    table = sh(py("encoder_eval.summarize", "--results-dir", "results/report",
                  "--selection", "selection.json", "--allow-partial"), root).stdout  # fmt: skip
    as_json = json.loads(sh(py("encoder_eval.summarize", "--results-dir", "results/report",
                               "--selection", "selection.json", "--allow-partial",
                               "--format", "json"), root).stdout)  # fmt: skip
    assert "avg@2 instead of avg@5" in table

    report = load_results(root / "results/report")
    assert len(report) == 2 * pairs
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header == ["Model", "SST-2* (acc)", "RTE* (acc)", "GLUE", "Average"]
    col = {"glue_sst2": 1, "glue_rte": 2}
    for name in MODELS:
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        task_means = []
        for task in TASKS:
            chosen = selection["pairs"][name][task]["lr_key"]
            scores = [r.data["report"]["mean"] for r in report
                      if r.cell["model"] == name and r.cell["task"] == task]  # fmt: skip
            assert {r.cell["lr_key"] for r in report
                    if r.cell["model"] == name and r.cell["task"] == task} == {chosen}  # fmt: skip
            assert len(scores) == 2
            mean, std = statistics.mean(scores), statistics.stdev(scores)
            task_means.append(mean)
            # (a model that scores the same on both seeds has a zero-width interval)
            low, high = (
                sps.t.interval(0.95, 1, loc=mean, scale=std / 2**0.5) if std else (mean,) * 2
            )
            low, high = max(low, 0.0), min(high, 1.0)  # cut to accuracy's range (issue 40 item 13)
            shown = cols[col[task]].replace("**", "").replace(" ≈", "")  # best / tied marks
            assert (
                shown == f"{100 * mean:.2f} ± {100 * std:.2f} [{100 * low:.2f}, {100 * high:.2f}] †"
            )
            cell = next(r for r in as_json["rows"] if r["model"] == name)["cells"][task]
            assert cell["mean"] == pytest.approx(mean) and cell["std"] == pytest.approx(std)
            assert cell["n"] == 2 and cell["lr_key"] == chosen
        assert cols[3] == cols[4] == f"{100 * statistics.mean(task_means):.2f}"
