"""``cascade.replay``: a candidate replayed on a decision log decides every question as a gateway
serving it live does, and counts the questions it cannot judge instead of guessing them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from cascade.policy.files import load_policy
from cascade.replay.judge import REASONS, Unjudged, judge
from cascade.replay.logged import logged_requests
from cascade.replay.run import replay
from cascade.store import read_rows
from tests.replay.helpers import ask, policy_text, served

N = 30  # requests


def logged(tmp_path: Path, threshold: float, n: int = N) -> Path:
    """A decision log of ``n`` requests served by a gateway with every threshold at
    ``threshold``."""
    policy, log = tmp_path / f"logged-{threshold}.toml", tmp_path / f"d-{threshold}.db"
    policy.write_text(policy_text(threshold))
    with served(policy, log) as client:
        for n_ in range(n):
            ask(client, n_)
    return log


def test_replay_decides_each_question_as_the_candidate_serving_live(tmp_path: Path) -> None:
    """Logged under A (every question escalated: both tiers' answers logged), replayed under B
    (threshold 0.7), compared with a gateway actually serving B on the same requests."""
    log = logged(tmp_path, 1.0)
    candidate = tmp_path / "b.toml"
    candidate.write_text(policy_text(0.7))
    policy = load_policy(candidate)
    replayed = {}
    for request in logged_requests([log])[0]:
        for j in judge(policy, {}, request):
            assert j.candidate.tier is not None
            tier = policy.route.cheap if j.candidate.tier == "cheap" else policy.route.strong
            replayed[(j.request, j.question)] = (tier, j.candidate.answer)
    with served(candidate) as client:
        live = {(f"r{n}", q): found for n in range(N) for q, found in ask(client, n).items()}
    assert len(replayed) == len(live) == 3 * N
    assert replayed == live
    assert {tier for tier, _ in live.values()} == {"cheap", "strong"}
    report = replay(policy, [log], weights={}, prices={"cheap": 1.0, "strong": 20.0})
    moved = sum(tier == "cheap" for tier, _ in live.values())
    assert report["judged"] == 3 * N and report["not_judged"] == dict.fromkeys(REASONS, 0)
    assert report["tier_changes"] == {"cheap_to_strong": 0, "strong_to_cheap": moved}
    assert report["strong_share"] == {"served": 1.0, "candidate": 1 - moved / (3 * N)}
    assert 0 < report["answers_changed"] <= moved
    assert report["cost"]["candidate"] < report["cost"]["served"]


def test_questions_it_cannot_judge_are_counted_by_reason_not_guessed(tmp_path: Path) -> None:
    kept = logged(tmp_path, 0.0, 6)  # every answer kept cheap: no strong answer logged
    escalate, renamed = tmp_path / "all-strong.toml", tmp_path / "renamed.toml"
    escalate.write_text(policy_text(1.0))
    renamed.write_text(policy_text(0.0, cheap="laya2"))
    prices = {"cheap": 1.0, "strong": 20.0}
    report = replay(load_policy(escalate), [kept], weights={}, prices=prices)
    assert report["judged"] == 0 and report["questions"] == 18
    assert report["not_judged"]["no_strong_answer"] == 18
    assert report["strong_share"]["candidate"] is None
    report = replay(load_policy(renamed), [kept], weights={}, prices=prices)
    assert report["not_judged"]["changed_tier"] == 18
    same = load_policy(tmp_path / "logged-0.0.toml")
    report = replay(same, [kept], weights={"cheap": "other weights"}, prices=prices)
    assert report["not_judged"]["changed_tier"] == 18
    with sqlite3.connect(kept) as db:  # requests r0, r1 as a file before token shares has them
        db.execute(
            "UPDATE decisions SET cheap_tokens = NULL, strong_tokens = NULL "
            "WHERE request_id IN ('r0', 'r1')"
        )
        db.execute("UPDATE decisions SET tenant_policy_hash = 'own' WHERE request_id = 'r2'")
    db.close()
    report = replay(same, [kept], weights={}, prices=prices)
    assert report["not_judged"] == {
        **dict.fromkeys(REASONS, 0),
        "older_schema": 6,
        "tenant_policy": 3,
    }
    assert report["judged"] == 9 and report["tier_changes"] == {
        "cheap_to_strong": 0,
        "strong_to_cheap": 0,
    }
    assert report["answers_changed"] == 0


def test_a_candidate_keeping_an_answer_never_logged_cheap_is_not_judged(tmp_path: Path) -> None:
    log = logged(tmp_path, 1.0, 2)
    with sqlite3.connect(log) as db:  # the cheap tier failed on r0: its answers were not logged
        db.execute("UPDATE decisions SET cheap = NULL, cheap_tokens = NULL WHERE request_id = 'r0'")
    db.close()
    policy = load_policy(tmp_path / "logged-1.0.toml")
    requests, cut = logged_requests([log])
    assert not cut and len(requests) == 2
    reasons = []
    for request in requests:
        try:
            judge(policy, {}, request)
        except Unjudged as why:
            reasons.append(why.reason)
    assert reasons == ["no_cheap_answer"]
    assert logged_requests([log], limit=1) == (requests[:1], True)


def test_accuracy_on_labelled_and_shadow_rows_is_the_live_candidates(tmp_path: Path) -> None:
    """Logged under A (every answer kept cheap, every request shadowed, feedback labels on
    ``team``), replayed under B: the accuracies are those of a live B against the same labels
    and against the strong tier's answers (the teacher)."""
    n = 12
    policy, log = tmp_path / "a.toml", tmp_path / "d.db"
    policy.write_text(policy_text(0.0, extra="[shadow]\nfraction = 1.0\n"))
    with served(policy, log) as client:
        served_a = {n_: ask(client, n_) for n_ in range(n)}
        for n_ in range(n):
            r = client.post(
                "/v1/feedback", json={"request_id": f"r{n_}", "labels": {"team": "billing"}}
            )
            assert r.status_code == 200, r.text
        for _ in range(200):  # the shadow answers land off the response path
            if all(row.shadow for row in read_rows(log)):
                break
            time.sleep(0.05)
    candidate, strong = tmp_path / "b.toml", tmp_path / "strong.toml"
    candidate.write_text(policy_text(0.7))
    strong.write_text(policy_text(1.0))
    with served(candidate) as client:
        live = {n_: ask(client, n_) for n_ in range(n)}
    with served(strong) as client:
        teacher = {n_: ask(client, n_) for n_ in range(n)}
    report = replay(load_policy(candidate), [log], weights={}, prices={})
    assert report["judged"] == 3 * n  # the shadow answers judge the escalations too

    def rate(answers: dict[int, dict], truth: dict[tuple[int, str], object]) -> float:
        return sum(answers[r][q][1] == t for (r, q), t in truth.items()) / len(truth)

    labels = {(r, "team"): "billing" for r in range(n)}
    taught = {(r, q): teacher[r][q][1] for r in range(n) for q in teacher[r]}
    assert report["labelled"]["questions"] == n
    assert report["labelled"]["served"]["accuracy"] == rate(served_a, labels)
    assert report["labelled"]["candidate"]["accuracy"] == rate(live, labels)
    shadow = report["shadow"]
    assert shadow["teacher"] == "strong" and shadow["questions"] == 3 * n
    assert shadow["served"]["accuracy"] == rate(served_a, taught)
    assert shadow["candidate"]["accuracy"] == rate(live, taught) > shadow["served"]["accuracy"]
    kept = {k: t for k, t in taught.items() if live[k[0]][k[1]][0] == "cheap"}
    assert shadow["candidate"]["kept"] == len(kept) > 0
    assert shadow["candidate"]["kept_accuracy"] == rate(live, kept)
