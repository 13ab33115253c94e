"""Parity with Cloudflare's reference on a tiny release, fp32 on the CPU.

The reference is ``joint_schema_model.py`` from clef-finetune 0.1.0 (see conftest). Ours is
the prompt encoder + ``ClefRunner`` (backbone + our batched head).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from cascade.calls import Image
from cascade.clef.prompt import PromptEncoder
from cascade.clef.runner import ClefRunner, Job
from cascade.errors import TokensExceeded
from tests.clef.clef_cases import CASES, LONG_STATE, QUESTIONS, questions, request


def encoder(loaded, **kwargs) -> PromptEncoder:
    return PromptEncoder(
        lambda texts: loaded.tokenizer(texts, add_special_tokens=False).input_ids, **kwargs
    )


def reference_probs(reference, req, **kwargs) -> tuple[object, list[list[float]]]:
    """The reference's record and unrounded probabilities per question (prompt order)."""
    jsm, model, processor = reference
    record = jsm.encode_record(processor.tokenizer, req, processor=processor, **kwargs)
    with torch.inference_mode():
        logits = model(
            jsm.collate_records([record], processor.tokenizer.pad_token_id, torch.device("cpu"))
        )[0]
    return record, [q.float().softmax(-1).tolist() for q in logits]


def in_prompt_order(encoded, probs: list[list[float]]) -> list[list[float]]:
    out = []
    for question, caller in zip(encoded.questions, probs, strict=True):
        prompt = [0.0] * len(caller)
        for value, index in zip(caller, question.caller_order, strict=True):
            prompt[index] = value
        out.append(prompt)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoding_matches_reference(reference, loaded, name):
    jsm, _, processor = reference
    case = CASES[name]
    ours = encoder(loaded).encode(case["state"], questions(case))
    ref = jsm.encode_record(processor.tokenizer, request(case))
    assert ours.input_ids == ref.input_ids
    for mine, theirs in zip(ours.questions, ref.questions, strict=True):
        assert mine.question_span == theirs.question_span
        assert mine.option_spans == theirs.option_spans
        assert mine.option_ids == theirs.option_ids
        assert mine.question_type == theirs.question_type


@pytest.mark.parametrize("name", sorted(CASES))
def test_answers_match_reference(reference, loaded, name):
    case = CASES[name]
    encoded = encoder(loaded).encode(case["state"], questions(case))
    (ours,) = ClefRunner(loaded).run_batch([Job(encoded)])
    _, ref = reference_probs(reference, request(case))
    np.testing.assert_allclose(
        np.concatenate(in_prompt_order(encoded, ours)), np.concatenate(ref), atol=1e-5
    )


def test_systemone_answers_and_usage_match(reference, loaded):
    """The caller-order mapping against ``systemone``'s own answers (rounded to 4 places)."""
    jsm, model, processor = reference
    case = CASES["object-state"]
    response = jsm.systemone(model, processor, request(case))
    encoded = encoder(loaded).encode(case["state"], questions(case))
    (ours,) = ClefRunner(loaded).run_batch([Job(encoded)])
    assert response["usage"]["input_tokens"] == len(encoded.input_ids)
    team, urgent, severity = ours
    answers = response["answers"]
    ids = list(QUESTIONS["team"]["criteria"])
    assert answers["team"]["choice"] == ids[int(np.argmax(team))]
    assert list(answers["team"]["probabilities"].values()) == pytest.approx(team, abs=1e-4)
    assert answers["urgent"]["noul"] == pytest.approx(urgent[1], abs=1e-4)  # [P(false), P(true)]
    assert list(answers["severity"]["probabilities"].values()) == pytest.approx(severity, abs=1e-4)


def test_answers_depend_on_the_state(loaded):
    """The tiny release is discriminating: different states move the probabilities."""
    runner, enc = ClefRunner(loaded), encoder(loaded)
    a, b = runner.run_batch(
        [
            Job(enc.encode(case["state"], questions(case)))
            for case in (CASES["string-state"], CASES["array-state"])
        ]
    )
    assert max(abs(x - y) for x, y in zip(a[0], b[0], strict=True)) > 1e-3


def test_batched_equals_single(loaded):
    runner, enc = ClefRunner(loaded), encoder(loaded)
    jobs = [Job(enc.encode(case["state"], questions(case))) for case in CASES.values()]
    batched = runner.run_batch(jobs)
    for job, together in zip(jobs, batched, strict=True):
        (alone,) = runner.run_batch([job])
        for x, y in zip(together, alone, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-4)


def test_truncate_mode_equals_reference_truncation(reference, loaded):
    case = {"state": LONG_STATE, "questions": QUESTIONS}
    full = encoder(loaded).encode(case["state"], questions(case))
    limit = len(full.input_ids) - 100
    encoded = encoder(loaded, max_length=limit, overlong="truncate").encode(
        case["state"], questions(case)
    )
    record, ref = reference_probs(reference, request(case), max_length=limit)
    assert encoded.input_ids == record.input_ids
    assert len(encoded.input_ids) == limit
    assert encoded.state_dropped == 100
    assert encoded.state_tokens == full.state_tokens - 100
    (ours,) = ClefRunner(loaded).run_batch([Job(encoded)])
    np.testing.assert_allclose(
        np.concatenate(in_prompt_order(encoded, ours)), np.concatenate(ref), atol=1e-5
    )


def test_reject_mode_reports_token_counts(loaded):
    full = encoder(loaded).encode(LONG_STATE, questions({"questions": QUESTIONS}))
    limit = len(full.input_ids) - 1
    with pytest.raises(TokensExceeded, match=f"has {len(full.input_ids)} tokens; limit is {limit}"):
        encoder(loaded, max_length=limit).encode(LONG_STATE, questions({"questions": QUESTIONS}))


def test_schema_too_long_is_refused_even_when_truncating(loaded):
    with pytest.raises(TokensExceeded, match="before the state"):
        encoder(loaded, max_length=50, overlong="truncate").encode(
            "x", questions({"questions": QUESTIONS})
        )


def _png(seed: int, size: tuple[int, int]) -> tuple[PILImage.Image, Image]:
    rng = np.random.default_rng(seed)
    pil = PILImage.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    buffer = io.BytesIO()
    pil.save(buffer, format="PNG")
    return pil, Image(data=buffer.getvalue(), mime="image/png", width=size[0], height=size[1])


def test_image_request_matches_reference(reference, loaded):
    from cascade.clef.media import ImageEncoder

    pils, images = zip(*(_png(i, size) for i, size in enumerate([(70, 50), (40, 90)])), strict=True)
    case = CASES["string-state"]
    tokenize = loaded.tokenizer
    media_encoder = ImageEncoder(
        loaded.path,
        lambda t: tokenize(t, add_special_tokens=False).input_ids,
        tokenize.convert_tokens_to_ids("<|image_pad|>"),
    )
    media = media_encoder.encode(list(images))
    assert media_encoder.count(list(images)) == len(media.input_ids)
    encoded = encoder(loaded).encode(case["state"], questions(case), media.input_ids)
    (ours,) = ClefRunner(loaded).run_batch([Job(encoded, media)])
    record, ref = reference_probs(reference, {**request(case), "images": list(pils)})
    assert encoded.input_ids == record.input_ids
    np.testing.assert_allclose(
        np.concatenate(in_prompt_order(encoded, ours)), np.concatenate(ref), atol=1e-5
    )
    (text_only,) = ClefRunner(loaded).run_batch(
        [Job(encoder(loaded).encode(case["state"], questions(case)))]
    )
    assert max(abs(x - y) for x, y in zip(ours[0], text_only[0], strict=True)) > 1e-3
