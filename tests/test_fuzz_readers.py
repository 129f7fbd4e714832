"""Damaged and hostile files thrown at every reader: no traceback, no file lost, one line
per message.

Seeded and bounded: the seed is printed (ENCODER_EVAL_FUZZ_SEED picks another), and the
test damages at least 1,000 result, selection, receipt, token-cache and experiment files
(plus predictions files and files that are not cell results) in batches, each batch a
results folder read by `done` (`results.settle_cell`), `select`, `status`, `estimate`,
`summarize`, `compare`, `leaderboard`, `track report`, the experiment and selection loaders
and the token cache's `load`, called in-process. A reader may refuse (exit 1 or 2, one
`error:` line) or skip a file with a warning; it may never raise, never delete a file, and
`done` moves only files named like a cell result whose bytes read and fail to parse or
validate, into `.corrupt/`, byte for byte.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from result_helpers import make_result, make_selection, write_cell_with_predictions, write_result

from encoder_eval import compare, estimate, leaderboard, select, status, summarize, track
from encoder_eval.core.errors import MESSAGE_LIMIT, HarnessError
from encoder_eval.core.results import (
    CORRUPT,
    KEPT,
    MOVED,
    QUARANTINE_DIR,
    cell_state,
    is_result_name,
    settle_cell,
)
from encoder_eval.data import tokencache
from encoder_eval.plans import experiment
from encoder_eval.plans.selection import load_selection

SEED = int(os.environ.get("ENCODER_EVAL_FUZZ_SEED", "20261202"))
BATCHES = 24
MODELS, TASKS = ("m1", "m2"), ("glue_rte", "glue_mrpc")
MARK = "FUZZLINE"  # injected after a line break: no output line may start with it
DEEP = "[" * 100_000 + "]" * 100_000


def _hostile_values() -> list:
    nested: list = []
    for _ in range(60):
        nested = [nested]
    return [None, True, False, 0, -1, 2**63, 10**4000, 1e308, -5e-324, 0.5, "", "x",
            "NaN", f"a\n{MARK} injected", "y" * 5000, [], {}, [1, "a", None], {"a": 1},
            nested, {"per_language": {"en": "0.5"}}, ["lr06"], {"": None}]  # fmt: skip


HOSTILE = _hostile_values()
BLOBS = ["1" * 5000, "[" * 5000, "NaN", "-Infinity", "1e999", '"\\ud800"', "\n" + MARK,
         "{", "}", '"' + "z" * 3000 + '"', "\x00", "null", "[]"]  # fmt: skip
WHOLE = [b"", b"   \n", DEEP.encode(), b"\xff\xfe{}", b"null", b"[]", b'"text"', b"0",
         b"{" * 3000, ("[" * 2000 + "1" * 5000 + "]" * 2000).encode(),
         b'{"schema": "encoder-eval-result", "schema_version": 1e999}']  # fmt: skip


def _paths(node, prefix=()):
    """Every (path to a container, key) in a JSON tree."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(
        node, list) else ()  # fmt: skip
    for key, value in items:
        out.append((prefix, key))
        out += _paths(value, (*prefix, key))
    return out


def _at(node, path):
    for key in path:
        node = node[key]
    return node


def damage(rng: random.Random, obj) -> bytes:
    """One damaged version of the JSON object `obj`: a tree edit (a hostile value anywhere,
    a key removed), a text edit (truncation, bytes flipped, a hostile token inserted, a
    number made 5,000 digits long) or a whole hostile document."""
    kind = rng.randrange(10)
    if kind <= 3:
        tree = copy.deepcopy(obj)
        for _ in range(rng.randint(1, 3)):
            spots = _paths(tree)
            if not spots:
                break
            parent_path, key = rng.choice(spots)
            parent = _at(tree, parent_path)
            if isinstance(parent, dict) and rng.random() < 0.25:
                del parent[key]
            else:
                parent[key] = copy.deepcopy(rng.choice(HOSTILE))
        return json.dumps(tree).encode()
    text = json.dumps(obj, indent=rng.choice([None, 2]))
    if kind == 4:
        return text[: rng.randrange(len(text))].encode()
    if kind == 5:
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 6:
        at = rng.randrange(len(text))
        return (text[:at] + rng.choice(BLOBS) + text[at:]).encode()
    if kind == 7:
        numbers = list(re.finditer(r"(?<![\w.])\d+(?![\w.])", text))
        if numbers:
            m = rng.choice(numbers)
            return (text[: m.start()] + "9" * 5000 + text[m.end() :]).encode()
        return text.encode()
    if kind == 8 and isinstance(obj, dict) and "schema_version" in obj:
        newer = dict(obj, schema_version=obj["schema_version"] + rng.randint(1, 3))
        return json.dumps(newer).encode()
    return rng.choice(WHOLE)


def damage_toml(rng: random.Random, text: str) -> bytes:
    """One damaged version of a TOML document."""
    kind = rng.randrange(6)
    lines = text.splitlines()
    if kind == 0:
        return text[: rng.randrange(len(text))].encode()
    if kind == 1:
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 2:  # a value replaced by a hostile one
        keyed = [i for i, line in enumerate(lines) if "=" in line and not line.startswith("#")]
        i = rng.choice(keyed)
        value = rng.choice(['"x"', "1" + "0" * 5000, "inf", "nan", "-1", "true", "[]", "{}",
                            "[" * 3000 + "]" * 3000, '"' + "w" * 5000 + '"', "1e999",
                            "[1, 2]", '["lr99"]', '{a = 1}', "'''\n" + MARK + "\n'''"])  # fmt: skip
        lines[i] = lines[i].split("=", 1)[0] + "= " + value
        return "\n".join(lines).encode()
    if kind == 3:  # a section or key repeated, or an unknown one
        return (text + rng.choice(["\n[seeds]\nselect = [1]\n", "\nversion = 1\n",
                                   "\nunknown = 1\n", "\n[models.evil]\npath = 5\n"])).encode()  # fmt: skip
    if kind == 4:
        return ("a = " + "[" * 2000 + "]" * 2000).encode()
    return rng.choice([b"", b"\xff", b"version = 99", b"version = 1\ntasks = 3\n", b"[[x]]"])


# ----------------------------------------------------------------------------- the batch


def _valid_files(root: Path) -> dict:
    """A select and a report folder of valid results (report cells with predictions), their
    selection, receipts and an experiment file; returns what to damage."""
    sel_dir, rep_dir, track_dir = root / "select", root / "report", root / "track"
    results: dict[str, list] = {"select": [], "report": []}
    for model in MODELS:
        for task in TASKS:
            for key in ("lr03", "lr06"):
                for seed in (42, 43, 44):
                    data = make_result(model, task, key, seed, "select", 0.5 + seed / 1000)
                    results["select"].append((write_result(sel_dir, data), data))
            for seed in (45, 46, 47):
                path = write_cell_with_predictions(rep_dir, model, task, "lr06", seed,
                                                   [0, 1, 1, 0], [0, 1, 0, 0])  # fmt: skip
                results["report"].append((path, json.loads(path.read_text())))
    selection = make_selection({(m, t): "lr06" for m in MODELS for t in TASKS})
    sel_file = root / "selection.json"
    sel_file.write_text(json.dumps(selection))
    receipts = []
    (track_dir / "receipts").mkdir(parents=True)
    for i, score in enumerate((0.7, 0.69, 0.5)):
        r = track.Receipt(
            f"c{i}", i, [track.TaskResult("glue_rte", score, True, 100,
                                          {"std": 0.01, "n": 5, "metric": "accuracy"})],
            [45, 46, 47], {"step": i}, {"kind": "finetune", "tasks": ["glue_rte"],
                                         "lr_key": "lr06", "seeds": [45, 46, 47]},
            f"/ckpt/{i}", f"rev{i}", "2026-01-01T00:00:00+00:00",
        )  # fmt: skip
        path = track.receipt_path(track_dir, r.checkpoint_id)
        path.write_text(json.dumps(r.to_dict()))
        receipts.append((path, r.to_dict()))
    exp_text = "\n".join([
        "version = 1", 'tasks = ["glue_rte", "glue_mrpc"]', 'lr_keys = ["lr03", "lr06"]',
        'device = "cpu"', "[models.m1]", 'path = "org/m1"', 'mode = "auto"', "[models.m2]",
        'path = "org/m2"', "[seeds]", "select = [42, 43, 44]", "report = [45, 46, 47]",
        "[recipe]", "max_steps = 40", "max_seq_len = 128", "",
    ])  # fmt: skip
    return {"sel_dir": sel_dir, "rep_dir": rep_dir, "track_dir": track_dir,
            "results": results, "selection": (sel_file, selection), "receipts": receipts,
            "experiment": exp_text}  # fmt: skip


def _moved(obj, old: Path, new: Path):
    """`obj` (the description `_valid_files` returns) with every path under `old` moved
    under `new`."""
    if isinstance(obj, Path):
        return new / obj.relative_to(old)
    if isinstance(obj, dict):
        return {k: _moved(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_moved(v, old, new) for v in obj)
    return obj


class Output:
    """Everything readers printed, checked line by line at the end."""

    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def add(self, where: str, text: str, message: bool = True) -> None:
        self.lines += [(where, line, message) for line in text.splitlines()]

    def check(self) -> None:
        for where, line, message in self.lines:
            assert "Traceback" not in line, (where, line)
            assert not line.startswith(MARK), f"{where}: a line broke in two: {line!r}"
            if message:  # stderr: messages are capped (stdout is the command's output)
                assert len(line) <= MESSAGE_LIMIT + 200, f"{where}: a {len(line)}-char message"


def _call(main, argv: list[str], capsys, out: Output, where: str) -> int:
    try:
        rc = main([str(a) for a in argv])
    except Exception as exc:  # pragma: no cover - the failure this test exists to catch
        captured = capsys.readouterr()
        pytest.fail(f"seed {SEED}, {where}: {type(exc).__name__}: {exc}\n{captured.err[-2000:]}")
    captured = capsys.readouterr()
    out.add(where, captured.out, message=False)
    out.add(where, captured.err)
    assert rc in (0, 1, 2), (where, rc, captured.err[-2000:])
    if rc == 2:
        errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (where, captured.err[-2000:])
    return rc


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_every_reader_survives_damaged_files(tmp_path, capsys):
    print(f"fuzz seed {SEED} (set ENCODER_EVAL_FUZZ_SEED to replay another)")
    rng = random.Random(SEED)
    out = Output()
    damaged = {"result": 0, "selection": 0, "receipt": 0, "experiment": 0, "other": 0}
    base = _valid_files(tmp_path / "base")
    for batch in range(BATCHES):
        root = tmp_path / f"b{batch}"
        shutil.copytree(tmp_path / "base", root)
        files = _moved(base, tmp_path / "base", root)
        sel_dir, rep_dir, track_dir = files["sel_dir"], files["rep_dir"], files["track_dir"]
        # Results: a third of each folder damaged in place.
        for phase in ("select", "report"):
            for path, data in rng.sample(
                files["results"][phase], {"select": 14, "report": 10}[phase]
            ):
                path.write_bytes(damage(rng, data))
                damaged["result"] += 1
        # Files that are not cell results, damaged: never moved by done.
        for path, _ in rng.sample(files["results"]["report"], 2):
            pred = path.with_name(path.name.replace(".json", ".predictions.json"))
            pred.write_bytes(damage(rng, json.loads(pred.read_text())))
            damaged["other"] += 1
        (sel_dir / "notes.json").write_bytes(damage(rng, {"note": "mine", "score": 0.9}))
        damaged["other"] += 1
        if batch % 3 == 0:  # read first by most report readers: they then refuse at once
            (rep_dir / "experiment.toml").write_bytes(damage_toml(rng, files["experiment"]))
            damaged["experiment"] += 1
        # Selections, receipts, experiment files, cache entries.
        sel_file, selection = files["selection"]
        bad_selections = []
        for k in range(7):
            bad = root / f"selection-{k}.json"
            bad.write_bytes(damage(rng, selection))
            bad_selections.append(bad)
            damaged["selection"] += 1
        for path, obj in rng.sample(files["receipts"], 3):
            path.write_bytes(damage(rng, obj))
            damaged["receipt"] += 1
        exp_files = []
        for k in range(5):
            exp = root / f"exp-{k}.toml"
            exp.write_bytes(damage_toml(rng, files["experiment"]))
            exp_files.append(exp)
            damaged["experiment"] += 1
        before = _snapshot(root)

        model_flags = [f for m in MODELS for f in ("--model", f"{m}=org/{m}")]
        plan_flags = [*model_flags, "--tasks", ",".join(TASKS)]
        _call(select.main, ["--results-dir", sel_dir, "--out", tmp_path / f"out-selection-{batch}.json",
                            "--lr-keys", "lr03,lr06", "--seeds", "42,43,44",
                            "--allow-partial"], capsys, out, "select")  # fmt: skip
        _call(status.main, ["--phase", "select", *plan_flags, "--lr-keys", "lr03,lr06",
                            "--seeds", "42,43,44", "--results-dir", sel_dir],
              capsys, out, "status select")  # fmt: skip
        _call(estimate.main, ["--results-dir", sel_dir, "--tasks", ",".join(TASKS)],
              capsys, out, "estimate")  # fmt: skip
        for sel in (sel_file, rng.choice(bad_selections)):
            _read_report(rep_dir, sel, plan_flags, capsys, out)
        _call(track.main, ["report", "--out-dir", track_dir, "--no-plots"], capsys, out,
              "track report")  # fmt: skip
        for bad in bad_selections:
            try:
                load_selection(bad)
            except HarnessError as exc:
                out.add(f"load_selection {bad}", f"error: {exc}")
        for exp in exp_files:
            try:
                experiment.load(exp)
            except HarnessError as exc:
                out.add(f"experiment.load {exp}", f"error: {exc}")
        out.add("readers", capsys.readouterr().err)
        after = _snapshot(root)
        for path, data in before.items():  # the readers above only read
            assert after.get(path) == data, f"seed {SEED}: a reader changed or removed {path}"
        # track's report; the comparisons summarize and compare keep are in the user's cache
        allowed = {track_dir}
        assert {p.parent for p in set(after) - set(before)} <= allowed
        before = after

        # done: only a cell-result-named file that reads and fails to parse or validate moves.
        messages: list[str] = []
        for directory, phase in ((sel_dir, "select"), (rep_dir, "report")):
            for path in sorted(p for p in directory.iterdir() if p.is_file()):
                data_before = path.read_bytes()
                was, _, why = cell_state(path, phase)
                state = settle_cell(path, phase, warn=messages.append)[0]
                if state == MOVED:  # only a cell result that reads and fails to validate
                    assert is_result_name(path) and was == CORRUPT, (path, was, why)
                    (kept,) = (directory / QUARANTINE_DIR).glob(f"{path.name}.*Z")
                    assert kept.read_bytes() == data_before
                    kept.rename(path)  # put back: the snapshot check below holds for all
                else:
                    assert path.read_bytes() == data_before, path
                    assert state == (KEPT if was in (CORRUPT, KEPT) else was), (path, state)
        out.add("done", "\n".join(messages))
        assert _snapshot(root) == before
    out.check()
    total = sum(damaged.values())
    print(f"damaged files: {total} {damaged}")
    assert total >= 1000 and all(damaged.values()), damaged


def test_the_token_cache_reader_survives_damaged_entries(tmp_path):
    """Damaged entries, under each name the cache may use, are misses: `load` never raises."""
    print(f"fuzz seed {SEED} (set ENCODER_EVAL_FUZZ_SEED to replay another)")
    rng = random.Random(SEED)
    entry = {"input_ids": [[101, 2023, 102]] * 3, "attention_mask": [[1, 1, 1]] * 3}
    for k in range(300):
        raw = damage(rng, entry) if k % 2 else bytes(rng.randrange(256) for _ in range(64))
        for name in (f"k{k}.pkl", f"k{k}.npz", f"k{k}.json"):  # either cache format
            (tmp_path / name).write_bytes(raw)
        tokencache.load(tmp_path, f"k{k}")  # a damaged entry is a miss, never a crash
        assert (tmp_path / f"k{k}.json").read_bytes() == raw  # and never deleted


# ----------------------------------------------------------------------------- special files


class _Hung(Exception):
    pass


def _special_files(root: Path, outside: Path) -> list[Path]:
    """Beside the valid files of `_valid_files(root)`: under names every reader picks up (a
    result, a predictions file, a TREC run, a receipt, a selection, an experiment file, a
    token-cache entry), a FIFO, a symlink to /dev/zero, a symlink to a file out of the
    folder and a file over `fileio.MAX_READ_BYTES` (sparse: it costs no disk)."""
    from encoder_eval.core import fileio
    from encoder_eval.core.receipt import receipt_path

    secret = outside / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    made = []

    def fifo(path: Path) -> None:
        os.mkfifo(path)

    def zero(path: Path) -> None:
        path.symlink_to("/dev/zero")

    def out(path: Path) -> None:
        path.symlink_to(secret)

    def huge(path: Path) -> None:
        with open(path, "wb") as handle:
            handle.truncate(fileio.MAX_READ_BYTES + 1)

    kinds = (fifo, zero, out, huge)
    names = {"select": [f"m1_glue_rte_lr0{k}_s42.json" for k in (1, 2, 4, 5)],
             "report": [f"m2_glue_mrpc_lr06_s{s}.json" for s in (48, 49, 50, 51)]}  # fmt: skip
    for phase, listed in names.items():
        for make, name in zip(kinds, listed, strict=True):
            make(root / phase / name)
            made.append(root / phase / name)
    reports = sorted((root / "report").glob("*_s45.json"))
    for make, result in zip(kinds, reports, strict=False):  # beside a valid report cell
        for suffix in (".predictions.json", ".run.trec"):
            beside = result.with_name(result.name.replace(".json", suffix))
            beside.unlink(missing_ok=True)
            make(beside)
            made.append(beside)
    for make, k in zip(kinds, range(4), strict=True):
        for path in (root / f"special-selection-{k}.json", root / f"special-exp-{k}.toml",
                     receipt_path(root / "track", f"special{k}"), root / "cache" / f"s{k}.tokens"):  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            make(path)
            made.append(path)
    return made


def _read_report(rep_dir, sel, plan, capsys, out, export_too: bool = False) -> None:
    """Every table reader of a report folder with selection `sel`: summarize, compare,
    leaderboard (and export), then status of the report phase; each outcome into `out`."""
    from encoder_eval import export

    common = ["--results-dir", rep_dir, "--selection", sel, "--allow-partial"]
    _call(summarize.main, [*common, "--format", "json"], capsys, out, f"summarize {sel}")
    _call(compare.main, [*common, "--format", "json", "--resamples", "99"],
          capsys, out, f"compare {sel}")  # fmt: skip
    _call(leaderboard.main, [*common, "--format", "json", "--bootstrap", "50"],
          capsys, out, f"leaderboard {sel}")  # fmt: skip
    if export_too:
        _call(export.main, ["--format", "examples", *common], capsys, out, f"export {sel}")
    _call(status.main, ["--phase", "report", "--selection", sel, *plan,
                        "--results-dir", rep_dir], capsys, out, f"status report {sel}")  # fmt: skip


def test_every_reader_survives_fifos_devices_links_out_and_oversized_files(tmp_path, capsys):
    """Issue 40 item 4: a FIFO named like a result hung `done` and `summarize`, a symlink
    to /dev/zero exhausted memory. Each reader now refuses such a file in one line (or
    skips it), never waits on it, never reads past the size cap, and never moves it."""
    import signal

    root = tmp_path / "root"
    _valid_files(root)
    (tmp_path / "outside").mkdir()
    made = _special_files(root, tmp_path / "outside")
    secret = tmp_path / "outside" / "id_ed25519"
    out = Output()

    def hung(signum, frame):
        raise _Hung("a reader blocked on a special file")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(600)  # the whole test takes seconds; a hang fails it instead of blocking
    try:
        sel_dir, rep_dir = root / "select", root / "report"
        plan = ["--model", "m1=org/m1", "--model", "m2=org/m2", "--tasks", "glue_rte,glue_mrpc"]
        _call(select.main, ["--results-dir", sel_dir, "--out", tmp_path / "sel.json",
                            "--lr-keys", "lr03,lr06", "--seeds", "42,43,44",
                            "--allow-partial"], capsys, out, "select")  # fmt: skip
        _call(status.main, ["--phase", "select", *plan, "--lr-keys", "lr03,lr06", "--seeds",
                            "42,43,44", "--results-dir", sel_dir], capsys, out, "status")  # fmt: skip
        _call(estimate.main, ["--results-dir", sel_dir, "--tasks", "glue_rte,glue_mrpc"],
              capsys, out, "estimate")  # fmt: skip
        selections = [root / "selection.json", *sorted(root.glob("special-selection-*"))]
        for sel in selections:
            _read_report(rep_dir, sel, plan, capsys, out, export_too=True)
        _call(track.main, ["report", "--out-dir", root / "track", "--no-plots"], capsys, out,
              "track report")  # fmt: skip
        for path in [
            *sorted(root.glob("special-selection-*")),
            *sorted(root.glob("special-exp-*")),
        ]:
            loader = load_selection if path.suffix == ".json" else experiment.load
            with pytest.raises(HarnessError) as caught:
                loader(path)
            out.add(f"{loader.__name__} {path}", f"error: {caught.value}")
        for k in range(4):
            assert tokencache.load(root / "cache", f"s{k}") is None
        messages: list[str] = []
        for directory, phase in ((sel_dir, "select"), (rep_dir, "report")):
            for path in sorted(directory.iterdir()):
                if path in made and is_result_name(path):
                    state = settle_cell(path, phase, warn=messages.append)[0]
                    if state == MOVED:  # only a link out, which reads and does not parse:
                        (kept,) = (directory / QUARANTINE_DIR).glob(f"{path.name}.*Z")
                        assert kept.is_symlink() and kept.resolve() == secret, kept
                        kept.rename(path)  # the link moved aside, its target untouched
                    else:  # a FIFO, a device, an oversized file: never moved, never done
                        assert state == KEPT, (path, state)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out.add("done", "\n".join(messages))
    out.check()
    for path in made:  # nothing was moved or removed
        assert os.path.lexists(path), path
    assert secret.read_text() == "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    said = "\n".join(line for _, line, _ in out.lines)
    assert "not a regular file (a FIFO)" in said
    assert "not a regular file (a character device)" in said
    assert "bytes, more than the" in said
