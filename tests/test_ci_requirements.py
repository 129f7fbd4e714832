"""ENCODER_EVAL_REQUIRE_DATA=1 (set by .ci/run) makes a missing real-data mirror fail the
tests that need it instead of skipping them, so CI cannot pass with those tests unrun;
ENCODER_EVAL_REQUIRE_PERMISSIONS=1 (set by .ci/run) does the same for the tests that need
permission bits to stop their commands (`fault_helpers.skip_without_permission_bits`).

A small pytest session is run on a mirror location that does not exist
(ENCODER_EVAL_SHARED_DATA), through both ways tests reach the mirror: `shared_data()` of
mirror_helpers and the `small_mirror` fixture of conftest.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PROBE = """
from mirror_helpers import shared_data

def test_shared_data():
    shared_data()

def test_small_mirror(small_mirror):
    pass
"""


def _probe(tmp_path: Path, require: str | None) -> tuple[int, str]:
    """Run PROBE with the real conftest as a plugin and the mirror pointed at a missing
    directory; returns pytest's exit code and output."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "ENCODER_EVAL_REQUIRE_DATA"}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")])),
        ENCODER_EVAL_SHARED_DATA=str(tmp_path / "no-such-mirror"),
        ENCODER_EVAL_CACHE_DIR=str(tmp_path / "cache"),
    )
    if require is not None:
        env["ENCODER_EVAL_REQUIRE_DATA"] = require
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "test_probe.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("require", [None, "0"], ids=["unset", "0"])
def test_a_missing_mirror_skips_by_default(tmp_path, require):
    rc, out = _probe(tmp_path, require)
    assert rc == 0 and re.search(r"\b2 skipped\b", out), out
    assert "no-such-mirror is absent" in out


def test_a_missing_mirror_fails_under_encoder_eval_require_data(tmp_path):
    rc, out = _probe(tmp_path, "1")
    assert rc == 1, out
    # shared_data() fails its test; the fixture fails its test's setup (an error)
    assert re.search(r"\b1 failed, 1 error\b", out) and "skipped" not in out, out
    assert out.count("ENCODER_EVAL_REQUIRE_DATA=1 but the real-data mirror") >= 2, out
    assert "no-such-mirror is absent" in out


def test_permission_bits_skip_unless_required(monkeypatch):
    from fault_helpers import REQUIRE_PERMISSIONS_ENV, skip_without_permission_bits

    skip_without_permission_bits(None, "never")  # nothing in the way: the test goes on
    monkeypatch.delenv(REQUIRE_PERMISSIONS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="why: root reads"):
        skip_without_permission_bits("root reads", "why")
    monkeypatch.setenv(REQUIRE_PERMISSIONS_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="ENCODER_EVAL_REQUIRE_PERMISSIONS=1 but why"):
        skip_without_permission_bits("root reads", "why")
