"""The guards' figures for docs/guards.md: at which look the verdict comes, on arms growing by
their expected counts each look (``python -m tests.rollout.figures``, from the repository)."""

from __future__ import annotations

from collections.abc import Callable

from cascade.policy.model import Guards
from cascade.rollout.verdict import ArmCounts, judge

Arm = Callable[[int], ArmCounts]
PER_LOOK = 50  # questions per arm per look


def arm(strong: float, degraded: float = 0.01, labelled: float = 0.1, accuracy: float = 0.9) -> Arm:
    """An arm's counts at look k: ``PER_LOOK * k`` questions, its shares rounded."""

    def at(k: int) -> ArmCounts:
        n = PER_LOOK * k
        labels = round(n * labelled)
        return ArmCounts(
            n, round(n * strong), round(n * degraded), labels, round(labels * accuracy)
        )

    return at


def first_verdict(
    current: Arm, candidate: Arm, guards: Guards, cap: int = 1 << 20
) -> tuple[str, int]:
    """The first look whose verdict is not wait (found by doubling, then bisection: on expected
    counts the verdict does not go back to wait once given), or ("wait", cap)."""

    def verdict(k: int) -> str:
        return judge(current(k), candidate(k), guards, k).action

    high = 1
    while verdict(high) == "wait":
        if high >= cap:
            return "wait", cap
        high *= 2
    low = high // 2  # wait at low (or low is 0)
    while high - low > 1:
        mid = (low + high) // 2
        if verdict(mid) == "wait":
            low = mid
        else:
            high = mid
    return verdict(high), high


def main() -> None:
    no_accuracy = Guards(min_labelled_accuracy_delta=None)
    cases = [
        ("strong 0.9 vs 0.2, defaults", arm(0.2), arm(0.9), Guards()),
        ("strong 0.3 vs 0.2, defaults", arm(0.2), arm(0.3), Guards()),
        ("accuracy 0.8 vs 0.9, defaults", arm(0.2), arm(0.2, accuracy=0.8), Guards()),
        ("equal arms at 0.2, defaults", arm(0.2), arm(0.2), Guards()),
        ("equal arms at 0.2, no accuracy guard", arm(0.2), arm(0.2), no_accuracy),
    ]
    print(f"{PER_LOOK} questions per arm per look; 1 % degraded, 10 % labelled at 0.9 unless said")
    for name, current, candidate, guards in cases:
        action, look = first_verdict(current, candidate, guards)
        print(f"{name:40} {action:8} at look {look:6} ({PER_LOOK * look} questions per arm)")


if __name__ == "__main__":
    main()
