"""The PostgreSQL decision store against a real server: a schema migrated once by replicas that
boot at once, stamped rows read back streamed and filtered in SQL, labels scoped to their tenant,
batches spooled while the server is down and replayed once when it is back, retention, and a
bad URL or unreachable server at boot."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool
import pytest

from cascade.calls import EngineCall
from cascade.cli import main
from cascade.cli.errors import ConfigError
from cascade.cli.serve import open_decision_log
from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.policy.model import Checkpoints, ClefTier, DecisionLog, LayaTier, Policy, Route
from cascade.schema import NoulQuestion
from cascade.settings import Settings
from cascade.store import read_rows
from cascade.store.postgres import PostgresStore, migrate, prune
from tests.servers import Postgres

POLICY = Policy(
    tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")), "clef": ClefTier(release="x")},
    route=Route(cheap="laya", strong="clef"),
)


def _call(rid: str, state: str = "ticket") -> EngineCall:
    return EngineCall(
        state=state,
        model="jev-latest",
        request_id=rid,
        questions={
            "u": NoulQuestion(instructions="Urgent?"),
            "v": NoulQuestion(instructions="Angry?"),
        },
    )


def _serve(store: PostgresStore, calls: list[tuple[str, str]]) -> None:
    """Answer each (request id, tenant) through a gateway logging to ``store``."""
    gateway = Gateway(
        POLICY,
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")},
        decisions=store,
        weights={"laya": "w1"},
    )

    async def run() -> None:
        await gateway.start()
        for rid, tenant in calls:
            await gateway.decide(_call(rid), tenant=tenant)
        await gateway.aclose()

    asyncio.run(run())


def _store(url: str, tmp_path: Path, **kw: Any) -> PostgresStore:
    return PostgresStore(url, spool=tmp_path / "spool", replica="r1", **kw)


def test_replicas_booting_at_once_migrate_the_schema_once(
    postgres: Postgres, capsys: pytest.CaptureFixture[str]
):
    url = postgres.database("boot")
    start = threading.Barrier(6)

    def boot() -> tuple[int, int]:
        start.wait()
        return migrate(url)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        found = sorted(pool.map(lambda _: boot(), range(6)))
    assert found == [(0, 8)] + [(8, 8)] * 5  # one created it, the others found it done
    assert main(["store", "migrate", url]) == 0
    assert "schema 8, up to date" in capsys.readouterr().out


def test_rows_labels_and_filters(
    postgres: Postgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    url = postgres.database("rows")
    store = _store(url, tmp_path)
    _serve(store, [("ticket-1", "acme"), ("ticket-1", "globex"), ("solo", "acme")])
    assert store.label("ticket-1", {"u": True}, tenant="nobody").result(10).found is False
    done = store.label("ticket-1", {"u": True}, tenant="acme").result(10)
    assert done.found and [x.question.instructions for x in done.labelled] == ["Urgent?"]
    assert store.label("ticket-1", {"u": False}, tenant="acme").result(10).relabelled == ["u"]
    invalid = store.label("ticket-1", {"zz": True}, tenant="globex").result(10)
    assert invalid.unknown == ["zz"] and not invalid.labelled
    health = store.health()
    store.close()
    assert health["reachable"] and not health["behind"] and health["written"] == 6
    rows = list(read_rows(url))
    assert [(r.request_id, r.tenant, r.question_id) for r in rows] == [
        ("ticket-1", "acme", "u"),
        ("ticket-1", "acme", "v"),
        ("ticket-1", "globex", "u"),
        ("ticket-1", "globex", "v"),
        ("solo", "acme", "u"),
        ("solo", "acme", "v"),
    ]
    labelled = [r for r in rows if r.label is not None]
    assert [(r.tenant, r.label.value, r.label.count, r.label.tenant) for r in labelled] == [
        ("acme", False, 2, "acme")
    ]  # globex's row of the same id untouched
    assert rows[0].replica == "r1" and rows[0].checkpoints == {"laya": "w1"}
    assert rows[0].cheap is not None and rows[0].cheap.tier == "laya"
    assert [r.request_id for r in read_rows(url, tenant="globex")] == ["ticket-1"] * 2
    assert list(read_rows(url, since=rows[-1].ts + 1)) == []
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE decisions SET ts = 1000 WHERE request_id = 'solo'")
    assert {r.request_id for r in read_rows(url, since=2000)} == {"ticket-1"}
    assert main(["usage", "--from-log", url, "--tenant", "globex", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {t["tenant"] for t in report["rows"]} == {"globex"} and report["log_rows"] == 2


def test_rows_spool_while_the_server_is_down_and_are_written_once(
    postgres: Postgres, tmp_path: Path
):
    url = postgres.database("spool")
    store = _store(url, tmp_path)
    _serve(store, [("up-1", "")])
    postgres.stop()
    try:
        _serve(store, [(f"down-{i}", "") for i in range(5)])  # answered, rows in the spool
        health = store.health()
        assert not health["reachable"] and health["behind"] and health["spool_rows"] == 10
        with pytest.raises(psycopg_pool.PoolTimeout):  # feedback: the route says 503
            store.label("up-1", {"u": True}).result(10)
    finally:
        postgres.start()
    _serve(store, [("up-2", "")])  # behind the spooled batches
    deadline = time.monotonic() + 30
    while store.health()["behind"]:
        assert time.monotonic() < deadline, store.health()
        time.sleep(0.1)
    store.close()
    ids = [r.request_id for r in read_rows(url) if r.question_id == "u"]
    assert ids == ["up-1", *(f"down-{i}" for i in range(5)), "up-2"]  # in order, once each
    assert (tmp_path / "spool").stat().st_size == 0


def test_a_spool_left_by_a_killed_replica_is_replayed_once(postgres: Postgres, tmp_path: Path):
    url = postgres.database("leftover")
    postgres.stop()
    try:  # required = false: the boot warns and spools
        store = _store(url, tmp_path, required=False)
        _serve(store, [("a", ""), ("b", "")])
        store.close()  # as a kill -9 would leave it: the spool file, nothing in the database
    finally:
        postgres.start()
    again = _store(url, tmp_path)
    deadline = time.monotonic() + 30
    while again.health()["behind"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # the same spool replayed a second time (a crash between commit and truncation) adds nothing
    for batch, rows, _ in list(again.spool.records()):
        assert again._write(batch, rows)
    again.close()
    assert sorted((r.request_id, r.question_id) for r in read_rows(url)) == [
        ("a", "u"),
        ("a", "v"),
        ("b", "u"),
        ("b", "v"),
    ]


def test_a_replica_booted_without_its_database_migrates_it_when_it_answers(
    postgres: Postgres, tmp_path: Path
):
    url = postgres.database("late")
    postgres.stop()
    try:
        store = _store(url, tmp_path, required=False)
        _serve(store, [("early", "")])
    finally:
        postgres.start()
    _serve(store, [("late", "")])
    deadline = time.monotonic() + 30
    while store.health()["behind"]:
        assert time.monotonic() < deadline, store.health()
        time.sleep(0.1)
    store.close()
    assert [r.request_id for r in read_rows(url) if r.question_id == "u"] == ["early", "late"]


def test_keep_days_deletes_old_rows_with_their_labels(postgres: Postgres, tmp_path: Path):
    url = postgres.database("keep")
    now = [1_000_000.0]
    store = _store(url, tmp_path, clock=lambda: now[0])
    _serve(store, [("old", "")])
    assert store.label("old", {"u": True}).result(10).found
    now[0] += 10 * 86400
    _serve(store, [("new", "")])
    store.close()
    with psycopg.connect(url) as conn:
        assert prune(conn, now[0] - 7 * 86400) == 2
        assert conn.execute("SELECT count(*) FROM labels").fetchone() == (0,)
    assert {r.request_id for r in read_rows(url)} == {"new"}


def test_a_bad_url_or_an_unreachable_server_at_boot_is_one_line(postgres: Postgres, tmp_path: Path):
    settings = Settings(decision_spool=str(tmp_path / "spool"))
    down = f"postgresql://postgres@127.0.0.1:{postgres.port + 1}/x"  # nothing listens there
    for url in ("postgresql://[::1/x", down):
        with pytest.raises(ConfigError) as caught:
            open_decision_log(Settings(decision_log=url), POLICY)
        assert "\n" not in str(caught.value) and "CASCADE_DECISION_LOG" in str(caught.value)
    lenient = Policy(
        tiers=POLICY.tiers, route=POLICY.route, decision_log=DecisionLog(file=down, required=False)
    )
    store = open_decision_log(settings, lenient)
    assert isinstance(store, PostgresStore) and not store.reachable
    store.close()
    malformed = Policy(
        tiers=POLICY.tiers,
        route=POLICY.route,
        decision_log=DecisionLog(file="postgresql://[::1/x", required=False),
    )
    with pytest.raises(ConfigError, match="CASCADE_DECISION_LOG"):
        open_decision_log(settings, malformed)


def test_bench_store_measures_both_backends(postgres: Postgres, capsys: pytest.CaptureFixture[str]):
    url = postgres.database("bench")
    assert main(["bench", "store", "--postgres", url, "--clients", "1,4", "--seconds", "0.3"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    for name in ("sqlite", "postgresql"):
        rows = result["backends"][name]
        assert [r["clients"] for r in rows] == [1, 4]
        assert all(
            r["requests"] > 0 and r["rows_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] for r in rows
        )
    written = sum(r["requests"] for r in result["backends"]["postgresql"]) * 2
    assert sum(1 for _ in read_rows(url)) == written


@pytest.mark.parametrize(("requests", "by_copy"), [(11, False), (40, True)])
def test_one_batch_keeps_its_order_and_a_shadow_answer_finds_its_rows(
    postgres: Postgres, tmp_path: Path, requests: int, by_copy: bool
):
    """The writer blocked behind a lock while requests and a shadow answer queue up: they go in
    as one batch (pipelined inserts, or from ``COPY_ROWS`` rows COPY through the staging table),
    ids in queue order, and the shadow update of a request in that very batch lands on its
    rows."""
    from cascade.bench.store import _decided
    from cascade.engines.fake import deterministic_answer
    from cascade.store.postgres import COPY_ROWS

    assert (2 * (requests - 1) >= COPY_ROWS) == by_copy  # the batch after the first request
    url = postgres.database(f"batch{requests}")
    store = _store(url, tmp_path)
    calls = [_call(f"r{n}") for n in range(requests)]
    decisions = [_decided(call) for call in calls]
    with psycopg.connect(url) as lock:
        lock.execute("LOCK TABLE decisions IN ACCESS EXCLUSIVE MODE")

        async def run() -> None:
            first = asyncio.ensure_future(store.record(calls[0], decisions[0], 0.01))
            await asyncio.sleep(0)  # it queued its request
            deadline = time.monotonic() + 10
            while store._queue.qsize():  # the writer took the first and waits for the lock
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            rest = [
                asyncio.ensure_future(store.record(c, d, 0.01))
                for c, d in zip(calls[1:], decisions[1:], strict=True)
            ]
            await asyncio.sleep(0.05)
            store.shadowed(calls[4], deterministic_answer(calls[4]), decisions[4].stamp)
            assert store._queue.qsize() == requests
            await asyncio.to_thread(lock.commit)
            await asyncio.gather(first, *rest)

        asyncio.run(run())
    store.close()
    rows = list(read_rows(url))
    assert [r.request_id for r in rows] == [f"r{n // 2}" for n in range(2 * requests)]
    assert [r.question_id for r in rows] == ["u", "v"] * requests
    assert {r.request_id for r in rows if r.shadow} == {"r4"}
    assert all(r.strong is not None for r in rows if r.request_id == "r4")
    assert store.health()["errors"] == 0 and store.written == 2 * requests
