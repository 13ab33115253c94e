"""DEMO data for the signals' figures in docs/evaluation.md: ``calib.jsonl`` (400 familiar
items) and ``mix.jsonl`` (150 familiar, 150 foreign: other vocabulary, 40-90 words instead of 7).
Usage: ``python docs/novelty-demo-data.py SEED`` (writes both into the current directory)."""

import json
import random
import sys

TEAMS = {"billing": "Payments", "tech": "Bugs", "sales": "Sales", "legal": "Legal"}
ANGER = ["calm", "upset", "furious"]
FAMILIAR = ["refund", "crash", "price", "login", "invoice", "contract"]
FOREIGN = ["the", "weather", "in", "lisbon", "tomorrow", "will", "be", "sunny", "with", "light",
           "winds", "from", "north", "and", "a", "chance", "of", "rain", "later", "evening",
           "harvest", "tractor", "wheat", "barley", "sonata", "violin", "orchestra", "glacier"]


def item(i: int, rng: random.Random, foreign: bool) -> dict:
    if foreign:
        state = " ".join(rng.choice(FOREIGN) for _ in range(rng.randint(40, 90)))
    else:
        state = f"ticket {i}: " + " ".join(rng.choice(FAMILIAR) for _ in range(6))
    questions = {
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
        "anger": {"type": "score", "instructions": "How angry?", "criteria": ANGER},
    }
    gold = {"urgent": rng.random() < 0.5, "team": rng.choice(list(TEAMS)),
            "anger": rng.randrange(3)}
    return {"id": f"{'f' if foreign else 't'}{i}", "state": state, "questions": questions,
            "gold": gold, "source": "foreign" if foreign else "familiar"}


def main() -> None:
    rng = random.Random(int(sys.argv[1]))
    with open("calib.jsonl", "w") as out:
        for i in range(400):
            out.write(json.dumps(item(i, rng, False)) + "\n")
    with open("mix.jsonl", "w") as out:
        for i in range(400, 550):
            out.write(json.dumps(item(i, rng, False)) + "\n")
        for i in range(150):
            out.write(json.dumps(item(i, rng, True)) + "\n")


if __name__ == "__main__":
    main()
