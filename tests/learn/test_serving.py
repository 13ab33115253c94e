"""Serving NEWDIR: the engine makes it its own ONNX export (the cache keys on content), and
laya 0.4.15's ``Agent`` answers NEWDIR exactly as cascade serves it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import msgspec
import numpy as np

from cascade.calls import EngineCall
from cascade.engines.laya import LayaEngine
from cascade.laya.checkpoint import content_hash
from cascade.laya.export import cached_export, export
from cascade.schema import Controls
from tests.laya.conftest import laya_dicts, to_questions
from tests.laya.test_parity import CASES, assert_same_result, laya_with_logits
from tests.learn.conftest import Run


async def answers(engine: LayaEngine) -> dict[str, tuple[dict, list]]:
    """cascade's served answer (Laya's dict shape) for every parity case."""
    await engine.start()
    try:
        out = {}
        for name, (state, questions, controls) in CASES.items():
            call = EngineCall(
                state=state,
                questions=to_questions(questions),
                model="english",
                controls=Controls(**controls),
            )
            answer = await engine.answer(call)
            out[name] = laya_dicts(call.questions, answer.results, answer.usage)
        return out
    finally:
        await engine.aclose()


def test_newdir_gets_its_own_export_and_laya_answers_it_as_cascade_does(
    distilled: Run, demo_dir: Path, tmp_path: Path
) -> None:
    import torch
    from laya import Agent

    source, new = demo_dir / "laya-english", distilled.out
    cache = tmp_path / "onnx"
    export(source, cache=cache, progress=lambda _: None)
    assert cached_export(new, cache) is None  # the source's export is not reused
    engine = LayaEngine("laya", {"english": new}, onnx_cache=cache, intra_op_threads=1)
    served = asyncio.run(answers(engine))
    own = cached_export(new, cache)
    assert own == cache / content_hash(new)[:16] != cached_export(source, cache)
    assert msgspec.json.decode((own / "export.json").read_bytes())["content_hash"] == content_hash(
        new
    )

    torch.set_num_threads(1)
    # the tiny temperatures are in Laya's range: laya loads both without a warning
    agent = Agent(str(shutil.copytree(new, tmp_path / "agent")), device="cpu")
    before = Agent(str(shutil.copytree(source, tmp_path / "source")), device="cpu")
    moved = 0.0
    for name, (state, questions, controls) in CASES.items():
        theirs, logits = laya_with_logits(agent, state, questions, **controls)
        assert_same_result(served[name], theirs)
        _, old_logits = laya_with_logits(before, state, questions, **controls)
        moved = max(moved, float(np.abs(logits - old_logits).max()))
    assert moved > 0.1  # the distilled weights answer differently from the source's
