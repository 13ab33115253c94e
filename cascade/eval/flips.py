"""The flip check: run a checkpoint's fp32 and int8 exports on a user's requests and report.

Both precisions run through the serving engine (``LayaEngine``: the same rows, batching and
decoding as the gateway), one after the other with ``clients`` concurrent requests each, so the
report's speed-up is measured on the user's own traffic. Requests come from an evaluation data
file (``cascade.eval.data``; gold labels give each precision's accuracy) or from a decision log
(its rows with the state stored as text; shadow rows' strong answers stand in for gold). The
policy's confidence gate (``cascade.policy.routing.post_route``) is applied to both answers to
count the flips a client would see and the escalation decisions that change: each request runs
through the gateway's flow (``cascade.policy.flow.decide``), its cheap tier answered with the
precision's answer and its strong tier canned, as a request of the policy's cascade model.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.laya import LayaEngine
from cascade.engines.onnx import default_threads
from cascade.errors import ClientError
from cascade.eval.data import Item, read_items
from cascade.laya.checkpoint import content_hash
from cascade.laya.export import MODEL_FILE
from cascade.laya.flip_report import Accuracy, FlipCell, FlipGate, FlipReport, Speed
from cascade.laya.int8 import model_hash, recipe_id
from cascade.policy.canned import certain
from cascade.policy.fingerprint import policy_hash
from cascade.policy.flow import Ask, Reply, TierCall, decide, run
from cascade.policy.model import Policy
from cascade.questions import answer_label, label_index, option_band
from cascade.schema import Question
from cascade.store import read_rows

Answers = list[EngineAnswer | None]  # per item; None: the cheap tier refused it


def items_from_log(path: str | Path) -> tuple[list[Item], int]:
    """Requests rebuilt from a decision log's rows that kept their state as text, and how many
    rows could not be used (state stored as a hash or not at all). A shadow row's strong
    answer is its question's gold label."""
    requests: dict[str, dict[str, Any]] = {}
    unusable = 0
    for row in read_rows(path):
        if row.state_mode != "text" or row.state is None:
            unusable += 1
            continue
        request = requests.setdefault(
            row.request_id, {"state": row.state, "questions": {}, "gold": {}, "model": row.model}
        )
        question = msgspec.convert(row.question, Question)
        request["questions"][row.question_id] = question
        if row.shadow and row.strong is not None:
            request["gold"][row.question_id] = answer_label(question, row.strong.probabilities)
    items = [
        Item(
            id=rid,
            call=EngineCall(state=r["state"], questions=r["questions"], model=r["model"]),
            gold=r["gold"],
        )
        for rid, r in requests.items()
    ]
    return items, unusable


def items_from_data(path: str | Path) -> tuple[list[Item], int]:
    """The text items of an evaluation data file, and how many were left out (images)."""
    items, left_out = read_items(path, text_only=True)
    return items, left_out.get("with_images", 0)


async def _run(engine: LayaEngine, items: Sequence[Item], clients: int) -> tuple[Answers, float]:
    """Every item through ``engine`` with ``clients`` concurrent requests; answers, seconds."""
    out: Answers = [None] * len(items)
    todo = list(range(len(items)))[::-1]

    async def client() -> None:
        while todo:
            i = todo.pop()
            try:
                out[i] = await engine.answer(items[i].call)
            except ClientError:
                out[i] = None

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return out, time.perf_counter() - started


async def run_both(
    ckpt: Path, items: Sequence[Item], *, cache: Path | None, clients: int, threads: int | None
) -> tuple[Answers, Answers, Speed]:
    """Both precisions' answers to ``items`` and their speed."""
    answers: dict[str, Answers] = {}
    seconds: dict[str, float] = {}
    rows = 0
    for precision in ("fp32", "int8"):
        engine = LayaEngine(
            f"laya-{precision}",
            {"english": ckpt},
            onnx_cache=cache,
            intra_op_threads=threads,
            precision=precision,
        )
        await engine.start()
        try:
            answers[precision], seconds[precision] = await _run(engine, items, clients)
        finally:
            await engine.aclose()
        rows = sum(len(a.results) for a in answers[precision] if a is not None)
    fp32, int8 = rows / seconds["fp32"], rows / seconds["int8"]
    speed = Speed(
        clients=clients,
        threads=threads or default_threads(),
        fp32_rows_per_s=fp32,
        int8_rows_per_s=int8,
        speedup=int8 / fp32,
    )
    return answers["fp32"], answers["int8"], speed


def _argmax(probabilities: Sequence[float]) -> int:
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))


def _escalated(policy: Policy, call: EngineCall, answer: EngineAnswer) -> set[str]:
    """The questions the cascade answers on the strong tier when the cheap tier says
    ``answer``."""
    cheap, strong = policy.route.cheap, policy.route.strong
    if cheap is None or strong is None:
        return set()
    model = policy.models.cascade[0] if policy.models.cascade else call.model

    def reply(ask: Ask) -> Reply:
        return (
            answer if isinstance(ask, TierCall) and ask.tier == cheap else certain(ask.call, strong)
        )

    decision = run(
        decide(policy, msgspec.structs.replace(call, model=model), previews=False), reply
    )
    return {q for q, tier in decision.tiers.items() if tier == strong}


def compare(items: Sequence[Item], fp32: Answers, int8: Answers, policy: Policy) -> dict[str, Any]:
    """The report's figures from both precisions' answers (``FlipReport`` fields)."""
    cells: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"questions": 0, "flips": 0, "max_dp": 0.0}
    )
    gate = {"decisions_changed": 0, "flips_served": 0, "flips_escalated": 0}
    correct = {"fp32": 0, "int8": 0}
    labelled = skipped = 0
    applied = policy.route.cheap is not None and policy.route.strong is not None
    for item, a, b in zip(items, fp32, int8, strict=True):
        if a is None or b is None:
            skipped += 1
            continue
        esc_a, esc_b = _escalated(policy, item.call, a), _escalated(policy, item.call, b)
        for qid, ra in a.results.items():
            pa, pb = ra.probabilities, b.results[qid].probabilities
            cell = cells[f"{ra.type}:{option_band(len(pa))}"]
            flipped = _argmax(pa) != _argmax(pb)
            cell["questions"] += 1
            cell["flips"] += flipped
            cell["max_dp"] = max(
                cell["max_dp"], max(abs(x - y) for x, y in zip(pa, pb, strict=True))
            )
            gate["decisions_changed"] += (qid in esc_a) != (qid in esc_b)
            if flipped:
                gate["flips_escalated" if qid in esc_b else "flips_served"] += 1
            gold = item.gold.get(qid)
            index = None if gold is None else label_index(item.call.questions[qid], gold)
            if index is not None:
                labelled += 1
                correct["fp32"] += _argmax(pa) == index
                correct["int8"] += _argmax(pb) == index
    questions = sum(c["questions"] for c in cells.values())
    flips = sum(c["flips"] for c in cells.values())
    return {
        "items": len(items),
        "questions": questions,
        "skipped": skipped,
        "flips": flips,
        "flip_rate": flips / questions if questions else 0.0,
        "max_dp": max((c["max_dp"] for c in cells.values()), default=0.0),
        "cells": {k: FlipCell(**v) for k, v in sorted(cells.items())},
        "accuracy": Accuracy(
            labelled=labelled, fp32=correct["fp32"] / labelled, int8=correct["int8"] / labelled
        )
        if labelled
        else None,
        "gate": {"applied": applied, **gate},
    }


def flip_report(
    ckpt: Path,
    int8_dir: Path,
    items: Sequence[Item],
    policy: Policy,
    *,
    policy_file: str,
    data: str,
    max_flip_rate: float,
    cache: Path | None,
    clients: int = 8,
    threads: int | None = None,
) -> FlipReport:
    """Run both precisions of ``ckpt`` on ``items`` and build the stamped report."""
    fp32, int8, speed = asyncio.run(
        run_both(ckpt, items, cache=cache, clients=clients, threads=threads)
    )
    figures = compare(items, fp32, int8, policy)
    gate = FlipGate(policy=policy_file, policy_hash=policy_hash(policy), **figures.pop("gate"))
    passed = figures["questions"] > 0 and figures["flip_rate"] <= max_flip_rate
    return FlipReport(
        checkpoint=str(ckpt),
        fp32_hash=content_hash(ckpt),
        int8_hash=model_hash(int8_dir / MODEL_FILE),
        recipe=recipe_id(),
        data=data,
        max_flip_rate=max_flip_rate,
        passed=passed,
        speed=speed,
        gate=gate,
        **figures,
    )


def summary_lines(report: FlipReport) -> list[str]:
    """The report in a few lines, for the terminal."""
    verdict: Literal["PASSED", "FAILED"] = "PASSED" if report.passed else "FAILED"
    lines = [
        f"flip check {verdict}: {report.flips} of {report.questions} answers changed "
        f"(flip rate {report.flip_rate:.4f}, max_flip_rate {report.max_flip_rate}); "
        f"max |Δp| {report.max_dp:.4f}; {report.skipped} of {report.items} requests skipped",
    ]
    lines += [
        f"  {cell:<14} {c.flips:>5} of {c.questions:<6} flipped, max |Δp| {c.max_dp:.4f}"
        for cell, c in report.cells.items()
    ]
    g = report.gate
    if g.applied:
        lines.append(
            f"  through the gate of {g.policy}: {g.flips_served} flips served, "
            f"{g.flips_escalated} escalated; {g.decisions_changed} escalation "
            "decisions changed"
        )
    if report.accuracy:
        a = report.accuracy
        lines.append(f"  accuracy on {a.labelled} labelled: fp32 {a.fp32:.4f}, int8 {a.int8:.4f}")
    s = report.speed
    lines.append(
        f"  speed ({s.clients} clients, {s.threads} threads): fp32 "
        f"{s.fp32_rows_per_s:.2f} rows/s, int8 {s.int8_rows_per_s:.2f} rows/s, "
        f"{s.speedup:.2f}x"
    )
    lines.append(f"  stamped fp32 {report.fp32_hash}, int8 {report.int8_hash}")
    return lines
