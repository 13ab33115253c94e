"""The teacher: the strong tier answers every item once, batched, cached in the run directory.

``ask`` runs the policy's strong engine in process (``Engine`` protocol: in-process Clef, or any
``/v1/systemone`` upstream) with a bounded number of calls in flight, so the engine's own
micro-batcher forms device batches. Each finished item is appended to ``teacher.jsonl`` at once
(one JSON line, flushed): an interrupted run asks only for what is missing. An item the tier
refuses for good (``ClientError``: too long, bad options) is cached as an error and skipped;
any other failure stops the run, which resumes later where it stopped.

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
from cascade.learn.source import Item

CACHE_FILE = "teacher.jsonl"


class Answer(msgspec.Struct, kw_only=True, omit_defaults=True):
    key: str
    results: dict[str, list[float]] | None = None  # question id -> probabilities, caller order
    error: str | None = None


class TeacherCache:
    """The run directory's cached answers, by item key; appended to as answers arrive."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / CACHE_FILE
        self.answers: dict[str, Answer] = {}
        if self.path.exists():
            for line in self.path.read_bytes().splitlines():
                try:
                    answer = msgspec.json.decode(line, type=Answer)
                except msgspec.DecodeError:
                    continue  # a line cut short by an interrupted run: asked again
                self.answers[answer.key] = answer

    def add(self, answer: Answer) -> None:
        with self.path.open("ab") as fh:
            fh.write(msgspec.json.encode(answer) + b"\n")
        self.answers[answer.key] = answer


async def ask(engine: Engine, items: Sequence[Item], cache: TeacherCache, *, model: str,
              in_flight: int = 32, progress: bool = True) -> None:
    """Fill ``cache`` with the engine's answer to every item not cached yet."""
    from tqdm import tqdm

    todo = [item for item in items if item.key not in cache.answers]
    if not todo:
        return
    bar = tqdm(total=len(items), initial=len(items) - len(todo), unit="item",
               desc="distill: teacher", disable=not progress, dynamic_ncols=True)
    slots = asyncio.Semaphore(in_flight)

    async def one(item: Item) -> None:
        async with slots:
            try:
                answer = await engine.answer(msgspec.structs.replace(item.call, model=model))
            except ClientError as exc:
                cache.add(Answer(key=item.key, error=exc.message))
            else:
                cache.add(Answer(key=item.key, results={
                    qid: r.probabilities for qid, r in answer.results.items()}))
            bar.update(1)

    await engine.start()
    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels the rest
            for item in todo:
                group.create_task(one(item))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    finally:
        bar.close()
        await engine.aclose()


def attach(items: Sequence[Item], cache: TeacherCache) -> list[Item]:
    """The items the teacher answered, with its answers; refused items are left out."""
    out = []
    for item in items:
        answer = cache.answers.get(item.key)
        if answer is not None and answer.results is not None:
            out.append(msgspec.structs.replace(item, teacher=answer.results))
    return out
