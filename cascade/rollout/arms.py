"""Each arm's counts for the guards, from the decision store a rollout's gateway writes.

An arm is a policy hash: its rows at or after ``since``, rows a tenant's own policy decided
(``tenant_policy_hash``) left out. Counted in one aggregate query: questions, strong (the final
tier is not the cheap tier that answered: as ``cascade.replay`` reads a served answer),
degraded and labelled. A shadowed row counts as what it served: the client got its cheap answer
(``shadow = 1`` only adds the strong tier's answer to the same row), so leaving shadow rows out
would leave out a sample of cheap answers only and raise the arm's strong share with its
``[shadow]`` rate. Correct needs the served answer (the argmax of the final
tier's probabilities, ``cascade.questions.answer_label``), so it is judged in Python over the
labelled rows only. Blocking: the caller runs it in a thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from cascade.questions import answer_label
from cascade.rollout.state import open_file
from cascade.rollout.verdict import ArmCounts
from cascade.schema import Question
from cascade.settings import is_database_url
from cascade.store.rows import CheapEntry, StrongEntry

# {cheap}: the cheap tier's name in a row's cheap JSON (each backend's JSON operator);
# {marks}: one placeholder per hash; {p}: the backend's placeholder.
WHERE = (
    "FROM decisions d {join} labels l ON l.decision = d.id WHERE d.policy_hash IN ({marks}) "
    "AND d.ts >= {p} AND d.tenant_policy_hash IS NULL"
)
COUNTS = (
    "SELECT d.policy_hash, count(*), "
    "sum(CASE WHEN d.cheap IS NOT NULL AND d.final_tier = {cheap} THEN 0 ELSE 1 END), "
    "sum(d.degraded), count(l.decision) " + WHERE + " GROUP BY d.policy_hash"
)
LABELLED = "SELECT d.policy_hash, d.question, d.cheap, d.strong, d.final_tier, l.label " + WHERE
DIALECTS = {
    "sqlite": {"p": "?", "cheap": "json_extract(d.cheap, '$.tier')"},
    "postgres": {"p": "%s", "cheap": "(d.cheap::json ->> 'tier')"},
}


def arm_counts(target: str, hashes: Sequence[str], since: float) -> dict[str, ArmCounts]:
    """Every hash of ``hashes`` with its counts (zeros when it has no row) in the store at
    ``target`` (a SQLite path or a ``postgresql://`` URL)."""
    if not hashes:
        return {}
    dialect = "postgres" if is_database_url(target) else "sqlite"
    marks = ", ".join([DIALECTS[dialect]["p"]] * len(hashes))
    counts = COUNTS.format(join="LEFT JOIN", marks=marks, **DIALECTS[dialect])
    labelled = LABELLED.format(join="JOIN", marks=marks, **DIALECTS[dialect])
    params = (*hashes, since)
    if dialect == "postgres":
        from cascade.store import postgres

        with postgres.connect(target) as pg:
            totals = pg.execute(counts, params).fetchall()
            rows = pg.execute(labelled, params).fetchall()
    else:
        lite = open_file(target, "ro")
        try:
            totals = lite.execute(counts, params).fetchall()
            rows = lite.execute(labelled, params).fetchall()
        finally:
            lite.close()
    correct = _correct(rows)
    found = {
        policy: ArmCounts(
            questions=int(n),
            strong=int(strong or 0),
            degraded=int(degraded or 0),
            labelled=int(labels),
            correct=correct.get(policy, 0),
        )
        for policy, n, strong, degraded, labels in totals
    }
    return {h: found.get(h, ArmCounts()) for h in hashes}


def _correct(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Per policy hash, the labelled rows whose served answer equals the label."""
    out: dict[str, int] = {}
    for policy, question_json, cheap_json, strong_json, final_tier, label_json in rows:
        question = msgspec.json.decode(question_json, type=Question)
        cheap = None if cheap_json is None else msgspec.json.decode(cheap_json, type=CheapEntry)
        strong = None if strong_json is None else msgspec.json.decode(strong_json, type=StrongEntry)
        served = cheap if cheap is not None and final_tier == cheap.tier else strong
        if served is None:
            continue  # no answer was logged: nothing to judge
        answer = msgspec.to_builtins(answer_label(question, served.probabilities))
        out[policy] = out.get(policy, 0) + (answer == msgspec.json.decode(label_json))
    return out
