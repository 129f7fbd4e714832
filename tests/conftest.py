"""Shared fixtures: tiny local models, a small slice of the real data mirror, no Hub."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

# A process started in the background of a non-interactive shell (`cmd &`, nohup) or as an
# xdist worker may inherit SIGINT ignored, and so would every process a test starts: the
# Ctrl-C tests would then signal processes that cannot hear it. Python's own handler here
# means the children start with the default (a Python-level handler is reset on exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread in each pytest process, as in the cell processes tests start
# (fault_helpers.env): two xdist workers on two cores with a thread per core each spin
# against each other (tests/test_cell.py: 89 -> 63 CPU s on an idle 2-core machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "ENCODER_EVAL_CACHE_DIR" not in os.environ:  # keep the tests' token cache out of $HOME
    import tempfile

    os.environ["ENCODER_EVAL_CACHE_DIR"] = tempfile.mkdtemp(prefix="encoder-eval-cache-")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mirror_helpers import shared_data  # noqa: E402  (needs the sys.path entry above)

REPO = Path(__file__).resolve().parents[1]

# (task, {split file: rows to keep}) for the small mirror most tests train on: the first n
# rows, or ("spread", n) for n rows evenly spaced through files sorted by label (the real
# Amazon files are, so their first rows are all one class, which the loader refuses).
SMALL_MIRROR = {
    "glue_rte": {"train.jsonl": 64, "validation.jsonl": 32},
    "glue_sst2": {"train.jsonl": 64, "validation.jsonl": 32},
    "glue_stsb": {"train.jsonl": 64, "validation.jsonl": 32},
    "sg_cb": {"train.jsonl": 48, "validation.jsonl": 24},
    "amazon_reviews_multi": {
        f"{split}.{lang}.jsonl": ("spread", n)
        for lang in ("de", "en", "es", "fr")
        for split, n in (("train", 16), ("validation", 12), ("test", 12))
    },
}


def write_small_mirror(dest: Path, spec: dict = SMALL_MIRROR) -> Path:
    """Copy the first rows of real mirror files into `dest` (same layout); skips, or fails
    under ENCODER_EVAL_REQUIRE_DATA=1, without the real mirror (`shared_data`)."""
    source = shared_data()
    for task, files in spec.items():
        (dest / task).mkdir(parents=True, exist_ok=True)
        for name, n in files.items():
            with open(source / task / name, encoding="utf-8") as src:
                if isinstance(n, tuple):
                    lines = src.readlines()
                    rows = [lines[i * len(lines) // n[1]] for i in range(n[1])]
                else:
                    rows = [next(src) for _ in range(n)]
            (dest / task / name).write_text("".join(rows), encoding="utf-8")
    return dest


@pytest.fixture(scope="session")
def small_mirror(tmp_path_factory) -> Path:
    return write_small_mirror(tmp_path_factory.mktemp("mirror"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny BERT, XLM-R, DeBERTa-v2, ModernBERT and a remote-code encoder, saved like Hub
    checkpoints without a classification head."""
    from tiny_models import build_all

    return build_all(tmp_path_factory.mktemp("models"), num_labels=None)


@pytest.fixture(scope="session")
def protocol_run(tmp_path_factory, tiny_models, small_mirror):
    """One real protocol run (tests/protocol_run.py) that several tests read; the tests
    that take it run on one xdist worker (`pytest_collection_modifyitems`), which builds it
    once."""
    from protocol_run import make_protocol_run

    return make_protocol_run(tmp_path_factory.mktemp("protocol_run"), tiny_models, small_mirror)


@pytest.fixture
def task_registry():
    """The task registries as built in; tasks a test registers (task files) are removed after."""
    from encoder_eval.data import tasks

    saved = [(d, dict(d)) for d in (tasks.TASK_KNOBS,)]
    yield
    for live, copy in saved:
        live.clear()
        live.update(copy)


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture
def slurm():
    """A healthy Slurm cluster (.ci/slurm.sh status), else a skip; a failure when CI says
    ENCODER_EVAL_REQUIRE_SLURM=1."""
    from test_slurm import _slurm_problem

    problem = _slurm_problem()
    if problem:
        if os.environ.get("ENCODER_EVAL_REQUIRE_SLURM") == "1":
            pytest.fail(f"ENCODER_EVAL_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--storm",
        action="store_true",
        help="run the kill storm's every round (tests/test_kills.py; make test passes it)",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist (`make test` runs two workers), the tests that submit jobs to the
    one-node Slurm cluster run on one worker, one at a time, as they were written to: two
    at once would queue behind each other's jobs and race their time limits. They carry the
    `slurm` marker, so `-m "not slurm"` (make test-fast) leaves them out. The tests that
    read the shared `protocol_run` run on one worker too, which builds it once."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "slurm" in fixtures or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif "protocol_run" in fixtures:
            item.add_marker(pytest.mark.xdist_group("protocol_run"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker sends the collected ids
def pytest_collection_finish(session) -> None:
    """Make `--dist loadgroup` group at all under pytest 9: pytest-xdist (3.8) marks a
    test's group by appending `@group` to `item._nodeid`, which pytest 9 no longer reads
    (`nodeid` comes from `item._id`), so every group was scattered over the workers. Where
    xdist has set a different `_nodeid`, it becomes the id the scheduler sees."""
    for item in session.items:
        grouped = getattr(item, "_nodeid", None)
        if isinstance(grouped, str) and grouped != item.nodeid:
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(grouped)
