"""Run each tier once on each item, in process through the engines, cached so runs resume.

Every tier answers every question it can (not only the ones routing would give it), so the
cascade, each tier alone and any other threshold can be computed offline from the same outputs
(``cascade.eval.decide``). The cheap tier reads text only, on the checkpoint pre-routing picks;
a call it refuses (a 4xx, e.g. too many options for Laya's head) is retried question by question
and each refusal is kept. Tier failures (timeouts, overload, a 5xx) are retried a few times and
never cached, so the next run retries them. With ``[consistency]`` the cheap tier also answers
every choice and score question in the option-order check's orders (``Outputs.orders``).

The cache is ``cascade.eval.tiercache``'s, one JSONL file per tier under ``DIR/cache/``: an
interrupted run (Ctrl-C, a crash) resumes where it stopped, and a tier whose weights changed
runs again.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from cascade.calls import CallPreview, EngineAnswer, EngineCall, merge
from cascade.engines.base import Engine, Previewing
from cascade.errors import ClientError, EngineError, Overloaded
from cascade.eval.data import Item
from cascade.eval.tiercache import TierCache, TierRun, item_key
from cascade.policy.consistency import every_order, reordered_call
from cascade.policy.flow import preview_call
from cascade.policy.model import LayaTier, Policy

Slot = Literal["cheap", "strong"]
RETRIES = 3


class Outputs(msgspec.Struct, kw_only=True):
    """Everything the tiers produced for one item (None: that tier is not configured, or it
    failed on this run)."""

    preview: CallPreview | None
    cheap: TierRun | None
    strong: TierRun | None
    error: str | None = None  # why a tier failed on this run, or why pre-routing refused it
    # the cheap tier on every choice and score question in the option-order check's orders
    # (``[consistency]`` only; ``cascade.policy.consistency.every_order``)
    orders: TierRun | None = None


class Runner:
    """Runs ``slots`` of ``policy``'s tiers on items (engines already started).

    ``identities``: {tier name: what identifies its weights} for the cache keys.
    """

    def __init__(
        self,
        policy: Policy,
        engines: Mapping[str, Engine],
        identities: Mapping[str, str],
        cache_dir: Path | None,
        *,
        slots: Sequence[Slot] = ("cheap", "strong"),
        concurrency: int = 8,
    ) -> None:
        self.policy = policy
        self.engines = engines
        self.identities = identities
        self.names: dict[Slot, str] = {
            s: n for s in slots if (n := getattr(policy.route, s)) is not None
        }
        cheap = engines.get(policy.route.cheap or "")
        self.previewer = cheap if isinstance(cheap, Previewing) else None
        self.caches = (
            {s: TierCache(cache_dir / "cache" / f"{s}.jsonl") for s in self.names}
            if cache_dir is not None
            else {}
        )
        self.concurrency = concurrency

    async def run(self, items: Sequence[Item], *, progress: bool = True) -> list[Outputs]:
        """The outputs of every item, in order. A progress bar goes to stderr on a terminal."""
        from tqdm import tqdm

        bar = tqdm(
            total=len(items),
            unit="item",
            desc="eval",
            file=sys.stderr,
            disable=not (progress and sys.stderr.isatty()),
        )
        gate = asyncio.Semaphore(self.concurrency)

        async def one(item: Item) -> Outputs:
            async with gate:
                out = await self._item(item)
            bar.update(1)
            return out

        try:
            return list(await asyncio.gather(*(one(item) for item in items)))
        finally:
            bar.close()
            for cache in self.caches.values():
                cache.close()

    async def _item(self, item: Item) -> Outputs:
        call = item.call
        try:
            preview = None
            if self.previewer is not None:
                preview = await asyncio.to_thread(preview_call, self.policy, call, self.previewer)
        except ClientError as exc:
            return Outputs(preview=None, cheap=None, strong=None, error=exc.message)
        runs: dict[str, TierRun | None] = {}
        errors = []
        for slot, name in self.names.items():
            tier_call = call
            checkpoint = None
            if slot == "cheap":
                checkpoint = self._checkpoint(preview)
                tier_call = msgspec.structs.replace(call, images=[], model=checkpoint or call.model)
            try:
                runs[slot] = await self._cached(slot, name, checkpoint, item.id, tier_call)
            except (EngineError, Overloaded) as exc:
                runs[slot] = None
                errors.append(f"{name}: {exc}")
            if slot == "cheap" and runs[slot] is not None:
                runs["orders"] = await self._orders(name, checkpoint, item.id, tier_call)
        return Outputs(
            preview=preview,
            cheap=runs.get("cheap"),
            strong=runs.get("strong"),
            orders=runs.get("orders"),
            error="; ".join(errors) or None,
        )

    async def _orders(
        self, name: str, checkpoint: str | None, item_id: str, call: EngineCall
    ) -> TierRun | None:
        """The option-order check's rows of every question it may check (None: off, none, or
        the tier failed on them: nothing is checked)."""
        planned = every_order(self.policy, call) if self.policy.consistency.enabled else {}
        if not planned:
            return None
        try:
            return await self._cached(
                "cheap", name, checkpoint, item_id, reordered_call(call, planned)
            )
        except (EngineError, Overloaded):
            return None

    def _checkpoint(self, preview: CallPreview | None) -> str | None:
        tier = self.policy.cheap_tier()
        if preview is not None:
            return preview.checkpoint
        return tier.default_checkpoint if isinstance(tier, LayaTier) else None

    async def _cached(
        self, slot: Slot, name: str, checkpoint: str | None, item_id: str, call: EngineCall
    ) -> TierRun:
        cache = self.caches.get(slot)
        key = item_key(self.identities.get(name, name), checkpoint, call)
        if cache is not None and key in cache.runs:
            return cache.runs[key]
        run = await self._answer(self.engines[name], call)
        if cache is not None:
            cache.put(key, item_id, run)
        return run

    async def _answer(self, engine: Engine, call: EngineCall) -> TierRun:
        try:
            return TierRun(answer=await _retrying(engine, call))
        except ClientError as whole:
            if len(call.questions) == 1:
                return TierRun(answer=None, refused={q: whole.message for q in call.questions})
        parts = [
            await self._answer(engine, msgspec.structs.replace(call, questions={q: v}))
            for q, v in call.questions.items()
        ]
        answers = [p.answer for p in parts if p.answer is not None]
        refused = {q: why for p in parts for q, why in p.refused.items()}
        return TierRun(answer=merge(answers) if answers else None, refused=refused)


async def _retrying(engine: Engine, call: EngineCall) -> EngineAnswer:
    for attempt in range(RETRIES):
        try:
            return await engine.answer(call)
        except (EngineError, Overloaded):
            if attempt == RETRIES - 1:
                raise
            await asyncio.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")
