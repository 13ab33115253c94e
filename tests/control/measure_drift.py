"""The drift observer's cost: µs per request (3 questions reach the gate) while the boot
reference fills, after it closed (counting into the window), the reference's close (20,000
confidences per cell) and one scrape (``psi``). Run from the repository root:
``python tests/control/measure_drift.py``."""

import random
import timeit

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.control.drift import RESERVOIR, DriftMonitor
from cascade.policy.flow import decide, run
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    Drift,
    LayaTier,
    Policy,
    Route,
    Thresholds,
    TypeBands,
)
from cascade.schema import ChoiceQuestion, NoulQuestion, ScoreQuestion

POLICY = Policy(
    tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")), "clef": ClefTier()},
    route=Route(cheap="laya", strong="clef"),
    thresholds=Thresholds(confidence=TypeBands(choice=Bands(three_five=0.6), noul=Bands(two=0.7))),
    drift=Drift(reference_s=3600.0, min_count=300, window_s=600.0),
)
CALL = EngineCall(
    state="where is my refund?",
    model="jev-latest",
    questions={
        "intent": ChoiceQuestion(criteria=["billing", "tech", "account"]),
        "urgent": NoulQuestion(),
        "mood": ScoreQuestion(criteria=["calm", "annoyed", "angry"]),
    },
)


def decisions(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(n):

        def reply(ask):
            results = {}
            for qid, q in ask.call.questions.items():
                k = 2 if q.type == "noul" else 3
                p = [rng.random() + 0.05 for _ in range(k)]
                results[qid] = QuestionResult(type=q.type, probabilities=[x / sum(p) for x in p])
            return EngineAnswer(model=ask.tier, results=results, usage=EngineUsage(input_tokens=3))

        out.append(run(decide(POLICY, CALL, previews=False), reply))
    return out


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def main() -> None:
    ds = decisions(2000)
    clock = Clock()
    monitor = DriftMonitor(POLICY, clock=clock)
    n = 0

    def observe() -> None:
        nonlocal n
        monitor.observe(POLICY, ds[n % len(ds)])
        n += 1
        clock.now += 0.001

    per = 20_000
    boot = min(timeit.repeat(observe, number=per, repeat=3)) / per * 1e6
    for cell in monitor.cells.values():  # a full reservoir per cell, as after a busy boot
        cell.seen = max(cell.seen, RESERVOIR)
        cell.sample = [random.random() for _ in range(RESERVOIR)]
    clock.now = 3600.0
    close_start = timeit.default_timer()
    for _ in range(len(monitor.cells)):  # each cell's first question after reference_s closes it
        observe()
    close = (timeit.default_timer() - close_start) / len(monitor.cells) * 1e3
    window = min(timeit.repeat(observe, number=per, repeat=3)) / per * 1e6
    scrape = min(timeit.repeat(monitor.psi, number=200, repeat=3)) / 200 * 1e6
    print(
        f"drift observer: {boot:.2f} µs/request filling the boot reference, "
        f"{window:.2f} µs/request counting the window; closing a 20,000-value reference "
        f"{close:.2f} ms per cell; a scrape (psi, 3 cells) {scrape:.1f} µs"
    )


main()
