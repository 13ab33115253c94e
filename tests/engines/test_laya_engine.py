"""LayaEngine end to end on tiny checkpoints: first-start export, batching, routing, errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from cascade.calls import EngineCall
from cascade.engines.base import Engine
from cascade.engines.laya import LayaEngine
from cascade.errors import Overloaded, ValidationFailed
from cascade.laya.tiny import make_tiny
from cascade.schema import Controls, Question

pytestmark = pytest.mark.anyio

QUESTIONS = {
    "dept": {
        "type": "choice",
        "instructions": "Which department?",
        "criteria": {"billing": "money", "tech": None, "account": "login"},
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "level": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "cross", "mad"],
        "option_order": [2, 0, 1],
    },
}
STATES = [
    "The order arrived broken.",
    {"body": "Refund me now, please!", "n": 2},
    [{"role": "user", "content": f"turn {i}: where is my money?"} for i in range(9)],
    "Need help " * 40,
    "Мой заказ не пришёл, верните деньги.",
]


def call(
    state: object, questions: dict = QUESTIONS, model: str = "jev-latest", **controls: object
) -> EngineCall:
    return EngineCall(
        state=state,
        questions=msgspec.convert(questions, dict[str, Question]),
        model=model,
        controls=Controls(**controls),
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-ckpts")
    return {
        "english": make_tiny(root / "english", seed=3),
        "multilingual": make_tiny(root / "multilingual", config_format="v4", seed=4),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-onnx")


@pytest.fixture
async def engine(checkpoints: dict[str, Path], cache: Path):
    eng = LayaEngine("laya", checkpoints, onnx_cache=cache, intra_op_threads=1, max_wait_s=0.01)
    await eng.start()
    yield eng
    await eng.aclose()


async def test_first_start_exports_then_reuses_the_cache(engine: LayaEngine, cache: Path) -> None:
    assert isinstance(engine, Engine) and engine.ready()
    exports = {c["onnx"] for c in engine.health()["checkpoints"].values()}
    assert len(exports) == 2 and all(Path(e).parent == cache for e in exports)
    assert engine.health()["demo"] is False


async def test_concurrent_answers_equal_sequential_ones(engine: LayaEngine) -> None:
    calls = [call(s) for s in STATES] * 2
    sequential = [await engine.answer(c) for c in calls]
    concurrent = await asyncio.gather(*(engine.answer(c) for c in calls))
    for one, many in zip(sequential, concurrent, strict=True):
        assert one.model == many.model and one.usage == many.usage
        for qid, res in one.results.items():
            assert res.type == many.results[qid].type
            assert res.probabilities == pytest.approx(many.results[qid].probabilities, abs=1e-5)
    batches = sum(c["batches"] for c in engine.health()["checkpoints"].values())
    assert batches < 2 * len(calls)  # concurrent rows shared forward passes


async def test_results_are_unrounded_in_caller_order(engine: LayaEngine) -> None:
    answer = await engine.answer(call(STATES[0]))
    assert list(answer.results) == list(QUESTIONS)
    noul = answer.results["urgent"]
    assert noul.type == "noul" and len(noul.probabilities) == 2
    assert sum(answer.results["level"].probabilities) == pytest.approx(1.0, abs=1e-6)
    assert 0.0 <= noul.act_probability <= 1.0
    rows = engine.preview(call(STATES[0])).rows
    assert answer.usage.input_tokens == sum(r.row_tokens for r in rows.values())
    assert answer.usage.state_tokens == rows["dept"].state_tokens > 0


async def test_checkpoint_choice(engine: LayaEngine) -> None:
    assert (await engine.answer(call(STATES[0]))).model == "english"
    assert (await engine.answer(call(STATES[4]))).model == "multilingual"  # cyrillic
    assert (await engine.answer(call(STATES[4], model="en"))).model == "english"
    assert (await engine.answer(call(STATES[0], model="ml"))).model == "multilingual"
    assert (await engine.answer(call(STATES[0], lang="de"))).model == "multilingual"
    preview = engine.preview(call(STATES[4], model="english"))
    assert preview.checkpoint == "english" and preview.script == "cyrillic"
    assert not preview.readable


async def test_usage_reports_truncation_and_collapsed_options(engine: LayaEngine) -> None:
    many = {
        "intent": {
            "type": "choice",
            "instructions": "Which?",
            "criteria": [f"intent_{i}" for i in range(45)],
        }
    }
    answer = await engine.answer(call("Need help " * 40, many, max_len=300))
    assert answer.usage.truncated_questions == ["intent"]
    assert answer.usage.state_tokens_dropped > 0
    spans = answer.usage.options["intent"]
    assert spans.total == 45 and spans.distinct < 45 and spans.tokens_per_option == 4
    assert len(answer.results["intent"].probabilities) == 45


async def test_request_errors_are_validation_failures(engine: LayaEngine) -> None:
    bad_order = {"q": {**QUESTIONS["dept"], "option_order": [0, 0, 1]}}
    with pytest.raises(ValidationFailed) as info:
        await engine.answer(call("x", bad_order))
    assert info.value.items[0]["loc"] == ["body", "questions", "q", "option_order"]
    # 300 options of 2-3 tokens each cannot all keep their marker in a 512-token row
    too_many = {"q": {"type": "choice", "instructions": "Which?", "criteria": list(range(300))}}
    with pytest.raises(ValidationFailed, match="option markers fit in max_len=512"):
        await engine.answer(call("x", too_many))


async def test_no_questions_means_no_inference(engine: LayaEngine) -> None:
    answer = await engine.answer(call("x", {}))
    assert answer.results == {} and answer.usage.input_tokens == 0
    assert answer.usage.state_tokens is None


async def test_full_queue_is_overloaded(checkpoints: dict[str, Path], cache: Path) -> None:
    eng = LayaEngine(
        "laya",
        {"english": checkpoints["english"]},
        onnx_cache=cache,
        intra_op_threads=1,
        max_batch_rows=1,
        max_queue_rows=3,
        demo=True,
    )
    await eng.start()
    results = await asyncio.gather(
        *(eng.answer(call(s)) for s in STATES[:4]), return_exceptions=True
    )
    assert any(isinstance(r, Overloaded) for r in results)
    assert all(r.model == "english-demo-random" for r in results if not isinstance(r, Exception))
    assert eng.health()["demo"] is True
    await eng.aclose()


def test_serving_path_never_imports_torch() -> None:
    code = (
        "import sys, cascade.cli.export, cascade.cli.make_tiny\n"
        "assert not {'torch', 'onnxruntime'} & set(sys.modules), 'cli imports heavy modules'\n"
        "import cascade.engines.laya\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
