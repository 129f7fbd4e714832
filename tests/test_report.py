"""`encoder-eval report`: the HTML page of a results folder, opened in a real headless
browser (Debian's Chromium, driven by selenium through /usr/bin/chromedriver; nothing is
downloaded). The results come from the real pipeline at tiny scale: three tiny local
models, two tasks of the small mirror, sweep -> run_all.sh -> select -> sweep -> run_all.sh
(the session's shared `protocol_run`, tests/protocol_run.py, which test_protocol_e2e.py
checks step by step).

The page must load without a console error and without fetching anything but itself, its
table must hold the numbers `summarize --format json` prints, every figure must decode,
and a score's link must open that cell's provenance. A screenshot is taken (and kept under
$ENCODER_EVAL_SCREENSHOT_DIR when set). .ci/run installs chromium and chromium-driver and
sets ENCODER_EVAL_REQUIRE_BROWSER=1, which makes a missing browser a failure."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fault_helpers import env, py, sh
from protocol_run import MODELS
from result_helpers import make_result, make_selection, write_many

from encoder_eval import report
from encoder_eval.core.errors import EXIT_INCOMPLETE, EXIT_OK
from encoder_eval.core.protocol import LR_GRID, PHASE_SEEDS
from encoder_eval.core.results import result_filename
from encoder_eval.reports.html import cell_anchor

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="session")
def browser() -> None:
    """A skip (a failure under ENCODER_EVAL_REQUIRE_BROWSER=1) without Chromium, its driver
    or selenium. Session-scoped like `protocol_run` and asked before it, so it runs first
    and a skip starts no cell process."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        why = f"missing {', '.join(missing)}: apt-get install chromium chromium-driver"
        if os.environ.get("ENCODER_EVAL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ENCODER_EVAL_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)


def _webdriver():
    """A headless Chromium (the `browser` fixture has checked that it is there)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--hide-scrollbars", "--no-first-run"):  # fmt: skip
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # An explicit driver path: selenium-manager is never asked to download one.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


class _Resources(HTMLParser):
    """Every URL-bearing attribute of a page, and its script elements' attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.scripts: list[dict] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("src", "href", "srcset", "action", "poster", "data"):
            if attrs.get(name) is not None:
                self.urls.append((tag, name, attrs[name]))
        if tag == "script":
            self.scripts.append(attrs)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
def test_the_report_page_in_a_real_browser(browser, protocol_run, tmp_path):
    rdir = str(protocol_run.root / "results" / "report")
    out = tmp_path / "report.html"
    cmd = [sys.executable, "-m", "encoder_eval", "report", "--results-dir", rdir, "--out",
           str(out)]  # fmt: skip
    # A shrunken run is not a protocol table: refused as summarize refuses it...
    refused = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    assert refused.returncode == EXIT_INCOMPLETE, refused.stderr
    assert "report refuses this table" in refused.stderr and "[off_protocol]" in refused.stderr
    assert not out.exists()
    # ...and shown, its problems in a banner, with --allow-partial.
    sh([*cmd, "--allow-partial"], tmp_path)
    expected = json.loads(sh(py("encoder_eval.summarize", "--results-dir", rdir,
                                "--allow-partial", "--format", "json"), tmp_path).stdout)  # fmt: skip

    # Self-contained: nothing on the page points outside it.
    page = out.read_text(encoding="utf-8")
    parsed = _Resources()
    parsed.feed(page)
    for tag, attr, url in parsed.urls:
        assert url.startswith(("#", "data:")), f"<{tag} {attr}={url[:60]}> leaves the page"
    assert all("src" not in s for s in parsed.scripts), "an external script"
    imgs = [u for tag, _, u in parsed.urls if tag == "img"]
    assert len(imgs) >= 1 + 2 * 3 + 1  # scores, 6 learning-rate curves, the CD plot
    assert all(u.startswith("data:image/png;base64,") for u in imgs)

    driver = _webdriver()
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        driver.get(out.as_uri())
        assert driver.title.startswith("encoder-eval report")
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == [], severe
        requests = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
        fetched = {m["params"]["request"]["url"] for m in requests
                   if m["method"] == "Network.requestWillBeSent"}  # fmt: skip
        assert fetched and all(u == out.as_uri() or u.startswith("data:") for u in fetched), fetched
        # Every figure decoded.
        assert driver.execute_script(
            "return Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)"
        )
        # The table's numbers are summarize's.
        shown = driver.execute_script(
            "return Array.from(document.querySelectorAll('#results-table td.score')).map(td =>"
            " ({model: td.dataset.model, task: td.dataset.task, mean: td.dataset.mean,"
            " std: td.dataset.std, text: td.innerText}))"
        )
        rows = {r["model"]: r["cells"] for r in expected["rows"]}
        assert len(shown) == len(expected["rows"]) * len(expected["tasks"]) == 6
        for cell in shown:
            want = rows[cell["model"]][cell["task"]]
            assert float(cell["mean"]) == want["mean"] and float(cell["std"]) == want["std"]
            ci = want["ci"]
            text = (f"{100 * want['mean']:.2f} ± {100 * want['std']:.2f} "
                    f"[{100 * ci['low']:.2f}, {100 * ci['high']:.2f}]")  # fmt: skip
            assert cell["text"].startswith(text), (cell, text)
        embedded = driver.execute_script(
            "return JSON.parse(document.getElementById('table-data').textContent)"
        )
        assert embedded == expected
        notes = driver.find_element("css selector", "#table ol.notes").text
        for note in expected["footnotes"]:
            assert note in notes
        for section in ("#compare", "#leaderboard", "#figures", "#provenance"):
            assert driver.find_element("css selector", section).is_displayed()
        board = driver.find_elements("css selector", "#leaderboard tbody tr")
        assert {r.get_attribute("data-model") for r in board} == set(MODELS)
        verdicts = driver.find_elements("css selector", "#compare table.verdicts tbody tr")
        assert len(verdicts) == 3 * 2  # three pairs x two tasks

        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot))
        width, height = _png_size(shot)
        assert width >= 1000 and height >= 600
        keep = os.environ.get("ENCODER_EVAL_SCREENSHOT_DIR")
        if keep:
            shutil.copy(shot, Path(keep) / "report.png")

        # A score's link opens the provenance of its cell.
        model, task = shown[0]["model"], shown[0]["task"]
        panel = cell_anchor(model, task)
        assert not driver.execute_script(f"return document.getElementById('{panel}').open")
        driver.find_element("css selector", f"#results-table td.score a[href='#{panel}']").click()
        is_open = f"return document.getElementById('{panel}').open"
        WebDriverWait(driver, 10).until(lambda d: d.execute_script(is_open))
        text = driver.find_element("id", panel).text
        assert f"{model}_{task}_" in text and "counted" in text

        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()


# ----------------------------------------------------------------------------- fast


HOSTILE = "m<b>\"'&x"  # every character HTML gives a meaning to


@pytest.fixture
def hostile_dir(tmp_path) -> Path:
    models = (HOSTILE, "base")
    sel = make_selection({(m, "glue_rte"): "lr06" for m in models})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    write_many(tmp_path / "report", [
        make_result(m, "glue_rte", "lr06", seed, "report", score)
        for m, base in zip(models, (0.7, 0.6), strict=True)
        for seed, score in zip(PHASE_SEEDS["report"], (base, base + 0.01, base - 0.01,
                                                       base + 0.02, base), strict=True)
    ])  # fmt: skip
    return tmp_path


def test_every_user_string_is_escaped(hostile_dir, capsys):
    out = hostile_dir / "r.html"
    code = report.main(["--results-dir", str(hostile_dir / "report"), "--selection",
                        str(hostile_dir / "selection.json"), "--out", str(out),
                        "--title", "<script>alert(1)</script>"])  # fmt: skip
    assert code == EXIT_OK, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    assert HOSTILE not in page and "<script>alert" not in page
    assert "m&lt;b&gt;&quot;&#x27;&amp;x" in page
    # The embedded json stays json, and cannot close its script element.
    start = page.index('id="table-data">') + len('id="table-data">')
    data = json.loads(page[start : page.index("</script>", start)])
    assert data["rows"][0]["model"] in (HOSTILE, "base")


def test_a_table_with_problems_is_refused_unless_allow_partial(hostile_dir, capsys):
    (hostile_dir / "report" / result_filename("base", "glue_rte", LR_GRID["lr06"], 49)).unlink()
    out = hostile_dir / "r.html"
    args = ["--results-dir", str(hostile_dir / "report"), "--selection",
            str(hostile_dir / "selection.json"), "--out", str(out)]  # fmt: skip
    assert report.main(args) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "report refuses this table" in err and "[missing_seeds]" in err
    assert not out.exists()
    assert report.main([*args, "--allow-partial"]) == EXIT_OK
    page = out.read_text(encoding="utf-8")
    assert "Not a protocol table" in page and "avg@4 instead of avg@5" in page


def test_a_probe_table_from_real_probe_results(hostile_dir, tmp_path, capsys):
    """Probe results (one tiny model's frozen embeddings, a synthetic task, 3 folds) make
    the page's table, or a section beside a fine-tuning table."""
    from tiny_models import build_tiny_model

    model = build_tiny_model("bert", tmp_path / "m", num_labels=None)
    probes = tmp_path / "probes"
    sh(py("encoder_eval.probe", "--model", f"tiny={model}", "--tasks", "synthetic_sentiment",
          "--pooling", "mean", "--k-folds", "3", "--results-dir", str(probes), "--device",
          "cpu", "--precision", "fp32", "--max-seq-len", "64"), tmp_path)  # fmt: skip
    expected = json.loads(sh(py("encoder_eval.summarize", "--results-dir", str(probes),
                                "--format", "json"), tmp_path).stdout)  # fmt: skip
    cell = expected["rows"][0]["cells"]["synthetic_sentiment"]
    out = tmp_path / "probe.html"
    assert report.main(["--results-dir", str(probes), "--out", str(out)]) == EXIT_OK
    page = out.read_text(encoding="utf-8")
    assert 'data-model="tiny:mean"' in page and f'data-mean="{cell["mean"]!r}"' in page
    assert "probe folds" in page  # the probe table's own footnotes
    out = tmp_path / "both.html"
    assert report.main(["--results-dir", str(hostile_dir / "report"), "--selection",
                        str(hostile_dir / "selection.json"), "--probe-results-dir",
                        str(probes), "--out", str(out)]) == EXIT_OK  # fmt: skip
    page = out.read_text(encoding="utf-8")
    assert 'id="results-table"' in page and 'id="probe-table"' in page
    assert f'data-mean="{cell["mean"]!r}"' in page


def test_many_models_get_a_heatmap_and_a_matrix_of_every_pair(tmp_path, capsys):
    """Issue 50: at the protocol's size the score figure was 238 grouped bars and the
    compare section 91 tables. Past a few models the page draws a models x tasks heatmap
    in place of the bars, and leads the compare section with every pair's tally (row
    better / column better / not distinguishable), the per-pair tables folded below."""
    import base64
    import re

    tasks = ("glue_rte", "glue_mrpc")
    skill = {f"m{i}": 0.5 + 0.05 * i for i in range(5)} | {"twin": 0.7}  # twin = m4
    noise = (0.0, 0.004, -0.004, 0.008, -0.002)
    sel = make_selection({(m, t): "lr06" for m in skill for t in tasks})
    (tmp_path / "selection.json").write_text(json.dumps(sel))
    write_many(tmp_path / "report", [
        make_result(m, t, "lr06", seed, "report", p + e)
        for m, p in skill.items() for t in tasks
        for seed, e in zip(PHASE_SEEDS["report"], noise, strict=True)
    ])  # fmt: skip
    out = tmp_path / "r.html"
    code = report.main(["--results-dir", str(tmp_path / "report"), "--selection",
                        str(tmp_path / "selection.json"), "--out", str(out)])  # fmt: skip
    assert code == EXIT_OK, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    # the heatmap, full width, in place of the grouped bars
    assert "Report scores (mean over seeds, 95 % t-interval)" not in page
    (heat,) = re.findall(r'<figure class="wide"><img alt="([^"]*)" src="data:image/png;'
                         r'base64,([^"]+)"', page)  # fmt: skip
    assert "models x tasks" in heat[0]
    png = tmp_path / "heat.png"
    png.write_bytes(base64.b64decode(heat[1]))
    width, height = _png_size(png)
    assert width > 400 and height > 300
    # the pair matrix first, then 15 folded pair tables
    assert page.index('id="pair-matrix"') < page.index('class="verdicts"')
    assert page.count('<details class="pair"') == 15 and "<h3>A = " not in page

    def cell(row: str, col: str) -> str:
        found = re.search(rf'<td class="[^"]*" data-col="{col}" title="{row} against {col}: '
                          r'[^"]*"><a href="#pair-[^"]+">([^<]+)</a></td>', page)  # fmt: skip
        assert found, (row, col)
        return found.group(1)

    assert cell("m4", "m0") == "2 / 0 / 0" and cell("m0", "m4") == "0 / 2 / 0"
    assert cell("m4", "twin") == "0 / 0 / 2" == cell("twin", "m4")
    assert 'title="m3 against m1: m3 better on 2 task(s), m1 better on 0' in page
