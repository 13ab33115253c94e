"""cascade/eval/plots.py: what each figure says, read back from matplotlib before it is saved.

A synthetic sweep that starts at a 23.5 % pre-routed share, and tiers whose reliability bins
include one with accuracy 0.05 (its point near the bottom edge, where counts used to be
written) and one with accuracy 0.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cascade.eval import plots
from cascade.eval.scores import Scored
from cascade.eval.sweep import Point

plt = plots._pyplot()
START = 0.235


def scored(confidences: list[float], correct: list[bool]) -> list[Scored]:
    return [
        Scored(
            type="choice",
            band="2",
            question="q",
            gold="a",
            answer="a" if ok else "b",
            gold_index=0 if ok else 1,
            probabilities=[p, 1 - p] if ok else [1 - p, p],
        )
        for p, ok in zip(confidences, correct, strict=True)
    ]


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    points = [
        Point(escalation_rate=START + 0.05 * k, accuracy=0.6 + 0.02 * k, cost=10.0 + 20 * k)
        for k in range(11)
    ]
    sweep = SimpleNamespace(points=points)
    curve = [{"escalation_rate": p.escalation_rate, "accuracy": p.accuracy} for p in points]
    summary = {
        "tiers": {
            "cascade": {
                "deferral_curve": curve,
                "operating_point": {"escalation_rate": 0.4, "accuracy": 0.7, "cost": 80.0},
                "cost": {
                    "per_1k_tokens": {"cheap": 1.0, "strong": 20.0},
                    "strong_only": 200.0,
                    "cascade": 80.0,
                    "saved": 0.6,
                    "at_strong_accuracy": {"cost": 150.0, "accuracy": 0.8, "saved": 0.25},
                },
            },
            "strong": {"accuracy": 0.8},
        }
    }
    tiers = {
        # 0.6-0.7: 1 of 20 right (accuracy 0.05); 0.9-1: all right.
        "cheap": scored(
            [0.6 + 0.005 * i for i in range(20)] + [0.93, 0.95, 0.97],
            [i == 0 for i in range(20)] + [True] * 3,
        ),
        # 0.5-0.6: wrong (accuracy 0).
        "strong": scored([0.55, 0.85, 0.88], [False, True, True]),
    }
    made = plots.figures(plt, summary, tiers, sweep, "TEST")  # type: ignore[arg-type]
    yield made
    for fig in made.values():
        plt.close(fig)


def texts(fig: Any) -> list[str]:
    found = [t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text"))]
    return [t for t in found if t]


def test_cost_axis_is_in_named_units(figures: dict[str, Any]) -> None:
    fig = figures["cost.png"]
    (ax,) = [a for a in fig.axes if a.get_ylabel() == "accuracy"]
    assert ax.get_xlabel() == "cost, % of the strong tier alone"
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith("%") for t in ticks), ticks
    top = [t for t in texts(fig) if t.startswith("total cost, price units")]
    assert top and "per 1k tokens: cheap 1, strong 20" in top[0]
    # The strong tier alone is 100 %.
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "strong tier alone")
    assert list(line.get_xdata()) == [1.0]


def test_deferral_says_where_it_starts(figures: dict[str, Any]) -> None:
    fig = figures["deferral.png"]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any("pre-routed" in label and "23.5%" in label for label in labels), labels
    sweep = next(ln for ln in fig.axes[0].get_lines() if "threshold sweep" in ln.get_label())
    assert sweep.get_xdata()[0] == START


def boxes(fig: Any, ax: Any) -> tuple[list[Any], list[Any]]:
    """Display boxes of the count labels in the figure and of the points in ``ax``."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [
        t.get_window_extent(renderer) for a in fig.axes for t in a.texts if t.get_text().isdigit()
    ]
    marks = []
    for line in ax.get_lines():
        if line.get_marker() == "o":
            size = line.get_markersize() * fig.dpi / 72
            for x, y in ax.transData.transform(
                list(zip(line.get_xdata(), line.get_ydata(), strict=True))
            ):
                marks.append(Bbox.from_bounds(x - size / 2, y - size / 2, size, size))
    return labels, marks


def test_bin_counts_do_not_sit_on_the_points(figures: dict[str, Any]) -> None:
    fig = figures["reliability.png"]
    diagrams = [a for a in fig.axes if a.get_ylabel() == "accuracy"]
    assert len(diagrams) == 2
    for ax in diagrams:
        labels, marks = boxes(fig, ax)
        assert labels and marks
        assert not [(lb, m) for lb in labels for m in marks if lb.overlaps(m)]
    counts = sorted(int(t.get_text()) for a in fig.axes for t in a.texts)
    assert counts == [1, 2, 3, 20]


def test_write_plots_writes_the_three_pngs(figures: dict[str, Any], tmp_path: Path) -> None:
    for name, fig in figures.items():
        fig.savefig(tmp_path / name, dpi=60)
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
