"""Helpers that build small data mirrors for the task and prefetch tests.

- `shared_data()`: the real-data mirror (`../shared/data`, or $ENCODER_EVAL_SHARED_DATA), or a
  skip; a failure instead under ENCODER_EVAL_REQUIRE_DATA=1 (`missing_requirement`);
- `split_mirror()`: a mirror whose train/validation/test are a seeded split of the real
  validation files, for tasks whose real mirror has validation only (xnli, paws_x, seahorse);
- `massive_mirror()`: a synthetic MASSIVE mirror in the dataset's real schema.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import NoReturn

import pytest

from encoder_eval.data import sources

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SHARED_DATA_ENV = "ENCODER_EVAL_SHARED_DATA"  # another mirror location than SHARED_DATA
REQUIRE_DATA_ENV = "ENCODER_EVAL_REQUIRE_DATA"  # "1" (CI): a missing input fails the test

SPLIT_SEED = 1234
SPLIT_FRACTIONS = (0.6, 0.2)  # train, validation; test gets the rest


def missing_requirement(problem: str) -> NoReturn:
    """Skip the test for want of an input this machine lacks, or fail it when
    ENCODER_EVAL_REQUIRE_DATA=1: CI has every input, so there a skip would hide a test
    that never ran. Every test that needs the real data goes through here."""
    if os.environ.get(REQUIRE_DATA_ENV) == "1":
        pytest.fail(f"{REQUIRE_DATA_ENV}=1 but {problem}", pytrace=False)
    pytest.skip(problem)


def shared_data() -> Path:
    """The real-data mirror, or skip (fail under ENCODER_EVAL_REQUIRE_DATA=1) saying where
    it was looked for."""
    path = Path(os.environ.get(SHARED_DATA_ENV) or SHARED_DATA)
    if not path.is_dir():
        missing_requirement(
            f"the real-data mirror {path} is absent (put it there or point {SHARED_DATA_ENV} at one)"
        )
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def seeded_split(rows: list[dict], seed: int = SPLIT_SEED) -> dict[str, list[dict]]:
    """Shuffle rows with a fixed seed and cut them 60/20/20 into train/validation/test."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_train = int(len(rows) * SPLIT_FRACTIONS[0])
    n_val = int(len(rows) * SPLIT_FRACTIONS[1])
    shuffled = [rows[i] for i in order]
    return {
        "train": shuffled[:n_train],
        "validation": shuffled[n_train : n_train + n_val],
        "test": shuffled[n_train + n_val :],
    }


def split_mirror(
    task: str, dest: Path, source: Path | None = None, limit: int | None = None
) -> dict[str, dict[str | None, int]]:
    """Write `dest/<task>/` from a seeded split of the source's validation files.

    Every validation file of the task in the source (one per language, or one for all) is
    split into train/validation/test; `limit` keeps only its first rows. Returns the rows
    written as {split: {lang: n}} (lang None for a single file).
    """
    source = source or shared_data()
    counts: dict[str, dict[str | None, int]] = {"train": {}, "validation": {}, "test": {}}
    for lang in sources.file_languages(task):
        src = sources.mirror_file(source, task, "validation", lang)
        if not src.exists():
            continue
        rows = sources.read_jsonl(src)[:limit]
        for split, part in seeded_split(rows).items():
            write_jsonl(sources.mirror_file(dest, task, split, lang), part)
            counts[split][lang] = len(part)
    return counts


# --------------------------------------------------------------------------- SeaHorse

# The six questions as the Hub copy's long-schema `question` field holds them (one row per
# answered question; see tests/test_tasks.py for the card this follows).
SEAHORSE_LONG_QUESTIONS = (
    "The summary can be read and understood by the rater.",
    "The summary is free of unnecessarily repeated information.",
    "The summary is grammatically correct.",
    "All the information in the summary is fully attributable to the source article.",
    "The summary captures the main idea(s) of the source article.",
    "The summary concisely represents the information in the source article.",
)


# --------------------------------------------------------------------------- MASSIVE

# The 51 locale configs of AmazonScience/massive 1.0 (its loading script's _LANGUAGE_PAIRS).
MASSIVE_LOCALES = (
    "af-ZA", "am-ET", "ar-SA", "az-AZ", "bn-BD", "cy-GB", "da-DK", "de-DE", "el-GR", "en-US",
    "es-ES", "fa-IR", "fi-FI", "fr-FR", "he-IL", "hi-IN", "hu-HU", "hy-AM", "id-ID", "is-IS",
    "it-IT", "ja-JP", "jv-ID", "ka-GE", "km-KH", "kn-IN", "ko-KR", "lv-LV", "ml-IN", "mn-MN",
    "ms-MY", "my-MM", "nb-NO", "nl-NL", "pl-PL", "pt-PT", "ro-RO", "ru-RU", "sl-SL", "sq-AL",
    "sv-SE", "sw-KE", "ta-IN", "te-IN", "th-TH", "tl-PH", "tr-TR", "ur-PK", "vi-VN", "zh-CN",
    "zh-TW",
)  # fmt: skip
MASSIVE_EURO = ("de-DE", "en-US", "es-ES", "fr-FR", "it-IT", "nl-NL", "pl-PL", "pt-PT")
_SCENARIOS = ("alarm", "audio", "calendar", "cooking", "iot", "music", "news", "weather")
_OBJECTS = (
    "the kitchen light", "my morning alarm", "tomorrow's meeting", "a pasta recipe",
    "the radio", "some jazz", "the headlines", "the forecast", "the thermostat",
    "my shopping list",
)  # fmt: skip
_VERBS = ("turn off", "set up", "check", "find", "play", "cancel")
_WHEN = ("now", "at seven", "tonight", "on friday", "later today")


def massive_rows(locale: str, partition: str, n: int, seed: int) -> list[dict]:
    """Synthetic rows in MASSIVE's schema: `utt`, `intent` (0..59), `scenario`, `locale`."""
    rng = random.Random(f"{locale}/{partition}/{seed}")
    rows = []
    for i in range(n):
        intent = i % 60  # every intent appears once per 60 rows
        verb = _VERBS[intent % len(_VERBS)]
        obj = _OBJECTS[(intent // len(_VERBS)) % len(_OBJECTS)]
        utt = f"[{locale}] please {verb} {obj} {rng.choice(_WHEN)}"
        rows.append(
            {
                "id": f"{partition}-{locale}-{i}",
                "locale": locale,
                "partition": partition,
                "scenario": intent % len(_SCENARIOS),
                "intent": intent,
                "utt": utt,
                "annot_utt": utt,
                "worker_id": str(rng.randrange(100)),
            }
        )
    return rows


MASSIVE_SIZES = {"train": 120, "validation": 60, "test": 60}


def massive_mirror(
    dest: Path, sizes: dict[str, int] = MASSIVE_SIZES, locales: tuple[str, ...] = MASSIVE_LOCALES
) -> Path:
    """Write `dest/massive_intent/<split>.<locale>.jsonl` for each locale (default: all 51)."""
    for locale in locales:
        for split, n in sizes.items():
            path = sources.mirror_file(dest, "massive_intent", split, locale)
            write_jsonl(path, massive_rows(locale, split, n, seed=7))
    return dest
