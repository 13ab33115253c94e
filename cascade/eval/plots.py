"""The PNG plots of an evaluation (matplotlib, the ``eval`` extra; Agg backend, no display).

- ``reliability.png``: a reliability diagram per tier (accuracy against mean max p per
  equal-width bin, bar widths showing the bins, the diagonal for perfect calibration);
- ``deferral.png``: cascade accuracy against escalation rate over the sweep, the operating point
  and the strong tier alone marked (the operating point uses the policy's per type x band
  thresholds, the sweep one confidence order: it need not lie on the curve);
- ``cost.png``: accuracy against cost over the same sweep, with the cheapest point that reaches
  the strong tier's accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cascade.eval.scores import Scored, reliability
from cascade.eval.sweep import Sweep

FILES = ("reliability.png", "deferral.png", "cost.png")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("plots need matplotlib: pip install 'cascade[eval]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(out: Path, summary: Mapping[str, Any], scored: Mapping[str, Sequence[Scored]],
                sweep: Sweep, title: str) -> list[Path]:
    """Write the three PNGs into ``out``; returns their paths."""
    plt = _pyplot()
    paths = [out / name for name in FILES]
    _reliability(plt, paths[0], scored, title)
    cascade = summary["tiers"]["cascade"]
    strong = summary["tiers"]["strong"]
    _deferral(plt, paths[1], sweep, cascade, strong, title)
    _cost(plt, paths[2], sweep, cascade, strong, title)
    return paths


def _reliability(plt: Any, path: Path, scored: Mapping[str, Sequence[Scored]], title: str) -> None:
    tiers = [(name, rows) for name, rows in scored.items() if rows]
    fig, axes = plt.subplots(1, max(1, len(tiers)), figsize=(4.2 * max(1, len(tiers)), 4.4),
                             squeeze=False)
    for ax, (name, rows) in zip(axes[0], tiers, strict=False):
        bins = [b for b in reliability(rows) if b["n"]]
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
        ax.bar([b["lo"] for b in bins], [b["accuracy"] for b in bins], width=0.1, align="edge",
               edgecolor="black", alpha=0.7, label="accuracy")
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], "o",
                color="crimson", label="mean max p")
        for b in bins:
            ax.annotate(str(b["n"]), (b["lo"] + 0.05, 0.02), ha="center", fontsize=7)
        ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="confidence (max p)", ylabel="accuracy",
               title=f"{name} (n={len(rows)})")
        ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(f"{title}: reliability (bar labels: questions per bin)", fontsize=10)
    _save(plt, fig, path)


def _deferral(plt: Any, path: Path, sweep: Sweep, cascade: Mapping[str, Any],
              strong: Mapping[str, Any] | None, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.4))
    xs = [p.escalation_rate for p in sweep.points]
    ax.plot(xs, [p.accuracy for p in sweep.points], color="steelblue", label="threshold sweep")
    curve = cascade["deferral_curve"]
    ax.plot([p["escalation_rate"] for p in curve], [p["accuracy"] for p in curve], "o",
            color="steelblue", markersize=4)
    op = cascade["operating_point"]
    ax.plot([op["escalation_rate"]], [op["accuracy"]], "*", color="crimson", markersize=14,
            label=f"operating point ({op['escalation_rate']:.0%} escalated)")
    if strong and strong["accuracy"] is not None:
        ax.axhline(strong["accuracy"], color="darkgreen", linestyle=":",
                   label=f"strong tier alone ({strong['accuracy']:.3f})")
    ax.set(xlim=(0, 1), xlabel="escalation rate (share of questions the strong tier answers)",
           ylabel="cascade accuracy", title=f"{title}: deferral curve")
    _save(plt, fig, path, ax)


def _cost(plt: Any, path: Path, sweep: Sweep, cascade: Mapping[str, Any],
          strong: Mapping[str, Any] | None, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.4))
    ax.plot([p.cost for p in sweep.points], [p.accuracy for p in sweep.points],
            color="steelblue", label="threshold sweep")
    op = cascade["operating_point"]
    ax.plot([op["cost"]], [op["accuracy"]], "*", color="crimson", markersize=14,
            label="operating point")
    cost = cascade["cost"]
    if strong and strong["accuracy"] is not None:
        ax.plot([cost["strong_only"]], [strong["accuracy"]], "s", color="darkgreen",
                label="strong tier alone")
    at = cost["at_strong_accuracy"]
    if at is not None:
        saves = "" if at["saved"] is None else f" (saves {at['saved']:.0%})"
        ax.plot([at["cost"]], [at["accuracy"]], "D", color="orange",
                label=f"cheapest at strong accuracy{saves}")
    prices = ", ".join(f"{k} {v:g}" for k, v in cost["per_1k_tokens"].items())
    ax.set(xlabel=f"cost (per 1k input tokens: {prices})", ylabel="accuracy",
           title=f"{title}: cost against accuracy")
    _save(plt, fig, path, ax)


def _save(plt: Any, fig: Any, path: Path, ax: Any = None) -> None:
    if ax is not None:
        ax.legend(loc="best", fontsize=8, framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
