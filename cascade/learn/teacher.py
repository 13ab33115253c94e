"""The teacher: the strong tier answers every item once, batched, cached in the run directory.

``ask`` runs the policy's strong engine in process (``Engine`` protocol: in-process Clef, or any
``/v1/systemone`` upstream) with a bounded number of calls in flight, so the engine's own
micro-batcher forms device batches. Each finished item is appended to ``teacher.jsonl``, eval's
tier cache (``cascade.eval.tiercache``), keyed like eval's by the tier's identity (the content
hash of a Clef release's files) and the item's content: an interrupted run asks only for what
is missing, and a release retrained in place is asked again. An item the tier refuses for good
(``ClientError``: too long, bad options) is cached as refused and skipped; any other failure
stops the run, which resumes later where it stopped.

Batched answers equal single ones within 1e-4 (the Clef engine's guarantee), so a fresh run can
differ from a cached one in the last digits; runs from the same cache are exactly equal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import msgspec

from cascade.engines.base import Engine
from cascade.errors import ClientError
from cascade.eval.data import Item
from cascade.eval.tiercache import TierCache, TierRun, item_key

CACHE_FILE = "teacher.jsonl"


def open_cache(run_dir: Path) -> TierCache:
    """The run directory's teacher answers (close it when done)."""
    return TierCache(run_dir / CACHE_FILE)


async def ask(
    engine: Engine,
    items: Sequence[Item],
    cache: TierCache,
    *,
    identity: str,
    model: str,
    in_flight: int = 32,
    progress: bool = True,
) -> None:
    """Fill ``cache`` with the answer of the engine (the tier ``identity`` names) to every item
    not cached yet."""
    from tqdm import tqdm

    todo = {
        key: item
        for item in items
        if (key := item_key(identity, None, item.call)) not in cache.runs
    }
    if not todo:
        return
    bar = tqdm(
        total=len(items),
        initial=len(items) - len(todo),
        unit="item",
        desc="distill: teacher",
        disable=not progress,
        dynamic_ncols=True,
    )
    slots = asyncio.Semaphore(in_flight)

    async def one(key: str, item: Item) -> None:
        async with slots:
            try:
                answer = await engine.answer(msgspec.structs.replace(item.call, model=model))
            except ClientError as exc:
                cache.put(
                    key,
                    item.id,
                    TierRun(answer=None, refused={qid: exc.message for qid in item.call.questions}),
                )
            else:
                cache.put(key, item.id, TierRun(answer=answer))
            bar.update(1)

    await engine.start()
    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels the rest
            for key, item in todo.items():
                group.create_task(one(key, item))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    finally:
        bar.close()
        await engine.aclose()


def attach(items: Sequence[Item], cache: TierCache, *, identity: str) -> list[Item]:
    """The items the teacher answered, with its probabilities; refused items are left out."""
    out = []
    for item in items:
        run = cache.runs.get(item_key(identity, None, item.call))
        if run is not None and run.answer is not None:
            out.append(
                msgspec.structs.replace(
                    item, teacher={qid: r.probabilities for qid, r in run.answer.results.items()}
                )
            )
    return out
