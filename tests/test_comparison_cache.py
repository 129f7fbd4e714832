"""Comparisons computed once (`reports/comparison_cache.py`): a second render reads every
row back, a changed input recomputes exactly the rows it feeds, a corrupt entry is
recomputed, a read-only results folder still works, `--jobs` changes nothing, compare's
default family is the table, and `report` takes the marks and family flags.

The cache cannot change a number (issue 50, item 1): it lives in the user's cache, never
the results folder; after each attack (an edited entry with its checksum recomputed, in
the old `.stats-cache/` or the user's cache; an entry that agrees with its HMAC and not
with the table; a FIFO or a symlink to /dev/zero for an entry; a symlinked cache folder;
thousands of stale entries) the printed output is `--no-cache`'s.

The results are real result and predictions files (`result_helpers`), written without
training; the count of computed rows is read from a spy that calls the real
`compare_cells` (never from timing)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

import numpy as np
import pytest
from fault_helpers import (
    _drop_dac_capabilities,
    _permissions_problem,
    env,
    skip_without_permission_bits,
)
from result_helpers import make_selection, write_cell_with_predictions
from stats_helpers import seeded_rng
from statsmodels.stats.multitest import multipletests

from encoder_eval import compare, report, summarize
from encoder_eval.core.errors import EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.core.results import STATS_CACHE_DIR, load_results
from encoder_eval.reports import comparison_cache, verdicts
from encoder_eval.reports.comparison_cache import ComparisonCache, RowFlags
from encoder_eval.reports.stats_settings import StatsSettings
from encoder_eval.reports.table_loading import load_table

TASKS = ("glue_rte", "glue_mrpc")  # accuracy and F1
MODELS = {"strong": 0.8, "weak": 0.7, "twin": 0.8}
N_EXAMPLES = 120
RESAMPLES = "49"


def write_cell(rdir, rng, model: str, task: str, seed: int, skill: float, labels: list) -> None:
    right = rng.random(N_EXAMPLES) < skill + rng.normal(0, 0.01)
    preds = [y if ok else 1 - y for y, ok in zip(labels, right, strict=True)]
    write_cell_with_predictions(rdir, model, task, "lr05", seed, preds, labels)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """This test's own user cache (`$ENCODER_EVAL_CACHE_DIR`): its comparisons folder."""
    monkeypatch.setenv("ENCODER_EVAL_CACHE_DIR", str(tmp_path / "user-cache"))
    return tmp_path / "user-cache" / comparison_cache.SUBDIR


@pytest.fixture
def rdir(tmp_path):
    """A report folder of three models on two tasks, five seeds, with predictions."""
    rng = seeded_rng()
    out = tmp_path / "report"
    for task in TASKS:
        labels = rng.integers(0, 2, N_EXAMPLES).tolist()
        for model, skill in MODELS.items():
            for seed in range(45, 50):
                write_cell(out, rng, model, task, seed, skill, labels)
    selection = make_selection({(m, t): "lr05" for m in MODELS for t in TASKS})
    (out / "selection.json").write_text(json.dumps(selection))
    return out


@pytest.fixture
def computed(monkeypatch) -> list[tuple[str, str, str]]:
    """Every (A, B, task) `compare_cells` computes in this process, in order."""
    calls: list[tuple[str, str, str]] = []
    real = verdicts.compare_cells

    def spy(a, b, task, *args, **kwargs):
        calls.append((a, b, task))
        return real(a, b, task, *args, **kwargs)

    monkeypatch.setattr(verdicts, "compare_cells", spy)
    return calls


def base(rdir) -> list[str]:
    return ["--results-dir", str(rdir), "--selection", str(rdir / "selection.json"),
            "--resamples", RESAMPLES]  # fmt: skip


def entries(folder) -> list[str]:
    """The entries of a comparisons folder (not its key, not temporaries)."""
    if not folder.is_dir():
        return []
    return sorted(n for n in os.listdir(folder) if comparison_cache.ENTRY_NAME.fullmatch(n))


def marks_of(doc: dict) -> dict:
    return {r["model"]: {t: c["mark"] for t, c in r["cells"].items()} for r in doc["rows"]}


def page_table(path) -> dict:
    page = path.read_text()
    start = page.index('id="table-data">') + len('id="table-data">')
    return json.loads(page[start : page.index("</script>", start)])


def test_a_second_render_reads_every_comparison_back(rdir, cache_dir, computed, capsys):
    assert summarize.main(base(rdir)) == EXIT_OK
    out, err = capsys.readouterr()
    assert "Bold: the task's best model" in out and "statistics cache" not in err
    first = len(computed)
    assert first == 3 * len(TASKS)  # the table family: every pair of the three on each task
    assert len(entries(cache_dir)) == first
    assert not (rdir / STATS_CACHE_DIR).exists()  # nothing is written into a results folder
    assert summarize.main([*base(rdir), "--format", "json"]) == EXIT_OK
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert len(computed) == first  # nothing computed again, and stderr says so
    assert f"note: 6 of 6 comparison row(s) read from the statistics cache {cache_dir} " in err
    assert summarize.main([*base(rdir), "--format", "json", "--no-cache"]) == EXIT_OK
    fresh = json.loads(capsys.readouterr().out)
    assert len(computed) == 2 * first and doc == fresh  # the cached marks are the fresh ones
    # the results' readers pass over the cache folder without a word
    warned: list[str] = []
    assert len(load_results(rdir, warn=warned.append, phase="report")) == 30
    assert warned and not any(STATS_CACHE_DIR in w for w in warned)  # (selection.json is named)


def test_a_report_after_summarize_reuses_the_marks(rdir, computed, tmp_path, capsys):
    assert summarize.main([*base(rdir), "--format", "json"]) == EXIT_OK
    marks = marks_of(json.loads(capsys.readouterr().out))
    computed.clear()
    out = tmp_path / "page.html"
    assert report.main([*base(rdir), "--out", str(out)]) == EXIT_OK
    # only compare's rows (full: bootstrap, example test) are new; the marks are read back
    assert sorted(computed) == sorted(
        (a, b, t) for a, b in [("strong", "weak"), ("strong", "twin"), ("weak", "twin")]
        for t in TASKS
    )  # fmt: skip
    assert marks_of(page_table(out)) == marks
    computed.clear()
    assert report.main([*base(rdir), "--out", str(out)]) == EXIT_OK
    assert computed == []


def _cache_run(rdir, seed: int = 1234, n_resamples: int = 49):
    loaded = load_table(rdir, str(rdir / "selection.json"))
    cache = comparison_cache.open_cache(warn=None)
    settings = StatsSettings(n_resamples=n_resamples, seed=seed)
    cmp = verdicts.compare_table(loaded.table, loaded.results, settings, cache)
    return cache, cmp


def test_a_changed_input_recomputes_exactly_the_rows_it_feeds(rdir):
    cache, first = _cache_run(rdir)
    assert (cache.computed, cache.reused) == (6, 0)
    cache, again = _cache_run(rdir)
    assert (cache.computed, cache.reused) == (0, 6)
    assert [asdict(r) for r in again.rows] == [asdict(r) for r in first.rows]
    # new predictions (and their result) for one cell of `weak` on RTE: its two rows only
    labels = json.loads((rdir / "weak_glue_rte_lr05_s47.predictions.json").read_text())
    labels = labels["languages"]["en"]["labels"]
    write_cell(rdir, np.random.default_rng(7), "weak", "glue_rte", 47, 0.6, labels)
    cache, changed = _cache_run(rdir)
    assert (cache.computed, cache.reused) == (2, 4)
    moved = {(r.model_a, r.model_b) for r, o in zip(changed.rows, first.rows, strict=True)
             if r.mean_a != o.mean_a or r.mean_b != o.mean_b}  # fmt: skip
    assert moved == {("strong", "weak"), ("weak", "twin")}
    # a predictions file alone changed (now out of step with its result): recomputed, and
    # the row says the file is stale instead of serving the old numbers
    path = rdir / "twin_glue_mrpc_lr05_s45.predictions.json"
    doc = json.loads(path.read_text())
    doc["languages"]["en"]["predictions"][0] = 1 - doc["languages"]["en"]["predictions"][0]
    path.write_text(json.dumps(doc))
    cache, stale = _cache_run(rdir)
    assert (cache.computed, cache.reused) == (2, 4)
    notes = [n for r in stale.rows if r.task == "glue_mrpc" and "twin" in (r.model_a, r.model_b)
             for n in r.notes]  # fmt: skip
    assert any("out of step with its result" in n for n in notes)
    # another seed or another number of resamples: every row
    assert _cache_run(rdir, seed=99)[0].computed == 6
    assert _cache_run(rdir, n_resamples=59)[0].computed == 6


def test_a_corrupt_entry_is_recomputed_never_trusted(rdir, cache_dir):
    _, first = _cache_run(rdir)
    names = entries(cache_dir)
    torn, edited = cache_dir / names[0], cache_dir / names[1]
    torn.write_text(torn.read_text()[:50])
    doc = json.loads(edited.read_text())
    doc["row"]["diff"] = 0.5  # valid JSON, a wrong number: the HMAC refuses it
    edited.write_text(json.dumps(doc))
    cache, again = _cache_run(rdir)
    assert (cache.computed, cache.reused) == (2, 4)
    assert [asdict(r) for r in again.rows] == [asdict(r) for r in first.rows]
    assert _cache_run(rdir)[0].computed == 0  # both were written over, whole


def test_a_row_computed_with_more_serves_a_request_for_less(rdir):
    loaded = load_table(rdir, str(rdir / "selection.json"))
    cells = verdicts.included_cells(loaded.table, loaded.results)
    requests = [(a, b, t) for a, b in [("strong", "weak"), ("twin", "strong")] for t in TASKS]
    cache = comparison_cache.open_cache(warn=None)
    run = StatsSettings(n_resamples=49, seed=1234)
    full = verdicts.compute_rows(requests, loaded.table, cells, run, flags=RowFlags(), cache=cache)
    less = RowFlags(bootstrap=False, example_test=False)
    cache = comparison_cache.open_cache(warn=None)
    served = verdicts.compute_rows(requests, loaded.table, cells, run, flags=less, cache=cache)
    assert (cache.computed, cache.reused) == (0, 4)
    direct = verdicts.compute_rows(requests, loaded.table, cells, run, flags=less)
    assert [asdict(r) for r in served] == [asdict(r) for r in direct]
    assert all(r.boot_low is None and r.p_example is None for r in served)
    assert all(r.boot_low is not None and r.p_example is not None for r in full)
    # the reverse does not hold: a lesser row never serves a fuller request
    cache = comparison_cache.open_cache(warn=None)
    other = StatsSettings(n_resamples=49, seed=5)
    verdicts.compute_rows(requests[:1], loaded.table, cells, other, flags=less, cache=cache)
    verdicts.compute_rows(requests[:1], loaded.table, cells, other, flags=RowFlags(), cache=cache)
    assert cache.computed == 2


# summarize in a child process that counts the rows it computes (a spy calling the real
# compare_cells) and prints {"code", "computed"} as its last line of stderr.
COUNTING_SUMMARIZE = """
import json, sys
from encoder_eval import summarize
from encoder_eval.reports import verdicts
real, calls = verdicts.compare_cells, []
def spy(*args, **kwargs):
    calls.append(args[:3])
    return real(*args, **kwargs)
verdicts.compare_cells = spy
code = summarize.main(sys.argv[1:])
print(json.dumps({"code": code, "computed": len(calls)}), file=sys.stderr)
"""


def summarize_without_root(args: list[str]) -> tuple[str, list[str], dict]:
    """Run summarize held to permission bits (root's override dropped, as in
    test_bad_input): its stdout, its warnings and its count of computed rows."""
    proc = subprocess.run(
        [sys.executable, "-c", COUNTING_SUMMARIZE, *args], env=env(), capture_output=True,
        text=True, timeout=600, preexec_fn=_drop_dac_capabilities if os.geteuid() == 0 else None,
    )  # fmt: skip
    *lines, last = proc.stderr.strip().splitlines()
    return proc.stdout, [line for line in lines if line.startswith("warning:")], json.loads(last)


def require_permission_bits(tmp_path) -> None:
    """Skip where root cannot be held to permission bits (its override cannot be dropped);
    a failure instead under ENCODER_EVAL_REQUIRE_PERMISSIONS=1 (.ci/run sets it)."""
    locked = tmp_path / "probe"
    locked.mkdir(mode=0)
    locked.chmod(0)
    skip_without_permission_bits(
        _permissions_problem(locked), "permission bits do not stop this root"
    )


def test_a_read_only_results_folder_or_cache_still_works(rdir, cache_dir, tmp_path, capsys):
    require_permission_bits(tmp_path)
    assert summarize.main([*base(rdir), "--no-cache"]) == EXIT_OK
    fresh = capsys.readouterr().out
    before = sorted(os.listdir(rdir))
    # a read-only results folder: the cache is the user's, written and read as usual
    os.chmod(rdir, 0o555)
    try:
        out, warnings, run = summarize_without_root(base(rdir))
        assert run == {"code": EXIT_OK, "computed": 6} and out == fresh
        assert not [w for w in warnings if "statistics cache" in w]
        out, warnings, run = summarize_without_root(base(rdir))
        assert run == {"code": EXIT_OK, "computed": 0} and out == fresh
        assert sorted(os.listdir(rdir)) == before  # nothing written
    finally:
        os.chmod(rdir, 0o755)
    # a user cache that cannot be written: one warning, every row computed, the same numbers
    for name in os.listdir(cache_dir):
        os.unlink(cache_dir / name)
    cache_dir.rmdir()
    os.chmod(cache_dir.parent, 0o555)
    try:
        out, warnings, run = summarize_without_root(base(rdir))
        assert run == {"code": EXIT_OK, "computed": 6} and out == fresh
        assert [w for w in warnings if "statistics cache" in w] == [
            f"warning: cannot write the statistics cache {cache_dir} "
            "(Permission denied); computing without it"
        ]
    finally:
        os.chmod(cache_dir.parent, 0o755)


# ------------------------------------------------------------------ attacks (issue 50, item 1)


def run_compare(rdir, capsys, *extra: str) -> tuple[str, str]:
    """compare's JSON (every number of every row) and its stderr."""
    assert compare.main([*base(rdir), "--format", "json", *extra]) == EXIT_OK
    return capsys.readouterr()


def forged(rdir, *, means: bool = True) -> list[tuple[str, dict]]:
    """Each row compare computes here (as the cache names it, its key) with its verdict
    turned around: every p-value 1e-6 and, with `means`, A's and B's means swapped."""
    loaded = load_table(rdir, str(rdir / "selection.json"))
    cells = verdicts.included_cells(loaded.table, loaded.results)
    pairs = [("strong", "weak"), ("strong", "twin"), ("weak", "twin")]
    requests = [(a, b, t) for a, b in pairs for t in TASKS]
    run = StatsSettings(n_resamples=int(RESAMPLES), seed=verdicts.DEFAULT_SEED)
    rows = verdicts.compute_rows(requests, loaded.table, cells, run, flags=RowFlags())
    namer = ComparisonCache(os.devnull)  # key() only
    out = []
    for (a, b, task), row in zip(requests, rows, strict=True):
        knobs = verdicts.task_knobs(task)
        scoring = {"metric": knobs.metric, "euro": list(knobs.euro_languages)}
        key = namer.key(a, b, task, scoring, loaded.table.cells, cells, run)
        doc = asdict(row)
        for name in ("p_seed", "p_combined", "p_verdict", "p_example", "p_mcnemar"):
            doc[name] = 1e-6
        if means:
            doc["mean_a"], doc["mean_b"], doc["diff"] = doc["mean_b"], doc["mean_a"], -doc["diff"]
        out.append((key, doc))
    return out


def checksummed(key: str, bits: str, row: dict, schema: str) -> str:
    """An entry as the old cache trusted it: its checksum a plain sha256 of the row."""
    canonical = json.dumps(row, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
    return json.dumps({"schema": schema, "stats_version": comparison_cache.STATS_VERSION,
                       "key": key, "flags": bits, "row": row,
                       "checksum": hashlib.sha256(canonical).hexdigest(),
                       "mac": hashlib.sha256(canonical).hexdigest()})  # fmt: skip


def test_an_edited_entry_with_its_checksum_recomputed_changes_no_number(rdir, cache_dir, capsys):
    fresh, _ = run_compare(rdir, capsys, "--no-cache")
    rows = forged(rdir)
    # the attack on main: .stats-cache/ in the results folder, entries covering every request
    old = rdir / STATS_CACHE_DIR
    old.mkdir()
    for key, row in rows:
        (old / f"{key}.111.json").write_text(
            checksummed(key, "111", row, "encoder-eval-stats-cache")
        )
    out, err = run_compare(rdir, capsys)
    assert out == fresh and "statistics cache" not in err  # never read
    assert {n.split(".")[0] for n in entries(cache_dir)} == {k for k, _ in rows}  # (the names)
    # the same in the user's cache, by someone without its key: refused, recomputed, written over
    for name in entries(cache_dir):
        key, bits, _ = name.split(".")
        row = dict(rows)[key]
        (cache_dir / name).write_text(checksummed(key, bits, row, comparison_cache.CACHE_SCHEMA))
    out, err = run_compare(rdir, capsys)
    assert out == fresh
    assert (
        f"note: 0 of 6 comparison row(s) read from the statistics cache {cache_dir}; 6 entries not trusted and recomputed"
        in err
    )
    out, err = run_compare(rdir, capsys)
    assert out == fresh and "note: 6 of 6 comparison row(s) read" in err
    # summarize and report read the same rows: the same marks as without the cache
    assert summarize.main([*base(rdir), "--format", "json", "--no-cache"]) == EXIT_OK
    table = capsys.readouterr().out
    assert summarize.main([*base(rdir), "--format", "json"]) == EXIT_OK
    assert capsys.readouterr().out == table


def test_an_authenticated_entry_that_disagrees_with_the_table_is_recomputed(
    rdir, cache_dir, capsys
):
    """A row the key vouches for (a leaked key, a bug) is still checked against the table:
    its models, task, metric, seed counts and means."""
    fresh, _ = run_compare(rdir, capsys, "--no-cache")
    cache = comparison_cache.open_cache(warn=None)
    for key, row in forged(rdir):
        cache.put(key, RowFlags(bootstrap=True, example_test=False, aso=False), row)
    assert len(entries(cache_dir)) == 6
    out, err = run_compare(rdir, capsys)
    assert out == fresh and "6 entries not trusted and recomputed" in err


# compare in a child process whose address space is capped, so that a reader of /dev/zero
# ends in a MemoryError instead of taking the machine's memory
CAPPED_COMPARE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from encoder_eval import compare
sys.exit(compare.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_dev_zero_entry_is_refused_unread(rdir, cache_dir, kind, capsys):
    fresh, _ = run_compare(rdir, capsys, "--no-cache")
    names = [f"{key}.111.json" for key, _ in forged(rdir)]
    for folder in (rdir / STATS_CACHE_DIR, cache_dir):  # the old place and the user's cache
        folder.mkdir(parents=True)
        for name in names:
            if kind == "fifo":
                os.mkfifo(folder / name)
            else:
                os.symlink("/dev/zero", folder / name)
    proc = subprocess.run(
        [sys.executable, "-c", CAPPED_COMPARE, *base(rdir), "--format", "json"],
        env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout == fresh
    assert "6 entries not trusted and recomputed" in proc.stderr
    # the next run prunes them (named like entries, not regular files) and reads its own rows
    out, err = run_compare(rdir, capsys)
    assert out == fresh and "note: 6 of 6 comparison row(s) read" in err
    assert not any((cache_dir / name).exists() or (cache_dir / name).is_symlink()
                   for name in names)  # fmt: skip


def test_a_symlinked_cache_folder_is_refused(rdir, cache_dir, tmp_path, capsys):
    fresh, _ = run_compare(rdir, capsys, "--no-cache")
    # a folder someone else controls, with its own key and entries that key vouches for
    theirs = tmp_path / "theirs"
    planted = ComparisonCache(theirs)
    for key, row in forged(rdir, means=False):  # p-values only: the table's checks pass
        planted.put(key, RowFlags(), row)
    before = sorted(os.listdir(theirs))
    cache_dir.parent.mkdir()
    cache_dir.symlink_to(theirs)
    old = tmp_path / "old-target"  # and an old .stats-cache/ pointing elsewhere
    old.mkdir()
    (rdir / STATS_CACHE_DIR).symlink_to(old)
    out, err = run_compare(rdir, capsys)
    assert out == fresh
    assert (
        f"warning: not using the statistics cache {cache_dir}: it is a symbolic link (remove "
        "it; the cache is made again); computing without it" in err
    )
    assert sorted(os.listdir(theirs)) == before and os.listdir(old) == []  # nothing written
    # without the link, the user's own folder is made and used
    cache_dir.unlink()
    run_compare(rdir, capsys)
    out, err = run_compare(rdir, capsys)
    assert out == fresh and "note: 6 of 6 comparison row(s) read" in err
    assert cache_dir.is_dir() and not cache_dir.is_symlink()
    assert os.stat(cache_dir).st_mode & 0o777 == 0o700


def test_old_entries_are_pruned_and_the_folder_capped(rdir, cache_dir, monkeypatch, capsys):
    run_compare(rdir, capsys)  # six entries
    kept = entries(cache_dir)
    assert len(kept) == 6
    month_ago = time.time() - (comparison_cache.MAX_AGE_DAYS + 1) * 86400
    stale = [f"{i:064x}.111.json" for i in range(50)]
    for name in stale:
        (cache_dir / name).write_text("{}")
        os.utime(cache_dir / name, (month_ago, month_ago))
    for i, name in enumerate(kept):  # the used ones: newer, the first the oldest
        os.utime(cache_dir / name, (time.time() - 100 + i, time.time() - 100 + i))
    monkeypatch.setattr(comparison_cache, "MAX_ENTRIES", 4)
    fresh, _ = run_compare(rdir, capsys, "--no-cache", "--seed", "7")
    out, _ = run_compare(rdir, capsys, "--seed", "7")  # six new rows: the first write prunes
    assert out == fresh
    left = entries(cache_dir)
    assert not set(stale) & set(left)  # unused past the age
    assert set(kept) & set(left) == set(kept[2:])  # past the cap: the least recently used
    assert len(left) == 4 + 6
    out, err = run_compare(rdir, capsys, "--seed", "7")
    assert out == fresh and "note: 6 of 6 comparison row(s) read" in err


@pytest.mark.parametrize("command", ["compare", "summarize"])
def test_jobs_do_not_change_a_number(rdir, command, capsys):
    main = {"compare": compare.main, "summarize": summarize.main}[command]
    outputs = []
    for jobs in ("1", "2", "3"):
        assert main([*base(rdir), "--format", "json", "--no-cache", "--jobs", jobs]) == EXIT_OK
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert not (rdir / STATS_CACHE_DIR).exists()  # --no-cache writes nothing
    with pytest.raises(SystemExit) as exc:
        main([*base(rdir), "--jobs", "0"])
    assert exc.value.code == EXIT_INPUT_ERROR
    assert "not a number of processes" in capsys.readouterr().err


def test_compare_corrects_over_the_table_by_default(rdir, capsys):
    assert compare.main([*base(rdir), "--format", "json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["family"] == "table"
    rows = doc["rows"]
    assert len(rows) == 6
    want = multipletests([r["p_verdict"] for r in rows], method="holm")[1]
    assert [r["p_verdict_adj"] for r in rows] == pytest.approx(list(want))
    assert all(r["family_size"] == 6 for r in rows)
    assert any("every row of this comparison" in n for n in doc["footnotes"])
    assert compare.main([*base(rdir), "--format", "json", "--family", "pair"]) == EXIT_OK
    assert all(r["family_size"] == 2 for r in json.loads(capsys.readouterr().out)["rows"])
    # two models: the table is the pair, so the default gives the pair's numbers
    two = [*base(rdir), "--format", "json", "--models", "strong,weak"]
    assert compare.main(two) == EXIT_OK
    table = json.loads(capsys.readouterr().out)
    assert compare.main([*two, "--family", "pair"]) == EXIT_OK
    pair = json.loads(capsys.readouterr().out)
    assert table["rows"] == pair["rows"]


def test_report_takes_the_marks_and_family_flags(rdir, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert report.main([*base(rdir), "--out", str(out), "--no-marks", "--family", "pair",
                        "--correction", "fdr_bh"]) == EXIT_OK  # fmt: skip
    capsys.readouterr()
    data = page_table(out)
    assert all(c["mark"] is None for r in data["rows"] for c in r["cells"].values())
    page = out.read_text()
    assert "each pair&#x27;s tasks (--family pair" in page and "Benjamini-Hochberg" in page
    assert report.main([*base(rdir), "--out", str(out), "--marks-family", "task"]) == EXIT_OK
    capsys.readouterr()
    page = out.read_text()
    assert "best only, --marks-family task" in page
    assert "every row of this comparison" in page  # the verdicts' default family
    assert {c["mark"] for r in page_table(out)["rows"] for c in r["cells"].values()} >= {"best"}
