"""POST /v1/feedback: labels stored beside their request's rows in the decision log, the 4xx
cases (log off, unknown request, labels that do not fit), re-labelling, a writer that is behind,
and the judged answers handed to a learner."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient

from cascade import metrics
from cascade.calls import EngineCall
from cascade.control.evidence import Labelled
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http import feedback
from cascade.http.app import create_app
from cascade.http.services import services_of
from cascade.policy.calibration import temper
from cascade.policy.model import (
    Bands,
    Calibration,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    TypeBands,
)
from cascade.schema import Question
from cascade.settings import Settings
from cascade.store.sqlite import SqliteStore, read_rows

KEY = "feedback-key"
AUTH = {"authorization": f"Bearer {KEY}"}
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "Payments", "technical": "Bugs", "sales": "Deals"},
    },
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
}
BODY = {"model": "jev-latest", "state": "I was charged twice", "questions": QUESTIONS}
TEMPERATURE = 2.0  # the calibration's, on choice questions of 3 options


class Recording:
    """A learner that keeps what it is handed."""

    def __init__(self) -> None:
        self.seen: list[Labelled] = []

    def observe(self, answers: Sequence[Labelled]) -> None:
        self.seen.extend(answers)


def _policy() -> Policy:
    return Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),
        calibration=Calibration(temperatures=TypeBands(choice=Bands(three_five=TEMPERATURE))),
    )


def _client(log: SqliteStore | None) -> TestClient:
    gateway = Gateway(
        _policy(), {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")}, decisions=log
    )
    return TestClient(create_app(Settings(api_keys=(KEY,)), gateway))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SqliteStore]:
    writer = SqliteStore(tmp_path / "d.db")
    yield writer
    writer.close()


def _count(outcome: str) -> float:
    return metrics.FEEDBACK.labels(outcome=outcome)._value.get()


def _answer(client: TestClient, rid: str) -> dict:
    r = client.post("/v1/systemone", json=BODY, headers={**AUTH, "x-request-id": rid})
    assert r.status_code == 200, r.text
    return r.json()


def _feedback(client: TestClient, rid: str, labels: dict, **kw: object):
    return client.post(
        "/v1/feedback", json={"request_id": rid, "labels": labels}, headers=AUTH, **kw
    )  # type: ignore[arg-type]


def test_labels_are_stored_beside_the_rows_and_the_latest_wins(log: SqliteStore):
    stored, relabelled = _count("stored"), _count("relabelled")
    with _client(log) as client:
        _answer(client, "r1")
        r = _feedback(client, "r1", {"team": "sales", "anger": 2, "urgent": True})
        assert r.status_code == 200, r.text
        assert r.json() == {"request_id": "r1", "stored": 3, "relabelled": []}
        again = _feedback(client, "r1", {"team": "billing"})
        assert again.json() == {"request_id": "r1", "stored": 1, "relabelled": ["team"]}
    log.close()
    rows = {row.question_id: row for row in read_rows(log.path)}
    assert {q: r.label.value for q, r in rows.items() if r.label} == {
        "team": "billing",
        "anger": 2,
        "urgent": True,
    }
    team = rows["team"].label
    assert team is not None and (team.count, team.source) == (2, "feedback")
    assert team.ts >= rows["team"].ts
    assert _count("stored") - stored == 3 and _count("relabelled") - relabelled == 1


def test_the_decision_log_off_is_409(tmp_path: Path):
    before = _count("log_off")
    with _client(None) as client:
        _answer(client, "r1")
        r = _feedback(client, "r1", {"urgent": True})
    assert r.status_code == 409
    assert r.json()["detail"]["error_type"] == "conflict_error"
    assert "decision log" in r.json()["detail"]["message"]
    assert _count("log_off") - before == 1


def test_an_unknown_request_id_is_404(log: SqliteStore):
    before = _count("unknown_request")
    with _client(log) as client:
        _answer(client, "r1")
        r = _feedback(client, "nobody-asked", {"urgent": True, "team": "sales"})
    assert r.status_code == 404
    assert r.json()["detail"]["error_type"] == "not_found_error"
    assert "nobody-asked" in r.json()["detail"]["message"]
    assert _count("unknown_request") - before == 2


@pytest.mark.parametrize(
    ("labels", "bad", "says"),
    [
        ({"team": "marketing"}, "team", "one of its options: 'billing', 'technical', 'sales'"),
        ({"anger": 3}, "anger", "level index, 0 to 2"),
        ({"anger": True}, "anger", "level index"),
        ({"urgent": 1}, "urgent", "true or false"),
        ({"urgent": "yes"}, "urgent", "true or false"),
        ({"team": 0}, "team", "one of its options"),
        ({"tone": "calm", "urgent": True}, "tone", "asked no question 'tone'"),
    ],
)
def test_a_label_that_does_not_fit_is_422_naming_it_and_nothing_is_stored(
    log: SqliteStore, labels: dict, bad: str, says: str
):
    before = _count("invalid")
    with _client(log) as client:
        _answer(client, "r1")
        r = _feedback(client, "r1", {"anger": 1, **labels})
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "labels", bad] and says in item["msg"]
    assert _count("invalid") - before == len(labels) + ("anger" not in labels)
    log.close()
    assert all(row.label is None for row in read_rows(log.path))  # all or nothing


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"request_id": "r1", "labels": {"anger": 1.5}}, ["body", "labels", "anger"]),
        ({"request_id": "r1", "labels": {}}, ["body", "labels"]),
        ({"request_id": "", "labels": {"anger": 1}}, ["body", "request_id"]),
        ({"labels": {"anger": 1}}, ["body", "request_id"]),
        ({"request_id": "r1", "labels": {"anger": None}}, ["body", "labels", "anger"]),
    ],
)
def test_a_body_of_the_wrong_shape_is_422(log: SqliteStore, body: dict, loc: list):
    with _client(log) as client:
        r = client.post("/v1/feedback", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_feedback_needs_the_key(log: SqliteStore):
    with _client(log) as client:
        r = client.post("/v1/feedback", json={"request_id": "r1", "labels": {"urgent": True}})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


def test_rows_still_queued_are_found_not_404(log: SqliteStore):
    """The writer is stuck while the request is answered (its rows wait in the queue, the
    response went out after COMMIT_WAIT_S): its feedback waits behind them, then is stored."""
    release = threading.Event()
    write = log._write

    def stalled(batch):
        release.wait(10)
        return write(batch)

    log._write = stalled  # type: ignore[method-assign]
    with _client(log) as client:
        _answer(client, "r1")
        assert log.lagging  # the rows are not on disk yet
        threading.Timer(0.3, release.set).start()
        r = _feedback(client, "r1", {"urgent": False})
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == 1


def test_a_writer_stuck_past_the_wait_is_503_not_a_hang(log: SqliteStore, monkeypatch):
    monkeypatch.setattr(feedback, "FEEDBACK_WAIT_S", 0.2)
    release = threading.Event()
    write = log._write
    failed = _count("failed")
    with _client(log) as client:
        _answer(client, "r1")
        log._write = lambda batch: release.wait(10) and write(batch)  # type: ignore[method-assign]
        r = _feedback(client, "r1", {"urgent": False})
        release.set()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["detail"]["message"] == "the decision log is behind; retry"
    assert _count("failed") - failed == 1


def test_the_learner_gets_the_cheap_answers_judged_as_the_gate_reads_them(log: SqliteStore):
    learner = Recording()
    with _client(log) as client:
        services_of(client.app).learner = learner
        _answer(client, "r1")
        cheap = deterministic_answer(_call_of(BODY))
        team = cheap.results["team"].probabilities
        top = ["billing", "technical", "sales"][team.index(max(team))]
        wrong = next(k for k in ("billing", "technical", "sales") if k != top)
        r = _feedback(client, "r1", {"team": wrong, "urgent": True})
        assert r.status_code == 200, r.text
    by_type = {e.type: e for e in learner.seen}
    assert set(by_type) == {"choice", "noul"}
    choice, noul = by_type["choice"], by_type["noul"]
    assert (choice.band, choice.correct, choice.source) == ("3-5", False, "feedback")
    assert choice.confidence == pytest.approx(max(temper(team, TEMPERATURE)))
    assert choice.confidence != pytest.approx(max(team))  # the temperature is applied
    urgent = cheap.results["urgent"].probabilities
    assert noul.band == "2" and noul.correct == (urgent[1] >= urgent[0])
    assert noul.confidence == pytest.approx(max(urgent))


def test_a_failing_learner_never_fails_the_stored_feedback(log: SqliteStore):
    class Broken:
        def observe(self, answers: Sequence[Labelled]) -> None:
            raise RuntimeError("bug")

    with _client(log) as client:
        services_of(client.app).learner = Broken()
        _answer(client, "r1")
        r = _feedback(client, "r1", {"urgent": True})
    assert r.status_code == 200


def _call_of(body: dict) -> EngineCall:
    questions = msgspec.convert(body["questions"], dict[str, Question])
    return EngineCall(state=body["state"], questions=questions, model=body["model"])
