"""``summary.md``: the evaluation as a readable report (tables, the curve, the plots)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cascade.eval.plots import FILES


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _prices(prices: Mapping[str, float]) -> str:
    return ", ".join(f"{slot} {value:g}" for slot, value in prices.items())


def _table(rows: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    out = ["| | n | accuracy | macro-F1 | Brier | ECE |", "|---|---:|---:|---:|---:|---:|"]
    out += [
        f"| {name} | {s['n']} | {_f(s['accuracy'])} | {_f(s['macro_f1'])} | "
        f"{_f(s['brier'])} | {_f(s['ece'])} |"
        for name, s in rows
    ]
    return out


def _signals(cascade: Mapping[str, Any]) -> list[str]:
    """The escalation signals' table, and the option-order check's figures."""
    out = [
        "## Escalation signals",
        "",
        "Cheap answers each signal escalated, and their accuracy against gold (kept: those "
        "none escalated).",
        "",
        "| signal | questions | cheap accuracy |",
        "|---|---:|---:|",
    ]
    out += [
        f"| {name} | {s['questions']} | {_f(s['cheap_accuracy'])} |"
        for name, s in cascade["signals"].items()
    ]
    check = cascade.get("order_check")
    if check is not None:
        out += [
            "",
            f"Option-order check: {check['checked']} questions checked, "
            f"{check['moved']} moved (flip rate {_pct(check['flip_rate'])}); cheap accuracy "
            f"moved {_f(check['cheap_accuracy_moved'])}, stable "
            f"{_f(check['cheap_accuracy_stable'])}; added per item "
            f"{_f(check['extra_rows_per_item'], 2)} cheap rows, "
            f"{_f(check['extra_tokens_per_item'], 1)} input tokens "
            f"({_pct(check['extra_token_share'])} of the cheap tier's).",
        ]
    novelty = cascade.get("novelty")
    if novelty is not None:
        out += [
            "",
            f"Novelty gate: {novelty['flagged']} of {novelty['judged']} judged questions "
            f"flagged ({_pct(novelty['flag_rate'])}); by source: "
            + ", ".join(
                f"{name or '(none)'} {_pct(s['flag_rate'])} of {s['judged']}"
                for name, s in novelty["by_source"].items()
            )
            + ".",
        ]
    return [*out, ""]


def render(summary: Mapping[str, Any]) -> str:
    tiers = summary["tiers"]
    cascade = tiers["cascade"]
    out = ["# cascade eval", ""]
    if summary.get("demo"):
        out += [f"> **{summary['warning']}**", ""]
    out += [
        f"Data: `{summary['data']}`: {summary['items']} items, {summary['questions']} questions"
        f" ({cascade['questions']} answered by the cascade). Policy: {summary['policy']}."
        + (f" Calibration: `{summary['calibration']}`." if summary.get("calibration") else ""),
        "",
        "## Tiers",
        "",
    ]
    named = [
        (f"{slot} ({summary['tier_names'].get(slot, '–')})", tiers[slot])
        for slot in ("cheap", "strong")
        if tiers[slot] is not None
    ]
    out += _table([*named, ("cascade", cascade)])
    for key, title in (("by_type", "question type"), ("by_band", "option band")):
        out += ["", f"### By {title}", ""]
        rows = [
            (f"{slot} · {group}", scores)
            for slot in ("cheap", "strong", "cascade")
            if tiers[slot] is not None
            for group, scores in tiers[slot][key].items()
        ]
        out += _table(rows)
    cost = cascade["cost"]
    at = cost["at_strong_accuracy"]
    out += [
        "",
        "## The cascade",
        "",
        f"- escalation rate: {_pct(cascade['escalation_rate'])} of the questions went to the "
        "strong tier (pre-routed included)",
        f"- confidence escalation rate: {_pct(cascade['confidence_escalation_rate'])} of the "
        "questions the cheap tier answered escalated on confidence",
        f"- fixed: {cascade['fixed']} (cheap wrong, cascade right); broke: {cascade['broke']} "
        "(cheap right, cascade wrong)",
        f"- cheap-strong agreement: {_pct(summary['agreement']['cheap_strong'])} of the "
        f"{summary['agreement']['questions']} questions both tiers answered (no gold needed)",
        f"- cost (per 1k input tokens: {_prices(cost['per_1k_tokens'])}): cascade "
        f"{_f(cost['cascade'], 4)}"
        f" against {_f(cost['strong_only'], 4)} for the strong tier alone: saves "
        f"{_pct(cost['saved'])}",
        "- at the strong tier's accuracy: "
        + (
            "no point of the sweep reaches it"
            if at is None
            else f"{_pct(at['escalation_rate'])} escalated, accuracy {_f(at['accuracy'])}, saves "
            f"{_pct(at['saved'])}"
        ),
        "",
        "### Deferral curve (threshold sweep over the gated questions)",
        "",
        "The k least confident questions that reached the cheap tier's gate go strong, for 11 "
        "even steps of k; the operating point applies the policy's per type × band thresholds "
        "instead, so it need not lie on the curve.",
        "",
        "| escalation rate | accuracy | cost |",
        "|---:|---:|---:|",
    ]
    out += [
        f"| {_pct(p['escalation_rate'])} | {_f(p['accuracy'])} | {_f(p['cost'], 4)} |"
        for p in cascade["deferral_curve"]
    ]
    op = cascade["operating_point"]
    out += [
        f"| **{_pct(op['escalation_rate'])}** (operating point) | **{_f(op['accuracy'])}** | "
        f"**{_f(op['cost'], 4)}** |",
        "",
    ]
    out += _signals(cascade)
    out += ["## Plots", ""] + [f"![{name}]({name})" for name in FILES] + [""]
    return "\n".join(out)
