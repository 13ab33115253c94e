"""``ClefRunner`` planning and failure isolation, and prompt validation."""

from __future__ import annotations

import pytest
import torch

from cascade.clef.prompt import PromptEncoder
from cascade.clef.runner import ClefRunner, Job, MemoryBudgetExceeded
from cascade.errors import ValidationFailed
from cascade.schema import NoulQuestion
from tests.clef.clef_cases import CASES, questions


@pytest.fixture
def jobs(loaded) -> list[Job]:
    encoder = PromptEncoder(lambda t: loaded.tokenizer(t, add_special_tokens=False).input_ids)
    return [Job(encoder.encode(case["state"], questions(case))) for case in CASES.values()]


def test_plan_respects_the_token_budget_and_keeps_order(loaded, jobs):
    wide = ClefRunner(loaded)
    narrow = ClefRunner(loaded, max_batch_tokens=max(job.length for job in jobs))
    assert len(wide._plan(jobs)) == 1
    plan = narrow._plan(jobs)
    assert sorted(i for batch in plan for i in batch) == list(range(len(jobs)))
    assert all(len(b) * max(jobs[i].length for i in b) <= narrow.max_batch_tokens for b in plan)
    for a, b in zip(wide.run_batch(jobs), narrow.run_batch(jobs), strict=True):
        for x, y in zip(a, b, strict=True):
            assert x == pytest.approx(y, abs=1e-4)


def test_out_of_memory_fails_only_the_job_that_cannot_fit(loaded, jobs, monkeypatch):
    runner = ClefRunner(loaded)
    longest = max(jobs, key=lambda job: job.length)
    real = runner.forward

    def forward(batch):
        if longest in batch:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(batch)

    monkeypatch.setattr(runner, "forward", forward)
    outcomes = runner.run_batch(jobs)
    for job, outcome in zip(jobs, outcomes, strict=True):
        assert isinstance(outcome, MemoryBudgetExceeded) == (job is longest)


def test_memory_budget_check_names_both_numbers(loaded):
    runner = ClefRunner(loaded, memory_budget_bytes=10_000)
    with pytest.raises(MemoryBudgetExceeded, match=r"needs about \d+ bytes.*budget is 10000"):
        runner.check_fits(500)
    assert runner.estimate_bytes(2, 500) > runner.estimate_bytes(1, 500)


def test_empty_question_id_is_a_validation_error(loaded):
    encoder = PromptEncoder(lambda t: loaded.tokenizer(t, add_special_tokens=False).input_ids)
    with pytest.raises(ValidationFailed, match="must not be empty"):
        encoder.encode("state", {"": NoulQuestion()})


def test_laya_label_lists_encode_like_criteria_without_descriptions(loaded):
    encoder = PromptEncoder(lambda t: loaded.tokenizer(t, add_special_tokens=False).input_ids)
    as_list = encoder.encode(
        "s",
        questions({"questions": {"pick": {"type": "choice", "criteria": ["zeta", "alpha", 3]}}}),
    )
    as_dict = encoder.encode(
        "s",
        questions(
            {
                "questions": {
                    "pick": {"type": "choice", "criteria": {"zeta": None, "alpha": None, "3": None}}
                }
            }
        ),
    )
    assert as_list == as_dict
    (question,) = as_list.questions
    assert question.option_ids == ("3", "alpha", "zeta")
    assert question.caller_order == (2, 1, 0)
