"""Cache keys change with each thing that determines an answer, and with nothing else."""

from __future__ import annotations

import msgspec
import pytest

from cascade.cache import keys
from cascade.cache.keys import Version
from cascade.calls import Budget, EngineCall, Image
from cascade.schema import Controls, NoulQuestion
from tests.cache.helpers import QUESTIONS, call

VERSION = Version(policy="p" * 64, calibration="c" * 64, tiers={"laya": "w" * 64})
BASE = {"version": VERSION, "namespace": "acme", "tier": "laya", "profile": "laya"}
PNG = Image(data=b"\x89PNG one", mime="image/png", width=1, height=1)


def both(call: EngineCall, **parts: object) -> tuple[dict[str, str], str]:
    prefix = keys.call_prefix(call=call, **{**BASE, **parts})  # type: ignore[arg-type]
    return keys.question_keys(prefix, call), keys.joint_key(prefix, call)


def replace(base: EngineCall, **changes: object) -> EngineCall:
    return msgspec.structs.replace(base, **changes)


ORIGINAL = call()
CHANGED_PARTS = {
    "namespace": {"namespace": "globex"},
    "tier": {"tier": "clef"},
    "weights": {"version": msgspec.structs.replace(VERSION, tiers={"laya": "v" * 64})},
    "policy": {"version": msgspec.structs.replace(VERSION, policy="q" * 64)},
    "calibration": {"version": msgspec.structs.replace(VERSION, calibration="d" * 64)},
    "profile": {"profile": "jev"},
}
CHANGED_CALLS = {
    "state": replace(ORIGINAL, state="charged three times"),
    "state key order": replace(ORIGINAL, state={"b": 1, "a": 2}),
    "model": replace(ORIGINAL, model="laya-english"),
    "images": replace(ORIGINAL, images=[PNG]),
    "image bytes": replace(
        ORIGINAL, images=[Image(data=b"\x89PNG two", mime="image/png", width=1, height=1)]
    ),
    "controls": replace(ORIGINAL, controls=Controls(max_len=256)),
}


@pytest.mark.parametrize("name", CHANGED_PARTS)
def test_each_part_of_the_version_and_scope_changes_every_key(name: str) -> None:
    per_q, joint = both(ORIGINAL)
    other_q, other_joint = both(ORIGINAL, **CHANGED_PARTS[name])
    assert joint != other_joint
    assert all(per_q[q] != other_q[q] for q in per_q)


@pytest.mark.parametrize("name", CHANGED_CALLS)
def test_each_part_of_the_call_changes_every_key(name: str) -> None:
    base = replace(ORIGINAL, state={"a": 2, "b": 1}) if name == "state key order" else ORIGINAL
    per_q, joint = both(base)
    other_q, other_joint = both(CHANGED_CALLS[name])
    assert joint != other_joint
    assert all(per_q[q] != other_q[q] for q in per_q)


def test_request_id_and_budget_change_no_key() -> None:
    same = replace(ORIGINAL, request_id="abc", budget=Budget(deadline=1.0, flow=7))
    assert both(same) == both(ORIGINAL)


def test_a_question_key_depends_on_that_question_alone_a_joint_key_on_the_whole_set() -> None:
    per_q, joint = both(ORIGINAL)
    fewer = call(**{k: v for k, v in QUESTIONS.items() if k != "anger"})
    fewer_q, fewer_joint = both(fewer)
    assert fewer_q == {q: per_q[q] for q in fewer_q}  # per question: the others do not matter
    assert fewer_joint != joint
    reordered = call(**dict(reversed(QUESTIONS.items())))
    assert both(reordered)[0] == per_q and both(reordered)[1] != joint
    edited = call(**{**QUESTIONS, "urgent": NoulQuestion(instructions="Urgent now?")})
    edited_q, _ = both(edited)
    assert edited_q["urgent"] != per_q["urgent"]
    assert {q: k for q, k in edited_q.items() if q != "urgent"} == {
        q: k for q, k in per_q.items() if q != "urgent"
    }


def test_the_question_id_is_part_of_its_key() -> None:
    """Laya reads the id of a question without instructions: a renamed one is another key."""
    per_q, _ = both(call(a=NoulQuestion()))
    renamed, _ = both(call(b=NoulQuestion()))
    assert per_q["a"] != renamed["b"]
