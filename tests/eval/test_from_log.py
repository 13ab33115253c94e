"""``eval``/``calibrate --from-log``'s rows (``cascade.eval.from_log``): every question the cheap
tier answered, gold only from shadow answers, and each row held as no more than its item needs."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import msgspec

from cascade.bench.store import POLICY, QUESTIONS
from cascade.calls import EngineCall
from cascade.engines.fake import deterministic_answer
from cascade.eval.from_log import log_rows
from cascade.questions import answer_label
from tests.store.helpers import synthetic_log


def test_rows_of_every_cheap_answer_and_gold_from_shadows_only(tmp_path: Path):
    log = tmp_path / "d.db"
    synthetic_log(log, 3, shadowed=frozenset({1}))
    every = log_rows([log], POLICY, labelled_only=False)
    assert sorted((r.id, r.question) for r in every) == sorted(
        (f"{log}#r{n}", q) for n in range(3) for q in QUESTIONS
    )
    labelled = log_rows([log], POLICY, labelled_only=True)
    strong = deterministic_answer(
        EngineCall(
            state="ticket 1: charged twice",
            model="jev-latest",
            request_id="r1",
            questions=dict(QUESTIONS),
        )
    )
    assert {r.question: r.gold for r in labelled} == {
        q: msgspec.to_builtins(answer_label(question, strong.results[q].probabilities))
        for q, question in QUESTIONS.items()
    }
    assert {r.id for r in labelled} == {f"{log}#r1"}
    assert all(r.gold is None for r in every if not r.id.endswith("#r1"))


def test_reading_holds_about_a_kilobyte_a_row(tmp_path: Path):
    """The fit needs every row's confidences at once, so they stay in memory: measured, the
    ``items.jsonl`` rows kept are about 0.7 KB a row and the peak while reading about 1.0 KB
    (it was 2.0 KB when whole decoded rows waited for their request)."""
    log = tmp_path / "d.db"
    synthetic_log(log, 2000)
    tracemalloc.start()
    try:
        rows = log_rows([log], POLICY, labelled_only=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == 4000
    assert peak / len(rows) < 1500, peak / len(rows)
