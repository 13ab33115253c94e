"""The PNG plots of an evaluation (matplotlib, the ``eval`` extra; Agg backend, no display).

- ``reliability.png``: a reliability diagram per tier (accuracy against mean max p per
  equal-width bin, bar widths showing the bins, the diagonal for perfect calibration), with the
  questions per bin as a histogram in a panel of its own below it;
- ``deferral.png``: cascade accuracy against escalation rate over the sweep, the operating point
  and the strong tier alone marked (the operating point uses the policy's per type x band
  thresholds, the sweep one confidence order: it need not lie on the curve). The curve starts at
  the share sent strong before the confidence gate (pre-routed, truncated, collapsed), which a
  shaded band marks;
- ``cost.png``: accuracy against cost over the same sweep, with the cheapest point that reaches
  the strong tier's accuracy. Cost is in percent of the strong tier alone (bottom axis) and in
  the prices' own units (top axis: tokens / 1000 x price per 1k input tokens, summed over the
  questions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cascade.errors import install_hint
from cascade.eval.scores import Scored, reliability
from cascade.eval.sweep import Sweep

FILES = ("reliability.png", "deferral.png", "cost.png")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit(f"plots need matplotlib: {install_hint('eval')}") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(
    out: Path,
    summary: Mapping[str, Any],
    scored: Mapping[str, Sequence[Scored]],
    sweep: Sweep,
    title: str,
) -> list[Path]:
    """Write the three PNGs into ``out``; returns their paths."""
    plt = _pyplot()
    paths = []
    for name, fig in figures(plt, summary, scored, sweep, title).items():
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def figures(
    plt: Any,
    summary: Mapping[str, Any],
    scored: Mapping[str, Sequence[Scored]],
    sweep: Sweep,
    title: str,
) -> dict[str, Any]:
    """The three figures, by file name (not yet saved)."""
    cascade = summary["tiers"]["cascade"]
    strong = summary["tiers"]["strong"]
    return {
        FILES[0]: _reliability(plt, scored, title),
        FILES[1]: _deferral(plt, sweep, cascade, strong, title),
        FILES[2]: _cost(plt, sweep, cascade, strong, title),
    }


def _reliability(plt: Any, scored: Mapping[str, Sequence[Scored]], title: str) -> Any:
    tiers = [(name, rows) for name, rows in scored.items() if rows]
    columns = max(1, len(tiers))
    fig, axes = plt.subplots(
        2,
        columns,
        figsize=(4.2 * columns, 5.4),
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [3, 1]},
    )
    for top, bottom, (name, rows) in zip(axes[0], axes[1], tiers, strict=False):
        bins = [b for b in reliability(rows) if b["n"]]
        lows = [b["lo"] for b in bins]
        top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
        top.bar(
            lows,
            [b["accuracy"] for b in bins],
            width=0.1,
            align="edge",
            edgecolor="black",
            alpha=0.7,
            label="accuracy",
        )
        top.plot(
            [b["confidence"] for b in bins],
            [b["accuracy"] for b in bins],
            "o",
            color="crimson",
            label="mean max p",
        )
        top.set(xlim=(0, 1), ylim=(0, 1.02), ylabel="accuracy", title=f"{name} (n={len(rows)})")
        top.legend(loc="upper left", fontsize=7)
        # The counts get their own panel: in the diagram they would sit on the points.
        counts = [b["n"] for b in bins]
        bottom.bar(lows, counts, width=0.1, align="edge", color="grey", edgecolor="black")
        for lo, n in zip(lows, counts, strict=True):
            bottom.annotate(
                str(n),
                (lo + 0.05, n),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
        bottom.set(
            xlim=(0, 1),
            ylim=(0, 1.3 * max(counts, default=1)),
            xlabel="confidence (max p)",
            ylabel="questions",
        )
    fig.suptitle(f"{title}: reliability (below: questions per bin)", fontsize=10)
    fig.tight_layout()
    return fig


def _deferral(
    plt: Any, sweep: Sweep, cascade: Mapping[str, Any], strong: Mapping[str, Any] | None, title: str
) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4.4))
    xs = [p.escalation_rate for p in sweep.points]
    # k = 0 already sends strong what never reaches the confidence gate.
    start = xs[0]
    if start > 0:
        ax.axvspan(
            0,
            start,
            color="grey",
            alpha=0.15,
            linewidth=0,
            label=f"pre-routed, never gated: {start:.1%} (truncated, collapsed, ...)",
        )
    ax.plot(
        xs,
        [p.accuracy for p in sweep.points],
        color="steelblue",
        label="threshold sweep (starts at the pre-routed share)",
    )
    curve = cascade["deferral_curve"]
    ax.plot(
        [p["escalation_rate"] for p in curve],
        [p["accuracy"] for p in curve],
        "o",
        color="steelblue",
        markersize=4,
    )
    op = cascade["operating_point"]
    ax.plot(
        [op["escalation_rate"]],
        [op["accuracy"]],
        "*",
        color="crimson",
        markersize=14,
        label=f"operating point ({op['escalation_rate']:.0%} escalated)",
    )
    if strong and strong["accuracy"] is not None:
        ax.axhline(
            strong["accuracy"],
            color="darkgreen",
            linestyle=":",
            label=f"strong tier alone ({strong['accuracy']:.3f})",
        )
    ax.xaxis.set_major_formatter(_percent())
    ax.set(
        xlim=(0, 1),
        xlabel="escalation rate (share of questions the strong tier answers)",
        ylabel="cascade accuracy",
        title=f"{title}: deferral curve",
    )
    return _finish(fig, ax)


def _cost(
    plt: Any, sweep: Sweep, cascade: Mapping[str, Any], strong: Mapping[str, Any] | None, title: str
) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4.6))
    cost = cascade["cost"]
    base = cost["strong_only"]
    # Percent of the strong tier alone when it costs anything; the prices' units on top.
    scale = 1 / base if base > 0 else 1.0

    def x(value: float) -> float:
        return value * scale

    ax.plot(
        [x(p.cost) for p in sweep.points],
        [p.accuracy for p in sweep.points],
        color="steelblue",
        label="threshold sweep",
    )
    op = cascade["operating_point"]
    ax.plot(
        [x(op["cost"])],
        [op["accuracy"]],
        "*",
        color="crimson",
        markersize=14,
        label="operating point",
    )
    if strong and strong["accuracy"] is not None:
        ax.plot([x(base)], [strong["accuracy"]], "s", color="darkgreen", label="strong tier alone")
    at = cost["at_strong_accuracy"]
    if at is not None:
        saves = "" if at["saved"] is None else f" (saves {at['saved']:.0%})"
        ax.plot(
            [x(at["cost"])],
            [at["accuracy"]],
            "D",
            color="orange",
            label=f"cheapest at strong accuracy{saves}",
        )
    prices = ", ".join(f"{k} {v:g}" for k, v in cost["per_1k_tokens"].items())
    units = f"price units (input tokens / 1000 × price per 1k tokens: {prices})"
    if base > 0:
        ax.xaxis.set_major_formatter(_percent())
        ax.set_xlabel("cost, % of the strong tier alone")
        top = ax.secondary_xaxis("top", functions=(lambda v: v * base, lambda v: v / base))
        top.set_xlabel(f"total cost, {units}", fontsize=8)
    else:
        ax.set_xlabel(f"total cost, {units}", fontsize=8)
    ax.set(ylabel="accuracy", title=f"{title}: cost against accuracy")
    return _finish(fig, ax)


def _percent() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(xmax=1, decimals=0)


def _finish(fig: Any, ax: Any) -> Any:
    ax.legend(loc="best", fontsize=8, framealpha=0.6)
    fig.tight_layout()
    return fig
