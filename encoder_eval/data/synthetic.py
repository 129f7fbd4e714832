"""Small SYNTHETIC tasks for the demo and for checking an install without the Hub.

The texts are generated here from word lists and templates written for this project
(no dataset is copied), from a fixed seed, in the schemas of real tasks:

- `synthetic_sentiment`: one sentence, 2 labels (like SST-2): the label is whether the
  sentence carries more praising than complaining words;
- `synthetic_nli`: a premise/hypothesis pair, 3 labels (like MNLI): entailment when the
  hypothesis restates facts of the premise, contradiction when it changes one, neutral
  when it adds one the premise does not mention;
- `synthetic_rating`: one review scored 0-5 (regression with Spearman, like STS-B's
  label): the number of praising words among the five judgements it makes.

Scores on these tasks say nothing about a model's quality; they exist so the whole
protocol can run end to end anywhere in minutes.
"""

from __future__ import annotations

import random

GENERATOR_VERSION = 1
SIZES = {"train": 320, "validation": 96, "test": 96}
_SPLIT_SEEDS = {"train": 11, "validation": 12, "test": 13}

_GOOD = ["wonderful", "delightful", "superb", "charming", "brilliant", "lovely", "gripping"]
_BAD = ["dreadful", "tedious", "clumsy", "boring", "awful", "dull", "painful"]
_THINGS = ["film", "novel", "concert", "meal", "game", "lecture", "journey", "album"]
_FILLER = ["honestly", "overall", "at times", "for the most part", "in places", "frankly"]

_COLOURS = ["red", "blue", "green", "yellow", "grey", "white", "black", "brown"]
_ANIMALS = ["cat", "dog", "horse", "fox", "rabbit", "goat", "parrot", "duck"]
_ACTIONS = ["sleeping", "running", "eating", "resting", "playing", "waiting", "hiding"]
_PLACES = ["garden", "kitchen", "barn", "forest", "meadow", "yard", "station", "river bank"]
_EXTRAS = ["at noon", "in the rain", "with a friend", "after breakfast", "near a fence"]


def _sentiment(rng: random.Random) -> tuple[dict, int]:
    label = rng.randint(0, 1)
    strong, weak = (_GOOD, _BAD) if label == 1 else (_BAD, _GOOD)
    n_strong = rng.randint(1, 3)
    n_weak = rng.randint(0, n_strong - 1)
    words = rng.sample(strong, n_strong) + rng.sample(weak, n_weak)
    rng.shuffle(words)
    thing = rng.choice(_THINGS)
    parts = [f"the {thing} was {words[0]}"] + [f"{rng.choice(_FILLER)} {w}" for w in words[1:]]
    return {"sentence": ", ".join(parts) + "."}, label


def _scene(rng: random.Random) -> dict:
    return {
        "colour": rng.choice(_COLOURS),
        "animal": rng.choice(_ANIMALS),
        "action": rng.choice(_ACTIONS),
        "place": rng.choice(_PLACES),
    }


def _say(s: dict, extra: str = "") -> str:
    tail = f" {extra}" if extra else ""
    return f"The {s['colour']} {s['animal']} is {s['action']} in the {s['place']}{tail}."


def _nli(rng: random.Random) -> tuple[dict, int]:
    premise = _scene(rng)
    label = rng.randint(0, 2)  # 0 entailment, 1 neutral, 2 contradiction (MNLI's order)
    if label == 0:
        hyp = f"A {premise['animal']} is {premise['action']}."
        if rng.random() < 0.5:
            hyp = f"Something {premise['colour']} is in the {premise['place']}."
    elif label == 1:
        hyp = _say(premise, rng.choice(_EXTRAS))
    else:
        slot = rng.choice(["colour", "action", "place"])
        pool = {"colour": _COLOURS, "action": _ACTIONS, "place": _PLACES}[slot]
        changed = dict(premise, **{slot: rng.choice([v for v in pool if v != premise[slot]])})
        hyp = _say(changed)
    return {"premise": _say(premise), "hypothesis": hyp}, label


def _rating(rng: random.Random) -> tuple[dict, float]:
    good = rng.randint(0, 5)
    words = rng.sample(_GOOD, good) + rng.sample(_BAD, 5 - good)
    rng.shuffle(words)
    thing = rng.choice(_THINGS)
    return {"sentence": f"the {thing} was " + ", ".join(words) + "."}, float(good)


GENERATORS = {
    "synthetic_sentiment": _sentiment,
    "synthetic_nli": _nli,
    "synthetic_rating": _rating,
}


def generate_rows(task: str, split: str) -> list[dict]:
    """The rows of one split, in the field names of the real task they imitate."""
    rng = random.Random(f"{task}:{_SPLIT_SEEDS[split]}:{GENERATOR_VERSION}")
    rows = []
    for idx in range(SIZES[split]):
        fields, label = GENERATORS[task](rng)
        rows.append({**fields, "label": label, "idx": idx})
    return rows
