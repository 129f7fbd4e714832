"""The one atomic writer (encoder_eval/core/fileio.py): content, file mode, one temporary-name
scheme that every writer uses and `clean_stale_temporaries` cleans, and the file-name rule."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO
from result_helpers import make_result

from encoder_eval.core import fileio, results
from encoder_eval.core.fileio import (
    TMP_PREFIX,
    atomic_open,
    clean_stale_temporaries,
    safe_filename_part,
    write_atomic,
    write_json_atomic,
)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_bytes_and_text_are_written_whole_with_the_mode_a_plain_open_gives(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")  # what an ordinary writer under this umask creates
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    write_atomic(tmp_path / "t.txt", "Grüße\n")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "Grüße\n"
    assert _mode(tmp_path / "b.bin") == _mode(tmp_path / "t.txt") == _mode(plain)
    assert fileio.FILE_MODE == _mode(plain)
    write_atomic(tmp_path / "t.txt", "again\n")  # over an existing file
    assert (tmp_path / "t.txt").read_text() == "again\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "plain", "t.txt"]


def test_a_streaming_writer_uses_the_one_temporary_name_and_publishes_on_exit(tmp_path):
    target = tmp_path / "state.pt"
    with atomic_open(target, "wb") as handle:
        handle.write(b"part")
        (tmp,) = tmp_path.iterdir()
        assert tmp.name.startswith(f"{TMP_PREFIX}state.pt.") and len(tmp.name) > 16
        assert not target.exists()  # nothing published before the writer is done
    assert target.read_bytes() == b"part"
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(target, "w") as handle:
            handle.write('{"a": ')
            raise RuntimeError("killed halfway")
    with pytest.raises(ValueError):
        write_json_atomic(target, {"a": float("nan")})  # JSON has no NaN: refused
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(target, "a"):
            pass


def test_json_keeps_key_order_unless_asked_to_sort(tmp_path):
    write_json_atomic(tmp_path / "a.json", {"b": 1, "a": 2})
    write_json_atomic(tmp_path / "s.json", {"b": 1, "a": 2}, sort_keys=True)
    assert (tmp_path / "a.json").read_text() == '{\n  "b": 1,\n  "a": 2\n}\n'
    assert (tmp_path / "s.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


# Each writer, killed between writing its temporary and renaming it (os.fsync is the last
# call before the rename): what it leaves behind must be of the one scheme.
KILLED_WRITER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    os.fsync = lambda fd: os._exit(9)
    kind, directory = sys.argv[1], Path(sys.argv[2])
    if kind == "result":
        from encoder_eval.core import results
        results.write_json_atomic(directory / "r.json", json.loads(sys.argv[3]))
    elif kind == "mirror":
        from encoder_eval import prefetch
        prefetch.write_jsonl_atomic(directory / "train.jsonl", [{"sentence": "a", "label": 1}])
    elif kind == "manifest":
        from encoder_eval import prefetch
        prefetch.write_json_atomic(directory / "manifest.json", {"tasks": {}})
    elif kind == "cache":
        from encoder_eval.data import tokencache
        tokencache.store(directory, "k" * 64, {"input_ids": [[1, 2]]}, [0])
    elif kind == "plot":
        from encoder_eval.reports import plots
        fig = plots.new_figure(2, 2)
        plots.save_png(fig, directory / "scores.png")
    """
)


def test_every_writer_leaves_only_temporaries_the_cleaner_removes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    result = json.dumps(make_result("m", "glue_rte", "lr06", 42, "select", 0.5))
    kinds = ["result", "mirror", "manifest", "cache", "plot"]
    for kind in kinds:
        proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, kind, str(tmp_path), result],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 9, (kind, proc.stderr)
    left = sorted(tmp_path.iterdir())
    assert len(left) == len(kinds), left  # one temporary per killed writer, nothing published
    assert all(p.name.startswith(TMP_PREFIX) for p in left), left
    fresh = tmp_path / f"{TMP_PREFIX}live.json.abc123"  # a live writer's: too young to remove
    fresh.write_text("{")
    past = time.time() - 120
    for p in left:
        os.utime(p, (past, past))
    assert clean_stale_temporaries(tmp_path) == len(kinds)
    assert sorted(tmp_path.iterdir()) == [fresh]
    assert results.clean_stale_temporaries is clean_stale_temporaries  # one cleaner


def test_one_file_name_rule_for_results_and_figures():
    hostile = "org/model name:v1\n\x00"
    assert safe_filename_part(hostile) == "org_model_name_v1__"  # figures, logs: portable
    # Result file names keep what older harnesses wrote: only separators and control
    # characters are replaced, so files already on disk keep their names.
    assert results.safe_component(hostile) == "org_model name:v1__"
    assert results.result_filename("a/b", "glue_rte", 3.59e-05, 42) == "a_b_glue_rte_lr06_s42.json"
    for degenerate, expected in (("", "_"), (".", "_"), ("..", "__")):
        assert safe_filename_part(degenerate) == results.safe_component(degenerate) == expected


def test_the_cleaner_removes_only_the_harness_own_temporaries(tmp_path):
    """Issue 23 item 11: another program's `.tmp-*` file in a results folder is not the
    harness's to delete, however old; the harness's own leftover is."""
    theirs = tmp_path / ".tmp-editor-swap.json"
    theirs.write_text("someone else's")
    ours = tmp_path / f"{fileio.temporary_name(tmp_path / 'x.json')}k1ll3d"
    ours.write_text("{")
    past = time.time() - 3600
    for p in (theirs, ours):
        os.utime(p, (past, past))
    assert clean_stale_temporaries(tmp_path) == 1
    assert theirs.read_text() == "someone else's" and not ours.exists()
    assert not TMP_PREFIX.startswith(".tmp-") and "encoder-eval" in TMP_PREFIX


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": ' + "7" * 5000 + "}", r"is not valid JSON \(Exceeds the limit \(4300 digits\)"),
        ("[" * 100_000 + "]" * 100_000, r"is not valid JSON \(nested too deeply\)"),
        ('{"a": NaN}', r"is not valid JSON \(NaN is not a JSON number\)"),
        ('{"a": 1e999}', r"is not valid JSON \(the number 1e999 is out of range\)"),
        (b'{"a": "\xff"}', r"is not UTF-8 text \(byte 7\)"),
        ('{"a": 1', r"is not valid JSON \(Expecting ',' delimiter at line 1 column 8\)"),
        # json's own message may end in "at": said once ("starting at line", not "at at")
        ('{"a": "b', r"is not valid JSON \(Unterminated string starting at line 1 column 7\)$"),
        ('{"a": "\t"}', r"is not valid JSON \(Invalid control character at line 1 column 8\)$"),
    ],
)
def test_every_way_json_fails_is_one_typed_error_naming_the_file(tmp_path, text, reason):
    path = tmp_path / "x.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(fileio.DamagedFile, match=f"^{re.escape(str(path))} {reason}"):
        fileio.read_json(path)
    with pytest.raises(fileio.MissingFile, match="does not exist"):
        fileio.read_json(tmp_path / "absent.json")
    with pytest.raises(fileio.UnreadableFile, match="is a directory"):
        fileio.read_json(tmp_path)


def test_toml_and_yaml_fail_the_same_way(tmp_path):
    for text, reason in (("a = " + "[" * 3000 + "]" * 3000, "nested too deeply"),
                         ("a = 1" + "0" * 5000, "Exceeds the limit"), ("[x", "Expected")):  # fmt: skip
        with pytest.raises(fileio.DamagedFile, match=f"is not valid TOML: .*{reason}"):
            fileio.parse_toml(text, "t.toml")
    with pytest.raises(fileio.DamagedFile, match="anchor or alias \\(line 1\\)"):
        fileio.parse_yaml("a: &x [1]\nb: *x\n", "t.yaml")
    assert fileio.parse_yaml("a: [1, 2]\n", "t.yaml") == {"a": [1, 2]}


def test_read_bytes_reads_only_regular_files_up_to_the_cap(tmp_path):
    """Issue 40 item 4: a FIFO is refused without waiting for a writer, a link to
    /dev/zero without reading it, a file over the cap by its size; a link to a regular
    file reads as that file."""
    from encoder_eval.core import fileio

    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "big.json").write_bytes(b"1" * 1001)
    (tmp_path / "ok.json").write_bytes(b"[1]")
    (tmp_path / "link.json").symlink_to(tmp_path / "ok.json")
    cases = {"fifo.json": "is not a regular file (a FIFO)",
             "zero.json": "is not a regular file (a character device)",
             "big.json": "is 1,001 bytes, more than the 1,000 a reader reads"}  # fmt: skip
    for name, reason in cases.items():
        with pytest.raises(fileio.UnreadableFile) as caught:
            fileio.read_bytes(tmp_path / name, limit=1000)
        assert caught.value.reason == reason
    assert fileio.read_bytes(tmp_path / "big.json") == b"1" * 1001  # under the default cap
    assert fileio.read_json(tmp_path / "link.json") == [1]
    assert fileio.MAX_READ_BYTES >= 1 << 30  # a ranking cell's predictions are hundreds of MB
