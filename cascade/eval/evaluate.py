"""``cascade eval`` end to end: run the tiers, decide the cascade, write every output.

``DIR/items.jsonl`` (``cascade.eval.decide.ItemRow`` per question), ``DIR/summary.json``
(``cascade.eval.summary``), ``DIR/summary.md`` (``cascade.eval.report``) and the PNG plots
(``cascade.eval.plots``). The tiers' raw outputs are cached under ``DIR/cache/``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from cascade.engines.base import Previewing
from cascade.eval.data import Item
from cascade.eval.decide import ItemRow, rows_of
from cascade.eval.plots import write_plots
from cascade.eval.report import render
from cascade.eval.runner import Runner, Slot
from cascade.eval.summary import scored, summarize
from cascade.eval.sweep import Sweep
from cascade.eval.tiers import identities, running
from cascade.policy.model import Policy
from cascade.policy.novelty import load_reference
from cascade.settings import Settings

SLOTS: tuple[Slot, ...] = ("cheap", "strong")


def slots_of(policy: Policy) -> list[Slot]:
    return [s for s in SLOTS if getattr(policy.route, s) is not None]


async def run_tiers(
    items: Sequence[Item],
    policy: Policy,
    settings: Settings,
    cache_dir: Path | None,
    *,
    slots: Sequence[Slot],
    progress: bool = True,
    strong_down: bool = False,
    canned_strong: bool = False,
) -> tuple[list[ItemRow], list[str]]:
    """The ``items.jsonl`` rows of ``items`` (as if the strong tier were unavailable, with
    ``strong_down``; as if it answered, with ``canned_strong``), and one line per item a tier
    failed on."""
    async with running(policy, settings, slots) as engines:
        runner = Runner(policy, engines, await identities(policy, engines), cache_dir, slots=slots)
        outputs = await runner.run(items, progress=progress)
        cheap = engines.get(policy.route.cheap or "")
        previewer = cheap if isinstance(cheap, Previewing) else None  # for stand-in previews
        reference = load_reference(policy)
        rows = [
            row
            for item, out in zip(items, outputs, strict=True)
            for row in rows_of(
                policy,
                item,
                out,
                strong_down=strong_down,
                canned_strong=canned_strong,
                previewer=previewer,
                reference=reference,
            )
        ]
    errors = [
        f"{item.id}: {out.error}" for item, out in zip(items, outputs, strict=True) if out.error
    ]
    return rows, errors


def write_outputs(
    out: Path,
    rows: Sequence[ItemRow],
    *,
    slots: Sequence[str],
    price: Mapping[str, float],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """Write items.jsonl, summary.json, summary.md and the plots; return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "items.jsonl").open("wb") as handle:
        for row in rows:
            handle.write(msgspec.json.encode(row) + b"\n")
    summary = summarize(rows, slots=slots, price=price, meta=meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(render(summary))
    groups = {s: scored(rows, s) for s in (*slots, "cascade")}
    title = "DEMO (random weights)" if meta.get("demo") else "cascade eval"
    write_plots(out, summary, groups, Sweep(rows, price), title)
    return summary
