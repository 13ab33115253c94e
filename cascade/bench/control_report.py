"""The figures of ``cascade bench control`` from what a run recorded: per phase, the realised
strong share (overall and over sliding windows), budget violations, the accuracy of the kept
cheap answers against the target, the live thresholds; the table, the JSON and the PNG.

- Strong share: questions some other tier than the cheap one answered, over answered questions,
  by answer time. Windows of ``window_s`` slide in steps of a twentieth of it inside each phase
  (a phase shorter than the window is one window); a window over ``max_strong_share + 0.02``
  is a violation (issue 20's tolerance).
- Kept cheap answers: the cheap tier's answers the cascade returned as final (not degraded
  stand-ins); their accuracy against the labels, and with synthetic labels the expected one,
  the mean ``f(c)``.
- Oracle thresholds (synthetic labels): per cell and phase, over the questions that reached the
  gate (kept, or escalated for low confidence or margin), the lowest confidence threshold whose
  kept answers reach the target in expectation (mean ``f(c)`` at or above it), 1.0 when none
  does. A refit that certifies the target with 95 % confidence sits at or above it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cascade.bench.control import Answered, BenchItem, ControlOptions, Run, f
from cascade.errors import install_hint

TOLERANCE = 0.02
GATED = {None, "low_confidence", "low_margin", "budget"}  # reasons of questions the gate judged


def windows(
    answered: Sequence[Answered], start: float, end: float, window_s: float, cheap_tier: str
) -> list[dict[str, float]]:
    """The strong share of every window of ``window_s`` in [start, end] (one window when the
    span is shorter), each with its question count; windows without questions are left out."""
    if end - start <= window_s:
        spans = [(start, end)]
    else:
        step = window_s / 20
        count = int((end - start - window_s) / step + 1e-9) + 1
        spans = [(start + i * step, start + i * step + window_s) for i in range(count)]
        if spans[-1][1] < end:
            spans.append((end - window_s, end))
    out = []
    for lo, hi in spans:
        inside = [a for a in answered if lo <= a.t <= hi]
        if inside:
            strong = sum(a.tier != cheap_tier for a in inside)
            out.append(
                {"from_s": lo, "to_s": hi, "questions": len(inside), "share": strong / len(inside)}
            )
    return out


def oracle_threshold(confidences: Sequence[float], target: float) -> float:
    """The lowest threshold whose kept confidences have a mean ``f(c)`` of at least ``target``
    (midway between the last kept and the first escalated confidence; 1.0: none)."""
    ranked = sorted(confidences, reverse=True)
    total, best = 0.0, 0
    for k, c in enumerate(ranked, 1):
        total += f(c)
        if total / k >= target:
            best = k
    if best == 0:
        return 1.0
    if best == len(ranked):
        return 0.0
    return (ranked[best - 1] + ranked[best]) / 2


def _kept(answered: Sequence[Answered], cheap_tier: str) -> dict[str, Any]:
    kept = [a for a in answered if a.tier == cheap_tier and not a.degraded]
    judged = [a for a in kept if a.correct is not None]
    right = sum(bool(a.correct) for a in judged)
    expected = [a.expected for a in kept if a.expected is not None]
    return {
        "n": len(kept),
        "judged": len(judged),
        "correct": right,
        "accuracy": right / len(judged) if judged else None,
        "expected_accuracy": sum(expected) / len(expected) if expected else None,
    }


def _thresholds(run: Run, start: float, end: float) -> dict[str, dict[str, float]]:
    series: dict[str, list[float]] = defaultdict(list)
    for t, values in run.scrapes:
        if start <= t <= end:
            for name, value in values.items():
                series[name].append(value)
    return {
        name: {"first": v[0], "last": v[-1], "min": min(v), "max": max(v)}
        for name, v in sorted(series.items())
    }


def _oracles(run: Run, phase: int, target: float) -> dict[str, dict[str, float]]:
    cells: dict[str, list[float]] = defaultdict(list)
    for a in run.answered:
        cheap = run.cheap.get((a.item, a.qid))
        if a.phase == phase and a.reason in GATED and cheap is not None:
            cells[a.cell].append(cheap.confidence)
    return {
        cell: {"threshold": round(oracle_threshold(cs, target), 4), "n": len(cs)}
        for cell, cs in sorted(cells.items())
    }


def _statuses(values: Sequence[int | str]) -> dict[str, int]:
    return dict(sorted(Counter(str(v) for v in values).items()))


def phase_summary(
    run: Run, phase: int, opts: ControlOptions, *, max_share: float, target: float, window_s: float
) -> dict[str, Any]:
    start, end = (phase - 1) * run.phase_s, phase * run.phase_s
    answered = [a for a in run.answered if a.phase == phase]
    requests = [status for _, p, status in run.requests if p == phase]
    last = max((a.t for a in answered), default=end)
    shares = windows(answered, start, max(end, last), window_s, run.cheap_tier)
    strong = sum(a.tier != run.cheap_tier for a in answered)
    summary: dict[str, Any] = {
        "phase": phase,
        "hard_share": opts.mix[phase - 1],
        "from_s": start,
        "to_s": end,
        "requests": len(requests),
        "failures": sum(s != 200 for s in requests),
        "statuses": _statuses(requests),
        "questions": len(answered),
        "strong": strong,
        "strong_share": strong / len(answered) if answered else None,
        "windows": len(shares),
        "max_window_share": max((w["share"] for w in shares), default=None),
        "violations": sum(w["share"] > max_share + TOLERANCE for w in shares),
        "degraded": sum(a.degraded for a in answered),
        "reasons": dict(sorted(Counter(str(a.reason) for a in answered if a.reason).items())),
        "kept": _kept(answered, run.cheap_tier),
        "target_accuracy": target,
        "feedback": _statuses([s for p, s in run.feedback if p == phase]),
        "thresholds": _thresholds(run, start, end),
    }
    if opts.synthetic:
        summary["oracle_thresholds"] = _oracles(run, phase, target)
    return summary


def summarize(
    run: Run,
    items: Sequence[BenchItem],
    opts: ControlOptions,
    *,
    max_share: float,
    target: float,
    window_s: float,
    plot: Path | None,
) -> dict[str, Any]:
    phases = [
        phase_summary(run, p, opts, max_share=max_share, target=target, window_s=window_s)
        for p in (1, 2)
    ]
    everything = windows(run.answered, 0.0, 2 * run.phase_s, window_s, run.cheap_tier)
    statuses = [s for _, _, s in run.requests]
    result: dict[str, Any] = {
        "url": run.url,
        "items": len(items),
        "hard_items": sum(i.hard for i in items),
        "phase_s": run.phase_s,
        "concurrency": opts.concurrency,
        "mix": list(opts.mix),
        "feedback_share": opts.feedback_share,
        "labels": "synthetic: right with probability f(c) = c" if opts.synthetic else "gold",
        "cheap_tier": run.cheap_tier,
        "max_strong_share": max_share,
        "target_accuracy": target,
        "window_s": window_s,
        "phases": phases,
        "run": {
            "requests": len(statuses),
            "failures": sum(s != 200 for s in statuses),
            "max_window_share": max((w["share"] for w in everything), default=None),
            "violations": sum(w["share"] > max_share + TOLERANCE for w in everything),
            "windows": len(everything),
        },
        "reloads": _reload_summary(run, opts),
        "trajectory": [{"t": round(t, 3), **values} for t, values in run.scrapes],
        "plot": str(plot) if plot is not None else None,
    }
    return result


def _reload_summary(run: Run, opts: ControlOptions) -> dict[str, Any]:
    """The reloads asked and their answers, and the requests answered within 2 s after one."""
    near = [s for t, _, s in run.requests if any(0 <= t - r <= 2.0 for r, _ in run.reloads)]
    return {
        "asked": opts.reloads,
        "statuses": _statuses([s for _, s in run.reloads]),
        "requests_within_2s": len(near),
        "failures_within_2s": sum(s != 200 for s in near),
    }


# ---------------------------------------------------------------- the table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['url']}: {result['items']} items ({result['hard_items']} hard), 2 phases x "
        f"{result['phase_s']:g} s, {result['concurrency']} clients; labels {result['labels']}; "
        f"feedback for {result['feedback_share']:.0%} of answers",
        f"budget: strong share <= {result['max_strong_share']:g} (+{TOLERANCE:g}) over "
        f"{result['window_s']:g} s windows; target accuracy of kept answers "
        f"{result['target_accuracy']:g}",
        f"{'phase':<7}{'hard':>6}{'requests':>9}{'fail':>6}{'questions':>10}{'strong':>8}"
        f"{'max win':>9}{'over':>7}{'kept':>6}{'kept acc':>10}{'expected':>10}",
    ]
    for p in result["phases"]:
        kept = p["kept"]
        lines.append(
            f"{p['phase']:<7}{p['hard_share']:>6.0%}{p['requests']:>9}{p['failures']:>6}"
            f"{p['questions']:>10}{_pct(p['strong_share']):>8}{_pct(p['max_window_share']):>9}"
            f"{p['violations']:>3}/{p['windows']:<3}{kept['n']:>6}{_pct(kept['accuracy']):>10}"
            f"{_pct(kept['expected_accuracy']):>10}"
        )
    whole = result["run"]
    lines.append(
        f"whole run: {whole['requests']} requests, {whole['failures']} failed; max "
        f"window share {_pct(whole['max_window_share'])}, {whole['violations']} of "
        f"{whole['windows']} windows over budget"
    )
    cells = sorted(
        {c for p in result["phases"] for c in p["thresholds"] if c != "strong_share"}
        | {c for p in result["phases"] for c in p.get("oracle_thresholds", {})}
    )
    if cells:
        lines.append(
            "live threshold, first -> last per phase"
            + (" (oracle for f(c) = c)" if "oracle_thresholds" in result["phases"][0] else "")
        )
        for cell in cells:
            row = f"  {cell:<12}"
            for p in result["phases"]:
                live = p["thresholds"].get(cell)
                oracle = p.get("oracle_thresholds", {}).get(cell)
                text = f"{live['first']:.3f} -> {live['last']:.3f}" if live else "-"
                text += f" ({oracle['threshold']:.3f})" if oracle else ""
                row += f"{text:<28}"
            lines.append(row)
    reloads = result["reloads"]
    if reloads["asked"]:
        answers = ", ".join(f"{k} x{v}" for k, v in reloads["statuses"].items()) or "none"
        lines.append(
            f"reloads: {reloads['asked']} asked ({answers}); requests within 2 s "
            f"after one: {reloads['requests_within_2s']}, failed "
            f"{reloads['failures_within_2s']}"
        )
    if result["plot"]:
        lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the PNG


def write_plot(path: Path, result: dict[str, Any], run: Run) -> Path:
    """Thresholds per cell (oracles dashed) above, the strong share and its budget below."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit(f"the plot needs matplotlib: {install_hint('eval')}") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    trajectory = result["trajectory"]
    cells = sorted(
        {k for point in trajectory for k in point if k not in ("t", "strong_share")}
        | {c for phase in result["phases"] for c in phase.get("oracle_thresholds", {})}
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, cell in enumerate(cells):
        points = [(p["t"], p[cell]) for p in trajectory if cell in p]
        color = colors[i % len(colors)]
        top.plot([t for t, _ in points], [v for _, v in points], color=color, label=cell)
        for phase in result["phases"]:
            oracle = phase.get("oracle_thresholds", {}).get(cell)
            if oracle is not None:
                top.hlines(
                    oracle["threshold"],
                    phase["from_s"],
                    phase["to_s"],
                    colors=color,
                    linestyles="--",
                    linewidth=1,
                )
    oracles = "oracle_thresholds" in result["phases"][0]
    top.set(
        ylabel="confidence threshold",
        ylim=(0, 1.02),
        title=f"{result['url']}: live thresholds per type x band"
        + (" (dashed: oracle for f(c) = c)" if oracles else ""),
    )
    if cells:
        top.legend(loc="best", fontsize=7, ncol=2, framealpha=0.6)
    scraped = [(p["t"], p["strong_share"]) for p in trajectory if "strong_share" in p]
    if scraped:
        bottom.plot(
            [t for t, _ in scraped],
            [v for _, v in scraped],
            color="steelblue",
            label="cascade_strong_share",
        )
    ends = [t for t, _ in run.scrapes] or [0.0]
    own = [
        (
            t,
            windows(
                run.answered,
                max(0.0, t - result["window_s"]),
                t,
                result["window_s"],
                run.cheap_tier,
            ),
        )
        for t in ends
    ]
    bottom.plot(
        [t for t, w in own if w],
        [w[-1]["share"] for _, w in own if w],
        color="darkorange",
        label=f"answered strong, last {result['window_s']:g} s",
    )
    budget = result["max_strong_share"]
    bottom.axhline(budget, color="crimson", linestyle="--", linewidth=1, label="budget")
    bottom.axhline(
        budget + TOLERANCE,
        color="crimson",
        linestyle=":",
        linewidth=1,
        label=f"budget + {TOLERANCE:g}",
    )
    for ax in (top, bottom):
        ax.axvline(result["phase_s"], color="grey", linewidth=1)
    for t, _ in run.reloads:
        bottom.axvline(t, color="grey", linestyle=":", linewidth=0.8)
    from matplotlib.ticker import PercentFormatter

    bottom.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    bottom.set(
        xlabel="seconds (grey: the mix changes; dotted: reloads)",
        ylabel="strong share",
        ylim=(0, 1),
    )
    bottom.legend(loc="best", fontsize=7, framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
