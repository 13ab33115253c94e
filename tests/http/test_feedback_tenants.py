"""Feedback between tenants, on loopback against a real server with tenants from a keys file:
another tenant's request id answers as an unknown one (404, same body, never its options), two
tenants' same request id never cross, the label names who gave it, a call counts against the
tenant's requests_per_min, it takes as many labels as /v1/decisions takes questions; and the
probe's attack (one answered question, 60 relabels) moves no threshold of the live gate."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from litestar import Litestar

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.services import services_of
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    Control,
    LayaTier,
    Policy,
    Route,
    Thresholds,
    TypeBands,
)
from cascade.schema import MAX_ASKED
from cascade.settings import Settings
from cascade.store.sqlite import LogRow, SqliteStore, read_rows
from cascade.tenants.admission import TenantAdmission
from cascade.tenants.limits import LocalStore
from tests.control.load import Clock
from tests.servers import serve_app

DESKS = {"billing-escalations": "Refunds", "fraud-desk": "Stolen cards", "sales": "Deals"}
TEAM = {"team": {"type": "choice", "instructions": "Which desk?", "criteria": DESKS}}
URGENT = {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}
KEYS = {"acme": "acme-key", "beta": "beta-key"}


def _sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _keys_file(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "keys.toml"
    path.write_text(
        "".join(
            f'[[tenant]]\nname = "{name}"\nkeys = ["{_sha(key)}"]\n{extra}\n'
            for name, key in KEYS.items()
        )
    )
    return str(path)


def _auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def _unsure(call: EngineCall) -> EngineAnswer:
    """The cheap tier: a noul's p(true) is the state (a number), other questions as the fake."""
    if not all(q.type == "noul" for q in call.questions.values()):
        return deterministic_answer(call)
    c = float(str(call.state))
    return EngineAnswer(
        model="laya-fake",
        usage=EngineUsage(input_tokens=1),
        results={q: QuestionResult(type="noul", probabilities=[1 - c, c]) for q in call.questions},
    )


def _policy(control: Control | None = None) -> Policy:
    return Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),
        thresholds=Thresholds(confidence=TypeBands(noul=Bands(two=0.8))),
        control=control,
    )


class Served:
    """A gateway with a decision log served on loopback, and a client of it."""

    def __init__(
        self, client: httpx.Client, app: Litestar, gateway: Gateway, log: SqliteStore
    ) -> None:
        self.client, self.app, self.gateway, self.log = client, app, gateway, log


@contextmanager
def _served(
    tmp_path: Path, *, keys: str | None, control: Control | None = None, clock: Clock | None = None
) -> Iterator[Served]:
    log = SqliteStore(tmp_path / "d.db")
    gateway = Gateway(
        _policy(control),
        {"laya": FakeEngine("laya", _unsure), "clef": FakeEngine("clef")},
        decisions=log,
        clock=clock or Clock(),
    )
    app = create_app(Settings(api_keys_file=keys), gateway)
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            yield Served(client, app, gateway, log)
    finally:
        log.close()


def _ask(
    client: httpx.Client,
    tenant: str | None,
    rid: str,
    questions: dict,
    state: str = "I was charged twice",
) -> None:
    r = client.post(
        "/v1/systemone",
        headers={**(_auth(tenant) if tenant else {}), "x-request-id": rid},
        json={"model": "jev-latest", "state": state, "questions": questions},
    )
    assert r.status_code == 200, r.text


def _label(client: httpx.Client, tenant: str | None, rid: str, labels: dict) -> httpx.Response:
    return client.post(
        "/v1/feedback",
        headers=_auth(tenant) if tenant else {},
        json={"request_id": rid, "labels": labels},
    )


def _rows(log: SqliteStore) -> list[LogRow]:
    log.close()
    return list(read_rows(log.path))


def test_another_tenants_request_id_answers_exactly_as_an_unknown_id(tmp_path: Path) -> None:
    unknown = metrics.FEEDBACK.labels(outcome="unknown_request")
    before = unknown._value.get()
    with _served(tmp_path, keys=_keys_file(tmp_path)) as served:
        client = served.client
        _ask(client, "acme", "ticket-1001", TEAM)
        answers = {
            "theirs, a label that does not fit": _label(
                client, "beta", "ticket-1001", {"team": "nope"}
            ),
            "theirs, a label that fits": _label(
                client, "beta", "ticket-1001", {"team": "fraud-desk"}
            ),
            "nobody's": _label(client, "beta", "ticket-1002", {"team": "nope"}),
        }
        for what, r in answers.items():
            assert r.status_code == 404, (what, r.text)
            assert "fraud-desk" not in r.text and "billing" not in r.text
        bodies = {r.text.replace("ticket-1002", "ticket-1001") for r in answers.values()}
        assert len(bodies) == 1  # the same body, whoever's the id is
        assert _label(client, "acme", "ticket-1001", {"team": "nope"}).status_code == 422
    assert unknown._value.get() - before == 3  # the same path: counted as unknown each time
    assert [row.label for row in _rows(served.log)] == [None]


def test_two_tenants_same_request_id_never_cross_and_labels_name_their_tenant(
    tmp_path: Path,
) -> None:
    with _served(tmp_path, keys=_keys_file(tmp_path)) as served:
        client = served.client
        _ask(client, "acme", "ticket-1001", TEAM)
        _ask(client, "beta", "ticket-1001", TEAM)  # later: the latest row of that id
        mine = _label(client, "acme", "ticket-1001", {"team": "fraud-desk"})
        assert mine.json() == {"request_id": "ticket-1001", "stored": 1, "relabelled": []}
        theirs = _label(client, "beta", "ticket-1001", {"team": "sales"})
        assert theirs.json() == {"request_id": "ticket-1001", "stored": 1, "relabelled": []}
    labels = {row.tenant: row.label for row in _rows(served.log)}
    assert {t: (x.value, x.tenant) for t, x in labels.items() if x is not None} == {
        "acme": ("fraud-desk", "acme"),
        "beta": ("sales", "beta"),
    }


def test_keyless_feedback_labels_as_before(tmp_path: Path) -> None:
    with _served(tmp_path, keys=None) as served:
        _ask(served.client, None, "r1", TEAM)
        assert _label(served.client, None, "r1", {"team": "sales"}).status_code == 200
        assert _label(served.client, None, "r2", {"team": "sales"}).status_code == 404
    (row,) = _rows(served.log)
    assert row.label is not None and (row.label.value, row.label.tenant) == ("sales", "")


def test_feedback_counts_against_the_tenants_requests_per_min(tmp_path: Path) -> None:
    keys = _keys_file(tmp_path, "requests_per_min = 3")
    with _served(tmp_path, keys=keys) as served:
        client, clock = served.client, [0.0]
        services_of(served.app).tenant_admission = TenantAdmission(LocalStore(lambda: clock[0]))
        _ask(client, "acme", "r1", TEAM)
        seen = [_label(client, "acme", "r1", {"team": "sales"}) for _ in range(3)]
        assert [r.status_code for r in seen] == [200, 200, 429]
        assert seen[1].headers["x-ratelimit-remaining-requests"] == "0"
        assert seen[2].json()["detail"]["error_type"] == "rate_limit_exceeded"
        assert _label(client, "beta", "r1", {"team": "sales"}).status_code == 404  # not limited
        clock[0] = 20.0  # one request's refill
        assert _label(client, "acme", "r1", {"team": "sales"}).status_code == 200


def test_feedback_takes_as_many_labels_as_decisions_takes_questions(tmp_path: Path) -> None:
    questions = [
        {"type": "predicate", "name": f"q{i}", "instructions": "Urgent?"} for i in range(MAX_ASKED)
    ]
    with _served(tmp_path, keys=_keys_file(tmp_path)) as served:
        client = served.client
        r = client.post(
            "/v1/decisions",
            headers={**_auth("acme"), "x-request-id": "big"},
            json={"model": "jev-latest", "input": "0.9", "questions": questions},
        )
        assert r.status_code == 200 and len(r.json()["answers"]) == MAX_ASKED == 400
        labels = {q["name"]: True for q in questions}
        stored = _label(client, "acme", "big", labels)
        assert stored.status_code == 200, stored.text[:300]
        assert stored.json()["stored"] == MAX_ASKED
        too_many = _label(client, "acme", "big", {**labels, "extra": True})
        assert too_many.status_code == 422


def test_a_batch_state_of_a_longest_request_id_can_be_labelled(tmp_path: Path) -> None:
    rid = "t" * 128  # the longest x-request-id kept; its states' rows are rid/0 ... rid/63
    with _served(tmp_path, keys=_keys_file(tmp_path)) as served:
        r = served.client.post(
            "/v1/systemone/batch",
            json={"states": ["0.9"] * 64, "questions": URGENT},
            headers={**_auth("acme"), "x-request-id": rid},
        )
        assert r.status_code == 200, r.text
        labelled = _label(served.client, "acme", f"{rid}/63", {"urgent": True})
        assert labelled.status_code == 200, labelled.text


@pytest.mark.parametrize("order", ["all right", "alternating"])
@pytest.mark.parametrize("keys", ["tenants", "keyless"])
def test_one_answered_question_relabelled_60_times_moves_no_threshold(
    tmp_path: Path, order: str, keys: str
) -> None:
    """The probe: one noul answered at 0.6 (under the configured 0.80), then 60 feedback calls.
    Before, the refit kept 60 copies: the threshold went to 0.6 (all right) or 1.0."""
    clock = Clock()
    control = Control(target_accuracy=0.9, min_labels=30)
    key_file = _keys_file(tmp_path) if keys == "tenants" else None
    tenant = "acme" if keys == "tenants" else None
    with _served(tmp_path, keys=key_file, control=control, clock=clock) as served:
        client = served.client
        _ask(client, tenant, "probe", URGENT, state="0.6")
        for i in range(60):
            right = True if order == "all right" else i % 2 == 0  # the cheap answer is true
            assert _label(client, tenant, "probe", {"urgent": right}).status_code == 200
        clock.now += control.refit_interval_s + 1
        _ask(client, tenant, "next", URGENT, state="0.9")  # the gate refits on this request
        status = served.gateway.control.status()
    print(
        f"{keys}, labels {order}: noul:2 {status['thresholds']['noul:2']}, refit {status['refit']}"
    )
    assert status["thresholds"]["noul:2"] == 0.8 and status["refit"] == {}
