"""One table over several results folders (issue 39, item 5): a user who keeps a second
model, or a noise-check twin, in its own report folder gets one table of both from
`summarize`, `leaderboard`, `report`, `export` and `compare` (`--results-dir` repeated),
never the last folder alone; `push` refuses several folders. What cannot share a table is
refused with one `error:` line: a cell in two folders with other contents, a model its
folders' selections choose otherwise for, folders of other protocols, one folder named
twice. The results are real result files (`result_helpers`), no cell is trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from result_helpers import make_result, make_selection, write_many, write_result

from encoder_eval import compare, export, leaderboard, push, report, summarize
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_INPUT_ERROR, EXIT_OK
from encoder_eval.core.protocol import LR_GRID
from encoder_eval.core.results import STATS_CACHE_DIR, result_filename

TASKS = ("glue_rte", "glue_mrpc")
SEEDS = range(45, 50)
SKILL = {"model-a": 0.70, "model-b": 0.60}


def write_folder(folder: Path, model: str, selection: Path, **experiment: str) -> None:
    """`model`'s report cells on TASKS (protocol seeds, the selected lr05), and the
    experiment file a report sweep of that model alone writes (`experiment`: extra
    top-level TOML lines, e.g. a recipe)."""
    write_many(
        folder,
        [
            make_result(model, task, "lr05", seed, "report", SKILL[model] + seed / 1000)
            for task in TASKS
            for seed in SEEDS
        ],
    )
    extra = "".join(f"{v}\n" for v in experiment.values())
    (folder / "experiment.toml").write_text(
        f'version = 1\nphase = "report"\ntasks = {json.dumps(list(TASKS))}\n{extra}'
        f'[models.{model}]\npath = "org/{model}"\n'
        f"[seeds]\nreport = {list(SEEDS)}\n"
        f'[phases.report]\nresults_dir = "{folder}"\nselection = "{selection}"\n',
        encoding="utf-8",
    )


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The issue's scenario: one select sweep chose for both models (one selection), the
    report sweep of model-a ran into r1, model-b's into r2."""
    selection = tmp_path / "selection.json"
    selection.write_text(
        json.dumps(make_selection({(m, t): "lr05" for m in SKILL for t in TASKS})),
        encoding="utf-8",
    )
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    write_folder(r1, "model-a", selection)
    write_folder(r2, "model-b", selection)
    return r1, r2, selection


def run(capsys, command, *args: str) -> tuple[int, str, str]:
    code = command.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def both(two) -> list[str]:
    return ["--results-dir", str(two[0]), "--results-dir", str(two[1])]


def test_summarize_one_table_of_both_folders(two, capsys):
    code, out, err = run(capsys, summarize, *both(two), "--format", "json", "--no-marks")
    assert code == EXIT_OK, err
    doc = json.loads(out)
    assert [r["model"] for r in doc["rows"]] == ["model-a", "model-b"]
    for row in doc["rows"]:
        skill = SKILL[row["model"]]
        for task in TASKS:
            cell = row["cells"][task]
            assert cell["n"] == 5 and cell["missing_seeds"] == []
            assert cell["mean"] == pytest.approx(skill + 0.047)
    assert doc["problems"] == []
    code, out, err = run(capsys, summarize, *both(two), "--no-marks")
    assert code == EXIT_OK and "—" not in out.split("\n\n")[0], out


def test_one_folder_has_no_phantom_row(two, capsys):
    """The shared selection names model-b too, but r1's report sweep ran model-a alone."""
    r1, _, _ = two
    code, out, err = run(capsys, summarize, "--results-dir", r1, "--format", "json",
                         "--no-marks")  # fmt: skip
    assert code == EXIT_OK, err
    assert [r["model"] for r in json.loads(out)["rows"]] == ["model-a"]
    # the leaderboard of model-b's folder alone says nothing of model-a
    code, out, err = run(capsys, leaderboard, "--results-dir", two[1], "--format", "json",
                         "--bootstrap", "20")  # fmt: skip
    assert code == EXIT_OK and "model-a" not in out + err, err
    assert [r["model"] for r in json.loads(out)["rows"]] == ["model-b"]


def test_leaderboard_ranks_both_folders(two, capsys):
    code, out, err = run(capsys, leaderboard, *both(two), "--format", "json",
                         "--bootstrap", "50")  # fmt: skip
    assert code == EXIT_OK, err
    assert "no report result" not in err
    rows = json.loads(out)["rows"]
    assert [r["model"] for r in rows] == ["model-a", "model-b"]
    for row in rows:
        assert row["task_means"] == pytest.approx({t: SKILL[row["model"]] + 0.047 for t in TASKS})
    assert rows[0]["mean_rank"]["value"] == 1.0  # model-a is better on every task


def test_report_page_of_both_folders(two, tmp_path, capsys):
    out_file = tmp_path / "page.html"
    code, _, err = run(capsys, report, *both(two), "--out", out_file, "--resamples", "20")
    assert code == EXIT_OK, err
    page = out_file.read_text(encoding="utf-8")
    start = page.index('<script type="application/json" id="table-data">')
    start = page.index(">", start) + 1
    doc = json.loads(page[start : page.index("</script>", start)])
    assert [r["model"] for r in doc["rows"]] == ["model-a", "model-b"]
    assert all(r["cells"][t]["n"] == 5 for r in doc["rows"] for t in TASKS)
    assert "r1, r2" in page  # the title names both folders


def test_export_records_of_both_folders(two, capsys):
    code, out, err = run(capsys, export, "--format", "euroeval-legacy", *both(two))
    assert code == EXIT_OK, err
    records = [json.loads(line) for line in out.splitlines()]
    assert {r["model"] for r in records} == {"model-a", "model-b"}
    assert len(records) == len(SKILL) * len(TASKS)


def test_compare_one_selection_for_every_folder(two, capsys):
    r1, r2, selection = two
    for d in (r1, r2):  # folders without experiment files: --selection names their selection
        (d / "experiment.toml").unlink()
    code, out, err = run(capsys, compare, *both(two), "--selection", selection,
                         "--format", "json", "--resamples", "20")  # fmt: skip
    assert code == EXIT_OK, err
    rows = json.loads(out)["rows"]
    assert {(r["model_a"], r["model_b"]) for r in rows} == {("model-a", "model-b")}
    assert all((r["n_a"], r["n_b"]) == (5, 5) for r in rows)
    # one per folder, in order, works too; any other count is refused
    code, _, err = run(capsys, compare, *both(two), "--selection", selection,
                       "--selection", selection, "--resamples", "20")  # fmt: skip
    assert code == EXIT_OK, err
    code, _, err = run(capsys, compare, *both(two), *["--selection", selection] * 3)
    assert code == EXIT_INPUT_ERROR
    assert err.count("error:") == 1 and "--selection is given 3 times" in err


def test_push_refuses_several_folders(two, capsys):
    code, out, err = run(capsys, push, *both(two), "--repo", "org/results", "--dry-run")
    assert code == EXIT_INPUT_ERROR and out == ""
    assert err.count("error:") == 1 and "push reads one --results-dir, not 2" in err


def test_push_stages_no_phantom_row(two, capsys):
    r1, _, _ = two
    code, out, err = run(capsys, push, "--results-dir", r1, "--repo", "org/results",
                         "--dry-run")  # fmt: skip
    assert code == EXIT_OK, err
    staged = Path(err.split("staged ", 1)[1].split(" in ", 1)[1].split(" (dry run", 1)[0])
    try:
        table = json.loads((staged / "table.json").read_text(encoding="utf-8"))
    finally:
        import shutil

        shutil.rmtree(staged, ignore_errors=True)
    assert [r["model"] for r in table["rows"]] == ["model-a"]


def test_a_cell_in_two_folders(two, capsys):
    r1, r2, _ = two
    cell = result_filename("model-a", "glue_rte", LR_GRID["lr05"], 45)
    # the same content (a copy): counted once
    (r2 / cell).write_bytes((r1 / cell).read_bytes())
    code, out, err = run(capsys, summarize, *both(two), "--format", "json", "--no-marks")
    assert code == EXIT_OK, err
    cells = {r["model"]: r["cells"] for r in json.loads(out)["rows"]}
    assert cells["model-a"]["glue_rte"]["n"] == 5
    # another content: refused, naming both files
    write_result(r2, make_result("model-a", "glue_rte", "lr05", 45, "report", 0.1))
    for command in (summarize, compare, leaderboard, export):
        extra = ("--format", "euroeval") if command is export else ()
        code, out, err = run(capsys, command, *extra, *both(two))
        assert code == EXIT_INPUT_ERROR and out == "", command
        assert err.count("error:") == 1 and "hold the same cell" in err, err
        assert str(r1 / cell) in err and str(r2 / cell) in err


def test_a_model_selected_otherwise_in_two_folders(two, tmp_path, capsys):
    r1, r2, selection = two
    other = tmp_path / "other-selection.json"
    other.write_text(
        json.dumps(make_selection({("model-a", "glue_rte"): "lr06",
                                   ("model-b", "glue_rte"): "lr05",
                                   ("model-b", "glue_mrpc"): "lr05"})),
        encoding="utf-8",
    )  # fmt: skip
    # model-a's seed 49 reran in r2, from a selection that chose another LR
    write_result(r2, make_result("model-a", "glue_rte", "lr06", 49, "report", 0.7))
    text = (r2 / "experiment.toml").read_text(encoding="utf-8")
    (r2 / "experiment.toml").write_text(text.replace(str(selection), str(other)))
    code, out, err = run(capsys, summarize, *both(two))
    assert code == EXIT_INPUT_ERROR and out == ""
    assert err.count("error:") == 1
    assert "model-a/glue_rte is selected otherwise" in err and str(other) in err


def test_folders_of_other_protocols(two, capsys):
    r1, r2, selection = two
    text = (r2 / "experiment.toml").read_text(encoding="utf-8")
    (r2 / "experiment.toml").write_text(
        text.replace("[models", "[recipe]\nmax_steps = 100\n[models", 1)
    )
    code, out, err = run(capsys, summarize, *both(two), "--allow-partial")
    assert code == EXIT_INPUT_ERROR and out == ""
    assert err.count("error:") == 1 and "recipe.max_steps" in err and "other protocols" in err


def test_select_grids_differ(two, tmp_path, capsys):
    r1, r2, selection = two
    shrunk = make_selection({(m, t): "lr05" for m in SKILL for t in TASKS})
    shrunk["policy"] = {"lr_keys": ["lr05"], "seeds": [42]}
    other = tmp_path / "shrunk.json"
    other.write_text(json.dumps(shrunk), encoding="utf-8")
    text = (r2 / "experiment.toml").read_text(encoding="utf-8")
    (r2 / "experiment.toml").write_text(text.replace(str(selection), str(other)))
    code, _, err = run(capsys, summarize, *both(two), "--allow-partial")
    assert code == EXIT_INPUT_ERROR and err.count("error:") == 1
    assert "other select grids" in err


def test_one_folder_named_twice(two, capsys):
    r1, _, _ = two
    code, _, err = run(capsys, summarize, "--results-dir", r1, "--results-dir", f"{r1}/.")
    assert code == EXIT_INPUT_ERROR and err.count("error:") == 1 and "name each folder once" in err


@pytest.mark.parametrize("command", [summarize, export])
def test_out_may_not_replace_an_input_of_any_folder(two, command, capsys):
    r1, r2, _ = two
    before = (r1 / "experiment.toml").read_bytes()
    extra = ("--format", "euroeval") if command is export else ()
    code, _, err = run(capsys, command, *extra, *both(two), "--out", r1 / "experiment.toml")
    assert code == EXIT_INPUT_ERROR and err.count("error:") == 1
    assert (r1 / "experiment.toml").read_bytes() == before


def test_comparison_cache_in_no_results_folder(two, tmp_path, monkeypatch, capsys):
    """The comparisons of a table over several folders are kept in the user's cache, never
    in a results folder (issue 50: others may write those)."""
    r1, r2, _ = two
    monkeypatch.setenv("ENCODER_EVAL_CACHE_DIR", str(tmp_path / "user-cache"))
    code, _, err = run(capsys, summarize, *both(two), "--resamples", "20")
    assert code == EXIT_OK, err
    assert any((tmp_path / "user-cache" / "comparisons").glob("*.json"))
    assert not (r1 / STATS_CACHE_DIR).exists() and not (r2 / STATS_CACHE_DIR).exists()


def test_twin_on_other_seeds_is_counted_as_such(two, capsys):
    """A noise-check twin reported on seeds 50-54 in its own folder: one table, its cells
    off-protocol and its protocol seeds missing (refused unless --allow-partial)."""
    r1, r2, selection = two
    for path in r2.glob("*.json"):
        path.unlink()
    write_many(r2, [make_result("model-b", t, "lr05", s, "report", 0.6) for t in TASKS
                    for s in range(50, 55)])  # fmt: skip
    code, _, err = run(capsys, summarize, *both(two), "--no-marks")
    assert code == EXIT_INCOMPLETE and "[missing_seeds]" in err and "[off_protocol]" in err
    assert "model-a" not in err.split("[missing_seeds]")[1].split("[")[0]


def test_select_sweeps_of_other_protocols(two, tmp_path, capsys):
    """Each selection records its select sweep's experiment: a shrunken one beside the
    protocol's is refused, whichever report folder it reaches."""
    r1, r2, selection = two
    for path, steps in ((selection, None), (tmp_path / "short.json", 100)):
        doc = make_selection({(m, t): "lr05" for m in SKILL for t in TASKS})
        doc["experiment"] = {"version": 1, "phase": "select", "tasks": list(TASKS)}
        if steps:
            doc["experiment"]["recipe"] = {"max_steps": steps}
        path.write_text(json.dumps(doc), encoding="utf-8")
    text = (r2 / "experiment.toml").read_text(encoding="utf-8")
    (r2 / "experiment.toml").write_text(text.replace(str(selection), str(tmp_path / "short.json")))
    code, _, err = run(capsys, summarize, *both(two), "--allow-partial", "--no-marks")
    assert code == EXIT_INPUT_ERROR and err.count("error:") == 1
    assert "(its select sweep)" in err and "recipe.max_steps" in err
    code, _, err = run(capsys, summarize, "--results-dir", r2, "--allow-partial", "--no-marks")
    assert code == EXIT_OK, err  # one folder alone: nothing to disagree with


def test_probe_results_make_a_table_of_one_folder(two, capsys):
    r1, r2, _ = two
    (r2 / "m_glue_rte_mean.probe.json").write_text("{}", encoding="utf-8")
    for command in (summarize, leaderboard):
        code, out, err = run(capsys, command, *both(two))
        assert code == EXIT_INPUT_ERROR and out == "" and err.count("error:") == 1
        assert "holds probe results, which make a table of one --results-dir" in err
