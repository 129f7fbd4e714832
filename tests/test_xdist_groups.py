"""The tests that submit jobs to the one-node Slurm cluster run on one pytest-xdist worker
under `make test` (`-n 2 --dist loadgroup`), and so do those that read the shared
`protocol_run`: tests/conftest.py gives them an `xdist_group` and, under pytest 9, makes
the id pytest-xdist's scheduler sees carry the group (`pytest_collection_finish`, which
relies on pytest and pytest-xdist internals). This guards that grouping (issue 50, item 5):
a small session with the real conftest as a plugin, on two workers, records which worker
ran each test. Without the conftest's re-applied ids the groups scatter over both workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent

PROBE = """
import os
import time
from pathlib import Path

import pytest

OUT = Path(os.environ["XDIST_PROBE_OUT"])


def record(name):
    (OUT / f"{name}.{os.environ.get('PYTEST_XDIST_WORKER', 'none')}").write_text("")
    time.sleep(0.2)  # long enough that a free worker would take the next one


@pytest.fixture
def slurm():  # the conftest's needs a cluster; grouping goes by the fixture's name
    return None


@pytest.fixture
def protocol_run():  # the conftest's trains a protocol; grouping goes by the name
    return None


@pytest.mark.slurm
@pytest.mark.parametrize("i", range(4))
def test_marked_slurm(i):
    record(f"slurm-marked-{i}")


@pytest.mark.parametrize("i", range(4))
def test_slurm_fixture(slurm, i):
    record(f"slurm-fixture-{i}")


@pytest.mark.parametrize("i", range(4))
def test_protocol(protocol_run, i):
    record(f"protocol-{i}")


@pytest.mark.parametrize("i", range(8))
def test_free(i):
    record(f"free-{i}")
"""


def test_slurm_and_protocol_run_tests_run_on_one_worker_each(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        "XDIST_PROBE_OUT": str(out),
        "ENCODER_EVAL_CACHE_DIR": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-n", "2", "--dist", "loadgroup", "test_probe.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for path in out.iterdir():
        name, worker = path.name.rsplit(".", 1)
        workers[name.rsplit("-", 1)[0]].add(worker)
    assert sum(1 for _ in out.iterdir()) == 20, sorted(p.name for p in out.iterdir())
    assert workers["free"] <= {"gw0", "gw1"}  # (two workers ran the session)
    # every Slurm test, by marker or by fixture, on one worker; the protocol_run ones too
    slurm = workers["slurm-marked"] | workers["slurm-fixture"]
    assert len(slurm) == 1, dict(workers)
    assert len(workers["protocol"]) == 1, dict(workers)
