"""Files written by an older harness are still read: results, a selection, probe results and
receipts made by `a4b0e90` (before the package was split into layers), kept in
tests/fixtures/a4b0e90/.

They were made with a4b0e90's own commands on the tiny BERT the tests build: four select
cells and one report cell of `synthetic_sentiment` (2 steps, 32 tokens), `select
--allow-partial`, `probe --model tiny=... --k-folds 3`, and two `track receipt --kind probe`.
"""

from __future__ import annotations

from pathlib import Path

from encoder_eval import summarize
from encoder_eval.core.errors import EXIT_OK
from encoder_eval.core.receipt import read_receipt
from encoder_eval.core.results import cell_state, is_result_name, load_results, read_result
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports import tracking as track
from encoder_eval.reports.probe_table import load_probe_results, probe_table

OLD = Path(__file__).parent / "fixtures" / "a4b0e90"


def test_old_results_are_done_cells_and_load():
    for phase in ("sel", "rep"):
        paths = sorted(p for p in (OLD / phase).glob("*.json") if is_result_name(p))
        assert paths, phase
        for path in paths:
            state, data, why = cell_state(path)
            assert (state, why) == ("ok", None), path
            assert read_result(path)[0] == data
    assert len(load_results(OLD / "sel", phase="select")) == 4
    assert len(load_results(OLD / "rep", phase="report")) == 1


def test_an_old_selection_is_read_and_summarized(capsys):
    selection = load_selection(OLD / "selection.json")
    assert selection["pairs"]["tiny"]["synthetic_sentiment"]["lr_key"] in ("lr06", "lr08")
    rc = summarize.main(["--results-dir", str(OLD / "rep"), "--selection",
                         str(OLD / "selection.json"), "--allow-partial", "--no-marks"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == EXIT_OK and "| tiny |" in out


def test_old_probe_results_are_done_and_tabulated():
    (path,) = sorted((OLD / "probe").glob("*.probe.json"))
    state, data, why = cell_state(path, "probe", model="tiny", task="synthetic_sentiment")
    assert (state, why) == ("ok", None)
    table = probe_table(load_probe_results(OLD / "probe"))
    assert (
        table.models == ["tiny:mean"] and table.cells[("tiny:mean", "synthetic_sentiment")].n == 3
    )


def test_old_receipts_are_read_and_compared():
    receipts = [read_receipt(p) for p in sorted((OLD / "receipts").glob("*.json"))]
    assert [r.checkpoint_id for r in receipts] == ["ck0", "ck1"]
    track.check_comparable(receipts)  # one setup: no refusal
    assert receipts[0].task("synthetic_sentiment") is not None
