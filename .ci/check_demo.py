"""CI check of `make demo`'s output: the table and non-trivial plots exist."""

import re
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo_out")
table = (out / "table.md").read_text()
problems = [t for t in ("synthetic_sentiment", "synthetic_nli", "synthetic_rating", "±")
            if t not in table]  # fmt: skip
# Every cell's 95 % interval, within the metrics' range (x100: -100 to 100 at most).
intervals = [(float(a), float(b)) for a, b in re.findall(r"\[(-?[\d.]+), (-?[\d.]+)\]", table)]
if not intervals:
    problems.append("no [low, high] interval in the table")
problems += [f"interval [{a}, {b}] past the metric's range" for a, b in intervals
             if not -100 <= a <= b <= 100]  # fmt: skip
pngs = list((out / "plots").glob("*.png"))
if not any(p.name == "scores.png" for p in pngs) or len(pngs) < 4:
    problems.append(f"expected scores.png and 3 LR curves, found {[p.name for p in pngs]}")
problems += [f"{p} is only {p.stat().st_size} bytes" for p in pngs if p.stat().st_size < 10_000]
if problems:
    sys.exit("demo output check failed: " + "; ".join(problems))
print(f"demo output ok: table with {len(table.splitlines())} lines, {len(pngs)} plots")
