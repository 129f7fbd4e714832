"""Loader modes as plug-ins (issue 27 item 5): a real package, written here and installed with
pip into a folder on PYTHONPATH, adds a mode through the `encoder_eval.loaders` entry point
group. `list models` / `list modes` name the package, a cell run with the mode is built by
the plug-in's function (and records it), and a broken plug-in is one error line naming its
package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from encoder_eval.core.errors import EXIT_INPUT_ERROR, EXIT_OK

ROOT = Path(__file__).resolve().parents[1]

GOOD = '''
import os
from transformers import AutoModelForSequenceClassification


def load(model_path, *, config, num_labels, problem, **kwargs):
    """A sequence classifier, as `auto` builds it, leaving a mark that it ran."""
    with open(os.environ["TOY_LOADER_MARK"], "a") as f:
        f.write(f"{model_path} {num_labels} {problem}\\n")
    return AutoModelForSequenceClassification.from_pretrained(
        model_path, config=config, ignore_mismatched_sizes=True, **kwargs)
'''
BROKEN = "import no_such_module_for_a_broken_plugin  # noqa: F401\n"


def _package(root: Path, name: str, module: str, body: str, mode: str) -> Path:
    src = root / name
    src.mkdir()
    (src / f"{module}.py").write_text(textwrap.dedent(body))
    (src / "pyproject.toml").write_text(textwrap.dedent(f'''
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.3"

        [tool.setuptools]
        py-modules = ["{module}"]

        [project.entry-points."encoder_eval.loaders"]
        {mode} = "{module}:load"
    '''))  # fmt: skip
    return src


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    """Two installed plug-in packages: a working `toy-head` mode, a broken `broken-head`."""
    root = tmp_path_factory.mktemp("plugins")
    target = root / "site"
    for name, module, body, mode in (("ee-toy-loader", "ee_toy_loader", GOOD, "toy-head"),
                                     ("ee-broken-loader", "ee_broken_loader", BROKEN,
                                      "broken-head")):  # fmt: skip
        src = _package(root, name, module, body, mode)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", str(target), str(src)],
                       check=True, capture_output=True)  # fmt: skip
    return target


def _harness(site: Path, *args: str, mark: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
           "HF_HUB_OFFLINE": "1", "TOY_LOADER_MARK": str(mark or os.devnull)}  # fmt: skip
    return subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip


def test_list_shows_where_each_mode_comes_from(plugins) -> None:
    proc = _harness(plugins, "encoder_eval", "list", "models")
    assert proc.returncode == EXIT_OK, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert "package ee-toy-loader 0.3 (ee_toy_loader:load)" in lines["toy-head"]
    assert "package ee-broken-loader 0.3" in lines["broken-head"]  # listed without importing
    assert "built-in" in lines["decoder-adapted"]
    proc = _harness(plugins, "encoder_eval", "list", "modes", "--format", "json")
    rows = {r["mode"]: r["from"] for r in json.loads(proc.stdout)}
    assert rows["toy-head"].startswith("plug-in: package ee-toy-loader 0.3")
    assert list(rows)[:3] == ["auto", "liquid-bidir", "decoder-adapted"]


def _cell(tiny_models, small_mirror, out: Path, mode: str) -> list[str]:
    return ["encoder_eval.run", "--model-path", str(tiny_models["bert"]), "--model-key", "tiny",
            "--task", "glue_rte", "--lr", "1.67e-05", "--seed", "45", "--data-dir",
            str(small_mirror), "--device", "cpu", "--max-steps", "2", "--max-seq-len", "64",
            "--out-json", str(out), "--progress", "quiet", "--mode", mode]  # fmt: skip


def test_a_cell_loads_its_model_through_the_plugin(plugins, tiny_models, small_mirror,
                                                   tmp_path) -> None:  # fmt: skip
    mark, out = tmp_path / "mark.txt", tmp_path / "cell.json"
    proc = _harness(plugins, *_cell(tiny_models, small_mirror, out, "toy-head"), mark=mark)
    assert proc.returncode == EXIT_OK, proc.stderr[-2000:]
    assert mark.read_text().split() == [str(tiny_models["bert"]), "2",
                                        "single_label_classification"]  # fmt: skip
    result = json.loads(out.read_text())
    assert result["recipe"]["mode"] == "toy-head"
    assert result["recipe"]["loader_plugin"] == "ee-toy-loader 0.3 (ee_toy_loader:load)"


def test_a_broken_plugin_is_one_error_line_naming_its_package(plugins, tiny_models,
                                                              small_mirror, tmp_path) -> None:  # fmt: skip
    out = tmp_path / "cell.json"
    proc = _harness(plugins, *_cell(tiny_models, small_mirror, out, "broken-head"))
    assert proc.returncode == EXIT_INPUT_ERROR, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "package ee-broken-loader 0.3" in errors[0]
    assert "ModuleNotFoundError" in errors[0] and "uninstall ee-broken-loader" in errors[0]
    # without the plug-ins installed the mode is unknown, as any bad mode
    proc = _harness(tmp_path, *_cell(tiny_models, small_mirror, out, "toy-head"))
    assert proc.returncode == EXIT_INPUT_ERROR and "toy-head" in proc.stderr
