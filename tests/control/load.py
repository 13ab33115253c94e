"""Scripted traffic for the controllers: single-question requests decided by the real flow on a
fake clock, their cheap confidences drawn per cell, and the realised strong share measured."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.control.live import LiveControl
from cascade.policy.flow import Ask, Decision, Reply, TierCall, decide, run
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    Control,
    LayaTier,
    Policy,
    Route,
    Thresholds,
    TypeBands,
)
from cascade.schema import ChoiceQuestion, NoulQuestion, Question

CONFIGURED = TypeBands(choice=Bands(two=0.8), noul=Bands(two=0.7))
KINDS: dict[str, Question] = {
    "choice": ChoiceQuestion(criteria=["yes", "no"]),
    "noul": NoulQuestion(),
    "wide": ChoiceQuestion(criteria=[f"o{i}" for i in range(60)]),  # pre-routed strong
}


def policy(**control: object) -> Policy:
    return Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),
        thresholds=Thresholds(confidence=CONFIGURED),
        control=Control(**control),
    )  # type: ignore[arg-type]


def decided(
    control: LiveControl, kind: str, confidence: float, *, escalate: bool = True
) -> Decision:
    """One request of ``kind`` whose cheap answer has max p ``confidence``, through the flow
    with the controller's gate, told back to the controller."""
    call = EngineCall(state="s", model="jev-latest", questions={"q": KINDS[kind]})

    def reply(ask: Ask) -> Reply:
        assert isinstance(ask, TierCall)  # no previews asked for
        q = ask.call.questions["q"]
        if isinstance(q, NoulQuestion):
            p = [1 - confidence, confidence]
        else:
            n = len(q.criteria)  # type: ignore[union-attr]
            p = [confidence, 1 - confidence] if n == 2 else [1.0 / n] * n
        return EngineAnswer(
            model=ask.tier,
            results={"q": QuestionResult(type=q.type, probabilities=p)},
            usage=EngineUsage(input_tokens=1),
        )

    decision = run(
        decide(control.policy, call, previews=False, gate=control.gate(escalate=escalate)), reply
    )
    control.decided(call, decision)
    return decision


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(
    control: LiveControl,
    clock: Clock,
    phases: list[tuple[float, float, dict[str, tuple[float, float, float]]]],
    seed: int = 0,
    each: Callable[[float], None] | None = None,
) -> list[tuple[float, bool]]:
    """Phases of (seconds, requests a second, {kind: (share, lowest, highest confidence)});
    ``(time, answered strong)`` of every request."""
    rng = random.Random(seed)
    out: list[tuple[float, bool]] = []
    end = clock.now
    for seconds, rate, mix in phases:
        end += seconds
        while True:
            clock.now += rng.expovariate(rate)
            if clock.now >= end:
                clock.now = end
                break
            u, kind = rng.random(), "choice"
            for name, (share, _, _) in mix.items():
                kind = name
                if u < share:
                    break
                u -= share
            _, lo, hi = mix[kind]
            decision = decided(control, kind, rng.uniform(lo, hi))
            out.append((clock.now, decision.tiers["q"] == "clef"))
            if each is not None:
                each(clock.now)
    return out


def max_window_share(
    events: list[tuple[float, bool]], window_s: float = 300.0, since: float = 0.0
) -> float:
    """The highest strong share over every ``window_s`` window ending on a whole second."""
    times = [t for t, _ in events]
    strong = [0]
    for _, s in events:
        strong.append(strong[-1] + s)
    worst = 0.0
    for end in range(int(since + window_s), int(times[-1]) + 1):
        i, j = bisect.bisect_left(times, end - window_s), bisect.bisect_left(times, end)
        if j > i:
            worst = max(worst, (strong[j] - strong[i]) / (j - i))
    return worst
