"""The sample outputs the documentation shows are what the code prints today (issue 40 item
18): a page that quotes a command's output is checked against that command's code, so a
change of format cannot leave an old sample behind."""

from __future__ import annotations

import re

from conftest import REPO

from encoder_eval.core.receipt import TaskResult
from encoder_eval.reports import tracking

TRACKING = REPO / "docs" / "tracking.md"
REPORT_INTRO = "The report, `runs/track/regression.md`, as written"
# One checkpoint's row: index, id, then "score ± std (n)".
ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| (-?[\d.]+) ± ([\d.]+) \((\d+)\) \|")


def fenced_block_after(text: str, intro: str) -> str:
    """The first fenced code block after the line starting with `intro`, without fences."""
    start = text.index(intro)
    opening = text.index("```", start)
    body = text.index("\n", opening) + 1
    return text[body : text.index("```", body)]


def receipts_of(report: str) -> list[tracking.Receipt]:
    """Receipts holding the scores a regression report shows (score, std and n per task and
    checkpoint): everything else the report says is computed from these."""
    by_id: dict[str, tracking.Receipt] = {}
    setup = {"kind": "probe", "pooling": "mean", "k_folds": 10, "seed": 42}
    task = None
    for line in report.splitlines():
        if line.startswith("## "):
            task = line[3:].strip()
        found = ROW.match(line)
        if found and task:
            index, cid, score, std, n = found.groups()
            cid = cid.strip()
            receipt = by_id.setdefault(
                cid, tracking.Receipt(cid, int(index), [], [], {}, setup, "", "rev")
            )
            details = {"std": float(std) / 100, "n": int(n)}
            receipt.tasks.append(TaskResult(task, float(score) / 100, True, None, details))
    return sorted(by_id.values(), key=lambda r: r.checkpoint_index)


def test_the_tracking_pages_regression_report_is_what_track_report_writes():
    """docs/tracking.md shows `runs/track/regression.md` "as written": the report that
    `track report` (defaults: reference best, threshold 5 %, the noise rule) writes for the
    scores it shows is that text, to the character: headings, rule, references, Δ, noise
    ratios, verdicts and flags."""
    shown = fenced_block_after(TRACKING.read_text(encoding="utf-8"), REPORT_INTRO)
    receipts = receipts_of(shown)
    assert len(receipts) == 6 and all(len(r.tasks) == 5 for r in receipts)
    report = tracking.track_regression(receipts)
    assert tracking.format_markdown(report, receipts) == shown
