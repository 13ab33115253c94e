"""``ClefEngine``'s edges without a model: closing under a call, and content the image
processor refuses (the client's, never a tier failure)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cascade.calls import EngineCall, Image
from cascade.clef.media import _refused
from cascade.engines.batcher import MicroBatcher
from cascade.engines.clef import ClefEngine, _Loaded
from cascade.errors import EngineFailed, EngineUnavailable, ValidationFailed
from cascade.schema import NoulQuestion

CALL = EngineCall(state="s", questions={"q": NoulQuestion(instructions="?")}, model="clef-flash")


def test_closing_while_a_call_is_prepared_is_unavailable_not_a_crash() -> None:
    prepared = threading.Event()
    release = threading.Event()

    class Parts:
        def prepare(self, call: EngineCall) -> Any:
            prepared.set()
            release.wait(5)
            return object()

    async def run() -> None:
        engine = ClefEngine("clef", Path("unused"))
        engine._ready, engine._parts = True, Parts()
        engine._batcher = MicroBatcher(
            lambda jobs: jobs, name="clef", max_batch_items=1, max_batch_cost=10**6
        )
        answer = asyncio.create_task(engine.answer(CALL))
        await asyncio.to_thread(prepared.wait, 5)
        await engine.aclose()  # shutdown while the call is in its helper thread
        release.set()
        with pytest.raises(EngineUnavailable):
            await answer

    asyncio.run(run())


def test_an_image_the_processor_refuses_is_the_clients_422() -> None:
    class Images:
        def encode(self, images: list[Image]) -> Any:
            with _refused(None):  # how ImageEncoder wraps every processor call
                raise ValueError("absolute aspect ratio must be smaller than 200, got 201")

    release = SimpleNamespace(path=Path("/models/clef-tiny"))
    parts = _Loaded(release, encoder=None, images=Images(), runner=None, calibration=[])
    image = Image(data=b"png", mime="image/png", width=201, height=1)
    with pytest.raises(ValidationFailed, match="aspect ratio") as info:
        parts.prepare(EngineCall(state="s", questions=CALL.questions, model="m", images=[image]))
    assert info.value.items[0]["loc"] == ["body", "images"]


def test_an_image_processor_bug_is_the_tiers_failure_not_the_clients() -> None:
    class Images:
        def encode(self, images: list[Image]) -> Any:
            raise TypeError("'NoneType' object is not subscriptable")

    release = SimpleNamespace(path=Path("/models/clef-tiny"))
    parts = _Loaded(release, encoder=None, images=Images(), runner=None, calibration=[])
    image = Image(data=b"png", mime="image/png", width=8, height=8)
    with pytest.raises(EngineFailed, match="image processor failed"):
        parts.prepare(EngineCall(state="s", questions=CALL.questions, model="m", images=[image]))
