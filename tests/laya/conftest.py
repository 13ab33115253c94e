"""Tiny checkpoints (both config formats), their ONNX exports, and laya's own Agent on copies."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cascade.answers import apply_gate, build_answer, build_usage
from cascade.calls import EngineCall, EngineUsage, QuestionResult
from cascade.engines.onnx import OnnxSession
from cascade.laya import decode
from cascade.laya.export import MODEL_FILE, export
from cascade.laya.preview import Previewer
from cascade.laya.rows import collate
from cascade.laya.tiny import write_random
from cascade.schema import Controls, Question

FORMATS = ("v5", "v4")
# The shipped tiny checkpoint's temperatures are all in range (its loading logs nothing); these
# copies carry one out of range, as the English checkpoint's choice:11+ = 0.1006 is, so the
# comparisons with laya exercise the clamp.
UNCLAMPED = {"temperature_by_options": {"choice:3-5": 1.2, "choice:11+": 0.1, "noul:2": 1.7}}


def to_questions(raw: dict[str, dict[str, Any]]) -> dict[str, Question]:
    """Wire Structs from plain dicts, as the gateway's decoder would build them."""
    return msgspec.convert(raw, dict[str, Question])


def laya_dicts(
    questions: dict[str, Question],
    results: dict[str, QuestionResult],
    usage: EngineUsage,
    min_confidence: float | dict[str, float] | None = None,
) -> dict[str, Any]:
    """What the gateway's ``laya`` profile serves, as Laya's ``Agent`` dicts: the serving
    code path (``cascade.answers``), minus ``x_jev_confidence`` (laya-serve adds that, the
    ``Agent`` does not)."""
    answers = {}
    for qid, question in questions.items():
        answer = build_answer(question, results[qid], "laya")
        if min_confidence is not None:
            n = len(results[qid].probabilities)
            apply_gate(answer, question.type, n, min_confidence)
        as_dict = msgspec.to_builtins(answer)
        as_dict.pop("x_jev_confidence", None)
        answers[qid] = as_dict
    return {
        "model": "laya-rl-agent",
        "answers": answers,
        "usage": msgspec.to_builtins(build_usage(usage, "laya")),
    }


class Ours:
    """cascade's full Laya path for one checkpoint, returning Laya's answer dict."""

    def __init__(self, ckpt: Path, export_dir: Path) -> None:
        self.previewer = Previewer({"english": ckpt})
        self.ckpt = self.previewer.checkpoints["english"]
        # the export's extra output (the novelty gate's vectors) runs too: the parity holds with it
        self.session = OnnxSession(
            export_dir / MODEL_FILE, intra_op_threads=1, optional=("pooled",)
        )
        self.last_logits: list = []

    def __call__(
        self, state: Any, questions: dict, min_confidence: Any = None, **controls: Any
    ) -> dict[str, Any]:
        call = EngineCall(
            state=state,
            questions=to_questions(questions),
            model="english",
            controls=Controls(**controls),
        )
        plan = self.previewer.plan(call)
        logits, act, pooled = self.session.run(collate(plan.rows, self.ckpt.tok.pad_id))
        self.last_logits = [logits[i, : len(r.markers)] for i, r in enumerate(plan.rows)]
        outputs = list(zip(self.last_logits, act, pooled, strict=True))
        results = decode.results(plan.questions, plan.rows, outputs, self.ckpt.cfg)
        usage = decode.usage(plan.questions, plan.rows, plan.state_tokens)
        return laya_dicts(call.questions, results, usage, min_confidence)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("laya-tiny")
    return {
        fmt: write_random(
            root / fmt,
            config_format=fmt,
            seed=i,  # type: ignore[arg-type]
            agent=UNCLAMPED,
        )
        for i, fmt in enumerate(FORMATS)
    }


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory, tiny_dirs: dict[str, Path]) -> Path:
    import torch

    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("laya-onnx")
    for ckpt in tiny_dirs.values():
        export(ckpt, cache=cache, progress=lambda _: None)
    return cache


@pytest.fixture(scope="session")
def ours(tiny_dirs: dict[str, Path], onnx_cache: Path) -> dict[str, Ours]:
    from cascade.laya.export import cached_export

    return {fmt: Ours(ckpt, cached_export(ckpt, onnx_cache)) for fmt, ckpt in tiny_dirs.items()}


@pytest.fixture(scope="session")
def agents(tiny_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """laya 0.4.15's Agent on a COPY of each tiny dir (it rewrites the tokenizer config)."""
    import torch
    from laya import Agent

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("laya-agent")
    agents = {}
    for fmt, ckpt in tiny_dirs.items():
        # laya clamps the tiny checkpoint's choice:11+ = 0.1 to 0.5, as cascade does, and says so
        with pytest.warns(RuntimeWarning, match=r"choice:11\+=0.1 -> 0.5"):
            agents[fmt] = Agent(str(shutil.copytree(ckpt, root / fmt)), device="cpu")
    return agents
