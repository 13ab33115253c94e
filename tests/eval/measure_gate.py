"""The gate figure of issue 30: ``cascade calibrate --target-escalation 0.3`` fitted on one half
of 230 held-out demo items, then ``cascade eval --calibration`` on that half and on the other.
A quarter of the tickets have a state long enough that only the long-criteria choice question
truncates (pre-routed strong) while its siblings reach the gate. Run from the repository root:
``python tests/eval/measure_gate.py DIR`` (DIR: scratch space; the demo tiers are built there)."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

ANGER = ["calm", "upset", "furious"]
TEAMS = {"billing": "Payments " * 30, "tech": "Bugs", "sales": "Sales", "legal": "Legal"}


def data(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        state = f"ticket {i}: " + " ".join(
            rng.choice(["refund", "crash", "price", "login", "invoice", "contract"])
            for _ in range(6)
        )
        if i % 4 == 0:
            state += " refund" * 425
        questions = {
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": TEAMS},
            "anger": {"type": "score", "instructions": "How angry?", "criteria": ANGER},
        }
        gold = {
            "urgent": rng.random() < 0.5,
            "team": rng.choice(list(TEAMS)),
            "anger": rng.choice(ANGER),
        }
        lines.append(
            json.dumps({"id": f"t{i}", "state": state, "questions": questions, "gold": gold})
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def cascade(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "cascade", *args, "--demo", "--no-progress"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def main(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    os.environ["CASCADE_DEMO_DIR"] = str(root / "demo")
    halves = [data(root / f"{h}.jsonl", 115, 21 + i) for i, h in enumerate("ab")]
    fit = json.loads(
        cascade(
            "calibrate",
            str(halves[0]),
            "--out",
            str(root / "cal.toml"),
            "--target-escalation",
            "0.3",
            "--json",
        )
    )
    escalated = sum(round(c["escalation"] * c["n"]) for c in fit["cells"].values())
    print(
        f"calibrate on half a: {escalated / fit['gated_questions']:.1%} of "
        f"{fit['gated_questions']} gated questions escalate"
    )
    for name, half in zip("ab", halves, strict=True):
        out = root / f"out-{name}"
        cascade("eval", str(half), "--out", str(out), "--calibration", str(root / "cal.toml"))
        c = json.loads((out / "summary.json").read_text())["tiers"]["cascade"]
        print(
            f"eval on half {name}: {c['confidence_escalation_rate']:.1%} of "
            f"{c['gated_questions']} gated questions escalate"
        )


main(Path(sys.argv[1]))
